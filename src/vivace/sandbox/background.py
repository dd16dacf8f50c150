"""Serving an ASGI app with uvicorn: from a daemon thread of the current process (BackgroundServer), and
stopping promptly with the app's help (ClosingServer, which the environment server and `vivace serve` run).

Used where the server shares a process with other work: tests, and the per-node Ray actor.
The listening socket is bound before the thread starts, so `url` is exact even for port 0
and a port in use fails at construction. Not guaranteed: stopping a server whose shutdown
hangs (after `stop`'s timeout the thread is abandoned with a warning; as a daemon thread
it dies with the process), or signal handling (uvicorn installs none outside the main thread).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time
from typing import Any

import uvicorn
from fastapi import FastAPI

log = logging.getLogger(__name__)
# After the drain, what a connection still has unsent is for a client that takes nothing: given
# this long, then the connection is dropped instead of holding the stop until uvicorn's graceful timeout.
STALLED_CLIENT_GRACE_S = 0.5


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


class ClosingServer(uvicorn.Server):
    """uvicorn, stopping as promptly as a container's stop needs. Left to itself, uvicorn waits
    for every request to end (up to `timeout_graceful_shutdown`) before the app's shutdown, so a
    running command held it for as long as the command ran; and when forced to exit (a second
    Ctrl-C, which its "CTRL+C to force quit" invites) it skips the app's shutdown. Here the app
    drains alongside uvicorn's wait (running calls get the app's short grace, then are cancelled
    and answered), and the workspaces are closed, killing their commands, in either case. A stream
    cut short for stalling has its connection dropped, which uvicorn would keep until sent.

    Any app can run under it (the environment server and `vivace serve` do) by setting on `app.state`:
    `drain()` (async: refuse new work, give running work its grace, then end it), `stop_now()` (forced:
    no grace left), `close_all()` (async, idempotent: release what the app holds), and optionally
    `set_drop_connection(drop)`, which is given the function that drops a request's connection."""

    async def startup(self, sockets: Any = None) -> None:
        state = self.config.app.state
        if hasattr(state, "set_drop_connection"):
            state.set_drop_connection(self._drop_connection)
        await super().startup(sockets)

    def _drop_connection(self, scope: dict) -> None:
        # By the scope itself, not its "client": behind a local proxy that is the forwarded address.
        for connection in list(self.server_state.connections):
            if getattr(getattr(connection, "cycle", None), "scope", None) is scope:
                connection.transport.abort()  # frees the descriptor; close() would wait for the buffer to drain

    async def shutdown(self, sockets: Any = None) -> None:
        state = self.config.app.state
        drain = asyncio.ensure_future(state.drain())
        drop = asyncio.ensure_future(self._drop_stalled_clients(drain))
        try:
            await super().shutdown(sockets)  # returns once the drained calls have answered, or forced
        finally:
            drop.cancel()
            state.stop_now()  # forced: no grace left
            await drain
            await state.close_all()  # idempotent: a no-op after a graceful shutdown
            if self.force_exit:  # uvicorn skipped the app's lifespan shutdown: its task would die logging a traceback
                await self.lifespan.shutdown()

    async def _drop_stalled_clients(self, drain: asyncio.Future[None]) -> None:
        """Once the drain is over, connections still holding unsent bytes after STALLED_CLIENT_GRACE_S
        are dropped: their client takes nothing (a read it stopped reading), and uvicorn, which closes a
        connection only after sending what it holds, would wait for it until its graceful timeout."""
        await asyncio.wait({drain})
        await asyncio.sleep(STALLED_CLIENT_GRACE_S)
        for connection in list(self.server_state.connections):
            transport = getattr(connection, "transport", None)
            if transport is not None and transport.get_write_buffer_size():
                transport.abort()
