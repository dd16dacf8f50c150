"""The environment server: workspace pools of one machine exposed over HTTP (FastAPI).

`create_app` serves one backend: a `WorkspacePool` per snapshot key, made on first use from
the request's source (paths name files on the *server's* machine), and the workspace API
under /v1. Every route except GET /v1/health needs `Authorization: Bearer <token>`; errors
come back as {"error": {"kind", "message"}} with the stable `kind` of base.py's errors (an
OSError as kind "os_error" with its "errno"), so `client.py` re-raises the same exception
classes as the in-process backend. File names that are not UTF-8 travel as the in-process
API spells them (surrogate escapes): percent-encoded bytes in the `path` query, \\udcXX
escapes in JSON.

Guarantees: a request without the right token is refused before any handler runs; closing
is idempotent; a client that hangs up during an exec or a create cancels it, as cancelling
the call in-process would (the command is killed; a create waiting for a pool slot leaves
the queue; a workspace made for nobody is closed); a request body over its limit (file
uploads: MAX_UPLOAD_BYTES, JSON: MAX_JSON_BYTES) is refused with 413 "too_large" without
being held in memory past the limit; a command's timeout over `server.max_exec_timeout_s` (an hour
by default, never below the backend's default timeout) is refused with 400
"invalid_argument" naming the limit, so no token holder keeps a workspace and its pool slot
longer; a file is read from a descriptor opened safely inside the workspace
(`ConfinedFS.open_regular`) and sent READ_CHUNK_BYTES at a time, never held whole (a file over the
in-process read limit, 64 MiB, is refused as in-process); at most `server.max_file_streams` files
stream at once (one more is refused with 503 "busy" and Retry-After), and a stream whose client
takes nothing for `server.file_stream_stall_s` is cut short and its file closed, so a reader that
stops reading without hanging up holds a file for that long at most. A client hanging up is
normal: its stream ends with a debug line, not an ERROR. Under `ClosingServer` (`serve`),
SIGTERM or Ctrl-C stops new work, gives running creates and execs SHUTDOWN_GRACE_S to finish,
then cancels them (commands killed, clients answered 503 "shutting_down"), cuts file streams
short, drops connections whose client takes nothing, and closes every workspace the server
handed out, within a few seconds (inside Docker's and Kubernetes' 10 s stop grace); also when
forced (a second Ctrl-C). Not guaranteed: TLS (bind to loopback, or put it behind a proxy),
isolation between token holders (a token holder may snapshot any path the server can read and
use every workspace), under plain uvicorn: closing the connection of a stream cut short for
stalling (uvicorn closes it only once its buffered bytes are sent: the socket stays, as any slow
client's does; ClosingServer drops it) and a prompt stop (uvicorn waits for running commands;
`serve` and the Ray actor's servers run ClosingServer), and a prompt end of workspaces whose client
vanished without closing them: they hold a pool slot until no request has touched them for
`server.workspace_idle_s` (30 minutes by default; a running command or a streaming read counts as one),
when they are closed and a late request for one is told so (410 "closed").
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import hmac
import json
import logging
import os
import secrets
import socket
import sys
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import parse_qsl

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect

from vivace.aio import cancel_and_wait
from vivace.body_limit import BodyLimit, BodyTooLarge
from vivace.config import PoolConfig, ServerConfig, VivaceConfig
from vivace.sandbox.background import ClosingServer, http_url, serving_config
from vivace.sandbox.base import SandboxError, Unauthorized, UnknownWorkspace, WorkspaceClosedError
from vivace.sandbox.local import LocalBackend, LocalWorkspace
from vivace.sandbox.paths import OpenFile
from vivace.sandbox.pool import WorkspacePool, open_backend
from vivace.sandbox.snapshot import Snapshot, SnapshotSource

log = logging.getLogger(__name__)

MAX_UPLOAD_BYTES = 64 << 20  # a file upload (PUT) beyond this is refused (413) instead of filling memory
# Every other body is JSON: a source path, or a command and its environment, which the kernel
# caps at ARG_MAX (2 MiB by default) and JSON's \u escapes inflate at most six-fold.
MAX_JSON_BYTES = 16 << 20
# How long running creates and execs may still finish once the server is told to stop: enough
# for a command about to end, and far inside a container's 10 s stop grace (after which the
# server would be SIGKILLed, leaving mounts, cgroups and workspace state behind).
SHUTDOWN_GRACE_S = 1.0
# uvicorn's own wait for requests in flight, a backstop only under ClosingServer: the drain answers running
# creates and execs after SHUTDOWN_GRACE_S; what still runs after this (a file operation) is cancelled.
GRACEFUL_BACKSTOP_S = SHUTDOWN_GRACE_S + 4
# The longest command a client may ask for (`server.max_exec_timeout_s`): a test suite or a build
# may take many minutes; more only keeps a workspace (and its pool slot) from everybody else.
MAX_EXEC_TIMEOUT_S: float = ServerConfig.model_fields["max_exec_timeout_s"].default
# A file read is sent this much at a time: what one read holds in memory, whatever the file's size.
READ_CHUNK_BYTES = 256 << 10
# A reader that stops reading without hanging up would hold its file open for as long as it likes
# (measured: 20 such readers, 20 descriptors still open 10 s later). As a production server bounds
# slow clients, both: a stream whose client takes nothing for `server.file_stream_stall_s` is
# abandoned (nginx's send_timeout, 60 s), and at most `server.max_file_streams` stream at once, so
# that readers opened faster than the stall frees them cannot run the server out of descriptors.
MAX_FILE_STREAMS: int = ServerConfig.model_fields["max_file_streams"].default
FILE_STREAM_STALL_S: float = ServerConfig.model_fields["file_stream_stall_s"].default
# A diff is built, escaped and sent whole: past this it is refused (413), as one over a few hundred MB
# took the server's memory to gigabytes and held every other request up while it was escaped.
MAX_DIFF_CHARS: int = ServerConfig.model_fields["max_diff_chars"].default
# A workspace handed out and untouched this long is closed (`server.workspace_idle_s`): a client that was
# killed holds its workspaces, and their pool slots, until then rather than until the server stops.
WORKSPACE_IDLE_S: float = ServerConfig.model_fields["workspace_idle_s"].default
HEALTH_PATH = "/v1/health"
STATUS_BY_KIND = {"path_escape": 403, "symlink_loop": 403, "not_found": 404, "unknown_workspace": 404, "wrong_type": 409, "closed": 410,
                  "unauthorized": 401, "backend_unavailable": 503, "shutting_down": 503, "busy": 503, "too_large": 413}  # fmt: skip
RETRY_AFTER_BY_KIND = {"busy": "1"}  # seconds; a file stream of a client that reads lasts well under that


class ShuttingDown(SandboxError):
    """The server is stopping: a new create or exec is refused, a running one cancelled."""

    kind = "shutting_down"


class Busy(SandboxError):
    """The server is at a limit of work at once (`server.max_file_streams`): retry in a moment. Raised
    only before any work is done, so that a client may repeat any request refused so (client.py does)."""

    kind = "busy"


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SourceBody(_Body):
    path: str = Field(min_length=1, description="Directory, tarball or git repository on the server's machine.")
    kind: Literal["dir", "tar", "git"] | None = None
    commit: str | None = None
    enclosing_ignore_rules: bool = False  # see SnapshotSource


class CreateBody(_Body):
    source: SourceBody


class ExecBody(_Body):
    cmd: str | list[str]
    timeout: float | None = Field(None, gt=0, allow_inf_nan=False)
    env: dict[str, str] | None = None


class AsciiJSON(JSONResponse):
    """JSON with every non-ASCII character escaped: a file name that is not UTF-8 (a str with
    surrogate escapes, as the in-process API gives it) cannot be encoded as UTF-8, but its
    \\udcXX escape is valid JSON, and Python's json reads it back to the same str."""

    def render(self, content: Any) -> bytes:
        return ascii_json(content)


