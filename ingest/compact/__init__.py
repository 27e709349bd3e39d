"""Compaction: runs of small published segments rewritten into files near a target size and
replaced in one metastore transaction (migrations/0017): ``plan`` chooses, ``job`` rewrites,
checks and replaces."""
