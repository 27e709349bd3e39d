"""The table properties the committer keeps in each table's current metadata (so expiring
snapshots never loses them), and the check that a commit lands on the state it was chosen from.

- ``ingest.commit-seq``: the number of the table's last commit (the metastore records each);
- ``ingest.commit-segments``: the segments that commit put in;
- ``ingest.commit-replaced``: the segments it took out (a replacement; empty for an append);
- ``commit.retry.num-retries=0``: pyiceberg never rebases a conflicting commit onto a newer head
  (a batch chosen from the old head would then be committed on top of one that holds it).
"""

from __future__ import annotations

from pyiceberg.exceptions import CommitFailedException
from pyiceberg.table import Table

from ingest.table.errors import TableDiverged

COMMIT_SEQ = "ingest.commit-seq"
COMMIT_SEGMENTS = "ingest.commit-segments"
COMMIT_REPLACED = "ingest.commit-replaced"
NO_REBASE = {"commit.retry.num-retries": "0"}


def at_commit(table: Table, seq: int) -> Table:
    """``table`` if it holds commit ``seq - 1`` (the state a commit ``seq`` was chosen from) and
    never rebases a commit; any other table is a conflict (CommitFailedException)."""
    held = table.properties.get(COMMIT_SEQ, "0")  # as the committer's reconcile reads it
    if held != str(seq - 1):
        raise CommitFailedException(f"table holds commit {held}, the batch was chosen for commit {seq}")
    if any(table.properties.get(k) != v for k, v in NO_REBASE.items()):
        # Someone changed it (or an older table): restore it first, in a commit of its own
        # (a properties-only commit is never rebased), then commit on what that returns.
        table = table.transaction().set_properties(NO_REBASE).commit_transaction()
        if table.properties.get(COMMIT_SEQ) != str(seq - 1):
            # It landed on a head newer than the one the batch was chosen from.
            raise CommitFailedException(f"table moved to commit {table.properties.get(COMMIT_SEQ)}")
    return table


def segment_ids(table: Table, key: str) -> list[int]:
    """The segment ids a property (``COMMIT_SEGMENTS``, ``COMMIT_REPLACED``) lists."""
    text = table.properties.get(key, "")
    try:
        return [int(part) for part in text.split(",") if part]
    except ValueError as exc:
        raise TableDiverged(f"table property {key} is not a list of segment ids: {text[:80]!r}") from exc
