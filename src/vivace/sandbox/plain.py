"""The plain backend: a full copy of the snapshot and a subprocess with rlimits. NOT isolated.

It exists for machines where namespaces, overlayfs or root are unavailable (a laptop, a
locked-down CI runner) and as the full-copy baseline of `vivace sandbox bench`. Commands
see the whole host filesystem and network as the current user; only the environment is
clean and memory, file size and CPU time are capped with rlimits. Creating a workspace
costs a copy of the repository; its diff reads only the files changed since (`changed_paths`).
"""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path

from vivace.config import SandboxConfig
from vivace.sandbox.base import ExecResult
from vivace.sandbox.diff import walk_files
from vivace.sandbox.local import LocalBackend, LocalWorkspace, command_env, toolchain_dirs
from vivace.sandbox.process import kill_process_group, run_capped
from vivace.sandbox.snapshot import Snapshot

UNISOLATED_WARNING = (
    "vivace sandbox: using the PLAIN backend -- commands are NOT isolated (they can read and "
    "write anything the current user can, and reach the network). Use it only with trusted "
    "models and repositories."
)

# Touched when a workspace's copy is whole: its ctime is the copy's end on the filesystem's clock.
_COPIED = ".copied"

# dash counts -f in 512-byte blocks and -v in KiB.
_RLIMITS = 'ulimit -v "$1" 2>/dev/null; ulimit -f "$2" 2>/dev/null; ulimit -t "$3" 2>/dev/null; shift 3; exec "$@"'


class PlainBackend(LocalBackend):
    name = "plain"
    isolated = False

    def __init__(self, config: SandboxConfig, fallback: str | None = None):
        super().__init__(config)
        self.toolchain = toolchain_dirs(config)
        self.fallback = fallback

    async def _create(self, ws_id: str, snapshot: Snapshot, ws_dir: Path) -> Path:
        def copy() -> None:
            shutil.copytree(snapshot.root, ws_dir / "tree", symlinks=True)
            (ws_dir / "home").mkdir()
            (ws_dir / _COPIED).touch()  # stamped by the filesystem's clock once the copy is whole

        try:
            await asyncio.to_thread(copy)
        except BaseException:
            shutil.rmtree(ws_dir, ignore_errors=True)
            raise
        return ws_dir / "tree"

    def _destroy(self, ws_id: str, ws_dir: Path) -> None:
        shutil.rmtree(ws_dir, ignore_errors=True)

    def _sweep_owner(self, owner_dir: Path) -> None:
        shutil.rmtree(owner_dir, ignore_errors=True)

    async def run(self, ws: LocalWorkspace, argv: list[str], timeout: float, env: dict[str, str]) -> ExecResult:
        limits = [str(self.config.memory_mb * 1024), str(self.config.disk_mb * 2048), str(int(timeout) + 1)]
        raw = await run_capped(
            ["/bin/sh", "-c", _RLIMITS, "sh", *limits, *argv],
            cwd=str(ws.root),
            env=command_env(self.toolchain, str(ws.root.parent / "home"), env),
            timeout=timeout,
            output_limit=self.config.output_limit_bytes,
            kill=kill_process_group,
        )
        return ExecResult(**vars(raw))

    def changed_paths(self, ws: LocalWorkspace) -> list[str]:
        """The paths the diff compares: those in one tree only, and those in the workspace whose
        inode changed (ctime) since the copy was made, git's racy-clean test on the filesystem's own
        clock. Nothing else can differ: a write, chmod, rename or link sets the ctime, and a command
        cannot set it back (mtime it can); a change in the copy's last clock tick counts as one. Not
        reading the unchanged files is what keeps a diff of a large repository cheap (50,000 files:
        seconds before)."""
        base, work = set(walk_files(ws.snapshot.root)), walk_files(ws.root)
        try:
            copied = os.stat(ws.root.parent / _COPIED).st_ctime_ns
        except OSError:  # a workspace made before the stamp existed: compare everything
            return sorted(base.union(work))
        touched = set()
        for rel in work:
            try:
                if rel not in base or os.lstat(ws.root / rel).st_ctime_ns >= copied:
                    touched.add(rel)
            except OSError:  # removed meanwhile: compare it
                touched.add(rel)
        return sorted(touched | (base - set(work)))
