"""Equal freshness: the highest produce rate each system keeps within a produce-to-visible bound.

``phase`` runs it (``python -m bench.freshness``, or ``python -m bench --freshness``); each system
is a ``followers`` follower on a topic of its own; ``search`` picks the rates probed;
``visibility`` turns each system's units into per-record latencies; ``report`` prints the table.
"""
