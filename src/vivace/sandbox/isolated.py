"""The isolated backend: overlayfs workspaces, commands in bubblewrap namespaces, cgroup limits.

Each workspace is a size-capped tmpfs holding an overlayfs upper layer over the cached
snapshot, so creating one costs two mounts whatever the repository's size, and a command
that fills the disk fills only its own quota. Both are detached mounts (linux.py): held
by file descriptors, attached to the host only for the instant a command's sandbox is
cloned, so the host's mount table does not grow with the number of workspaces. Each
command runs as:

    bwrap (new mount, PID, network, IPC, UTS and cgroup namespaces; minimal read-only
    root) -> setpriv (drops to an unprivileged uid, no capabilities, no_new_privs) ->
    env -i (the command's environment, set only now: nothing the caller chose reaches the
    privileged stages) -> the command

under a seccomp filter (seccomp.py) that denies the kernel keyring, which the kernel keeps
per uid and every sandbox shares the uid of.

bwrap reports its sandbox child's pid on an info pipe and then waits on a block pipe; we
move the child into the workspace's cgroups before releasing it, so not one instruction of
the command runs outside its limits (and no extra process is spawned to join the group).

The network namespace has only loopback; the root holds read-only /usr (and the /bin,
/lib links), a few synthetic /etc files, the configured toolchain, a private /tmp and the
workspace at /workspace. When the command exits, its PID namespace dies with it, so no
background process survives one `exec`. Requires root, bubblewrap, setpriv, overlayfs and
writable cgroups; `probe()` says which is missing.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import json
import logging
import os
import resource
import shutil
import signal
import subprocess
from pathlib import Path

from vivace.config import SandboxConfig
from vivace.sandbox.base import BackendUnavailable, ExecResult
from vivace.sandbox.diff import walk_files, walk_tree
from vivace.sandbox.linux import (
    Cgroups,
    attach_clone,
    detached_mount,
    kill_processes_mentioning,
    mounts_under,
    umount,
)
from vivace.sandbox.local import (
    LocalBackend,
    LocalWorkspace,
    Trees,
    command_env,
    owner_alive,
    remove_tree,
    toolchain_dirs,
)
from vivace.sandbox.paths import WORKSPACE_MOUNT
from vivace.sandbox.process import kill_process, run_capped
from vivace.sandbox.seccomp import keyring_filter
from vivace.sandbox.snapshot import Snapshot, build_once, claim, evict_replaced

log = logging.getLogger(__name__)

# Host files copied into the sandbox's /etc (when they exist): dynamic linker, TLS roots, tz.
_ETC_PASSTHROUGH = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "alternatives", "ssl", "ca-certificates", "localtime")


def probe() -> str | None:
    """None when the isolated backend can run here, else the reason it cannot."""
    if os.geteuid() != 0:
        return "the isolated backend needs root (for overlayfs mounts and cgroups)"
    for tool in ("bwrap", "setpriv"):
        if shutil.which(tool) is None:
            hint = "apt-get install bubblewrap" if tool == "bwrap" else "install util-linux"
            return f"{tool} is not installed ({hint})"
    with open("/proc/filesystems") as f:
        if "overlay" not in f.read():
            return "the kernel has no overlayfs (modprobe overlay)"
    try:
        os.close(detached_mount("tmpfs", {"size": "1m"}))
    except OSError as e:
        return f"the kernel lacks the new mount API (fsopen/fsmount, Linux >= 5.2): {e}"
    try:
        Cgroups()
    except OSError as e:
        return f"cgroups are not usable: {e}"
    return None


class IsolatedBackend(LocalBackend):
    name = "isolated"
    isolated = True

    def __init__(self, config: SandboxConfig):
        reason = probe()
        if reason:
            raise BackendUnavailable(f"isolated sandbox unavailable: {reason}")
        self.file_owner = (config.sandbox_uid, config.sandbox_gid)
        self.cgroups = Cgroups()
        self._mount_fds: dict[str, list[int]] = {}  # ws id -> [tmpfs fd, overlay fd]
        self._attach_ids = itertools.count()
        self._attach_points: list[Path] = []  # unmounted mount points, ready for reuse
        super().__init__(config)
        # Two descriptors per live workspace: 500 workspaces need more than the usual 1024.
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != resource.RLIM_INFINITY and (hard == resource.RLIM_INFINITY or soft < hard):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        self.attach_per_exec = self._can_attach_detached()
        self.toolchain = toolchain_dirs(config)
        self._bwrap_prefix = self._static_bwrap_args()
        # By their paths: bwrap finds the next program through its environment's PATH.
        self._setpriv = shutil.which("setpriv") or "setpriv"
        self._env = shutil.which("env") or "/usr/bin/env"
        self._seccomp = keyring_filter()
        if self._seccomp is None:
            log.warning("no seccomp filter for this architecture: sandboxes share the kernel keyring of their uid")
        self._trial_run()

    def _can_attach_detached(self) -> bool:
        """Whether this kernel can bind a clone of a detached mount (Linux >= 6.15 or so).
        If so, a workspace is attached to the host only while a command starts; if not, it
        stays attached, and each command's start costs grow with the number of workspaces."""
        point = self.owner_dir / "probe"
        point.mkdir(exist_ok=True)
        fd = detached_mount("tmpfs", {"size": "1m"})
        try:
            attach_clone(fd, point)
            umount(point)
            return True
        except OSError:
            log.warning("kernel cannot attach detached mounts; command start-up will grow with live workspaces")
            return False
        finally:
            os.close(fd)
            point.rmdir()

    # -- command line ------------------------------------------------------------------------
    def _build_etc(self) -> Path:
        """The sandbox's /etc: synthetic identity files plus copies of the few host files
        programs need, bound with one mount (a bind per file cost ~2 ms per command). Built
        once per machine and content (copying /etc/ssl takes most of a second); a copy of older
        content is removed once no live backend claims it."""
        uid, gid = self.config.sandbox_uid, self.config.sandbox_gid
        files = {
            "passwd": f"root:x:0:0:root:/root:/bin/sh\nsandbox:x:{uid}:{gid}:sandbox:/tmp:/bin/sh\n",
            "group": f"root:x:0:\nsandbox:x:{gid}:\n",
            "hosts": "127.0.0.1 localhost sandbox\n::1 localhost\n",
            "nsswitch.conf": "passwd: files\ngroup: files\nhosts: files\n",
            "hostname": "sandbox\n",
        }
        h = hashlib.sha256(repr(sorted(files.items())).encode())
        hosts = [Path("/etc") / n for n in _ETC_PASSTHROUGH if os.path.lexists(f"/etc/{n}")]
        for host in hosts:
            for p in [host, *(host.rglob("*") if host.is_dir() and not host.is_symlink() else [])]:
                st = p.lstat()
                # ctime too: a file replaced with its size and mtime kept (cp -p, rsync -a) has a new one.
                h.update(f"{p}\0{st.st_mtime_ns}\0{st.st_size}\0{st.st_ctime_ns}\0{st.st_ino}\n".encode())

        def build(tmp: Path) -> None:
            for name, text in files.items():
                (tmp / name).write_text(text)
            for host in hosts:
                if host.is_dir() and not host.is_symlink():
                    shutil.copytree(host, tmp / host.name, symlinks=True)
                else:
                    shutil.copyfile(host, tmp / host.name)  # follows a link (localtime -> zoneinfo)

        key = f"etc-{h.hexdigest()[:16]}"
        claim(self.state, self.owner_dir, key)  # for this backend's life: every command binds it
        etc = build_once(self.state / key, build)
        try:  # a host whose /etc changed (a container rebuilt) would otherwise keep every old copy
            evict_replaced(self.state, (self.state / "owners").iterdir(), "etc-", key)
        except OSError as e:
            log.warning("could not remove old copies of /etc from %s: %s", self.state, e)
        return etc

    def _static_bwrap_args(self) -> list[str]:
        args = [
            "bwrap", "--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try",
            "--die-with-parent", "--new-session", "--clearenv", "--hostname", "sandbox",
            "--ro-bind", "/usr", "/usr",
        ]  # fmt: skip
        for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
            host = Path("/") / name
            if host.is_symlink():
                args += ["--symlink", os.readlink(host), f"/{name}"]
            elif host.is_dir():
                args += ["--ro-bind", str(host), f"/{name}"]
        args += ["--proc", "/proc", "--dev", "/dev"]
        args += ["--perms", "1777", "--size", str(self.config.tmp_mb << 20), "--tmpfs", "/tmp"]
        args += ["--ro-bind", str(self._build_etc()), "/etc"]
        made = {Path("/"), Path("/usr"), Path("/etc"), Path("/tmp")}
        for d in self.toolchain:
            if d == Path("/usr") or Path("/usr") in d.parents:
                continue
            for parent in reversed(d.parents):
                if parent not in made:
                    args += ["--perms", "0755", "--dir", str(parent)]
                    made.add(parent)
            args += ["--ro-bind", str(d), str(d)]
            made.add(d)
        return args

    def _argv(self, source: Path, argv: list[str], env: dict[str, str], fds: tuple[int, int, int | None]) -> list[str]:
        info_fd, block_fd, seccomp_fd = fds
        bwrap = [*self._bwrap_prefix, "--info-fd", str(info_fd), "--block-fd", str(block_fd)]
        if seccomp_fd is not None:
            bwrap += ["--seccomp", str(seccomp_fd)]
        bwrap += ["--bind", str(source), WORKSPACE_MOUNT, "--chdir", WORKSPACE_MOUNT]
        # setpriv runs as root with every capability until it drops them: a variable the caller chose
        # (LD_PRELOAD, LD_LIBRARY_PATH, GCONV_PATH...) must not reach it, or code from the workspace runs
        # as root there. The command's environment is set by `env -i` once the privileges are gone.
        bwrap += ["--setenv", "PATH", "/usr/bin:/bin"]
        assignments = [f"{key}={value}" for key, value in command_env(self.toolchain, "/tmp", env).items()]
        if "=" in argv[0]:  # env would take it for one more assignment
            argv = ["/bin/sh", "-c", 'exec "$@"', "sh", *argv]
        uid, gid = self.config.sandbox_uid, self.config.sandbox_gid
        drop = [self._setpriv, f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--inh-caps=-all",
                "--bounding-set=-all", "--no-new-privs", "--"]  # fmt: skip
        return [*bwrap, "--", *drop, self._env, "-i", *assignments, *argv]

    def _cg_name(self, ws_id: str, owner: str | None = None) -> str:
        return f"{owner or self.owner}.{ws_id}"

    def _trial_run(self) -> None:
        """Fail at start-up, with bwrap's own message, rather than on the first command."""
        argv = [*self._bwrap_prefix, "--", "/bin/true"]
        proc = subprocess.run(argv, capture_output=True, env={"PATH": "/usr/bin:/bin"}, timeout=30)
        if proc.returncode != 0:
            raise BackendUnavailable(f"isolated sandbox unavailable: bwrap failed: {proc.stderr.decode().strip()}")

    # -- lifecycle -----------------------------------------------------------------------------
    async def _create(self, ws_id: str, snapshot: Snapshot, ws_dir: Path) -> Path:
        uid, gid = self.file_owner
        ws_dir.mkdir()  # holds only mount points for attaching the workspace to commands
        fds: list[int] = []
        self._mount_fds[ws_id] = fds
        try:
            # nr_inodes: without it a flood of empty files fills the memory limit instead and
            # leaves the workspace unable to run even `rm`.
            inodes = max(4096, self.config.disk_mb * 256)
            fds.append(
                detached_mount("tmpfs", {"size": f"{self.config.disk_mb}m", "nr_inodes": str(inodes), "mode": "0700"})
            )
            for sub in ("upper", "work"):
                os.mkdir(sub, 0o755, dir_fd=fds[0])
            os.chown("upper", uid, gid, dir_fd=fds[0])
            layers = {
                "lowerdir": str(snapshot.root),
                "upperdir": f"/proc/self/fd/{fds[0]}/upper",
                "workdir": f"/proc/self/fd/{fds[0]}/work",
                "redirect_dir": "off",  # keeps the upper layer a plain list of changes (see diff)
                "metacopy": "off",
            }
            fds.append(detached_mount("overlay", layers))
            if not self.attach_per_exec:
                (ws_dir / "merged").mkdir()
                attach_clone(fds[1], ws_dir / "merged")
            self.cgroups.create(
                self._cg_name(ws_id), self.config.memory_mb << 20, self.config.pids_max, self.config.cpus
            )
        except BaseException:
            self._destroy(ws_id, ws_dir)
            raise
        return Path(f"/proc/self/fd/{fds[1]}")

    def _new_attach_point(self) -> Path:
        point = self.owner_dir / "attach" / f"a{next(self._attach_ids)}"
        point.mkdir(parents=True)
        return point

    def upper_dir(self, ws: LocalWorkspace) -> Path:
        """The overlay's upper layer: exactly what the workspace changed."""
        return Path(f"/proc/self/fd/{self._mount_fds[ws.id][0]}/upper")

    def _destroy(self, ws_id: str, ws_dir: Path, owner: str | None = None) -> None:
        self.cgroups.remove(self._cg_name(ws_id, owner))
        for point in mounts_under(ws_dir):
            umount(point)
        for fd in self._mount_fds.pop(ws_id, []):
            os.close(fd)  # the last reference to a detached mount: the filesystem goes away
        remove_tree(ws_dir)

    def _sweep_owner(self, owner_dir: Path) -> None:
        owner = owner_dir.name
        prefix = owner + "."
        for name in self.cgroups.names():
            if name.startswith(prefix):
                self.cgroups.remove(name)
        # A sandbox whose owner died before moving it into its cgroup is in no group; its
        # bwrap command line names the workspace directory.
        kill_processes_mentioning(str(owner_dir) + "/")
        for point in mounts_under(owner_dir):
            umount(point)
        remove_tree(owner_dir)

    def sweep(self) -> int:
        swept = super().sweep()
        # Cgroups are machine-wide while state dirs are not: judge them by their owner's
        # liveness (another live process may use another state dir), never by directories.
        for name in self.cgroups.names():
            owner = name.partition(".")[0]
            if owner != self.owner and not owner_alive(owner):
                self.cgroups.remove(name)
        return swept

    # -- commands --------------------------------------------------------------------------
    async def run(self, ws: LocalWorkspace, argv: list[str], timeout: float, env: dict[str, str]) -> ExecResult:
        # bwrap's first fork can fail with EAGAIN when the machine is briefly short of processes
        # (seen under the test suite's load); nothing of the command ran then, so try again rather
        # than hand back bwrap's exit 1, which a caller such as grep would read as its own.
        for delay in (0.05, 0.2, 0.8):
            res = await self._run_once(ws, argv, timeout, env)
            if not _fork_failed(res):
                return res
            log.warning("bwrap could not fork (%s); retrying in %.2f s", res.stderr.strip(), delay)
            await asyncio.sleep(delay)
        return await self._run_once(ws, argv, timeout, env)

    async def _run_once(self, ws: LocalWorkspace, argv: list[str], timeout: float, env: dict[str, str]) -> ExecResult:
        name = self._cg_name(ws.id)
        ooms_before = self.cgroups.oom_kills(name)

        def kill(proc: asyncio.subprocess.Process) -> None:
            # The sandbox (its PID namespace's init, whose death ends the namespace) is bwrap's child.
            # Not yet moved into its cgroup (a cancellation before join_cgroup did), it survives bwrap
            # and would run the command, unconfined, once its block fd closes.
            # Killing that init kills every process of this command (the kernel empties its PID
            # namespace), and only those: other commands of the workspace share its cgroup.
            try:
                children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
            except OSError:
                children = None  # a kernel without the children list
            namespaces = set()
            for child in children or []:
                with contextlib.suppress(OSError):
                    namespaces.add(os.readlink(f"/proc/{child}/ns/pid"))
                    os.kill(int(child), signal.SIGKILL)
            kill_process(proc)  # bwrap, which has likely just exited: not proc.kill() (see there)
            if children is None:
                self.cgroups.kill_all(name)
            for namespace in namespaces:  # returns once the namespace's processes are gone
                self.cgroups.kill_all(name, pid_namespace=namespace)

        if self.attach_per_exec:
            # Attached only until bwrap has cloned its namespace (it then holds its own copy).
            source = self._attach_points.pop() if self._attach_points else self._new_attach_point()
            attach_clone(self._mount_fds[ws.id][1], source)
        else:
            source = self.owner_dir / ws.id / "merged"
        attached = self.attach_per_exec

        def detach() -> None:
            nonlocal attached
            if attached:
                attached = False
                umount(source)
                # Reused, never removed here: removing a directory detaches the mounts on it
                # in every namespace, including the copy the starting sandbox still needs.
                self._attach_points.append(source)

        info_r, info_w = os.pipe2(os.O_CLOEXEC)
        block_r, block_w = os.pipe2(os.O_CLOEXEC)
        open_fds = {info_r, info_w, block_r, block_w}
        seccomp_r = None
        if self._seccomp is not None:  # bwrap reads the filter from a pipe, to its end
            seccomp_r, seccomp_w = os.pipe2(os.O_CLOEXEC)
            os.write(seccomp_w, self._seccomp)  # a few hundred bytes: the pipe's buffer holds them
            os.close(seccomp_w)
            open_fds.add(seccomp_r)

        def close(fd: int) -> None:
            # Close each fd exactly once: a closed number is reused at once by other
            # concurrent commands' pipes, so a second close would break them.
            if fd in open_fds:
                open_fds.discard(fd)
                os.close(fd)

        async def join_cgroup(proc: asyncio.subprocess.Process) -> None:
            close(info_w)  # the child holds its own copies now
            close(block_r)
            if seccomp_r is not None:
                close(seccomp_r)
            info = await _read_json(info_r, timeout=30.0)
            detach()
            if info is None:
                return  # bwrap failed before starting the sandbox; its stderr says why
            for procs in self.cgroups.procs_files(name):
                # The child only: bwrap's outer monitor runs nothing of the command's and is
                # killed directly; each migration costs kernel synchronisation.
                procs.write_text(str(info["child-pid"]))
            # The output pipes are root's (0600): as the sandbox's user, a command could write to its
            # stdout but not open /dev/stdout or /dev/stderr (`tee /dev/stderr`, `echo x > /dev/stderr`).
            for stream in (1, 2):
                with contextlib.suppress(OSError):  # without it the command still runs; only those opens fail
                    os.chown(f"/proc/{proc.pid}/fd/{stream}", *self.file_owner)
            os.write(block_w, b"go")

        try:
            raw = await run_capped(
                self._argv(source, argv, env, (info_w, block_r, seccomp_r)),
                cwd="/",
                env={"PATH": "/usr/bin:/bin"},
                timeout=timeout,
                output_limit=self.config.output_limit_bytes,
                kill=kill,
                pass_fds=(info_w, block_r) if seccomp_r is None else (info_w, block_r, seccomp_r),
                on_spawn=join_cgroup,
            )
        finally:
            detach()
            for fd in list(open_fds):
                close(fd)
        return ExecResult(**vars(raw), oom_killed=self.cgroups.oom_kills(name) > ooms_before)

    def changed_paths(self, ws: LocalWorkspace, trees: Trees) -> list[str]:
        """Every path the upper layer touched, plus lower files hidden by whiteouts, opaque dirs, and
        files or links that took a lower directory's place (`rm -r d; ln -s x d`)."""
        upper = trees.upper
        if upper is None:
            raise ValueError("the isolated backend's changed paths need the upper layer held open (Trees.upper)")
        lower = ws.snapshot.root
        out: list[str] = []
        for rel_dir, dir_fd, names in walk_tree(upper):
            if rel_dir and _opaque(dir_fd):
                out += walk_files(lower, rel_dir)
            for name in names:
                rel = os.path.join(rel_dir, name)
                out.append(rel)
                out += walk_files(lower, rel)  # a directory's files there, hidden by this entry
        return out


