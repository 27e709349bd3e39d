"""A local S3 API for the object-store tests, the chaos run and the benchmark: moto's server
mode (from PyPI) in a process of its own, with a request recorder in front of it."""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, Self

from ingest_dev.process import ManagedProcess
from ingest_dev.testkit import LOOPBACK, free_port

# The checkout's root: the server process imports this module from it.
_ROOT = Path(__file__).resolve().parent.parent


class LocalS3(ManagedProcess):
    """An S3 API server on a free loopback port (moto's server mode, from PyPI), with one
    bucket, for the object-store tests, the chaos run and the benchmark. ``env`` is what a
    process needs to reach it: the usual AWS variables, which pyarrow and (through
    ``ingest.spark.session``) Spark's S3A connector both read; never anything in a spec. The
    server's output goes to ``s3.log`` in a temporary directory removed by :meth:`stop`."""

    kind = "the S3 API server (moto)"
    log_name = "s3.log"
    dir_prefix = "ingest-s3-"
    probe_interval_s = 0.1

    def __init__(self, bucket: str = "ingest", start_timeout: float = 30.0) -> None:
        super().__init__(None)
        self.bucket = bucket
        self._start_timeout = start_timeout
        self.port = 0

    @property
    def endpoint(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    @property
    def env(self) -> dict[str, str]:
        return {
            "AWS_ACCESS_KEY_ID": "ingest-test",
            "AWS_SECRET_ACCESS_KEY": "ingest-test-secret",
            "AWS_REGION": "us-east-1",
            "AWS_ENDPOINT_URL": self.endpoint,
        }

    def uri(self, *parts: str) -> str:
        return "/".join([f"s3a://{self.bucket}", *parts])

    def start(self) -> Self:
        self._run_start(self._launch)
        return self

    def stop(self) -> None:
        self._halt(crash=False, timeout=10.0)
        self._cleanup()

    def record(self, on: bool) -> None:
        """Start (after clearing) or stop the server's request recorder (``requests()`` reads it)."""
        import urllib.request

        action = "start" if on else "stop"
        urllib.request.urlopen(
            urllib.request.Request(f"{self.endpoint}{_RECORDER_PATH}{action}", method="POST"), timeout=10
        ).close()

    def requests(self) -> list[dict[str, Any]]:
        """The requests recorded since ``record(True)``: method, url (path and query), headers."""
        import urllib.request

        with urllib.request.urlopen(f"{self.endpoint}{_RECORDER_PATH}requests", timeout=30) as resp:
            entries: list[dict[str, Any]] = json.loads(resp.read())
        return entries

    # -- ManagedProcess

    def _ready_probe(self) -> Callable[[], bool]:
        def listens() -> bool:
            with socket.create_connection((LOOPBACK, self.port), timeout=0.5):
                return True

        return listens

    def _not_ready(self) -> str:
        return f"listen on port {self.port}"

    # -- internals

    def _launch(self) -> None:
        self.port = free_port()
        path = os.environ.get("PYTHONPATH")
        env = {**os.environ, "PYTHONPATH": f"{_ROOT}{os.pathsep}{path}" if path else str(_ROOT)}
        self._spawn(
            [sys.executable, "-c", f"from ingest_dev.s3 import serve_local_s3; serve_local_s3({self.port})"],
            self._start_timeout,
            env=env,
        )
        try:
            self._create_bucket()
        except BaseException:
            self._halt(crash=True, timeout=0.0)
            raise

    def _create_bucket(self) -> None:
        from pyarrow import fs as pafs

        s3 = pafs.S3FileSystem(
            access_key=self.env["AWS_ACCESS_KEY_ID"],
            secret_key=self.env["AWS_SECRET_ACCESS_KEY"],
            region=self.env["AWS_REGION"],
            endpoint_override=self.endpoint,
            scheme="http",
            allow_bucket_creation=True,
        )
        s3.create_dir(self.bucket)


_RECORDER_PATH = "/_ingest/recorder/"


class _RequestRecorder:
    """WSGI middleware in front of moto: while on, keeps each request's method, path and query,
    and headers (no bodies) in memory under a lock. moto's own recorder writes whole bodies,
    base64-encoded, to a file in its working directory, and concurrent uploads interleave there."""

    def __init__(self, app: Any) -> None:
        self._app = app
        self._on = False
        self._entries: list[dict[str, Any]] = []
        self._lock = threading.Lock()

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Any:
        path = environ.get("PATH_INFO", "")
        if path.startswith(_RECORDER_PATH):
            action = path[len(_RECORDER_PATH) :]
            with self._lock:
                if action == "start":
                    self._entries, self._on = [], True
                elif action == "stop":
                    self._on = False
                body = json.dumps(self._entries if action == "requests" else "ok").encode()
            start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
            return [body]
        if self._on:
            query = environ.get("QUERY_STRING", "")
            headers = {
                key[5:].replace("_", "-").lower(): value for key, value in environ.items() if key.startswith("HTTP_")
            }
            entry = {
                "method": environ.get("REQUEST_METHOD", ""),
                "url": path + ("?" + query if query else ""),
                "headers": headers,
            }
            with self._lock:
                self._entries.append(entry)
        return self._app(environ, start_response)


def serve_local_s3(port: int) -> None:
    """The S3 API server LocalS3 runs (moto's, on 127.0.0.1) with a request recorder."""
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
    from werkzeug.serving import run_simple

    run_simple("127.0.0.1", port, _RequestRecorder(DomainDispatcherApplication(create_backend_app)), threaded=True)
