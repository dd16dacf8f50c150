"""The HTTP client of the environment server: the async Workspace interface, remotely.

`EnvClient` holds one pooled `httpx.AsyncClient` (sized for hundreds of concurrent requests)
and creates `RemoteWorkspace`s, which implement exactly the methods of `base.Workspace` and
return the same dataclasses. Server errors are re-raised as the same exception classes as
the in-process backend (chosen by the error's `kind`), so callers cannot tell the two apart.

A request the server refuses as "busy" (503, at `server.max_file_streams`) is repeated after
the Retry-After it asks for, for up to `busy_retry_s` (the client's timeout by default): the
server refuses so before doing any work, so repeating is safe. Not guaranteed: other retries
(a request that failed in transit, or was refused otherwise, "shutting_down" included, is not
repeated: exec is not idempotent), and translating transport failures (refused connection,
timeout) -- those surface as `httpx.TransportError`. Any other HTTP error, and a success
whose body is not what the server sends (another service on that port, a proxy's page),
becomes a `SandboxError`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import io
import random
import time
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import quote

import httpx

from vivace.sandbox.base import (
    ERRORS_BY_KIND,
    DirEntry,
    ExecResult,
    FileStat,
    NotAFileError,
    SandboxError,
    TextFilesMixin,
    WorkspaceClosedError,
)
from vivace.sandbox.paths import MAX_READ_BYTES
from vivace.sandbox.snapshot import SnapshotSource

EXEC_MARGIN_S = 30.0  # beyond the command's own limit: killing it and returning its output
# The longest wait between tries of a request refused as "busy", whatever Retry-After says: a stream
# slot may free at any moment, and a server (or proxy) asking for minutes would outlast the budget.
BUSY_WAIT_CAP_S = 5.0


def _raise_for(response: httpx.Response) -> None:
    """Re-raise the server's error as the exception class the local backend would raise."""
    if response.is_success:
        return
    try:
        err = response.json()["error"]
        kind, message = str(err["kind"]), str(err["message"])
    except (ValueError, KeyError, TypeError):  # not our error body (a proxy, a crash page)
        # A proxy's own body limit (nginx: 1 MiB by default) answers with a page of its own.
        hint = " (request body too large for a proxy before the server)" if response.status_code == 413 else ""
        raise SandboxError(f"HTTP {response.status_code}{hint}: {response.text[:500]}") from None
    if kind == "invalid_argument":
        raise ValueError(message)  # what LocalWorkspace raises for a bad env name or argv
    if kind == "os_error" and isinstance(err.get("errno"), int):
        raise OSError(err["errno"], message)  # the same subclass (FileNotFoundError, ...) and str as in-process
    raise ERRORS_BY_KIND.get(kind, SandboxError)(message)


def _busy_retry_after(response: httpx.Response) -> float | None:
    """The seconds to wait before repeating a request the server refused as "busy"; None for any other answer."""
    if response.status_code != 503:
        return None
    try:
        if response.json()["error"]["kind"] != "busy":
            return None
    except (ValueError, KeyError, TypeError):  # not our error body: a proxy's 503 is not known to be safe to repeat
        return None
    try:
        return max(0.1, float(response.headers.get("retry-after", "")))  # never 0: tries without a pause
    except ValueError:  # missing, or an HTTP date (never sent by our server)
        return 1.0


def _json(response: httpx.Response, build: Any = dict) -> Any:
    """`build(body)`; a body that is not the server's JSON is a SandboxError naming the URL."""
    try:
        return build(response.json())
    except (ValueError, KeyError, TypeError) as e:
        raise SandboxError(
            f"unexpected response from {response.request.url} (not a vivace environment server?): "
            f"{type(e).__name__}: {e}; body: {response.text[:200]!r}"
        ) from None


def _path_query(path: str, **extra: str) -> str:
    """`?path=...` with the path's bytes percent-encoded, so a name that is not UTF-8 (surrogate
    escapes, as the in-process API gives it) reaches the server intact; httpx's `params` cannot."""
    query = [("path", path), *extra.items()]
    return "?" + "&".join(f"{k}={quote(v.encode('utf-8', 'surrogateescape'), safe='')}" for k, v in query)


