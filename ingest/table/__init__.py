"""Published segments as Apache Iceberg tables, committed exactly once (issue 20).

``ingest table-enable SOURCE`` turns a source's table on; ``ingest table-commit SOURCE`` runs
the committer (:mod:`ingest.table.committer`); ``ingest table SOURCE`` and ``ingest query
SOURCE 'SQL'`` look at it (:mod:`ingest.table.status`). Importing this package imports no
pyiceberg: the CLI imports the modules it needs.
"""


def demo_query(database_url: str, source: str) -> list[str]:
    """For the demo (``scripts/demo``): commit the source's published segments to its table
    (enabling it if needed) and return a query over the table as printable lines."""
    from ingest.table.status import demo_query as run

    return run(database_url, source)
