"""The Workspace contract shared by every sandbox backend, the HTTP client and the harness.

A workspace is a private, writable copy of a repository snapshot. Commands run inside it
(isolated or not, depending on the backend) and a small file API reads and writes it with
paths that are always relative to the workspace root and can never leave it.

This module holds only data types, errors and the protocol; backends live beside it.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

FileKind = Literal["file", "dir", "symlink", "other"]


class SandboxError(Exception):
    """Base class of every sandbox error; `kind` is a stable name used over HTTP."""

    kind = "sandbox_error"


class PathEscapeError(SandboxError, PermissionError):
    """A path (through `..`, an absolute path or a symlink) would leave the workspace."""

    kind = "path_escape"


class SymlinkLoop(PathEscapeError):
    """A path's symlinks lead to themselves (more than MAX_SYMLINKS of them): a loop, not an escape,
    though it is refused the same way."""

    kind = "symlink_loop"


class WorkspaceFileNotFound(SandboxError, FileNotFoundError):
    kind = "not_found"


class NotAFileError(SandboxError, IsADirectoryError):
    """A file operation named a directory (or a directory operation named a file)."""

    kind = "wrong_type"


class WorkspaceClosedError(SandboxError):
    kind = "closed"


class UnknownWorkspace(SandboxError, LookupError):
    """An environment server has no workspace with this id (never created, or server restarted)."""

    kind = "unknown_workspace"


class Unauthorized(SandboxError, PermissionError):
    """An environment server refused the request: missing or wrong bearer token."""

    kind = "unauthorized"


class BackendUnavailable(SandboxError):
    """The requested backend cannot run on this machine; the message says why and what to do."""

    kind = "backend_unavailable"


class TooLarge(SandboxError):
    """What a call would send or return is over a limit (an upload, a diff): refused, nothing done."""

    kind = "too_large"


ERRORS_BY_KIND: dict[str, type[SandboxError]] = {
    cls.kind: cls
    for cls in (
        SandboxError,
        PathEscapeError,
        SymlinkLoop,
        WorkspaceFileNotFound,
        NotAFileError,
        WorkspaceClosedError,
        UnknownWorkspace,
        Unauthorized,
        BackendUnavailable,
        TooLarge,
    )
}


@dataclass(frozen=True)
class ExecResult:
    """What one command produced."""

    stdout: str  # decoded UTF-8 (invalid bytes replaced), at most `output_limit` bytes kept
    stderr: str
    exit_code: int  # the command's status; 128+N when killed by signal N (shell convention)
    duration_s: float  # wall-clock seconds from spawn to exit
    timed_out: bool = False  # killed because the wall-clock timeout expired
    # A process was killed by the memory limit while the command ran. The limit, and so this count,
    # is the workspace's: commands running at once in one workspace all see it.
    oom_killed: bool = False
    stdout_dropped: int = 0  # bytes of stdout beyond the cap that were read and discarded
    stderr_dropped: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class FileStat:
    path: str  # relative to the workspace root
    kind: FileKind
    size: int  # bytes (for a symlink: length of its target)
    mode: int  # permission bits
    mtime: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class DirEntry:
    name: str
    kind: FileKind
    size: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@runtime_checkable
class Workspace(Protocol):
    """A private writable copy of a snapshot. All paths are relative to the workspace root."""

    id: str

    async def exec(
        self, cmd: str | list[str], timeout: float | None = None, env: dict[str, str] | None = None
    ) -> ExecResult:
        """Run `cmd` (a shell string run by bash, or an argv list) in the workspace root."""
        ...

    async def read_bytes(self, path: str) -> bytes: ...

    async def write_bytes(self, path: str, data: bytes) -> None:
        """Create or replace a file; missing parent directories are created."""
        ...

    async def list(self, path: str = ".") -> list[DirEntry]: ...

    async def remove(self, path: str, recursive: bool = False) -> None: ...

    async def stat(self, path: str) -> FileStat: ...

    async def diff(self) -> str:
        """Unified (git-style) diff of the workspace against its base snapshot."""
        ...

    async def close(self) -> None: ...


class TextFilesMixin:
    """`read_text`/`write_text` on top of a workspace's byte-level file API."""

    async def read_text(self, path: str) -> str:
        return (await self.read_bytes(path)).decode("utf-8", errors="replace")  # type: ignore[attr-defined]

    async def write_text(self, path: str, text: str) -> None:
        await self.write_bytes(path, text.encode("utf-8"))  # type: ignore[attr-defined]

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()  # type: ignore[attr-defined]


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def check_env(env: dict[str, str]) -> dict[str, str]:
    """`env` unchanged, or ValueError naming the first variable a command could not be given."""
    for name, value in env.items():
        if not _ENV_NAME.fullmatch(name):
            raise ValueError(
                f"invalid environment variable {name!r}: a name is letters, digits and _, not starting with a digit"
            )
        if "\0" in value:
            raise ValueError(f"invalid environment variable {name!r}: its value contains a NUL byte")
    return env


class WithEnv:
    """A workspace whose commands all get `env` (a command's own variables win); the rest is the
    workspace's: how a task's environment (Task.env) reaches its setup, the agent's tools and its tests."""

    def __init__(self, workspace: Workspace, env: dict[str, str]) -> None:
        self._workspace, self._env = workspace, env

    def __getattr__(self, name: str) -> Any:
        return getattr(self._workspace, name)

    async def exec(
        self, cmd: str | list[str], timeout: float | None = None, env: dict[str, str] | None = None
    ) -> ExecResult:
        return await self._workspace.exec(cmd, timeout, {**self._env, **(env or {})})


@dataclass
class LatencyStats:
    """Running latency samples (seconds) with percentile summaries for metrics endpoints."""

    samples: list[float] = field(default_factory=list)
    max_samples: int = 10_000

    def add(self, seconds: float) -> None:
        if len(self.samples) >= self.max_samples:
            # Keep memory bounded: drop the oldest half, the recent window stays representative.
            del self.samples[: self.max_samples // 2]
        self.samples.append(seconds)

    def summary(self) -> dict[str, float]:
        if not self.samples:
            return {"count": 0}
        xs = sorted(self.samples)
        return {
            "count": len(xs),
            "p50_ms": percentile(xs, 50) * 1e3,
            "p90_ms": percentile(xs, 90) * 1e3,
            "p99_ms": percentile(xs, 99) * 1e3,
            "max_ms": xs[-1] * 1e3,
        }


def percentile(sorted_xs: list[float], q: float) -> float:
    """Nearest-rank percentile of an already sorted, non-empty list."""
    rank = max(0, min(len(sorted_xs) - 1, round(q / 100 * (len(sorted_xs) - 1))))
    return sorted_xs[rank]