async def _first_bytes(response: httpx.Response, n: int) -> bytes:
    """Up to the first `n` bytes of a streamed body (to name what answered), not the whole of it."""
    head = b""
    async for chunk in response.aiter_bytes():
        head += chunk[: n - len(head)]
        if len(head) >= n:
            break
    return head


def _declared_size(response: httpx.Response) -> int | None:
    """The body's size as the server declares it: Content-Length, or for a file it streams chunked
    X-File-Size (the file's size when opened: the body holds that or less, if truncated meanwhile)."""
    declared = response.headers.get("content-length") or response.headers.get("x-file-size") or ""
    return int(declared) if declared.isdigit() else None


async def _file_body(response: httpx.Response, path: str) -> bytes:
    """A file read's body, held once. Chunks joined at the end would hold the file twice (a 60 MB read
    peaked at ~2x); a BytesIO sized from the declared size is filled in place, and its getvalue()
    hands over that buffer without a copy (CPython). The declared size only sizes it: a size over
    MAX_READ_BYTES is refused unread, and what arrives is counted against the limit itself."""
    declared = _declared_size(response)
    if declared is not None and declared > MAX_READ_BYTES:
        raise NotAFileError(f"{path!r} is {declared} bytes, over the {MAX_READ_BYTES}-byte read limit")
    # bytes(n) is calloc'd: pages a shorter body never writes are never touched.
    buffer, received = io.BytesIO(bytes(declared or 0)), 0
    async for chunk in response.aiter_bytes():
        received += len(chunk)
        if received > MAX_READ_BYTES:  # a server of another version, or not ours
            raise NotAFileError(
                f"{path!r}: the server sent more than the {MAX_READ_BYTES}-byte read limit, which a vivace "
                "environment server refuses to; is it one, of this client's version?"
            )
        buffer.write(chunk)
    buffer.truncate()  # a file truncated while it was sent: less than declared
    return buffer.getvalue()


