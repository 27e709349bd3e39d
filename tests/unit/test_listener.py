"""The LISTEN thread reconnects on the one Backoff vocabulary, on the clock it is given."""

from __future__ import annotations

from structlog.testing import capture_logs

from ingest_dev.testkit import free_port, wait_until
from metastore.listener import RECONNECT_BACKOFF, ControlListener
from tests.fakes import FakeClock


def test_a_lost_listen_connection_is_retried_on_the_reconnect_schedule() -> None:
    clock = FakeClock()
    # Nothing listens on the port: every connect is refused at once.
    url = f"postgresql://ingest@127.0.0.1:{free_port()}/ingest"
    listener = ControlListener(url, "src", backoff=RECONNECT_BACKOFF.on(clock))
    with capture_logs() as logs:
        listener.start()
        try:
            wait_until(
                lambda: sum(1 for e in logs if e["event"] == "control_listen_failed") >= 7,
                10,
                "seven failed connects",
            )
        finally:
            listener.close()
    delays = [e["retry_in_s"] for e in logs if e["event"] == "control_listen_failed"][:7]
    assert delays == [0.5, 1.0, 2.0, 5.0, 10.0, 10.0, 10.0]
    # Waited on the injected clock (no real sleep): the fake time moved by the delays.
    assert sum(clock.sleeps) >= sum(delays[:6])
    assert not listener.changed.is_set()  # never connected
