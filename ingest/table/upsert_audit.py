"""``ingest audit``'s look at an upsert table (ingest.table.upsert): it holds no segment file (a
merge copies rows), so instead of files it is checked for what its invariants promise:

- the offsets it merged, per partition, are those the metastore recorded with the same commit,
  and none lies beyond what was published (``upsert_offsets``): a table one commit ahead of
  the metastore is a committer between its swap and its record (the reconcile settles it),
  not a finding;
- each key has one row (``upsert_duplicate_key``);
- keys seen on more than one partition, counted by the merges (``cross_partition_keys``):
  Kafka orders a key's changes only within a partition, so their last state is the newest
  Kafka timestamp's, not an order the producer chose.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import NoSuchTableError

from ingest.spec.model import SourceSpec
from ingest.table.catalog import identifier
from ingest.table.properties import COMMIT_SEQ
from ingest.table.upsert import UPSERT_OFFSETS
from metastore.base import Row
from metastore.tables import TableKind

TableFinding = tuple[str, str, str]


def upsert_findings(catalog: Catalog, spec: SourceSpec, recorded: Row, partitions: Sequence[Row]) -> list[TableFinding]:
    source = spec.name
    name = ".".join(identifier(source, TableKind.DATA))
    findings: list[TableFinding] = []
    if int(recorded["cross_partition_keys"] or 0):
        findings.append(
            (
                "cross_partition_keys",
                f"table {name}",
                f"{recorded['cross_partition_keys']} key(s) appeared on more than one partition: Kafka orders a "
                "key's changes only within a partition, so their state is the newest Kafka timestamp's "
                "(produce each key to one partition: key the topic by the table's key)",
            )
        )
    try:
        table = catalog.load_table(identifier(source, TableKind.DATA))
    except NoSuchTableError:
        return findings
    recorded_offsets = {str(k): int(v) for k, v in dict(recorded["upsert_offsets"] or {}).items()}
    held_seq = int(table.properties.get(COMMIT_SEQ, "0"))
    if held_seq == int(recorded["committed_seq"]):
        held = {k: int(v) for k, v in json.loads(table.properties.get(UPSERT_OFFSETS, "{}")).items()}
        if held != recorded_offsets:
            findings.append(
                (
                    "upsert_offsets",
                    f"table {name}",
                    f"commit {held_seq} merged offsets {held}, the metastore recorded {recorded_offsets}",
                )
            )
    published = {f"{p['topic']}/{p['partition']}": int(p["next_offset"]) for p in partitions}
    for key, offset in sorted(recorded_offsets.items()):
        if offset > published.get(key, -1):
            findings.append(
                (
                    "upsert_offsets",
                    f"table {name} partition {key}",
                    f"merged up to offset {offset}, beyond the published next offset {published.get(key)}",
                )
            )
    keys = list(spec.table.key)
    rows = table.scan(selected_fields=tuple(keys)).to_arrow()
    counts = rows.group_by(keys).aggregate([([], "count_all")])
    twice = counts.filter(counts["count_all"].to_numpy() > 1) if counts.num_rows else counts
    for row in twice.to_pylist()[:20]:
        findings.append(
            (
                "upsert_duplicate_key",
                f"table {name} key {tuple(row[k] for k in keys)}",
                f"{row['count_all']} rows hold this key; an upsert table holds one",
            )
        )
    return findings
