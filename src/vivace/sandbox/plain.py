"""The plain backend: a full copy of the snapshot and a subprocess with rlimits. NOT isolated.

It exists for machines where namespaces, overlayfs or root are unavailable (a laptop, a
locked-down CI runner) and as the full-copy baseline of `vivace sandbox bench`. Commands
see the whole host filesystem and network as the current user; only the environment is
clean and memory, file size and CPU time are capped with rlimits. When a command's main
process exits its process group is killed, so what it ran in the background ends with it,
as in the isolated backend. A process that left the group (setsid, setpgid, a daemon) is
killed when no command of the workspace runs any more (its output is read for
process.DRAIN_S seconds more, not waited for), and again when the workspace closes, only if
its working directory is in the workspace: one that changed directory elsewhere outlives
both. Such a daemon could change files while the hidden tests run, and a command can write
the Python environment the tests run with: rewards on this backend are only as trustworthy
as the model. Creating a workspace costs a copy of the repository (`copy_tree`:
GNU cp where it is the machine's cp, shutil elsewhere); its diff reads only the files
changed since (`changed_paths`).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import shutil
import subprocess
from pathlib import Path

from vivace.config import SandboxConfig
from vivace.sandbox.base import ExecResult
from vivace.sandbox.diff import walk_files, walk_tree
from vivace.sandbox.local import LocalBackend, LocalWorkspace, Trees, command_env, remove_tree, toolchain_dirs
from vivace.sandbox.process import kill_process_group, kill_processes_in, run_capped
from vivace.sandbox.snapshot import Snapshot

log = logging.getLogger(__name__)

UNISOLATED_WARNING = (
    "vivace sandbox: using the PLAIN backend -- commands are NOT isolated (they can read and "
    "write anything the current user can, and reach the network). Use it only with trusted "
    "models and repositories."
)

# Touched when a workspace's copy is whole: its ctime is the copy's end on the filesystem's clock.
_COPIED = ".copied"

# GNU cp's flags for what shutil.copytree(symlinks=True) makes: symlinks copied as links (-P), never
# followed; mode (with ACLs) and access and modification times of files, directories and symlinks;
# xattrs where they can be set, as copystat's are (`all` preserves them but fails on none, unlike
# `xattr` alone); a file's other names in the tree become files of their own (no `links`, as copytree),
# and every copy is the copier's (no `ownership`). --reflink=auto shares the data blocks on btrfs/XFS.
_CP_FLAGS = ["-R", "-P", "--preserve=all", "--no-preserve=links,ownership", "--reflink=auto"]
# Snapshots GNU cp failed to copy: each workspace of one is made by shutil instead of trying again.
_CP_FAILED: set[Path] = set()

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
            ws_dir.mkdir(parents=True, exist_ok=True)
            copy_tree(snapshot.root, ws_dir / "tree")
            (ws_dir / "home").mkdir()
            (ws_dir / _COPIED).touch()  # stamped by the filesystem's clock once the copy is whole

        try:
            await asyncio.to_thread(copy)
        except BaseException:
            remove_tree(ws_dir)
            raise
        return ws_dir / "tree"

    def _destroy(self, ws_id: str, ws_dir: Path) -> None:
        kill_processes_in(ws_dir)
        remove_tree(ws_dir)

    def _sweep_owner(self, owner_dir: Path) -> None:
        kill_processes_in(owner_dir)
        remove_tree(owner_dir)

    def commands_done(self, ws: LocalWorkspace) -> None:
        # Run synchronously (a /proc scan: ~0.3 ms with 70 processes) so that a cancelled command's
        # daemons die too: one left running could rewrite files while the scorer runs the tests.
        kill_processes_in(ws.root.parent)

    async def run(self, ws: LocalWorkspace, argv: list[str], timeout: float, env: dict[str, str]) -> ExecResult:
        limits = [str(self.config.memory_mb * 1024), str(self.config.disk_mb * 2048), str(int(timeout) + 1)]
        raw = await run_capped(
            ["/bin/sh", "-c", _RLIMITS, "sh", *limits, *argv],
            cwd=str(ws.root),
            env=command_env(self.toolchain, str(ws.root.parent / "home"), env),
            timeout=timeout,
            output_limit=self.config.output_limit_bytes,
            kill=kill_process_group,
            reap=kill_process_group,  # what the command left running dies with it, as in a sandbox
        )
        return ExecResult(**vars(raw))

    def changed_paths(self, ws: LocalWorkspace, trees: Trees) -> list[str]:
        """The paths the diff compares: those in one tree only, and those in the workspace whose
        inode changed (ctime) since the copy was made, git's racy-clean test on the filesystem's own
        clock. Nothing else can differ: a write, chmod, rename or link sets the ctime, and a command
        cannot set it back (mtime it can); a change in the copy's last clock tick counts as one. Not
        reading the unchanged files is what keeps a diff of a large repository cheap (50,000 files:
        seconds before)."""
        base = set(walk_files(ws.snapshot.root))
        # walk_tree, as walk_files takes a root that is a link (trees.root is /proc/self/fd/N) for no tree
        work = [os.path.join(d, name) for d, _, names in walk_tree(trees.root) for name in names]
        try:
            copied = os.stat(ws.root.parent / _COPIED).st_ctime_ns
        except OSError:  # a workspace made before the stamp existed: compare everything
            return sorted(base.union(work))
        touched = set()
        for rel in work:
            try:
                if rel not in base or os.lstat(trees.root / rel).st_ctime_ns >= copied:
                    touched.add(rel)
            except OSError:  # removed meanwhile: compare it
                touched.add(rel)
        return sorted(touched | (base - set(work)))


@functools.cache
def _gnu_cp() -> str | None:
    """The path of this machine's `cp` when it is GNU cp (coreutils), else None (macOS and BSD cp,
    busybox, none at all)."""
    path = shutil.which("cp")
    if path is None:
        return None
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, env=_cp_env(), timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return path if "GNU coreutils" in out else None


def _cp_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "POSIXLY_CORRECT"}
    env["LC_ALL"] = "C"
    return env


def copy_tree(src: Path, dest: Path) -> None:
    """Copy the snapshot tree `src` to `dest` (which must not exist) as shutil.copytree(symlinks=True)
    does: directories, including empty ones; regular files with their content, mode and times, each
    path its own file; symlinks as symlinks, never followed, with their times; xattrs where they can
    be set. A snapshot holds nothing else (every way one is made leaves out sockets, FIFOs and devices).

    GNU cp does it where it is the machine's cp: 1.6x (ext4) to 2x (tmpfs) faster than copytree for
    one workspace, and more for several made at once, as cp holds no GIL (docs/benchmarks.md); near
    free where reflinks are. Elsewhere, or when cp fails (the partial copy removed), shutil.copytree
    does it, and the debug log says which. Either way every file's ctime is at or before the copy's
    end, which `changed_paths` relies on."""
    cp = _gnu_cp()
    if cp is None:
        log.debug("copying %s with shutil.copytree: this machine's cp is not GNU cp", src)
    elif src in _CP_FAILED:
        log.debug("copying %s with shutil.copytree: GNU cp failed on it before", src)
    else:
        log.debug("copying %s with GNU cp", src)
        why = _run_cp([cp, *_CP_FLAGS, "-T", "--", src, dest])
        if why is None:
            return
        if not dest.parent.is_dir():  # removed under it: a cancelled create, nothing left to copy to
            raise FileNotFoundError(f"{dest.parent} was removed while {src} was copied")
        _CP_FAILED.add(src)
        log.warning("GNU cp could not copy %s (%s); copying with shutil.copytree", src, why)
        remove_tree(dest)
    shutil.copytree(src, dest, symlinks=True)


def _run_cp(argv: list[str | Path]) -> str | None:
    """Run cp; None when it succeeds, else its exit status and first errors."""
    done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, env=_cp_env())
    if done.returncode == 0:
        return None
    return f"exit {done.returncode}: {done.stderr.decode(errors='replace').strip()[:2000]}"
