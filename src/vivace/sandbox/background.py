"""Serving an ASGI app with uvicorn from a daemon thread of the current process.

Used where the server shares a process with other work: tests, and the per-node Ray actor.
The listening socket is bound before the thread starts, so `url` is exact even for port 0
and a port in use fails at construction. Not guaranteed: stopping a server whose shutdown
hangs (after `stop`'s timeout the thread is abandoned with a warning; as a daemon thread
it dies with the process), or signal handling (uvicorn installs none outside the main thread).
"""

from __future__ import annotations

import logging
import socket
import threading
import time

import uvicorn
from fastapi import FastAPI

log = logging.getLogger(__name__)


def http_url(host: str, port: int) -> str:
    """The http URL of `host`:`port`, an IPv6 address in brackets (http://[::1]:8000)."""
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


class BackgroundServer:
    """uvicorn in a daemon thread with its own event loop (tests, the Ray actor).

    The socket is bound here, before the thread starts, so `url` is exact even for port 0.
    """

    def __init__(
        self,
        app: FastAPI,
        host: str = "127.0.0.1",
        port: int = 0,
        server_class: type[uvicorn.Server] = uvicorn.Server,
        graceful_s: float = 30.0,
    ) -> None:
        """`server_class` and `graceful_s` (uvicorn's wait for requests in flight): the environment
        server passes its own ClosingServer and a short wait, as `vivace sandbox serve` runs it."""
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._sock = socket.socket(family, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host, port))
        self.host, self.port = host, self._sock.getsockname()[1]
        config = uvicorn.Config(app, log_level="warning", backlog=2048, timeout_graceful_shutdown=graceful_s)
        self.server = server_class(config)
        self._thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self._sock]}, name="vivace-env-server", daemon=True
        )

    @property
    def url(self) -> str:
        return http_url({"0.0.0.0": "127.0.0.1", "::": "::1"}.get(self.host, self.host), self.port)

    def start(self, timeout: float = 30.0) -> BackgroundServer:
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"environment server on {self.url} did not start")
            time.sleep(0.01)
        return self

    def stop(self, timeout: float = 60.0) -> None:
        """Stop serving; the app's shutdown (closing workspaces) runs before this returns."""
        self.server.should_exit = True
        self._thread.join(timeout)
        self._sock.close()
        if self._thread.is_alive():
            log.warning("environment server on %s did not stop within %.0fs", self.url, timeout)
