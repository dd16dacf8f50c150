"""Thin wrappers over the Linux primitives the isolated backend needs: mounts and cgroups.

Mounts go through libc directly (a `mount` process per workspace would cost more than
the workspace itself). Workspace filesystems are made with the new mount API as *detached*
mounts (fsopen/fsmount): they exist only as file descriptors, never in the host's mount
table. That matters because every sandboxed command starts in a copy of the host's mount
namespace: with 500 workspaces mounted there, each command paid ~80 ms copying and
discarding 1,000 mounts. Detached mounts also vanish by themselves when their owner
process dies (its descriptors close). Cgroups work on both the unified (v2) hierarchy and the legacy (v1)
per-controller hierarchies, because both are still common on hosts and CI runners.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import os
import re
import signal
import time
from pathlib import Path

MS_NOSUID = 2
MS_NODEV = 4
MNT_DETACH = 2

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def mount(source: str, target: str | Path, fstype: str, flags: int = 0, data: str = "") -> None:
    if _libc.mount(source.encode(), str(target).encode(), fstype.encode(), flags, data.encode()) != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"mount {fstype} on {target}: {os.strerror(e)}")


def umount(target: str | Path) -> None:
    """Lazy unmount: detaches even if something still holds the mount busy."""
    if _libc.umount2(str(target).encode(), MNT_DETACH) != 0:
        e = ctypes.get_errno()
        if e not in (errno.EINVAL, errno.ENOENT):  # not a mount point / already gone
            raise OSError(e, f"umount {target}: {os.strerror(e)}")


_SYS_OPEN_TREE, _SYS_MOVE_MOUNT, _SYS_FSOPEN, _SYS_FSCONFIG, _SYS_FSMOUNT = 428, 429, 430, 431, 432  # x86_64, arm64
_FSCONFIG_SET_STRING, _FSCONFIG_CMD_CREATE = 1, 6
_MOUNT_ATTR_NOSUID, _MOUNT_ATTR_NODEV = 0x2, 0x4
_OPEN_TREE_CLONE, _OPEN_TREE_CLOEXEC, _AT_EMPTY_PATH, _AT_FDCWD = 1, 0o2000000, 0x1000, -100
_MOVE_MOUNT_F_EMPTY_PATH = 0x4


def _syscall(number: int, *args) -> int:
    result = _libc.syscall(number, *args)
    if result < 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
    return result


def detached_mount(fstype: str, options: dict[str, str]) -> int:
    """A new nosuid,nodev filesystem as a detached mount; returns its (close-on-exec) fd."""
    fs_fd = _syscall(_SYS_FSOPEN, fstype.encode(), 1)  # FSOPEN_CLOEXEC
    try:
        for key, value in options.items():
            try:
                _syscall(_SYS_FSCONFIG, fs_fd, _FSCONFIG_SET_STRING, key.encode(), value.encode(), 0)
            except OSError as e:
                raise OSError(e.errno, f"{fstype}: option {key}={value}: {e.strerror}") from None
        _syscall(_SYS_FSCONFIG, fs_fd, _FSCONFIG_CMD_CREATE, None, None, 0)
        return _syscall(_SYS_FSMOUNT, fs_fd, 1, _MOUNT_ATTR_NOSUID | _MOUNT_ATTR_NODEV)  # FSMOUNT_CLOEXEC
    finally:
        os.close(fs_fd)


def attach_clone(mount_fd: int, target: str | Path) -> None:
    """Bind a clone of the (possibly detached) mount `mount_fd` onto `target`."""
    clone = _syscall(_SYS_OPEN_TREE, mount_fd, b"", _OPEN_TREE_CLONE | _OPEN_TREE_CLOEXEC | _AT_EMPTY_PATH)
    try:
        _syscall(_SYS_MOVE_MOUNT, clone, b"", _AT_FDCWD, str(target).encode(), _MOVE_MOUNT_F_EMPTY_PATH)
    finally:
        os.close(clone)


_OCTAL = re.compile(r"\\([0-7]{3})")


def mounts_under(prefix: Path) -> list[str]:
    """Mount points at or below `prefix`, deepest first (the order to unmount them)."""
    prefix_s = str(prefix).rstrip("/")
    found = []
    with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as f:
        for line in f:
            point = _OCTAL.sub(lambda m: chr(int(m[1], 8)), line.split()[4])  # \040 is a space, \012 a newline
            if point == prefix_s or point.startswith(prefix_s + "/"):
                found.append(point)
    return sorted(found, key=lambda p: p.count("/"), reverse=True)


def process_start_time(pid: int) -> int | None:
    """The kernel's start time of `pid` (clock ticks since boot), or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


def kill_processes_mentioning(text: str) -> int:
    """SIGKILL every process whose command line contains `text`; returns how many."""
    needle = text.encode()
    killed = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if needle not in f.read():
                    continue
            os.kill(int(entry), signal.SIGKILL)
            killed += 1
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
    return killed


