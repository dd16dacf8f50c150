"""Environment servers: copy-on-write workspaces, isolation, burst pools, HTTP server and client.

Typical use:

    backend = open_backend(SandboxConfig())          # isolated when possible
    pool = WorkspacePool(backend, SnapshotSource("path/to/repo"))
    async with await pool.acquire() as ws:
        result = await ws.exec("pytest -q")
        patch = await ws.diff()
"""

from vivace.sandbox.base import (
    BackendUnavailable,
    DirEntry,
    ExecResult,
    FileStat,
    NotAFileError,
    PathEscapeError,
    SandboxError,
    TooLarge,
    Unauthorized,
    UnknownWorkspace,
    Workspace,
    WorkspaceClosedError,
    WorkspaceFileNotFound,
)
from vivace.sandbox.pool import WorkspacePool, open_backend
from vivace.sandbox.snapshot import Snapshot, SnapshotSource

__all__ = [
    "BackendUnavailable",
    "DirEntry",
    "ExecResult",
    "FileStat",
    "NotAFileError",
    "PathEscapeError",
    "SandboxError",
    "Snapshot",
    "SnapshotSource",
    "TooLarge",
    "Unauthorized",
    "UnknownWorkspace",
    "Workspace",
    "WorkspaceClosedError",
    "WorkspaceFileNotFound",
    "WorkspacePool",
    "open_backend",
]
