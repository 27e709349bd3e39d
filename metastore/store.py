"""The metastore: offsets, serials and published segments in PostgreSQL.

``Metastore`` is composed of one mixin per concern, each in a module of its own over the
shared connection (``metastore/base.py``); a new concern gets a mixin of its own:

- ``claims.py``: partitions, their owners and serials;
- ``segments.py``: the serial-guarded publish, the split registry, published segments;
- ``sources.py``: spec versions, controls, workers' heartbeats and errors;
- ``resets.py``: operator resets and the offset-gap ledger;
- ``audits.py``: what ``ingest audit`` reads, and its results.
- ``compaction.py``: segments replaced by compaction, and their files' deletion.

One ``Metastore`` owns one connection and is used by one thread at a time; the worker
gives its polling thread and its publisher thread one each. A broken connection is
dropped and re-opened on the next call.
"""

from __future__ import annotations

from metastore.audits import AuditsMixin
from metastore.base import Row
from metastore.claims import ClaimsMixin
from metastore.compaction import CompactionMixin
from metastore.resets import ResetsMixin
from metastore.segments import SegmentsMixin
from metastore.sources import SourcesMixin, group_id

__all__ = ["Metastore", "Row", "group_id"]


class Metastore(ClaimsMixin, SegmentsMixin, SourcesMixin, ResetsMixin, AuditsMixin, CompactionMixin):
    """Every metastore operation, one connection (``StoreBase``)."""
