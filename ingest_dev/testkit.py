"""What the tests, the chaos run, the demo and the local servers share to wait on threads and
processes they do not control.

The kit:

- :func:`wait_until`: the one bounded wait for something that must happen;
- :func:`free_port` for a port to listen on, :func:`port_open` to see something listen;
- :class:`ingest_dev.ingest_process.IngestProcess`: an ``ingest`` command (a worker, a table
  committer) as a child process, its JSON log in a file.

ingest_dev is not in the wheel; tests may import it, production code never does.
"""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

LOOPBACK = "127.0.0.1"


def wait_until(
    predicate: Callable[[], T],
    timeout: float,
    what: str,
    *,
    interval: float = 0.25,
    detail: Callable[[], str] | None = None,
) -> T:
    """Call ``predicate`` until it returns something true, and return that.

    The predicate runs at least once, and once more at the deadline, so a slow predicate
    cannot make the wait give up without a last look. Its exceptions are not caught: one
    that means "not yet" is the predicate's to swallow, one that means "never" (a process
    exited) ends the wait at once. After ``timeout`` seconds this raises TimeoutError naming
    ``what``, with ``detail()`` (a log's tail, the last error) when given.
    """
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        time.sleep(min(interval, remaining))
    suffix = f": {detail()}" if detail is not None else ""
    raise TimeoutError(f"timed out after {timeout:.1f} s waiting for {what}{suffix}")


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that was free a moment ago (the kernel picks it).

    There is a small race between closing the probe socket and a server binding the port;
    the local servers retry on a fresh port when the bind fails (ingest_dev.process.PortInUse).
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        port: int = sock.getsockname()[1]
        return port


def port_open(port: int, host: str = LOOPBACK) -> bool:
    """Whether something accepts TCP connections on ``host:port`` now."""
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


def java_under(root: int) -> int | None:
    """Pid of the first JVM (a process named ``java``) among ``root``'s descendants: the Spark
    driver a worker launched (pyspark starts it through spark-submit's scripts)."""
    out = subprocess.run(["ps", "-e", "-o", "pid=,ppid=,comm="], capture_output=True, text=True, check=False)
    children: dict[int, list[tuple[int, str]]] = {}
    for line in out.stdout.splitlines():
        parts = line.split(None, 2)
        if len(parts) == 3 and parts[0].isdigit() and parts[1].isdigit():
            children.setdefault(int(parts[1]), []).append((int(parts[0]), parts[2]))
    queue = [root]
    for _ in range(1000):  # bounded: a process table is never that deep
        if not queue:
            break
        pid = queue.pop()
        for child, comm in children.get(pid, []):
            if comm == "java":
                return child
            queue.append(child)
    return None
