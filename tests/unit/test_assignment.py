"""A partition's lifecycle: the transitions the protocol has, and only those."""

from __future__ import annotations

import pytest

from ingest.consume.assignment import REWIND_BACKOFF, Assignment, IllegalTransition, PartitionState
from ingest_common.model import PartitionClaim, TopicPartition

TP = TopicPartition("t", 0)


def owned_at(offset: int | None = 7) -> Assignment:
    a = Assignment()
    a.add(PartitionClaim(TP, 3, offset, "earliest"))
    return a


def test_a_claimed_partition_is_active_at_the_stored_offset() -> None:
    owned = owned_at(7).get(TP)
    assert owned is not None and owned.active and owned.cutter.position == 7 and owned.cutter.serial == 3
    assert owned.cutter.validated  # no leader epoch stored: nothing to validate


def test_a_claim_with_a_stored_leader_epoch_is_validated_before_its_cuts() -> None:
    a = Assignment()
    owned = a.add(PartitionClaim(TP, 3, 7, "earliest", leader_epoch=4))
    assert owned.cutter.needs_validation() and owned.cutter.validation_asked() == (7, 4)
    owned.repositioned(9, leader_epoch=5)
    assert owned.cutter.needs_validation() and owned.cutter.validation_asked() == (9, 5)


def test_every_way_back_to_active_starts_a_new_cut_generation() -> None:
    owned = owned_at().get(TP)
    assert owned is not None
    epochs = [owned.epoch]
    owned.rewind(now=0.0)
    epochs.append(owned.epoch)
    owned.repositioned(12)
    epochs.append(owned.epoch)
    assert owned.active and owned.cutter.position == 12 and owned.cutter.available() == 0
    assert owned.published_end == 12  # the stored offset it was repositioned to
    assert epochs == sorted(set(epochs))  # strictly increasing: older splits are never acted on


def test_rewinds_back_off_and_a_publish_resets_the_count() -> None:
    owned = owned_at().get(TP)
    assert owned is not None
    delays = [owned.rewind(now=0.0) for _ in range(3)]
    assert delays == [0.5, 1.0, 2.0] and owned.retry_at == REWIND_BACKOFF.delay(2)
    owned.repositioned(7)
    owned.published(20)
    assert owned.failures == 0 and owned.published_end == 20
    assert owned.rewind(now=0.0) == REWIND_BACKOFF.delay(0)


def test_a_fenced_partition_never_becomes_active_again_without_a_new_claim() -> None:
    owned = owned_at().get(TP)
    assert owned is not None
    owned.fence()
    for move in (lambda: owned.repositioned(7), lambda: owned.rewind(now=0.0), lambda: owned.refuse(7)):
        with pytest.raises(IllegalTransition):
            move()
    assert owned.state is PartitionState.FENCED
    owned.reclaimed(PartitionClaim(TP, 5, 30, "earliest"))
    assert owned.active and owned.claim.serial == 5 and owned.cutter.position == 30


def test_a_refused_offset_stops_the_partition_until_the_gap_is_settled() -> None:
    owned = owned_at().get(TP)
    assert owned is not None
    owned.refuse(7)
    assert owned.state is PartitionState.OUT_OF_RANGE and owned.gap_pending and owned.refused_offset == 7
    with pytest.raises(IllegalTransition):
        owned.refuse(7)
    owned.gap_settled()
    assert owned.state is PartitionState.OUT_OF_RANGE and not owned.gap_pending
    with pytest.raises(IllegalTransition):
        owned_at().get(TP).gap_settled()


def test_the_table_looks_partitions_up_and_forgets_removed_ones() -> None:
    a = owned_at()
    assert a.lookup("t", 0) is a.get(TP) and a.lookup("t", 1) is None
    assert [o.tp for o in a.remove([TP, TopicPartition("t", 1)])] == [TP]
    assert len(a) == 0 and a.tps() == []


def test_one_metastore_call_at_a_time_and_only_for_a_rewinding_or_stopped_partition() -> None:
    owned = owned_at().get(TP)
    assert owned is not None
    with pytest.raises(IllegalTransition):
        owned.call_started()  # an active partition has nothing to ask the metastore
    owned.rewind(now=0.0)
    assert not owned.rewind_due(now=0.0) and owned.rewind_due(now=owned.retry_at)
    owned.call_started()
    assert owned.busy and not owned.rewind_due(now=100.0)
    with pytest.raises(IllegalTransition):
        owned.call_started()
    owned.call_ended(retry_at=50.0)  # failed: try again at 50
    assert not owned.rewind_due(now=49.0) and owned.rewind_due(now=50.0)
    owned.repositioned(7)
    owned.refuse(9)
    assert owned.gap_due(now=0.0) and not owned.rewind_due(now=0.0)
    owned.call_started(retry_at=5.0)
    assert owned.retry_at == 5.0 and not owned.gap_due(now=10.0)
    owned.call_ended()
    assert owned.gap_due(now=5.0) and not owned.gap_due(now=4.0)
