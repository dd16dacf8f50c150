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
in-process read limit, 64 MiB, is refused as in-process). Under `ClosingServer` (`serve`),
SIGTERM or Ctrl-C stops new work, gives running creates and execs SHUTDOWN_GRACE_S to finish,
then cancels them (commands killed, clients answered 503 "shutting_down") and closes every
workspace the server handed out, within a few seconds (inside Docker's and Kubernetes' 10 s
stop grace); also when forced (a second Ctrl-C). Not guaranteed: TLS (bind to loopback, or put
it behind a proxy), isolation between token holders (a token holder may snapshot any path the
server can read and use every workspace), letting go of a file whose reader stopped reading
without hanging up (its descriptor stays open until the connection ends or the server stops), a
prompt stop under plain uvicorn (which waits for running commands; `serve` and the Ray actor's
servers run ClosingServer), and reaping of workspaces whose client vanished without closing
them (they hold a pool slot until closed or until the server stops).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import os
import secrets
import sys
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Literal
from urllib.parse import parse_qsl

import uvicorn
from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException

from vivace.body_limit import BodyLimit, BodyTooLarge
from vivace.config import PoolConfig, ServerConfig, VivaceConfig
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
HEALTH_PATH = "/v1/health"
STATUS_BY_KIND = {"path_escape": 403, "not_found": 404, "unknown_workspace": 404, "wrong_type": 409, "closed": 410,
                  "unauthorized": 401, "backend_unavailable": 503, "shutting_down": 503}  # fmt: skip


class ShuttingDown(SandboxError):
    """The server is stopping: a new create or exec is refused, a running one cancelled."""

    kind = "shutting_down"


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SourceBody(_Body):
    path: str = Field(min_length=1, description="Directory, tarball or git repository on the server's machine.")
    kind: Literal["dir", "tar", "git"] | None = None
    commit: str | None = None


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


class FileStream(Response):
    """A workspace file sent from its open descriptor READ_CHUNK_BYTES at a time (chunked transfer
    encoding): a read holds one chunk in memory, not the file. It sends the file's bytes up to its
    size when opened, or to its end if it was truncated meanwhile (what a read in-process would
    see). When the client hangs up it stops reading; when the workspace is closed or the server's
    shutdown grace is over (`stop`) it cuts the body short (the client sees an incomplete response,
    not a shorter file). The descriptor is closed however the response ends, never under a read
    still running in a thread."""

    media_type = "application/octet-stream"

    def __init__(self, ws: LocalWorkspace, opened: OpenFile, stop: asyncio.Event) -> None:
        self.ws, self.opened, self.stop = ws, opened, stop
        self.status_code = 200
        self.background = None
        self.init_headers()  # no body: no Content-Length, so uvicorn sends it chunked

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        fd, size = self.opened.fd, self.opened.size
        hangup = asyncio.ensure_future(_hangup(receive))
        reading: asyncio.Future[bytes] | None = None
        try:
            await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
            chunk, offset = self.opened.head, 0
            while chunk and not hangup.done():
                offset += len(chunk)
                # Waits while the client lags behind (uvicorn's flow control): one chunk in memory.
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
                if offset >= size:
                    break
                if self.ws.closed or self.stop.is_set():
                    log.info("a read from workspace %s cut short: closed, or the server stopping", self.ws.id)
                    return  # uvicorn closes the connection on a response left incomplete
                n = min(READ_CHUNK_BYTES, size - offset)
                reading = asyncio.get_running_loop().run_in_executor(None, os.pread, fd, n, offset)
                chunk = await asyncio.shield(reading)  # b"": truncated since it was opened
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            hangup.cancel()
            if reading is None or reading.done():
                os.close(fd)
            else:  # cancelled (the server stopping) during a read: close once the thread is done with it
                reading.add_done_callback(lambda _: os.close(fd))


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


