"""A loopback TCP proxy between clients and one server port, for tests.

Each accepted connection is piped to a new connection to the server. :meth:`TcpProxy.cut`
breaks the client's side only of every connection open at that moment: the client sees its
connection end while the server's side stays open, so the server's session goes on as if
nothing happened (what a lost network path does to PostgreSQL, unlike ending its backend).
Its server sides are closed by :meth:`TcpProxy.close`. :meth:`TcpProxy.pause` stops forwarding
in both directions while every socket stays open (a peer gone silent without closing anything,
as a black-holed path or a frozen server looks to the client: no reset, no end of file, its
kernel still ACKs) until :meth:`TcpProxy.resume`.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from types import TracebackType
from typing import Self

from ingest_dev.testkit import LOOPBACK

CHUNK = 65536


class _Link:
    """One proxied connection: the client's socket and the server's."""

    def __init__(self, client: socket.socket, server: socket.socket) -> None:
        self.client = client
        self.server = server
        self.cut = False

    def close_client(self) -> None:
        _close(self.client)

    def close(self) -> None:
        _close(self.client)
        _close(self.server)


def _close(sock: socket.socket) -> None:
    # shutdown first: it wakes a thread blocked in recv on the socket, close alone does not.
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()


class TcpProxy:
    def __init__(self, target_port: int) -> None:
        self._target_port = target_port
        self._listener = socket.create_server((LOOPBACK, 0))
        self._lock = threading.Lock()
        self._links: list[_Link] = []
        self._closed = False
        self._flowing = threading.Event()
        self._flowing.set()
        threading.Thread(target=self._accept, name="tcp-proxy-accept", daemon=True).start()

    @property
    def port(self) -> int:
        port: int = self._listener.getsockname()[1]
        return port

    def cut(self) -> int:
        """Break the client's side of every connection open now; returns how many. New
        connections are proxied as before."""
        with self._lock:
            links = [link for link in self._links if not link.cut]
            for link in links:
                link.cut = True
        for link in links:
            link.close_client()
        return len(links)

    def pause(self) -> None:
        """Forward nothing (a chunk read is held) until :meth:`resume`; sockets stay open."""
        self._flowing.clear()

    def resume(self) -> None:
        self._flowing.set()

    def close(self) -> None:
        self._flowing.set()  # paused pumps wake up, find their sockets shut and end
        with self._lock:
            self._closed = True
            links, self._links = self._links, []
        _close(self._listener)
        for link in links:
            link.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:  # closed
                return
            try:
                server = socket.create_connection((LOOPBACK, self._target_port))
            except OSError:  # the server is down: the client sees its connection refused
                _close(client)
                continue
            link = _Link(client, server)
            with self._lock:
                if self._closed:
                    link.close()
                    return
                self._links.append(link)
            threading.Thread(target=self._to_server, args=(link,), daemon=True).start()
            threading.Thread(target=self._to_client, args=(link,), daemon=True).start()

    def _to_server(self, link: _Link) -> None:
        with contextlib.suppress(OSError):
            while data := link.client.recv(CHUNK):
                self._flowing.wait()
                link.server.sendall(data)
        if not link.cut:  # the client left: so does the server's side; a cut keeps it open
            link.close()

    def _to_client(self, link: _Link) -> None:
        # After a cut, what the server sends is read and dropped: its side stays open and
        # never blocks on a full buffer.
        with contextlib.suppress(OSError):
            while data := link.server.recv(CHUNK):
                self._flowing.wait()
                if link.cut:
                    continue
                try:
                    link.client.sendall(data)
                except OSError:
                    if not link.cut:
                        raise
        link.close()
