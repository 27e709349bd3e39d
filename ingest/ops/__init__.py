"""Ops: what operators see and run: the worker's metrics and HTTP endpoints, ``ingest
status`` / ``segments`` / ``gaps`` (document and text), ``ingest source history`` and ``ingest
gc``.

Invariants: these modules read the metastore (and Kafka's watermarks) directly and never
import the worker's runtime (:mod:`ingest.consume`, :mod:`ingest.publish`): a status, a
history or a gc works from any machine that reaches the metastore, with no worker running.
What may be deleted is decided by the metastore alone, never by listing the store (gc).
The consume layer counts into :class:`ingest.ops.metrics.Metrics`; nothing here reads back.
"""