class Registry:
    """Pools and live workspaces of one app; only touched from the server's event loop."""

    def __init__(self, backend: LocalBackend, pool_config: PoolConfig) -> None:
        self.backend = backend
        self.pool_config = pool_config
        self.pools: dict[str, WorkspacePool] = {}
        self.workspaces: dict[str, LocalWorkspace] = {}
        # Closed ids are remembered (bounded) so a late request says "closed", not "unknown".
        self.recently_closed: OrderedDict[str, None] = OrderedDict()
        self._inflight: dict[SnapshotSource, asyncio.Future[Snapshot]] = {}
        self.stopping = False  # set by `drain`: new creates and execs are refused
        self.stop_now = asyncio.Event()  # set once the grace is over: running ones are cancelled
        self.running: set[asyncio.Future[Any]] = set()  # creates and execs in progress

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
        # Single flight: a burst of creates for one source hashes and copies the tree once.
        fut = self._inflight.get(source)
        if fut is None:
            fut = asyncio.ensure_future(self._materialize(source))
            self._inflight[source] = fut
            fut.add_done_callback(lambda f: self._settled(source, f))
        return await asyncio.shield(fut)  # a client hanging up must not cancel the others' wait

    def _settled(self, source: SnapshotSource, fut: asyncio.Future[Snapshot]) -> None:
        self._inflight.pop(source, None)
        if not fut.cancelled():
            fut.exception()  # retrieved: no "never retrieved" noise when every waiter left

    async def _materialize(self, source: SnapshotSource) -> Snapshot:
        return await asyncio.to_thread(self.backend.snapshot, source)  # hashing a tree blocks

    async def create(self, source: SnapshotSource) -> str:
        snapshot = await self.snapshot(source)
        pool = self.pools.get(snapshot.key)
        if pool is None:
            pool = self.pools[snapshot.key] = WorkspacePool(self.backend, snapshot, self.pool_config)
        ws = await pool.acquire()  # waits while the pool is at max_live
        # Backend ids restart with every process; the random suffix keeps a stale client
        # from reaching a newer server's workspace of the same number.
        ws_id = f"{ws.id}-{secrets.token_hex(4)}"
        self.workspaces[ws_id] = ws
        return ws_id

    def get(self, ws_id: str) -> LocalWorkspace:
        ws = self.workspaces.get(ws_id)
        if ws is not None:
            return ws
        if ws_id in self.recently_closed:
            raise WorkspaceClosedError(f"workspace {ws_id} is closed")
        raise UnknownWorkspace(f"no workspace {ws_id!r} on this server")

    async def close(self, ws_id: str) -> None:
        ws = self.workspaces.pop(ws_id, None)
        if ws is None:
            return  # idempotent: already closed (or never existed)
        self.recently_closed[ws_id] = None
        while len(self.recently_closed) > 10_000:
            self.recently_closed.popitem(last=False)
        await ws.close()

    async def aclose(self) -> None:
        await asyncio.gather(*(self.close(i) for i in list(self.workspaces)), return_exceptions=True)
        for pool in self.pools.values():
            await pool.close()

    def metrics(self) -> dict[str, Any]:
        return {
            "backend": self.backend.describe(),
            "live": len(self.workspaces),
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
) -> FastAPI:
    """The HTTP app over `backend`; with `own_backend` its shutdown also closes the backend.
    `ClosingServer` calls `app.state.drain()` when told to stop (see `Registry.drain`). An exec
    asking for a timeout over `max_exec_timeout_s` (raised to the backend's default timeout if
    lower) is refused."""
    if not token:
        raise ValueError("the environment server needs a non-empty token")
    max_timeout_s = max(max_exec_timeout_s, backend.config.timeout_s)
    reg = Registry(backend, pool_config)

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
    app.state.close_all = close_all
    app.state.drain = lambda: reg.drain(shutdown_grace_s)

    @app.exception_handler(SandboxError)
    async def _sandbox_error(_: Request, e: SandboxError) -> JSONResponse:
        return error_response(STATUS_BY_KIND.get(e.kind, 400), e.kind, str(e))

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
        if len(opened.head) < opened.size:
            return FileStream(ws, opened, reg.stop_now)
        os.close(opened.fd)  # read whole with the open: one trip to a thread for most files
        return Response(content=opened.head, media_type="application/octet-stream")

    @app.put("/v1/workspaces/{ws_id}/file", status_code=204)
    async def write(ws_id: str, request: Request, path: str = Depends(required_query_path)) -> Response:
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
    async def diff(ws_id: str) -> dict[str, str]:
        return {"diff": await reg.get(ws_id).diff()}

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


class ClosingServer(uvicorn.Server):
    """uvicorn, stopping as promptly as a container's stop needs. Left to itself, uvicorn waits
    for every request to end (up to `timeout_graceful_shutdown`) before the app's shutdown, so a
    running command held it for as long as the command ran; and when forced to exit (a second
    Ctrl-C, which its "CTRL+C to force quit" invites) it skips the app's shutdown. Here the app
    drains alongside uvicorn's wait (running calls get the app's short grace, then are cancelled
    and answered), and the workspaces are closed, killing their commands, in either case."""

    async def shutdown(self, sockets: Any = None) -> None:
        state = self.config.app.state
        drain = asyncio.ensure_future(state.drain())
        try:
            await super().shutdown(sockets)  # returns once the drained calls have answered, or forced
        finally:
            state.registry.stop_now.set()  # forced: no grace left
            await drain
            await state.close_all()  # idempotent: a no-op after a graceful shutdown


def serve(config: VivaceConfig) -> None:
    """Run the server in the foreground until interrupted (the `vivace sandbox serve` command)."""
    token, generated = resolve_token(config.server)
    if generated:
        # Printed once, here only: it is needed by every client and stored nowhere.
        print(
            f"vivace sandbox server token (set VIVACE_SANDBOX_TOKEN to choose one): {token}",
            file=sys.stderr,
            flush=True,
        )
    if config.server.host not in ("127.0.0.1", "::1", "localhost"):
        log.warning("environment server bound to %s: reachable from the network, without TLS", config.server.host)
    app = create_app(
        open_backend(config.sandbox),
        config.pool,
        token,
        own_backend=True,
        max_exec_timeout_s=config.server.max_exec_timeout_s,
    )
    server = ClosingServer(
        uvicorn.Config(
            app,
            host=config.server.host,
            port=config.server.port,
            backlog=2048,
            timeout_graceful_shutdown=GRACEFUL_BACKSTOP_S,
        )
    )
    with contextlib.suppress(KeyboardInterrupt):  # as uvicorn.run: Ctrl-C is how it stops
        server.run()
