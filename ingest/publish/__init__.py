"""Publish: built splits made visible, one serial-guarded metastore transaction each.

The publish queue holds every split in flight with the future its build returns and publishes
them one at a time per partition, in offset order; the publisher is that transaction, with
retries that never publish twice.

Invariants: for each partition, splits are published strictly in the order they were cut,
and a failed or refused split kills every later split of its partition still in flight; a
publish commits only under the split's serial and start offset (the metastore checks both
under row locks), with the kill switch held across it; a split's files are deleted only when
it is certain they were not published. No consumer call happens here: results go back to the
polling thread through ``PublishQueue.poll``. Nothing here builds: this package imports the
build stage's results, never the build stage.
"""
