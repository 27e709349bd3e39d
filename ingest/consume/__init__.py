"""Consume: the worker's member of the consumer group, driven by one polling thread.

The loop polls Kafka through the one boundary to confluent-kafka, routes records into
per-partition buffers, seals splits and hands them to the pipeline (:mod:`ingest.publish`);
the rebalance callbacks claim partitions (a new serial each) and trip the kill switches of
what is revoked or lost; finished splits come back as outcomes that advance, fence or rewind
their partition.

Invariants: every consumer call and every change to the loop's state happens on the polling
thread (rebalance callbacks run on it too); the metastore is waited for only inside a
rebalance callback, within its deadline: every other call runs on the background thread and
its result is applied by the polling thread; a partition is fetched from its stored
``next_offset`` only (assign, rewind, reset), never from the group's committed offsets.
Nothing outside this package and :mod:`ingest.worker` imports it.
"""
