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
import json
import logging
import resource
import socket
import threading
import time
from typing import Any, ClassVar

import h11
import uvicorn
from fastapi import FastAPI
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger(__name__)
# After the drain, what a connection still has unsent is for a client that takes nothing: given
# this long, then the connection is dropped instead of holding the stop until uvicorn's graceful timeout.
STALLED_CLIENT_GRACE_S = 0.5


# Connections at once, and how long one may take to send a request's head (nginx's client_header_timeout
# is 60 s): uvicorn sets neither, so clients that connect and send nothing, or half a head, were kept
# for good. 20,000 of them ran a server out of descriptors (every new client timed out) and, as asyncio
# logs each failed accept, wrote 122 MB of log a minute.
MAX_CONNECTIONS = 4096
HEAD_TIMEOUT_S = 20.0


def serving_config(app: FastAPI, **options: Any) -> uvicorn.Config:
    """uvicorn's config for vivace's servers: the h11 protocol with GuardedH11's limits."""
    return uvicorn.Config(app, http=GuardedH11, **options)


class GuardedH11(H11Protocol):
    """uvicorn's h11 protocol, bounded against clients that hold connections without using them:
    past `max_connections` at once (never more than half the descriptors the process may open) a new
    connection is answered 503 "busy" at once and closed; a connection that has not sent a whole
    request head `head_timeout_s` after it opened, or after its last response, is closed."""

    max_connections: ClassVar[int] = MAX_CONNECTIONS
    head_timeout_s: ClassVar[float] = HEAD_TIMEOUT_S

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > min(self.max_connections, resource.getrlimit(resource.RLIMIT_NOFILE)[0] // 2):
            transport.write(_BUSY)
            transport.close()
            return
        self._wait_for_head()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._wait_for_head()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
        super().connection_lost(exc)

    def _wait_for_head(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
        self._head_timer = self.loop.call_later(self.head_timeout_s, self._head_overdue)

    def _head_overdue(self) -> None:
        self._head_timer = None
        waiting = self.conn.their_state is h11.IDLE and (self.cycle is None or self.cycle.response_complete)
        if waiting and not self.transport.is_closing():  # else a request is in progress: not a head's wait
            self.conn.send(h11.ConnectionClosed())
            self.transport.close()


_BUSY_BODY = json.dumps({"error": {
    "kind": "busy", "type": "server_busy", "code": 503,
    "message": "the server has as many connections open as it takes; retry in a moment"}}).encode()  # fmt: skip
_BUSY = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\n"
    b"connection: close\r\ncontent-length: " + str(len(_BUSY_BODY)).encode() + b"\r\n\r\n" + _BUSY_BODY
)


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
        config = serving_config(app, log_level="warning", backlog=2048, timeout_graceful_shutdown=graceful_s)
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
            # A client still sending a request's body (slowly, or not at all) held the stop to uvicorn's backstop.
            sending = getattr(getattr(connection, "conn", None), "their_state", None) is h11.SEND_BODY
            if transport is not None and (transport.get_write_buffer_size() or sending):
                transport.abort()