def ascii_json(content: Any) -> bytes:
    """AsciiJSON's body for `content`."""
    return json.dumps(content, ensure_ascii=True, allow_nan=False, separators=(",", ":")).encode("ascii")


def error_response(
    status: int, kind: str, message: str, headers: dict[str, str] | None = None, **extra: Any
) -> AsciiJSON:
    return AsciiJSON({"error": {"kind": kind, "message": message, **extra}}, status_code=status, headers=headers)


def query_path(request: Request, path: str = ".") -> str:
    """The `path` query parameter with bytes that are not UTF-8 kept as surrogate escapes (how the
    in-process API names such files); FastAPI's own parsing would replace them with U+FFFD."""
    query = request.scope["query_string"].decode("latin-1")  # latin-1: one char per byte, reversible
    for key, value in parse_qsl(query, keep_blank_values=True, encoding="latin-1"):
        if key == "path":
            return value.encode("latin-1").decode("utf-8", "surrogateescape")
    return path


def required_query_path(request: Request, path: str) -> str:  # `path: str`: missing is a 422
    return query_path(request, path)


async def _hangup(receive: Callable[[], Awaitable[dict[str, Any]]]) -> None:
    """Returns once the client has closed the connection (call it after the body is read)."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def unless_cut_short(
    request: Request, work: Awaitable[Any], reg: Registry
) -> tuple[asyncio.Future[Any], Literal["hung_up", "shutting_down"] | None]:
    """Run `work` until it ends, the client hangs up, or the server's shutdown grace is over
    (`reg.stop_now`); in the last two cases it is cancelled, as the in-process call would be (a
    running command is killed). The finished task, and what cut it short (None: nothing)."""
    task = asyncio.ensure_future(work)
    reg.running.add(task)
    task.add_done_callback(reg.running.discard)
    hangup = asyncio.ensure_future(_hangup(request.receive))
    stop = asyncio.ensure_future(reg.stop_now.wait())
    cut_short: Literal["hung_up", "shutting_down"] | None = None
    try:
        await asyncio.wait({task, hangup, stop}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not task.done():  # the client left, the grace is over, or this handler was cancelled
            cut_short = "hung_up" if hangup.done() else "shutting_down"
            task.cancel()
        hangup.cancel()
        stop.cancel()
    await asyncio.wait({task})  # let the cancelled call clean up (kill the command) first
    if not task.cancelled():
        task.exception()  # retrieved here: when the client has left, nobody else looks at it
    return task, cut_short


def hung_up_response() -> Response:
    # Nobody reads it: uvicorn drops a response for a closed connection. 499 as nginx logs it.
    return error_response(499, "client_closed", "the client closed the connection; the call was cancelled")


# Set, in its request's own context, by a FileStream that leaves its body incomplete on purpose and has
# logged why: uvicorn then adds an ERROR ("ASGI callable returned without completing response."), which
# reads as a bug in the server. `QUIET_CUT_SHORT` (a filter on uvicorn's logger) drops that record then.
_cut_short_on_purpose: contextvars.ContextVar[bool] = contextvars.ContextVar("vivace_cut_short", default=False)


class _QuietCutShort(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        incomplete = str(record.msg).startswith("ASGI callable returned without completing response")
        return not (incomplete and _cut_short_on_purpose.get())


QUIET_CUT_SHORT = _QuietCutShort()


class FileStream(Response):
    """A workspace file sent from its open descriptor READ_CHUNK_BYTES at a time (chunked transfer
    encoding): a read holds one chunk in memory, not the file. It sends the file's bytes up to its
    size when opened (told in X-File-Size, so that a client can size its buffer), or to its end if
    it was truncated meanwhile (what a read in-process would see). It stops when the client hangs
    up, and cuts the body short (the client sees an incomplete response, not a shorter file) when
    the workspace is closed, when the server's shutdown grace is over (`reg.stop_now`), or when the
    client took nothing for `stall_s` (it stopped reading without hanging up). The descriptor is
    closed however the response ends, never under a read still running in a thread. Counted in
    `reg.file_streams` from when it is made to when it ends; `what` names it in the log."""

    media_type = "application/octet-stream"

    def __init__(
        self, ws_id: str, ws: LocalWorkspace, opened: OpenFile, reg: Registry, stall_s: float, what: str
    ) -> None:
        self.ws_id, self.ws, self.opened, self.reg, self.stall_s, self.what = ws_id, ws, opened, reg, stall_s, what
        self.status_code = 200
        self.background = None
        self.init_headers({"x-file-size": str(opened.size)})  # no Content-Length: sent chunked
        reg.file_streams += 1

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        fd, size = self.opened.fd, self.opened.size
        hangup = asyncio.ensure_future(_hangup(receive))
        stopping = asyncio.ensure_future(self.reg.stop_now.wait())
        reading: asyncio.Future[bytes] | None = None
        start = {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
        with self.reg.using(self.ws_id):  # a file streaming keeps its workspace from being closed as idle
            try:
                ended = await self._send(send, start, hangup, stopping)  # None, or why it ends before the file's end
                chunk, offset = self.opened.head, 0
                while chunk and not ended:
                    offset += len(chunk)
                    body = {"type": "http.response.body", "body": chunk, "more_body": True}
                    ended = await self._send(send, body, hangup, stopping)
                    if ended or offset >= size:
                        break
                    ended = "hung_up" if hangup.done() else "closed" if self.ws.closed else None
                    if not ended:
                        n = min(READ_CHUNK_BYTES, size - offset)
                        reading = asyncio.get_running_loop().run_in_executor(None, os.pread, fd, n, offset)
                        chunk = await asyncio.shield(reading)  # b"": truncated since it was opened
                if not ended:
                    ended = await self._send(send, {"type": "http.response.body", "body": b""}, hangup, stopping)
            finally:
                hangup.cancel()
                stopping.cancel()
                self.reg.file_streams -= 1
                if reading is None or reading.done():
                    os.close(fd)
                else:  # cancelled (the server stopping) during a read: close once the thread is done with it
                    reading.add_done_callback(lambda _: os.close(fd))
        if ended == "stalled":  # uvicorn would hold the connection until its client takes what is buffered
            self.reg.drop_connection(scope)
        self._say_why(ended)

    async def _send(
        self, send: Any, message: dict[str, Any], hangup: asyncio.Future[None], stopping: asyncio.Future[Any]
    ) -> str | None:
        """Hands `message` to the connection, which waits while the client lags behind (uvicorn's flow
        control: one chunk in memory). None once it is taken; else why the stream ends instead."""
        sending = asyncio.ensure_future(send(message))
        try:
            done, _ = await asyncio.wait(
                {sending, hangup, stopping}, timeout=self.stall_s, return_when=asyncio.FIRST_COMPLETED
            )
        except BaseException:
            sending.cancel()
            raise
        if sending in done:
            if isinstance(sending.exception(), OSError):  # how a server following ASGI 2.4 says the client left
                return "hung_up"
            sending.result()
            return None
        sending.cancel()  # still waiting for the client to take earlier chunks: nothing of this one written
        return "hung_up" if hangup.done() else "stopping" if stopping.done() else "stalled"

    def _say_why(self, ended: str | None) -> None:
        if ended == "hung_up":  # a client may stop reading whenever it likes: not the server's problem
            log.debug("%s ended early: the client hung up", self.what)
            return
        if ended is None:
            return
        _cut_short_on_purpose.set(True)
        if ended == "stalled":
            log.warning("%s cut short: its client took nothing for %g s (server.file_stream_stall_s)",
                        self.what, self.stall_s)  # fmt: skip
        else:
            why = "the workspace was closed" if ended == "closed" else "the server is stopping"
            log.info("%s cut short: %s", self.what, why)


class TokenGate:
    """Pure ASGI middleware: refuses every HTTP request but the health check without the token.

    It runs before routing and body parsing, so a refused request never reaches a handler.
    """

    def __init__(self, app: Any, token: str) -> None:
        self.app = app
        self.token = token.encode()

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] != HEALTH_PATH and not self._allowed(scope):
            await error_response(
                401, Unauthorized.kind, "missing or wrong bearer token", {"WWW-Authenticate": "Bearer"}
            )(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _allowed(self, scope: dict) -> bool:
        for name, value in scope["headers"]:
            if name == b"authorization":
                scheme, _, credentials = value.partition(b" ")
                # Constant-time comparison: response timing must not reveal a token prefix.
                return scheme.lower() == b"bearer" and hmac.compare_digest(credentials.strip(), self.token)
        return False


IDLE_POOLS_KEPT = 8  # pools with no workspace out kept ready (warm workspaces and all) for their source


@dataclass
class _Flight:
    """One snapshot being made for the creates that asked for it at once."""

    fut: asyncio.Future[Snapshot]
    waiters: int = 0
    released: bool = False  # its claim given back


class Registry:
    """Pools and live workspaces of one app; only touched from the server's event loop."""

    def __init__(self, backend: LocalBackend, pool_config: PoolConfig, idle_s: float = 0.0) -> None:
        self.backend = backend
        self.pool_config = pool_config
        # Workspaces handed out and untouched for idle_s are closed (0: never), see `reap_idle`.
        self.idle_s = idle_s
        self.last_used: dict[str, float] = {}  # by workspace id: the loop's time its last request started or ended
        self.in_use: dict[str, int] = {}  # by workspace id: commands running and files streaming
        self._reaper: asyncio.Task[None] | None = None
        # Pools by (snapshot, source), least recently used first. A pool with no workspace out and no
        # create under way is idle; past IDLE_POOLS_KEPT idle ones the oldest goes, with its warm
        # workspaces and its claim on the snapshot, so that a server fed many repositories does not keep
        # every snapshot it ever made from the cache's eviction.
        self.pools: OrderedDict[tuple[str, SnapshotSource], WorkspacePool] = OrderedDict()
        self._users: dict[tuple[str, SnapshotSource], int] = {}  # per pool: workspaces out and creates under way
        self.workspaces: dict[str, LocalWorkspace] = {}
        self._pool_of: dict[str, tuple[str, SnapshotSource]] = {}
        # pool.max_live for the whole server: each pool caps only its own source, and a client could
        # make a pool per spelling of one path ("repo/", "./repo", kind "dir") and pass any cap.
        self.live = asyncio.Semaphore(pool_config.max_live)
        self.waiting = 0  # creates waiting for a slot
        # Closed ids are remembered (bounded) with why, so a late request says "closed", not "unknown".
        self.recently_closed: OrderedDict[str, str] = OrderedDict()
        self._inflight: dict[SnapshotSource, _Flight] = {}
        self.stopping = False  # set by `drain`: new creates and execs are refused
        self.stop_now = asyncio.Event()  # set once the grace is over: running ones are cancelled
        self.running: set[asyncio.Future[Any]] = set()  # creates and execs in progress
        self.file_streams = 0  # FileStreams made and not yet ended
        # Drops the connection of a request (its scope) at once, unsent bytes and all; set by ClosingServer.
        self.drop_connection: Callable[[dict], None] = lambda scope: None

    def check_accepting(self) -> None:
        if self.stopping:
            raise ShuttingDown("the environment server is shutting down and takes no new work")

    async def drain(self, grace_s: float) -> None:
        """Refuse new work; give running creates and execs `grace_s` to finish, then cancel the
        rest (commands killed; their clients get 503 "shutting_down")."""
        self.stopping = True
        if self.running:
            await asyncio.wait(set(self.running), timeout=grace_s)
        self.stop_now.set()

    async def snapshot(self, source: SnapshotSource) -> Snapshot:
        """The snapshot of `source`, claimed for the caller, who releases it (`backend.release`)."""
        # Single flight: a burst of creates for one source hashes and copies the tree once. The flight's
        # one claim is shared: each waiter takes its own, and the last to leave gives the flight's back.
        flight = self._inflight.get(source)
        if flight is None:
            flight = self._inflight[source] = _Flight(asyncio.ensure_future(self._materialize(source)))
            flight.fut.add_done_callback(lambda f: self._settled(source, flight))
        flight.waiters += 1
        try:
            snapshot = await asyncio.shield(flight.fut)  # a client hanging up must not cancel the others' wait
            self.backend.hold(snapshot)
            return snapshot
        finally:
            flight.waiters -= 1
            self._give_back(flight)

    def _settled(self, source: SnapshotSource, flight: _Flight) -> None:
        if self._inflight.get(source) is flight:
            del self._inflight[source]
        if not flight.fut.cancelled():
            flight.fut.exception()  # retrieved: no "never retrieved" noise when every waiter left
        self._give_back(flight)  # every waiter may have left (hung up) before it was done

    def _give_back(self, flight: _Flight) -> None:
        """Release the flight's own claim once it is done and its last waiter has taken its own."""
        fut = flight.fut
        if flight.waiters or flight.released or not fut.done() or fut.cancelled() or fut.exception():
            return
        flight.released = True
        self.backend.release(fut.result())

    async def _materialize(self, source: SnapshotSource) -> Snapshot:
        return await asyncio.to_thread(self.backend.snapshot, source)  # hashing a tree blocks

    async def create(self, source: SnapshotSource) -> str:
        snapshot = await self.snapshot(source)
        try:
            self.waiting += 1
            try:
                await self.live.acquire()  # waits while max_live workspaces are alive; close releases it
            finally:
                self.waiting -= 1
            # By source too: a workspace's diff may read it (`enclosing_ignore_rules`), and two sources of
            # the same content share the snapshot, not what it was asked for as.
            key = (snapshot.key, source)
            pool = self.pools.get(key)
            if pool is None:
                pool = self.pools[key] = WorkspacePool(self.backend, snapshot, self.pool_config)
                self.backend.hold(snapshot)  # the pool's, for its warm workspaces; released when it goes
            self.pools.move_to_end(key)
            self._users[key] = self._users.get(key, 0) + 1
            try:
                ws = await pool.acquire()
            except BaseException:
                self.live.release()
                await self._left(key)
                raise
        finally:
            self.backend.release(snapshot)  # the workspace, if made, holds its own
        # Backend ids restart with every process; the random suffix keeps a stale client
        # from reaching a newer server's workspace of the same number.
        ws_id = f"{ws.id}-{secrets.token_hex(4)}"
        self.workspaces[ws_id] = ws
        self._pool_of[ws_id] = key
        self.last_used[ws_id] = asyncio.get_running_loop().time()
        if self.idle_s and self._reaper is None:
            self._reaper = asyncio.create_task(self.reap_idle())
        return ws_id

    async def reap_idle(self) -> None:
        """Close, every little while, the workspaces no request has touched for `idle_s` and none is
        using (a command running, a file streaming): their client crashed without closing them, or
        gave up on a create the server completed anyway, and nobody else knows their ids."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(min(max(self.idle_s / 10, 0.05), 30.0))  # closed within idle_s + this
            closed = []
            for ws_id in list(self.last_used):
                # Checked at each: a request may have come for it while an earlier one was being closed.
                last = self.last_used.get(ws_id)
                if last is None or self.in_use.get(ws_id) or loop.time() - last < self.idle_s:
                    continue
                why = (f"workspace {ws_id} was closed by the environment server after {self.idle_s:g} s without "
                       "a request (server.workspace_idle_s): make a new one")  # fmt: skip
                try:
                    await self.close(ws_id, why)
                    closed.append(ws_id)
                except Exception:  # a close that failed must not end the reaping of the rest
                    log.exception("closing idle workspace %s failed", ws_id)
            if closed:  # a client that vanished without closing them: worth the operator's notice, once
                log.warning("closed %d workspace(s) untouched for %g s (server.workspace_idle_s): %s",
                            len(closed), self.idle_s, ", ".join(closed))  # fmt: skip

    @contextlib.contextmanager
    def using(self, ws_id: str) -> Iterator[None]:
        """Marks workspace `ws_id` in use for the block (a command, a streamed read): not idle."""
        self.in_use[ws_id] = self.in_use.get(ws_id, 0) + 1
        try:
            yield
        finally:
            self.in_use[ws_id] -= 1
            if not self.in_use[ws_id]:
                del self.in_use[ws_id]
            if ws_id in self.last_used:
                self.last_used[ws_id] = asyncio.get_running_loop().time()

    async def _left(self, key: tuple[str, SnapshotSource]) -> None:
        """One user of pool `key` is gone: close the least recently used idle pools past the few kept."""
        self._users[key] -= 1
        if self._users[key]:
            return
        del self._users[key]
        idle = [k for k in self.pools if k not in self._users]
        for k in idle[: max(0, len(idle) - IDLE_POOLS_KEPT)]:
            pool = self.pools.pop(k)
            try:
                await pool.close()
            finally:
                self.backend.release(pool.snapshot)

    def get(self, ws_id: str) -> LocalWorkspace:
        """Workspace `ws_id`, touched: a request for it has started."""
        ws = self.workspaces.get(ws_id)
        if ws is not None:
            self.last_used[ws_id] = asyncio.get_running_loop().time()
            return ws
        if ws_id in self.recently_closed:
            raise WorkspaceClosedError(self.recently_closed[ws_id])
        raise UnknownWorkspace(f"no workspace {ws_id!r} on this server")

    async def close(self, ws_id: str, why: str | None = None) -> None:
        """Close workspace `ws_id`; a later request for it is told `why` (default: it is closed)."""
        ws = self.workspaces.pop(ws_id, None)
        if ws is None:
            return  # idempotent: already closed (or never existed)
        self.last_used.pop(ws_id, None)
        self.recently_closed[ws_id] = why or f"workspace {ws_id} is closed"
        while len(self.recently_closed) > 10_000:
            self.recently_closed.popitem(last=False)
        try:
            await ws.close()
        finally:
            self.live.release()
            await self._left(self._pool_of.pop(ws_id))

    async def aclose(self) -> None:
        if self._reaper is not None:
            await cancel_and_wait([self._reaper])
            self._reaper = None
        await asyncio.gather(*(self.close(i) for i in list(self.workspaces)), return_exceptions=True)
        while self.pools:
            _, pool = self.pools.popitem()
            try:
                await pool.close()
            finally:
                self.backend.release(pool.snapshot)

    def metrics(self) -> dict[str, Any]:
        return {
            "backend": self.backend.describe(),
            "live": len(self.workspaces),
            "max_live": self.pool_config.max_live,
            "waiting": self.waiting,
            "file_streams": self.file_streams,
            "pools": [pool.metrics() for pool in self.pools.values()],
        }


def create_app(
    backend: LocalBackend,
    pool_config: PoolConfig,
    token: str,
    *,
    own_backend: bool = False,
    max_json_bytes: int = MAX_JSON_BYTES,
    max_upload_bytes: int = MAX_UPLOAD_BYTES,
    shutdown_grace_s: float = SHUTDOWN_GRACE_S,
    max_exec_timeout_s: float = MAX_EXEC_TIMEOUT_S,
    max_file_streams: int = MAX_FILE_STREAMS,
    file_stream_stall_s: float = FILE_STREAM_STALL_S,
    max_diff_chars: int = MAX_DIFF_CHARS,
    workspace_idle_s: float = WORKSPACE_IDLE_S,
) -> FastAPI:
    """The HTTP app over `backend`; with `own_backend` its shutdown also closes the backend.
    `ClosingServer` calls `app.state.drain()` when told to stop (see `Registry.drain`). An exec
    asking for a timeout over `max_exec_timeout_s` (raised to the backend's default timeout if
    lower) is refused; a file read that would stream while `max_file_streams` do is refused (503
    "busy"); a stream whose client takes nothing for `file_stream_stall_s` is cut short."""
    if not token:
        raise ValueError("the environment server needs a non-empty token")
    max_timeout_s = max(max_exec_timeout_s, backend.config.timeout_s)
    reg = Registry(backend, pool_config, workspace_idle_s)
    logging.getLogger("uvicorn.error").addFilter(QUIET_CUT_SHORT)  # once: the same filter is not added twice

    async def close_all() -> None:  # idempotent: ClosingServer calls it again after the lifespan's shutdown
        await reg.aclose()
        if own_backend:
            await backend.aclose()

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        await close_all()

    # No /docs or /openapi.json: they would be unauthenticated surface for no benefit here.
    app = FastAPI(
        title="vivace environment server",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
        default_response_class=AsciiJSON,
    )
    # Added last, so it runs first: a refused request is a 401 whatever its size.
    app.add_middleware(BodyLimit, max_bytes=max_json_bytes, max_upload_bytes=max_upload_bytes,
                       too_large=lambda message: error_response(413, "too_large", message),
                       what="the environment server")  # fmt: skip
    app.add_middleware(TokenGate, token=token)
    app.state.registry = reg
    # ClosingServer's hooks (see its docstring)
    app.state.close_all = close_all
    app.state.drain = lambda: reg.drain(shutdown_grace_s)
    app.state.stop_now = reg.stop_now.set
    app.state.set_drop_connection = lambda drop: setattr(reg, "drop_connection", drop)

    @app.exception_handler(SandboxError)
    async def _sandbox_error(_: Request, e: SandboxError) -> JSONResponse:
        retry_after = RETRY_AFTER_BY_KIND.get(e.kind)
        headers = {"Retry-After": retry_after} if retry_after else None
        return error_response(STATUS_BY_KIND.get(e.kind, 400), e.kind, str(e), headers)

    @app.exception_handler(OSError)  # a name too long, a full workspace disk, an argv over the kernel's limit
    async def _os_error(_: Request, e: OSError) -> JSONResponse:
        message = f"{e.strerror}: {e.filename!r}" if e.strerror and e.filename else e.strerror or str(e)
        return error_response(400, "os_error", message, errno=e.errno)

    @app.exception_handler(HTTPException)  # no such route or method: a client of another version
    async def _http_error(request: Request, e: HTTPException) -> JSONResponse:
        if isinstance(e, BodyTooLarge):
            return error_response(413, "too_large", e.detail)
        message = f"{request.method} {request.url.path}: {e.detail}"
        return error_response(e.status_code, "unknown_route" if e.status_code in (404, 405) else "http_error", message)

    @app.exception_handler(ClientDisconnect)  # the client hung up (or the stop dropped it) mid-body: nothing done
    async def _hung_up(_: Request, e: ClientDisconnect) -> Response:
        return hung_up_response()

    @app.exception_handler(ValueError)  # what the backend raises for a bad argument (env name, empty argv)
    async def _value_error(_: Request, e: ValueError) -> JSONResponse:
        return error_response(400, "invalid_argument", str(e))

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, e: RequestValidationError) -> JSONResponse:
        return error_response(422, "invalid_request", str(e.errors()))

    @app.get(HEALTH_PATH)
    async def health() -> dict[str, Any]:
        return {"ok": True, "backend": backend.name, "isolated": backend.isolated}

    @app.get("/v1/metrics")
    async def metrics() -> dict[str, Any]:
        return reg.metrics()

    @app.post("/v1/workspaces")
    async def create(body: CreateBody, request: Request) -> Any:
        reg.check_accepting()
        task, cut_short = await unless_cut_short(request, reg.create(SnapshotSource(**body.source.model_dump())), reg)
        if cut_short:
            if not task.cancelled() and task.exception() is None:
                await reg.close(task.result())  # made as the call was cut short: nobody knows its id
            if cut_short == "shutting_down":
                raise ShuttingDown("the environment server is shutting down: the workspace was not created")
            return hung_up_response()
        info = {"backend": backend.name, "isolated": backend.isolated, "timeout_s": backend.config.timeout_s,
                "max_timeout_s": max_timeout_s}  # fmt: skip
        return {"id": task.result(), **info}

    @app.post("/v1/workspaces/{ws_id}/exec")
    async def exec_(ws_id: str, body: ExecBody, request: Request) -> Any:
        reg.check_accepting()
        if body.timeout is not None and body.timeout > max_timeout_s:
            raise ValueError(
                f"timeout {body.timeout:g} s is over this environment server's limit of {max_timeout_s:g} s per command"
            )
        with reg.using(ws_id):
            task, cut_short = await unless_cut_short(
                request, reg.get(ws_id).exec(body.cmd, timeout=body.timeout, env=body.env), reg
            )
        if cut_short == "shutting_down":
            raise ShuttingDown("the environment server is shutting down: the command was killed")
        return hung_up_response() if cut_short else task.result().to_dict()

    @app.get("/v1/workspaces/{ws_id}/file")
    async def read(ws_id: str, path: str = Depends(required_query_path)) -> Response:
        ws = reg.get(ws_id)
        opened = await ws.open_read(path, head_bytes=READ_CHUNK_BYTES)
        streamed = len(opened.head) < opened.size
        if streamed and reg.file_streams < max_file_streams:
            return FileStream(ws_id, ws, opened, reg, file_stream_stall_s, f"a read of {path!r} from workspace {ws_id}")
        os.close(opened.fd)  # read whole with the open (one trip to a thread for most files), or refused
        if streamed:
            raise Busy(
                f"{reg.file_streams} file reads are streaming from this environment server, its limit "
                "(server.max_file_streams): retry in a moment, or raise the limit if this is the normal load"
            )
        return Response(content=opened.head, media_type="application/octet-stream")

    @app.put("/v1/workspaces/{ws_id}/file", status_code=204)
    async def write(ws_id: str, request: Request, path: str = Depends(required_query_path)) -> Response:
        with reg.using(ws_id):
            ws = reg.get(ws_id)
            await ws.write_bytes(path, await request.body())  # within max_upload_bytes: BodyLimit
        return Response(status_code=204)

    @app.delete("/v1/workspaces/{ws_id}/file", status_code=204)
    async def remove(ws_id: str, path: str = Depends(required_query_path), recursive: bool = False) -> Response:
        await reg.get(ws_id).remove(path, recursive=recursive)
        return Response(status_code=204)

    @app.get("/v1/workspaces/{ws_id}/list")
    async def list_(ws_id: str, path: str = Depends(query_path)) -> dict[str, Any]:
        return {"entries": [e.to_dict() for e in await reg.get(ws_id).list(path)]}

    @app.get("/v1/workspaces/{ws_id}/stat")
    async def stat(ws_id: str, path: str = Depends(required_query_path)) -> dict[str, Any]:
        return (await reg.get(ws_id).stat(path)).to_dict()

    @app.get("/v1/workspaces/{ws_id}/diff")
    async def diff(ws_id: str) -> Response:
        with reg.using(ws_id):
            text = await reg.get(ws_id).diff(max_chars=max_diff_chars)
        # Rendered in a thread: escaping a diff of tens of MB held every other request up for seconds.
        body = await asyncio.to_thread(ascii_json, {"diff": text})
        return Response(body, media_type="application/json")

    @app.delete("/v1/workspaces/{ws_id}", status_code=204)
    async def close(ws_id: str) -> Response:
        await reg.close(ws_id)
        return Response(status_code=204)

    return app


def resolve_token(server: ServerConfig) -> tuple[str, bool]:
    """The token to require: configured, else $VIVACE_SANDBOX_TOKEN, else a fresh random one."""
    token = server.token or os.environ.get("VIVACE_SANDBOX_TOKEN")
    if token:
        return token, False
    return secrets.token_urlsafe(24), True


def configured_limits(server: ServerConfig) -> dict[str, Any]:
    """`create_app`'s limits as the config sets them (`serve` and the Ray actor's servers alike)."""
    return {
        "max_exec_timeout_s": server.max_exec_timeout_s,
        "max_file_streams": server.max_file_streams,
        "file_stream_stall_s": server.file_stream_stall_s,
        "max_diff_chars": server.max_diff_chars,
        "workspace_idle_s": server.workspace_idle_s,
    }


def serve(config: VivaceConfig, sock: socket.socket | None = None) -> None:
    """Run the server in the foreground until interrupted (the `vivace sandbox serve` command), on
    `sock` when given (bound to config.server's address already), else binding that address."""
    token, generated = resolve_token(config.server)
    if generated:
        # Printed once, here only: it is needed by every client and stored nowhere.
        print(
            f"vivace sandbox server token (set VIVACE_SANDBOX_TOKEN to choose one): {token}",
            file=sys.stderr,
            flush=True,
        )
    host, port = config.server.host, sock.getsockname()[1] if sock is not None else config.server.port
    print(f"serving workspaces on {http_url(host, port)}", file=sys.stderr, flush=True)  # --port 0: the one taken
    if config.server.host not in ("127.0.0.1", "::1", "localhost"):
        log.warning("environment server bound to %s: reachable from the network, without TLS", config.server.host)
    app = create_app(
        open_backend(config.sandbox),
        config.pool,
        token,
        own_backend=True,
        **configured_limits(config.server),
    )
    server = ClosingServer(
        serving_config(
            app,
            host=config.server.host,
            port=config.server.port,
            backlog=2048,
            timeout_graceful_shutdown=GRACEFUL_BACKSTOP_S,
        )
    )
    with contextlib.suppress(KeyboardInterrupt):  # as uvicorn.run: Ctrl-C is how it stops
        server.run(sockets=[sock] if sock is not None else None)
