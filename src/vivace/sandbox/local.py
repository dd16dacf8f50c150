"""What the two in-process backends share: the workspace object, state layout and sweeping.

State directory layout (one per machine, shared by every process):

    snapshots/<key>/            materialised base snapshots (see snapshot.py)
    owners/<pid>-<start>-<nonce>/<ws>/  live workspaces of one backend instance
    owners/<pid>-<start>-<nonce>/uses-<key>  a snapshot it handed out and not yet released, or with
                                             a live workspace: never evicted meanwhile
    etc/                        the sandbox's synthetic /etc files (isolated backend)

A process that dies without cleaning up (SIGKILL, OOM, power loss of a container) leaves
its `owners/` entry behind; the next backend to start on the machine sees that the owner is
dead (its pid is gone or belongs to a newer process) and removes everything it left:
processes, mounts, cgroups and directories.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import errno
import itertools
import logging
import os
import secrets
import shutil
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from vivace.config import SandboxConfig
from vivace.sandbox.base import (
    DirEntry,
    ExecResult,
    FileStat,
    LatencyStats,
    SandboxError,
    TextFilesMixin,
    WorkspaceClosedError,
    check_env,
)
from vivace.sandbox.diff import tree_diff
from vivace.sandbox.linux import mounts_under, process_start_time, umount
from vivace.sandbox.paths import MAX_READ_BYTES, ConfinedFS, OpenFile, rmtree_at
from vivace.sandbox.snapshot import CLAIM_PREFIX, Snapshot, SnapshotSource, checkout_prefix, claim, evict, materialize

log = logging.getLogger(__name__)

T = TypeVar("T")

CLOSE_GRACE_S = 5.0  # how long close() waits for execs in flight (a cancelled one ends in milliseconds)


@dataclass
class SandboxMetrics:
    created: int = 0
    destroyed: int = 0
    execs: int = 0
    create: LatencyStats = field(default_factory=LatencyStats)
    exec: LatencyStats = field(default_factory=LatencyStats)
    destroy: LatencyStats = field(default_factory=LatencyStats)

    def to_dict(self) -> dict[str, Any]:
        return {
            "live": self.created - self.destroyed,
            "created": self.created,
            "destroyed": self.destroyed,
            "execs": self.execs,
            "create_latency": self.create.summary(),
            "exec_latency": self.exec.summary(),
            "destroy_latency": self.destroy.summary(),
        }


def owner_id() -> str:
    """`<pid>-<start time>-<nonce>`: unique per backend instance, even several in one process."""
    pid = os.getpid()
    return f"{pid}-{process_start_time(pid)}-{secrets.token_hex(3)}"


def owner_alive(owner: str) -> bool:
    """Whether the process that created `owner` still runs (a reused pid has another start time)."""
    pid_s, _, rest = owner.partition("-")
    try:
        pid = int(pid_s)
    except ValueError:
        return False
    return str(process_start_time(pid)) == rest.partition("-")[0]


def remove_tree(path: Path) -> bool:
    """Remove `path` and everything under it, at any depth (paths.rmtree_at: never following a link,
    never entering another filesystem, such as a mount left behind); whether it is gone. Never
    raises: what it cannot remove is logged with its path and left, for a sweep to try again, rather
    than stop a backend from starting or a workspace from closing. An immutable or append-only file
    (`chattr +i`, which a command run as root can set) is made removable with `chattr -R -ia` and the
    removal tried once more. Mounts under `path` are detached first (see `_unmount_under`)."""
    if not _unmount_under(path):
        return False
    for attempt in (1, 2):
        try:
            parent = os.open(path.parent, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                rmtree_at(parent, path.name, one_file_system=True)
            finally:
                os.close(parent)
            return True
        except FileNotFoundError:
            if not os.path.lexists(path):  # nothing there (else a file vanished under the walk: try again)
                return True
            error: BaseException = FileNotFoundError(f"{path}: changed while it was removed")
        except Exception as e:  # whatever it is, the caller goes on
            error = e
        vanished = isinstance(error, FileNotFoundError)
        if attempt == 1 and not (vanished or isinstance(error, PermissionError) and _clear_immutable(path)):
            break
    log.warning("could not remove %s: %s: %s", path, type(error).__name__, error)
    return False


def _unmount_under(path: Path) -> bool:
    """Detach every mount at or under `path`; whether none is left. A command run as root by the plain
    backend can bind a directory of the host there, and removing through a bind mount of a directory on
    the same filesystem deleted that directory's files (one_file_system cannot tell such a mount apart)."""
    try:
        points = mounts_under(Path(os.path.realpath(path)))
    except OSError:  # no /proc/self/mountinfo: no mounts to mind
        return True
    for point in points:
        try:
            umount(point)
        except OSError as e:
            log.warning("could not remove %s: %s is mounted there and cannot be detached (%s)", path, point, e)
            return False
    return True