class EnvClient:
    """Talks to one environment server; share one instance across many workspaces."""

    def __init__(
        self,
        base_url: str,
        token: str,
        timeout: float = 60.0,
        max_connections: int = 1024,
        busy_retry_s: float | None = None,
    ) -> None:
        """`busy_retry_s`: how long a request refused as "busy" keeps being repeated (0: never); None: `timeout`,
        which the caller already allows one answer, and which covers the server's default stall limit (60 s)
        after which slots held by readers that stopped reading are freed."""
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.busy_retry_s = timeout if busy_retry_s is None else busy_retry_s
        self._http = httpx.AsyncClient(
            base_url=self.base_url,
            headers={"Authorization": f"Bearer {token}"},
            timeout=httpx.Timeout(timeout, connect=min(timeout, 30.0)),
            # The defaults (100 connections, 5s pool wait) would queue and then fail bursts.
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
        )

    async def request(self, method: str, path: str, **kw: Any) -> httpx.Response:
        return await self._send(method, path, stream=False, **kw)

    @contextlib.asynccontextmanager
    async def stream(self, method: str, path: str, **kw: Any) -> AsyncIterator[httpx.Response]:
        """`request`, with the body of a success left to read from the response as it arrives."""
        response = await self._send(method, path, stream=True, **kw)
        try:
            yield response
        finally:
            await response.aclose()

    async def _send(self, method: str, path: str, *, stream: bool, **kw: Any) -> httpx.Response:
        """A success, or the server's error raised. Refused as "busy", the request is repeated after the
        server's Retry-After (at most BUSY_WAIT_CAP_S, times 1-1.5 at random, so that readers refused
        together do not all come back together) while `busy_retry_s` allows. Any request: the server
        refuses as busy before doing any work (server.Busy); today only a streamed file read is."""
        start, tries = time.monotonic(), 0
        while True:
            response = await self._http.send(self._http.build_request(method, path, **kw), stream=stream)
            tries += 1
            if response.is_success:
                return response
            try:
                await response.aread()  # the server's error is a small JSON body
            finally:
                await response.aclose()
            after = _busy_retry_after(response)
            if after is None:
                _raise_for(response)
            wait = min(after, BUSY_WAIT_CAP_S) * random.uniform(1.0, 1.5)
            if time.monotonic() + wait > start + self.busy_retry_s:
                message, took = response.json()["error"].get("message", "busy"), time.monotonic() - start
                said = f"still busy after {tries} tr{'y' if tries == 1 else 'ies'} in {took:.1f} s"
                raise ERRORS_BY_KIND.get("busy", SandboxError)(f"{message} ({said})")  # as _raise_for would
            await asyncio.sleep(wait)

    async def create(self, source: SnapshotSource | str) -> RemoteWorkspace:
        """A fresh workspace over `source` (a path on the server's machine)."""
        if isinstance(source, str):
            source = SnapshotSource(path=source)
        body = {"source": dataclasses.asdict(source)}
        # No read limit: the server makes callers wait while its pool is at max_live, as the
        # local pool does; only connecting is bounded.
        timeout = httpx.Timeout(None, connect=self._http.timeout.connect)
        response = await self.request("POST", "/v1/workspaces", json=body, timeout=timeout)
        return _json(
            response, lambda info: RemoteWorkspace(self, info["id"], float(info.get("timeout_s") or self.timeout), info)
        )

    async def metrics(self) -> dict[str, Any]:
        return _json(await self.request("GET", "/v1/metrics"))

    async def health(self) -> dict[str, Any]:
        return _json(await self.request("GET", "/v1/health"))

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> EnvClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class RemoteWorkspace(TextFilesMixin):
    """A workspace on an environment server; the same interface as `LocalWorkspace`."""

    def __init__(self, client: EnvClient, ws_id: str, default_timeout: float, info: dict[str, Any]) -> None:
        self.id = ws_id
        self.client = client
        self.default_timeout = default_timeout  # the server's per-command default
        self.info = info  # what the server said at creation: backend name, isolated
        self.closed = False
        self._base = f"/v1/workspaces/{ws_id}"

    def _check(self) -> None:
        # Checked locally too: after close the server forgets the id, and a closed handle
        # must raise the same error as a local one without a round trip.
        if self.closed:
            raise WorkspaceClosedError(f"workspace {self.id} is closed")

    async def _call(self, method: str, suffix: str, **kw: Any) -> httpx.Response:
        self._check()
        return await self.client.request(method, self._base + suffix, **kw)

    async def exec(
        self, cmd: str | list[str], timeout: float | None = None, env: dict[str, str] | None = None
    ) -> ExecResult:
        limit = (timeout or self.default_timeout) + max(EXEC_MARGIN_S, self.client.timeout)
        # `timeout or None`: 0 means "the default", as in LocalWorkspace (the server refuses 0).
        body = {"cmd": cmd, "timeout": timeout or None, "env": env}
        r = await self._call("POST", "/exec", json=body, timeout=httpx.Timeout(limit, connect=30.0))
        return _json(r, lambda d: ExecResult(**d))

    async def read_bytes(self, path: str) -> bytes:
        self._check()
        async with self.client.stream("GET", self._base + "/file" + _path_query(path)) as r:
            if r.headers.get("content-type", "").split(";")[0].strip() != "application/octet-stream":
                # A proxy's page or another service's answer, which would pass for the file's content.
                body = (await _first_bytes(r, 200)).decode("utf-8", "replace")
                raise SandboxError(f"unexpected response from {r.request.url} (not a vivace environment server?): "
                                   f"content type {r.headers.get('content-type')!r}; body: {body!r}")  # fmt: skip
            return await _file_body(r, path)

    async def write_bytes(self, path: str, data: bytes) -> None:
        await self._call(
            "PUT",
            "/file" + _path_query(path),
            content=bytes(data),
            headers={"Content-Type": "application/octet-stream"},
        )

    async def list(self, path: str = ".") -> list[DirEntry]:
        r = await self._call("GET", "/list" + _path_query(path))
        return _json(r, lambda d: [DirEntry(**e) for e in d["entries"]])

    async def remove(self, path: str, recursive: bool = False) -> None:
        await self._call("DELETE", "/file" + _path_query(path, recursive=str(recursive).lower()))

    async def stat(self, path: str) -> FileStat:
        return _json(await self._call("GET", "/stat" + _path_query(path)), lambda d: FileStat(**d))

    async def diff(self) -> str:
        return _json(await self._call("GET", "/diff"), lambda d: d["diff"])

    async def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        await self.client.request("DELETE", self._base)
