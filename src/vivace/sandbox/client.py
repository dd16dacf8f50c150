"""The HTTP client of the environment server: the async Workspace interface, remotely.

`EnvClient` holds one pooled `httpx.AsyncClient` (sized for hundreds of concurrent requests)
and creates `RemoteWorkspace`s, which implement exactly the methods of `base.Workspace` and
return the same dataclasses. Server errors are re-raised as the same exception classes as
the in-process backend (chosen by the error's `kind`), so callers cannot tell the two apart.

Not guaranteed: retries (a request that failed in transit is not repeated: exec is not
idempotent), and translating transport failures (refused connection, timeout) -- those
surface as `httpx.TransportError`. Any other HTTP error, and a success whose body is not
what the server sends (another service on that port, a proxy's page), becomes a
`SandboxError`.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import httpx

from vivace.sandbox.base import (
    ERRORS_BY_KIND,
    DirEntry,
    ExecResult,
    FileStat,
    SandboxError,
    TextFilesMixin,
    WorkspaceClosedError,
)
from vivace.sandbox.snapshot import SnapshotSource

EXEC_MARGIN_S = 30.0  # beyond the command's own limit: killing it and returning its output


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


class EnvClient:
    """Talks to one environment server; share one instance across many workspaces."""

    def __init__(self, base_url: str, token: str, timeout: float = 60.0, max_connections: int = 1024) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self._http = httpx.AsyncClient(
            base_url=self.base_url,
            headers={"Authorization": f"Bearer {token}"},
            timeout=httpx.Timeout(timeout, connect=min(timeout, 30.0)),
            # The defaults (100 connections, 5s pool wait) would queue and then fail bursts.
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
        )

    async def request(
        self, method: str, path: str, *, timeout: Any = httpx.USE_CLIENT_DEFAULT, **kw: Any
    ) -> httpx.Response:
        response = await self._http.request(method, path, timeout=timeout, **kw)
        _raise_for(response)
        return response

    async def create(self, source: SnapshotSource | str) -> RemoteWorkspace:
        """A fresh workspace over `source` (a path on the server's machine)."""
        if isinstance(source, str):
            source = SnapshotSource(path=source)
        body = {"source": {"path": source.path, "kind": source.kind, "commit": source.commit}}
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
        r = await self._call("GET", "/file" + _path_query(path))
        if r.headers.get("content-type", "").split(";")[0].strip() != "application/octet-stream":
            # A proxy's page or another service's answer, which would pass for the file's content.
            raise SandboxError(f"unexpected response from {r.request.url} (not a vivace environment server?): "
                               f"content type {r.headers.get('content-type')!r}; body: {r.text[:200]!r}")  # fmt: skip
        return r.content

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