def _clear_immutable(path: Path) -> bool:
    """`chattr -R -ia path`; whether it ran. Its exit status says nothing: it fails on each symlink
    (which it never follows) and each file whose filesystem has no such flags, and goes on."""
    chattr = shutil.which("chattr")
    if chattr is None:
        return False
    try:
        subprocess.run([chattr, "-R", "-ia", "--", str(path)], capture_output=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return False
    return True


class _Claim:
    """Who closes a thread job's descriptors: the job, once it starts, or the event loop, when the job was
    cancelled before it started; the first to take it, across threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by: str | None = None

    def take(self, who: str) -> bool:
        with self._lock:
            self._by = self._by or who
            return self._by == who


def _close_opened(fut: asyncio.Future[OpenFile]) -> None:
    if not fut.cancelled() and fut.exception() is None:
        os.close(fut.result().fd)


def toolchain_dirs(config: SandboxConfig) -> list[Path]:
    """The directories mounted into the sandbox for tools: configured, or this Python's env."""
    dirs = config.toolchain or [Path(sys.prefix), Path(sys.base_prefix)]
    out: list[Path] = []
    for d in dirs:
        real = Path(d).expanduser().resolve()
        if not real.is_dir():
            raise ValueError(f"sandbox.toolchain: {d} is not a directory")
        if real not in out:
            out.append(real)
    return out


def command_env(toolchain: list[Path], home: str, extra: dict[str, str]) -> dict[str, str]:
    """The complete environment of a command: nothing from the host leaks in."""
    path = [str(d / "bin") for d in toolchain if (d / "bin").is_dir()]
    env = {
        "PATH": ":".join(path + ["/usr/local/bin", "/usr/bin", "/bin"]),
        "HOME": home,
        "TMPDIR": "/tmp" if home == "/tmp" else home,
        "LANG": "C.UTF-8",
        "TERM": "dumb",
        "USER": "sandbox",
        # Python checks cached bytecode by source mtime (1 s) and size: an edit of the same size in
        # the same second as a test run would otherwise run the old code.
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    venvs = [d for d in toolchain if (d / "pyvenv.cfg").exists()]
    if venvs:
        env["VIRTUAL_ENV"] = str(venvs[0])
    env.update(check_env(extra))
    return env


@dataclass(frozen=True)
class Trees:
    """A workspace's directories as one call in a worker thread reaches them: held open, by descriptor."""

    root: Path
    owner: tuple[int, int] | None  # who the files written belong to
    upper: Path | None = None  # the isolated backend's overlay upper layer, when asked for

    @property
    def fs(self) -> ConfinedFS:
        return ConfinedFS(self.root, self.owner)


class LocalWorkspace(TextFilesMixin):
    """A workspace whose files are a directory on this machine; commands go to its backend."""

    def __init__(
        self, backend: LocalBackend, ws_id: str, snapshot: Snapshot, root: Path, owner: tuple[int, int] | None
    ):
        self.id = ws_id
        self.backend = backend
        self.snapshot = snapshot
        self.root = root  # the tree the agent sees (overlay merge or plain copy)
        self.owner = owner  # who the files it writes belong to
        self.closed = False
        self._destroy_lock = asyncio.Lock()
        self._running = 0  # execs in flight
        self._idle = asyncio.Event()
        self._idle.set()
        self._destroying = False  # close's grace ended: what still runs is killed

    def _check(self) -> None:
        if self.closed:
            raise WorkspaceClosedError(f"workspace {self.id} is closed")

    async def exec(
        self, cmd: str | list[str], timeout: float | None = None, env: dict[str, str] | None = None
    ) -> ExecResult:
        self._check()
        argv = ["/bin/bash", "-c", cmd] if isinstance(cmd, str) else list(cmd)
        if not argv:
            raise ValueError("empty command")
        t0 = time.perf_counter()
        self._running += 1
        self._idle.clear()
        try:
            result = await self.backend.run(self, argv, timeout or self.backend.config.timeout_s, env or {})
        finally:
            self._running -= 1
            if not self._running:
                self.backend.commands_done(self)
                self._idle.set()
        if self._destroying and result.exit_code >= 128 and not result.timed_out:
            # Killed by the close's teardown after its grace, not by anything the command did: an
            # exit status 137 would read as the command's own crash (or an OOM kill).
            raise WorkspaceClosedError(f"workspace {self.id} was closed during the call; the command was killed")
        self.backend.metrics.execs += 1
        self.backend.metrics.exec.add(time.perf_counter() - t0)
        return result

    def _in_thread(self, fn: Callable[[Trees], T], upper: bool = False) -> asyncio.Future[T]:
        """`fn(trees)` in a worker thread, over this workspace's directories held open by
        descriptor from here until the thread ends (`Trees`; `upper`: the isolated backend's upper layer
        too). An isolated root names a mount by number (/proc/self/fd/N): a thread re-opening it by that
        number after close, as a long diff did, reached whichever mount took the number next, another
        workspace's, and a write landed there. Held open, the tree stays this workspace's; a call that
        ends after a close fails as closed (a plain backend's copy is removed under it)."""
        self._check()
        dirs = [self.root]
        if upper and (upper_dir := self.backend.upper_dir(self)) is not None:
            dirs.append(upper_dir)
        fds: list[int] = []
        try:
            for d in dirs:
                fds.append(os.open(d, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC))
        except BaseException:
            for fd in fds:
                os.close(fd)
            raise
        held = [Path(f"/proc/self/fd/{fd}") for fd in fds]
        trees = Trees(held[0], self.owner, held[1] if len(held) > 1 else None)
        claim = _Claim()

        def run() -> T:
            if not claim.take("thread"):  # cancelled before a thread got to it: the descriptors are closed
                raise asyncio.CancelledError
            try:
                result = fn(trees)
            except OSError as e:
                if self.closed:
                    raise WorkspaceClosedError(f"workspace {self.id} was closed during the call") from e
                raise
            finally:
                for fd in fds:  # only now: the thread outlives an await that was cancelled
                    os.close(fd)
            if self.closed:  # what it read may be half gone (a plain copy is removed): no answer, not a wrong one
                raise WorkspaceClosedError(f"workspace {self.id} was closed during the call")
            return result

        def unstarted(fut: asyncio.Future) -> None:
            # Cancelled while queued (every pool thread busy), run() never runs and would never close them:
            # each leaked descriptor of an isolated root kept its closed workspace's tmpfs in memory.
            if fut.cancelled() and claim.take("loop"):
                for fd in fds:
                    os.close(fd)

        job = asyncio.get_running_loop().run_in_executor(None, run)
        job.add_done_callback(unstarted)
        return job

    async def read_bytes(self, path: str) -> bytes:
        return await self._in_thread(lambda t: t.fs.read_bytes(path))

    async def open_read(self, path: str, max_bytes: int = MAX_READ_BYTES, head_bytes: int = 0) -> OpenFile:
        """The file opened to be read in pieces, checked as `read_bytes` checks it, with its first
        `head_bytes` (`ConfinedFS.open_regular`); the caller closes the descriptor."""
        opening = self._in_thread(lambda t: t.fs.open_regular(path, max_bytes, head_bytes))
        try:
            return await asyncio.shield(opening)
        except asyncio.CancelledError:
            opening.add_done_callback(_close_opened)  # nobody else will close what the thread still opens
            raise

    async def write_bytes(self, path: str, data: bytes) -> None:
        await self._in_thread(lambda t: t.fs.write_bytes(path, data))

    async def list(self, path: str = ".") -> list[DirEntry]:
        return await self._in_thread(lambda t: t.fs.list(path))

    async def remove(self, path: str, recursive: bool = False) -> None:
        await self._in_thread(lambda t: t.fs.remove(path, recursive))

    async def stat(self, path: str) -> FileStat:
        return await self._in_thread(lambda t: t.fs.stat(path))

    async def realpath(self, path: str) -> str:
        """`path` with every symlink resolved, confined (PathEscapeError for one leading outside)."""
        return await self._in_thread(lambda t: t.fs.realpath(path))

    async def readlink(self, path: str) -> str:
        """Where the symlink `path` points, as written: what applying a diff of a link needs, which
        only a workspace on this machine can say (the Workspace protocol has no call for it)."""
        return await self._in_thread(lambda t: t.fs.readlink(path))

    async def diff(self, max_chars: int | None = None) -> str:
        """The diff against the base snapshot (TooLarge past `max_chars`)."""

        def compute(trees: Trees) -> str:
            candidates = self.backend.changed_paths(self, trees)
            source = self.snapshot.source
            wanted = source.enclosing_ignore_rules and source.resolved_kind() == "dir"
            outer = checkout_prefix(Path(source.path)) if wanted else None
            ignore = self.backend.config.diff_ignore
            return tree_diff(self.snapshot.root, trees.root, candidates, ignore, outer, max_chars)

        return await self._in_thread(compute, upper=True)

    async def close(self) -> None:
        async with self._destroy_lock:
            if self.closed:
                return
            self.closed = True
            # A cancelled exec still kills and reaps its process, and unmounts what it attached: wait
            # for it (a caller such as gather closes on the first cancelled task, before the others),
            # or the workspace is removed under it and the directories it still uses are left behind.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._idle.wait(), CLOSE_GRACE_S)
            t0 = time.perf_counter()
            self._destroying = True
            await self.backend.destroy(self)
            self.backend.metrics.destroyed += 1
            self.backend.metrics.destroy.add(time.perf_counter() - t0)


class LocalBackend(abc.ABC):
    """Common lifecycle of the isolated and plain backends (subclasses fill the abstract parts)."""

    name = "local"
    isolated = False
    fallback: str | None = None  # why `auto` could not isolate, on the plain backend it fell back to
    file_owner: tuple[int, int] | None = None

    def __init__(self, config: SandboxConfig):
        self.config = config
        self.state = Path(config.state_dir).expanduser().absolute()  # bwrap resolves bind sources from elsewhere
        self.owner = owner_id()
        self.owner_dir = self.state / "owners" / self.owner
        self.metrics = SandboxMetrics()
        self.live: dict[str, LocalWorkspace] = {}
        self._ids = itertools.count()
        # Uses of each snapshot: claims handed out by `snapshot`/`hold` and not yet released, and live
        # workspaces. Its `uses-<key>` file exists while the count is above zero.
        self._claims: Counter[str] = Counter()
        self._claims_lock = threading.Lock()
        for d in (self.state, self.state / "owners", self.state / "snapshots"):
            d.mkdir(parents=True, exist_ok=True)
        os.chmod(self.state / "owners", 0o700)
        os.chmod(self.state / "snapshots", 0o700)
        self.sweep()
        self.owner_dir.mkdir(exist_ok=True)

    # -- snapshots and workspaces ----------------------------------------------------------
    def snapshot(self, source: SnapshotSource | str) -> Snapshot:
        """The cached snapshot of `source`, claimed: the cache does not evict it until `release` (or
        the backend's end), nor while a workspace of it is alive. A long-lived caller making snapshots
        of many sources (RL over many repositories, the environment server) releases each when done,
        or the cache can never evict any of them."""
        if isinstance(source, str):
            source = SnapshotSource(path=source)
        try:
            snap = materialize(source, self.state / "snapshots", self.file_owner, holder=self.owner_dir,
                               exclude=self.state)  # fmt: skip
        except RecursionError:  # os.walk and shutil recurse once per directory level (Python < 3.12)
            raise SandboxError(f"snapshot source {source.path!r} holds directories nested too deep to copy (about "
                               f"{sys.getrecursionlimit()} levels or more); remove that tree from the directory, "
                               "or snapshot a git commit or a tarball without it") from None  # fmt: skip
        except OSError as e:
            if e.errno != errno.ENAMETOOLONG:
                raise
            raise SandboxError(f"snapshot source {source.path!r} holds a path too long for this system ({e.filename!r:.120}"
                               "...); shorten or remove it, or snapshot a git commit or a tarball without it") from None  # fmt: skip
        self.hold(snap)
        if not snap.built:  # the cache grows only when a snapshot is built: nothing to evict
            return snap
        try:
            evicted = evict(self.state / "snapshots", (self.state / "owners").iterdir())
        except OSError as e:  # a full cache must not stop the work it caches
            log.warning("could not evict old snapshots from %s: %s", self.state / "snapshots", e)
        else:
            if evicted:
                log.info("evicted %d least recently used snapshots from the cache", len(evicted))
        return snap

    def hold(self, snapshot: Snapshot) -> None:
        """One more claim on `snapshot`, for `release`."""
        with self._claims_lock:
            self._claims[snapshot.key] += 1
            if self._claims[snapshot.key] == 1:  # a last release may have removed the file `materialize` made
                claim(self.state / "snapshots", self.owner_dir, snapshot.key)

    def release(self, snapshot: Snapshot) -> None:
        """Give back one claim that `snapshot` or `hold` took. The last one gone (and no workspace of
        it alive), the cache may evict it once it has been idle long enough."""
        with self._claims_lock:
            left = self._claims[snapshot.key] - 1
            if left < 0:
                raise RuntimeError(f"snapshot {snapshot.key} released more often than it was claimed")
            if left:
                self._claims[snapshot.key] = left
                return
            del self._claims[snapshot.key]
            (self.owner_dir / f"{CLAIM_PREFIX}{snapshot.key}").unlink(missing_ok=True)

    async def create(self, snapshot: Snapshot) -> LocalWorkspace:
        ws_id = f"w{next(self._ids)}"
        t0 = time.perf_counter()
        self.hold(snapshot)  # the workspace's own: its tree reads the snapshot until it is destroyed
        try:
            root = await self._create(ws_id, snapshot, self.owner_dir / ws_id)
        except BaseException:
            self.release(snapshot)
            raise
        ws = LocalWorkspace(self, ws_id, snapshot, root, self.file_owner)
        self.live[ws_id] = ws
        self.metrics.created += 1
        self.metrics.create.add(time.perf_counter() - t0)
        return ws

    async def destroy(self, ws: LocalWorkspace) -> None:
        self.live.pop(ws.id, None)
        await asyncio.to_thread(self._destroy, ws.id, self.owner_dir / ws.id)
        self.release(ws.snapshot)  # not when it failed: what is left of the tree may still read the snapshot

    async def aclose(self) -> None:
        """Destroy every workspace this backend still holds, all at once: each close may wait up to
        CLOSE_GRACE_S for a command in flight, and one after another that was 5 s per busy workspace."""
        closed = await asyncio.gather(*(ws.close() for ws in list(self.live.values())), return_exceptions=True)
        for error in (e for e in closed if isinstance(e, BaseException)):
            raise error  # after every close has ended: none still runs while the caller goes on
        remove_tree(self.owner_dir)

    def sweep(self) -> int:
        """Remove what dead owners left behind; returns how many owners were swept."""
        swept = 0
        for d in (self.state / "owners").iterdir():
            if d.name != self.owner and not owner_alive(d.name):
                log.warning("sweeping workspaces left by dead process %s", d.name)
                try:
                    self._sweep_owner(d)
                except Exception:  # what a dead owner left must not stop this backend
                    log.exception("could not sweep %s; left for a later backend to try again", d)
                    continue
                swept += 1
        return swept

    # -- backend specifics -----------------------------------------------------------------
    @abc.abstractmethod
    async def _create(self, ws_id: str, snapshot: Snapshot, ws_dir: Path) -> Path: ...

    @abc.abstractmethod
    def _destroy(self, ws_id: str, ws_dir: Path) -> None: ...

    @abc.abstractmethod
    def _sweep_owner(self, owner_dir: Path) -> None: ...

    @abc.abstractmethod
    async def run(self, ws: LocalWorkspace, argv: list[str], timeout: float, env: dict[str, str]) -> ExecResult: ...

    @abc.abstractmethod
    def changed_paths(self, ws: LocalWorkspace, trees: Trees) -> list[str]: ...

    def upper_dir(self, ws: LocalWorkspace) -> Path | None:
        """The directory holding exactly what `ws` changed, where the backend keeps one."""
        return None

    def commands_done(self, ws: LocalWorkspace) -> None:
        """None of `ws`'s commands runs any more: what they left running ends here (the isolated
        backend's end with each command's PID namespace, so it has nothing to do)."""
        return None

    def describe(self) -> dict[str, Any]:
        return {"backend": self.name, "isolated": self.isolated, "state_dir": str(self.state)}
