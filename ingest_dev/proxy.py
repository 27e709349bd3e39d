"""A loopback TCP proxy for tests and benchmarks: it can hold each chunk the server sends for a
while (round trips made visible), or stop forwarding altogether while keeping every socket
open: a peer that has gone silent without closing anything, as a black-holed network path or
a frozen server looks from the client (no reset, no end of file, its kernel still ACKs)."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from types import TracebackType
from typing import Self

LOOPBACK = "127.0.0.1"


class TcpProxy:
    """Forwards connections to ``LOOPBACK:target_port`` from its own ``port``.

    ``delay_s``: each chunk from the server is held that long. ``pause()``: no byte moves in
    either direction (new connections are still accepted, and wait) until ``resume()``.
    """

    def __init__(self, target_port: int, *, delay_s: float = 0.0) -> None:
        self._target_port = target_port
        self._delay_s = delay_s
        self._flowing = threading.Event()
        self._flowing.set()
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._listener = socket.create_server((LOOPBACK, 0))
        self.port: int = self._listener.getsockname()[1]
        threading.Thread(target=self._accept, name="tcp-proxy-accept", daemon=True).start()

    def pause(self) -> None:
        self._flowing.clear()

    def resume(self) -> None:
        self._flowing.set()

    def close(self) -> None:
        self._closed.set()
        self._flowing.set()  # paused pumps wake up, find their sockets shut and end
        with contextlib.suppress(OSError):
            self._listener.close()
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.close()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):
            while not self._closed.is_set():
                client, _ = self._listener.accept()
                server = socket.create_connection((LOOPBACK, self._target_port))
                with self._lock:
                    self._sockets += [client, server]
                threading.Thread(target=self._pump, args=(client, server, 0.0), daemon=True).start()
                threading.Thread(target=self._pump, args=(server, client, self._delay_s), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, delay_s: float) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                # Paused: the chunk is held and nothing more is read; both sockets stay open.
                self._flowing.wait()
                if self._closed.is_set():
                    return
                if delay_s:
                    time.sleep(delay_s)
                dst.sendall(data)
        for sock in (src, dst):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