async def _read_json(fd: int, timeout: float) -> dict | None:
    """Read one JSON object from a pipe without blocking the event loop; None on EOF."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[dict | None] = loop.create_future()
    buf = bytearray()
    os.set_blocking(fd, False)

    def readable() -> None:
        try:
            chunk = os.read(fd, 4096)
        except BlockingIOError:
            return
        if not chunk:
            done.done() or done.set_result(None)
            return
        buf.extend(chunk)
        try:
            done.done() or done.set_result(json.loads(buf))
        except ValueError:
            pass  # incomplete; wait for more

    loop.add_reader(fd, readable)
    try:
        return await asyncio.wait_for(done, timeout)
    finally:
        loop.remove_reader(fd)


def _opaque(dir_fd: int) -> bool:
    try:  # by descriptor: the directory may lie deeper than a path can name (PATH_MAX)
        return os.getxattr(dir_fd, "trusted.overlay.opaque") == b"y"
    except OSError:
        return False


def _fork_failed(res: ExecResult) -> bool:
    """Whether bwrap failed to fork its sandbox with EAGAIN, before running anything."""
    return (
        res.exit_code == 1
        and not res.stdout
        and res.stderr.startswith("bwrap: Can't fork")
        and ("Resource temporarily unavailable" in res.stderr)
    )