class Cgroups:
    """Per-workspace cgroups with memory, pids and cpu limits under a `vivace` parent group."""

    CONTROLLERS = ("memory", "pids", "cpu")

    def __init__(self, root: str = "/sys/fs/cgroup", parent: str = "vivace"):
        root_p = Path(root)
        self.v2 = (root_p / "cgroup.controllers").exists()
        if self.v2:
            self.parents = {"unified": root_p / parent}
        else:
            self.parents = {}
            for ctrl in self.CONTROLLERS:
                mnt = _v1_mount(ctrl)
                if mnt is None:
                    raise OSError(f"cgroup v1 controller {ctrl!r} is not mounted")
                self.parents[ctrl] = mnt / parent
        self._setup_parents(root_p)

    def _setup_parents(self, root: Path) -> None:
        for p in self.parents.values():
            p.mkdir(exist_ok=True)
        if self.v2:
            want = " ".join(f"+{c}" for c in self.CONTROLLERS)
            for d in (root, self.parents["unified"]):
                (d / "cgroup.subtree_control").write_text(want)

    def dirs(self, name: str) -> list[Path]:
        return [p / name for p in self.parents.values()]

    def procs_files(self, name: str) -> list[Path]:
        return [d / "cgroup.procs" for d in self.dirs(name)]

    def create(self, name: str, memory_bytes: int, pids_max: int, cpus: float) -> None:
        for d in self.dirs(name):
            d.mkdir(exist_ok=True)
        period = 100_000
        quota = max(1000, int(cpus * period))
        if self.v2:
            d = self.parents["unified"] / name
            (d / "memory.max").write_text(str(memory_bytes))
            if (d / "memory.swap.max").exists():
                (d / "memory.swap.max").write_text("0")
            (d / "pids.max").write_text(str(pids_max))
            (d / "cpu.max").write_text(f"{quota} {period}")
        else:
            mem = self.parents["memory"] / name
            (mem / "memory.limit_in_bytes").write_text(str(memory_bytes))
            if (mem / "memory.memsw.limit_in_bytes").exists():
                (mem / "memory.memsw.limit_in_bytes").write_text(str(memory_bytes))
            (self.parents["pids"] / name / "pids.max").write_text(str(pids_max))
            cpu = self.parents["cpu"] / name
            (cpu / "cpu.cfs_period_us").write_text(str(period))
            (cpu / "cpu.cfs_quota_us").write_text(str(quota))

    def oom_kills(self, name: str) -> int:
        f = (
            (self.parents["unified"] / name / "memory.events")
            if self.v2
            else (self.parents["memory"] / name / "memory.oom_control")
        )
        try:
            for line in f.read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        except OSError:
            pass
        return 0

    def _in_namespace(self, name: str, pid_namespace: str) -> set[int]:
        out = set()
        for pid in self.pids(name):
            with contextlib.suppress(OSError):  # gone meanwhile
                if os.readlink(f"/proc/{pid}/ns/pid") == pid_namespace:
                    out.add(pid)
        return out

    def pids(self, name: str) -> set[int]:
        out: set[int] = set()
        for f in self.procs_files(name):
            try:
                out.update(int(x) for x in f.read_text().split())
            except OSError:
                pass
        return out

    def kill_all(self, name: str, timeout: float = 5.0, pid_namespace: str | None = None) -> None:
        """SIGKILL every process in the group until it is empty (forks may race the first pass). With
        `pid_namespace` (a /proc/PID/ns/pid link), only the group's processes in that namespace: one
        command's, when several share the group."""
        if pid_namespace is not None:
            deadline = time.monotonic() + timeout
            while (pids := self._in_namespace(name, pid_namespace)) and time.monotonic() < deadline:
                for pid in pids:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                time.sleep(0.005)
            return
        if self.v2:
            kill_file = self.parents["unified"] / name / "cgroup.kill"
            if kill_file.exists():
                try:
                    kill_file.write_text("1")
                except OSError:
                    pass
        deadline = time.monotonic() + timeout
        while (pids := self.pids(name)) and time.monotonic() < deadline:
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.005)

    def remove(self, name: str) -> None:
        self.kill_all(name)
        for d in self.dirs(name):
            for _ in range(100):
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError as e:
                    if e.errno != errno.EBUSY:
                        raise
                    time.sleep(0.01)  # dying processes leave the group a moment later

    def names(self) -> set[str]:
        out: set[str] = set()
        for p in self.parents.values():
            if p.exists():
                out.update(c.name for c in p.iterdir() if c.is_dir())
        return out


def _v1_mount(controller: str) -> Path | None:
    with open("/proc/self/mounts") as f:
        for line in f:
            _, point, fstype, opts = line.split()[:4]
            if fstype == "cgroup" and controller in opts.split(","):
                return Path(point)
    return None
