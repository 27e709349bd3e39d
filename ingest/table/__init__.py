"""Published segments as Apache Iceberg tables, committed exactly once (issue 20).

``ingest table-enable SOURCE`` turns a source's table on; ``ingest table-commit SOURCE`` runs
the committer (:mod:`ingest.table.committer`); ``ingest table SOURCE`` and ``ingest query
SOURCE 'SQL'`` look at it (:mod:`ingest.table.status`). Importing this package imports no
pyiceberg: the CLI imports the modules it needs.
"""
