"""Segment files: the store's layout and file operations (file://, s3a://, ...), and which
split each file Spark wrote belongs to (read from its footers)."""
