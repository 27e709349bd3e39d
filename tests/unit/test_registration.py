import uuid

import pytest

from ingest.builder.registration import Registrar
from ingest.errors import SplitKilled
from ingest_common.backoff import Backoff
from ingest_common.model import BuildRegistration, TopicPartition
from metastore.errors import CommitOutcomeUnknown, MetastoreUnavailable
from tests.fakes import FakeClock, make_split


class FlakyStore:
    def __init__(self, failures: list[Exception]) -> None:
        self.failures = failures
        self.registered: list[BuildRegistration] = []

    def register_build(self, worker: str, build: BuildRegistration) -> None:
        if self.failures:
            raise self.failures.pop(0)
        self.registered.append(build)


def registration(*split_ids: uuid.UUID) -> BuildRegistration:
    return BuildRegistration(uuid.uuid4(), "s", "file:///st", "file:///d", "file:///r", split_ids)


def test_registration_rides_out_an_outage_and_a_lost_reply() -> None:
    store = FlakyStore([MetastoreUnavailable("down"), CommitOutcomeUnknown("lost reply")])
    errors: list[Exception] = []
    clock = FakeClock()
    registrar = Registrar(store, "w", backoff=Backoff(0.01, 0.02, clock=clock), on_store_error=errors.append)
    split = make_split(TopicPartition("t", 0), 0, 10)
    build = registration(split.id)
    registrar.register(build, [split])
    assert store.registered == [build] and len(errors) == 2 and clock.sleeps == [0.01, 0.02]


def test_registration_gives_up_once_every_split_of_the_build_is_killed() -> None:
    store = FlakyStore([MetastoreUnavailable("down")] * 100)
    a, b = make_split(TopicPartition("t", 0), 0, 10), make_split(TopicPartition("t", 1), 0, 10)
    attempts: list[float] = []

    def sleep(delay: float) -> None:
        attempts.append(delay)
        (a if len(attempts) == 1 else b).kill_switch.trip("revoke")

    registrar = Registrar(store, "w", backoff=Backoff(0.01, 0.01, clock=FakeClock(on_sleep=sleep)))
    with pytest.raises(SplitKilled):
        registrar.register(registration(a.id, b.id), [a, b])
    assert store.registered == [] and len(attempts) == 2  # one killed split is not enough to stop
