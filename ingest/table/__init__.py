"""Published segments as Apache Iceberg tables, committed exactly once (issue 20).

``ingest table-enable SOURCE`` turns a source's table on; ``ingest table-commit SOURCE`` runs
the committer (:mod:`ingest.table.committer`); ``ingest table SOURCE`` and ``ingest query
SOURCE 'SQL'`` look at it (:mod:`ingest.table.status`). Importing this package imports no
pyiceberg: the CLI imports the modules it needs.

Invariant: every published segment is appended to its table exactly once, never twice and
never skipped (the table's properties and the metastore record which commit holds which
segments; the committer reconciles the two before choosing a batch), and its files are
registered where Spark wrote them, never rewritten. It reads published segments only: it
imports :mod:`ingest.segments.store` and the shared modules, never the worker's runtime.
"""
