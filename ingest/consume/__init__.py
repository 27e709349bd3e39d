"""Consume: the worker's member of the consumer group, driven by one polling thread.

The member owns the partitions and reads no record: the rebalance callbacks claim partitions
(a new serial each), position each at its stored offset (validated with its leader epoch) and
trip the kill switches of what is revoked or lost; the loop asks where each owned partition's
log ends, cuts splits from offsets and hands each to the build stage (:mod:`ingest.builder`,
which returns a future) and the publish stage (:mod:`ingest.publish`, which settles it in
order); finished splits come back as outcomes that advance, fence or rewind their partition.

Invariants: every consumer call and every change to the loop's state happens on the polling
thread (rebalance callbacks run on it too); the metastore is waited for only inside a
rebalance callback, within its deadline: every other call runs on the background thread and
its result is applied by the polling thread; a partition is cut from its stored
``next_offset`` only (assign, rewind, reset), never from the group's committed offsets.
Nothing outside this package and :mod:`ingest.worker` imports it.
"""
