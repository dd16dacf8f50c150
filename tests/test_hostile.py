"""Hostile commands against the isolated backend: every attack must be contained.

Each case states its threat in the docstring and checks three things: the attack did not
work (from inside), the host is unchanged (from outside), and the backend is still healthy
afterwards (`Box.assert_healthy`: a fresh `echo ok` works in the attacked workspace and in a
new one, no process is left in the workspace's cgroup, the live count adds up, the host can
still fork).

Host-side resources are planted with random secrets so that a leak cannot be confused with
something the sandbox legitimately sees. Timeouts are small: the whole module is meant to
run in well under a minute on two cores.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import platform
import pwd
import re
import secrets
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from vivace.config import SandboxConfig
from vivace.sandbox import ExecResult, PathEscapeError, SandboxError, Snapshot
from vivace.sandbox.isolated import IsolatedBackend, probe
from vivace.sandbox.local import LocalWorkspace

_PROBLEM = probe()
if _PROBLEM is not None:
    pytest.skip(f"hostile-command suite needs the isolated backend: {_PROBLEM}", allow_module_level=True)

pytestmark = pytest.mark.isolated

PROJECT = Path(__file__).resolve().parents[1]
HOME = Path(pwd.getpwuid(os.getuid()).pw_dir)
SANDBOX_UID = SandboxConfig.model_fields["sandbox_uid"].default  # what the conftest backend runs commands as
_WS_MOUNT = re.compile(r"/owners/([0-9a-f-]+)/w\d+(/merged)?$")
_TEST_TMP = re.compile(r"/pytest-of-[^/]+/pytest-\d+/popen-(gw\d+)/")  # a pytest-xdist worker's tmp_path


# -- helpers ---------------------------------------------------------------------------------
@dataclass
class Box:
    """One workspace under attack, with the backend and snapshot it came from."""

    backend: IsolatedBackend
    snapshot: Snapshot
    ws: LocalWorkspace

    @property
    def cg(self) -> str:
        return self.backend._cg_name(self.ws.id)

    @property
    def ws_dir(self) -> Path:
        return self.backend.upper_dir(self.ws).parent  # host (via /proc/self/fd): the tmpfs holding upper/

    async def sh(self, cmd: str | list[str], timeout: float = 10.0, **kw) -> ExecResult:
        return await self.ws.exec(cmd, timeout=timeout, **kw)

    def cg_file(self, controller: str, name: str) -> Path:
        cgroups = self.backend.cgroups
        parent = cgroups.parents["unified"] if cgroups.v2 else cgroups.parents[controller]
        return parent / self.cg / name

    async def assert_no_processes(self, within: float = 3.0) -> None:
        await wait_until(lambda: not self.backend.cgroups.pids(self.cg), within, "processes left in the cgroup")

    async def assert_healthy(self) -> None:
        await self.assert_no_processes()
        r = await self.ws.exec("echo ok", timeout=15)
        assert (r.exit_code, r.stdout, r.timed_out) == (0, "ok\n", False), r
        fresh = await self.backend.create(self.snapshot)
        fresh_dir, fresh_cg = self.backend.owner_dir / fresh.id, self.backend._cg_name(fresh.id)
        try:
            r = await fresh.exec("echo ok && cat README.md", timeout=15)
            assert (r.exit_code, r.stdout) == (0, "ok\n# demo\n"), r
        finally:
            await fresh.close()
        assert not fresh_dir.exists() and fresh_cg not in self.backend.cgroups.names()
        assert fresh.id not in self.backend._mount_fds  # its detached mounts were released
        assert not any(p.startswith(str(fresh_dir)) for p in host_mount_points())
        metrics = self.backend.metrics.to_dict()
        assert metrics["live"] == len(self.backend.live) and self.ws.id in self.backend.live
        assert metrics["destroyed"] >= 1 and metrics["execs"] >= 2
        host = subprocess.run(["sh", "-c", "echo host-ok"], capture_output=True, timeout=10)
        assert host.stdout == b"host-ok\n"


async def wait_until(cond: Callable[[], bool], within: float, what: str) -> None:
    deadline = time.monotonic() + within
    while not cond():
        assert time.monotonic() < deadline, f"after {within}s: {what}"
        await asyncio.sleep(0.02)


def out(r: ExecResult) -> str:
    return r.stdout + r.stderr


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def host_procs_with(marker: str) -> list[int]:
    """Host pids whose command line contains `marker` (this test process excluded)."""
    found = []
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{d}/cmdline").read_bytes()
        except OSError:
            continue
        if marker.encode() in cmdline:
            found.append(int(d))
    return found


def pgrep(marker: str) -> str:
    if shutil.which("pgrep") is None:
        return ""
    return subprocess.run(["pgrep", "-af", marker], capture_output=True, text=True).stdout


def host_mount_points() -> list[str]:
    with open("/proc/self/mountinfo") as f:
        return [line.split()[4] for line in f]


def host_mounts(own_owner: str) -> set[str]:
    """This mount namespace's mounts, minus workspace mounts of other (concurrent) owners and mounts in other
    test workers' tmp_path (test_sft_cli's full-disk tmpfs came and went during a check)."""
    keep = set()
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            m = _WS_MOUNT.search(fields[4])
            if m and m.group(1) != own_owner:
                continue
            t = _TEST_TMP.search(fields[4] + "/")
            if t and t.group(1) != os.environ.get("PYTEST_XDIST_WORKER"):
                continue
            keep.add(" ".join(fields[3:5] + fields[fields.index("-") :]))
    return keep


@contextlib.contextmanager
def host_process(*argv: str, env: dict[str, str] | None = None) -> Iterator[subprocess.Popen]:
    """A process on the host running as the sandbox's own uid (so only namespaces protect it)."""
    proc = subprocess.Popen(
        argv, user=SANDBOX_UID, group=SANDBOX_UID, extra_groups=[], env=env or {"PATH": "/usr/bin:/bin"},
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    try:
        yield proc
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the whole group: `sh -c` leaves a child behind otherwise
        proc.wait()


@pytest.fixture
async def box(isolated_backend, repo) -> Box:
    snapshot = isolated_backend.snapshot(str(repo))
    return Box(isolated_backend, snapshot, await isolated_backend.create(snapshot))


@pytest.fixture
def canaries(tmp_path) -> Iterator[dict[Path, str]]:
    """Secret files on the host: in the home directory, the project checkout and /tmp.

    The checkout one ends in .pyc so that git ignores it even if a commit happens to run
    while this test does.
    """
    token = secrets.token_hex(6)
    planted = {
        HOME / f"vivace-canary-{token}.txt": secrets.token_hex(16),
        PROJECT / f"vivace-canary-{token}.pyc": secrets.token_hex(16),
        Path("/tmp") / f"vivace-canary-{token}.txt": secrets.token_hex(16),
        tmp_path / "canary.txt": secrets.token_hex(16),
    }
    for path, secret in planted.items():
        path.write_text(secret)
    try:
        yield planted
    finally:
        for path in planted:
            path.unlink(missing_ok=True)


# -- filesystem --------------------------------------------------------------------------------
async def test_host_files_are_not_readable(box, canaries):
    """Threat: a command reads secrets from the host (home, project checkout, /tmp)."""
    test_pid = os.getpid()
    for path, secret in canaries.items():
        r = await box.sh(
            f"cat {path}; cat /workspace/../../..{path}; cat /proc/1/root{path}; cat /proc/{test_pid}/root{path}; "
            f"python -c 'import sys; print(open(sys.argv[1]).read())' {path}"
        )
        assert secret not in out(r), (path, r)
        assert r.exit_code != 0
    found = await box.sh(
        "find / -maxdepth 4 -path /proc -prune -o -name 'vivace-canary-*' -print 2>/dev/null; ls /root"
    )
    assert "vivace-canary" not in found.stdout, found
    for path, secret in canaries.items():
        assert path.read_text() == secret
    await box.assert_healthy()


async def test_private_host_files_copied_into_etc_stay_private(repo, state_dir):
    """Threat: the sandbox's /etc is assembled from host files (TLS roots and friends); a private
    key next to them must not become readable."""
    private = Path("/etc/ssl/private")
    if not private.is_dir():
        pytest.skip("no /etc/ssl/private on this host")
    key = private / f"vivace-canary-{secrets.token_hex(6)}.pem"
    secret = secrets.token_hex(16)
    key.write_text(secret)
    key.chmod(0o600)
    try:
        backend = IsolatedBackend(SandboxConfig(backend="isolated", state_dir=state_dir, memory_mb=128, pids_max=32))
        try:
            snapshot = backend.snapshot(str(repo))
            box = Box(backend, snapshot, await backend.create(snapshot))
            r = await box.sh(f"ls -la /etc/ssl/private; cat /etc/ssl/private/*; cat /etc/ssl/private/{key.name}; "
                             f"find /etc -name '{key.name}' -exec cat {{}} +")  # fmt: skip
            assert secret not in out(r) and r.exit_code != 0, r
            await box.assert_healthy()
        finally:
            await backend.aclose()
    finally:
        key.unlink()


async def test_writes_outside_workspace_do_not_reach_host(box, canaries, tmp_path, state_dir):
    """Threat: a command writes to system dirs, host /tmp, the snapshot cache or via `..`."""
    tag = f"vivace-pwned-{secrets.token_hex(4)}"
    host_tmp_canary = next(p for p in canaries if str(p).startswith("/tmp/vivace-canary"))
    snap = box.snapshot.root
    before = {p: digest(p) for p in (Path("/etc/passwd"), host_tmp_canary, snap / "README.md", snap / "pkg/calc.py")}
    targets = [
        f"/usr/{tag}", f"/usr/bin/{tag}", f"/etc/{tag}", "/etc/passwd", f"/{tag}", f"/root/{tag}",
        f"{PROJECT}/{tag}", str(host_tmp_canary), f"{tmp_path}/{tag}", f"{snap}/README.md", f"{snap}/{tag}",
        f"{state_dir}/{tag}", f"{box.ws_dir}/upper/{tag}", f"/workspace/../{tag}", f"../{tag}", f"../../../{tag}",
    ]  # fmt: skip
    script = "".join(f'echo pwned >> \'{t}\'; python -c \'open("{t}", "a").write("pwned")\'; ' for t in targets)
    r = await box.sh(script + "echo pwned > README.md")
    assert "Traceback" in r.stderr  # the attempts failed loudly inside
    # Nothing appeared or changed on the host.
    for t in [f"/usr/{tag}", f"/usr/bin/{tag}", f"/etc/{tag}", f"/{tag}", f"{HOME}/{tag}", f"{PROJECT}/{tag}",
              f"{tmp_path}/{tag}", f"{snap}/{tag}", f"{state_dir}/{tag}", f"/tmp/{tag}"]:  # fmt: skip
        assert not os.path.lexists(t), t
    assert not any(tag in name for _, _, names in os.walk(state_dir) for name in names)
    assert {p: digest(p) for p in before} == before
    # The legitimate write went to this workspace's upper layer only.
    assert (box.ws_dir / "upper/README.md").read_text() == "pwned\n"
    # The file API refuses the same escapes.
    for path in (f"../{tag}", f"pkg/../../{tag}", f"/etc/{tag}", str(host_tmp_canary)):
        with pytest.raises(PathEscapeError):
            await box.ws.write_bytes(path, b"pwned")
    assert {p: digest(p) for p in before} == before
    await box.assert_healthy()


async def test_symlink_escapes_through_file_api(box, canaries):
    """Threat: a command plants symlinks so that the host-side file API reads/writes the host."""
    canary = next(iter(canaries))
    secret = canaries[canary]
    passwd = digest(Path("/etc/passwd"))
    up = "../" * 12
    r = await box.sh(
        f"ln -s /etc/passwd leak && ln -s {up.rstrip('/')} up && ln -s /etc etcdir && ln -s {canary} canary "
        f"&& ln -s {canary.parent} canarydir && ln -s {up}{str(canary).lstrip('/')} relcanary "
        f"&& ln -s {box.ws_dir} wsdir && ln -s pkg/calc.py inside"
    )
    assert r.exit_code == 0, r
    through = ["up/etc/passwd", f"up{canary}", "etcdir/passwd", f"canarydir/{canary.name}", "wsdir/upper"]
    final = ["leak", "up", "canary", "relcanary", "etcdir", "canarydir", "wsdir"]
    ops = {
        "read_bytes": box.ws.read_bytes,
        "write_bytes": lambda p: box.ws.write_bytes(p, b"pwned"),
        "list": box.ws.list,
        "remove": lambda p: box.ws.remove(p, recursive=True),
        "stat": box.ws.stat,
    }
    for path in through:
        for name, op in ops.items():
            with pytest.raises(PathEscapeError):
                await op(path)
                pytest.fail(f"{name}({path!r}) escaped")
    for path in final:
        for name in ("read_bytes", "write_bytes", "list"):
            with pytest.raises(PathEscapeError):
                await ops[name](path)
                pytest.fail(f"{name}({path!r}) escaped")
        # stat and remove act on the link itself, never on what it points to.
        assert (await box.ws.stat(path)).kind == "symlink"
    # Links that stay inside keep working (the checks above are not blanket refusals).
    assert (await box.ws.read_text("inside")).startswith("def add")
    for path in final:
        await box.ws.remove(path, recursive=True)
    assert canary.read_text() == secret and digest(Path("/etc/passwd")) == passwd
    assert all(p.read_text() == s for p, s in canaries.items())
    await box.assert_healthy()


async def test_symlink_swap_race_in_file_api(box, tmp_path):
    """Threat: a command atomically swaps a directory with a symlink to the host while the
    host-side file API is walking it (time-of-check to time-of-use)."""
    victim = tmp_path / "victim"
    victim.mkdir()
    secret = secrets.token_hex(16)
    (victim / "data").write_text(secret)
    swapper = (
        "import ctypes, os, time\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "os.mkdir('d'); open('d/data', 'w').write('inside\\n')\n"
        f"os.symlink({str(victim)!r}, 'abs'); os.symlink('../' * 12 + {str(victim).lstrip('/')!r}, 'rel')\n"
        "end, n = time.time() + 2.0, 0\n"
        "while time.time() < end:\n"
        "    for link in (b'abs', b'rel'):\n"
        "        for _ in range(2):  # RENAME_EXCHANGE: 'd' is always either the directory or a link\n"
        "            assert libc.renameat2(-100, b'd', -100, link, 2) == 0, ctypes.get_errno()\n"
        "            n += 1\n"
        "print('swaps', n)\n"
    )
    await box.ws.write_text("swap.py", swapper)
    task = asyncio.create_task(box.sh("python swap.py", timeout=10))
    await wait_until(lambda: os.path.lexists(box.ws.root / "rel") or task.done(), 5, "swapper start")
    ok = {"read": 0, "write": 0, "list": 0, "stat": 0}
    ops = {
        "read": lambda: box.ws.read_bytes("d/data"),
        "write": lambda: box.ws.write_bytes("d/data", b"inside\n"),
        "list": lambda: box.ws.list("d"),
        "stat": lambda: box.ws.stat("d/data"),
    }
    deadline = time.monotonic() + 1.5
    while time.monotonic() < deadline and not task.done():
        for name, op in ops.items():
            try:
                result = await op()
            except SandboxError:  # typed refusals (escape, not-a-dir, vanished) are fine; raw OSErrors are not
                continue
            ok[name] += 1
            if name == "read":
                assert result == b"inside\n", result
            elif name == "list":
                assert [e.name for e in result] == ["data"], result
            elif name == "stat":
                assert result.size == len("inside\n"), result
    r = await task
    assert r.exit_code == 0 and r.stdout.startswith("swaps"), r
    assert (victim / "data").read_text() == secret
    assert sorted(os.listdir(victim)) == ["data"]
    assert sum(ok.values()) > 0, ok  # the race was actually exercised, not refused wholesale
    await box.assert_healthy()


async def test_symlinks_through_commands_and_host_side_readers(box, canaries, tmp_path):
    """Threat: symlinks/hard links to host paths inside the workspace, followed by commands or by
    the host (diff, destroy)."""
    canary = next(iter(canaries))
    secret = canaries[canary]
    r = await box.sh(
        f"ln -s {canary} x; cat x; ln -s {tmp_path} hostdir; ls hostdir; cat hostdir/canary.txt; "
        f"ln {canary} hard; ln /usr/bin/su su-copy; ln /etc/passwd pw; true"
    )
    assert secret not in out(r) and canaries[tmp_path / "canary.txt"] not in out(r), r
    assert not (box.ws_dir / "upper" / "hard").exists() and not (box.ws_dir / "upper" / "su-copy").exists()
    # The host-side diff reports the links as links; it never reads through them.
    diff = await box.ws.diff()
    assert "b/x" in diff and str(canary) in diff and secret not in diff
    assert all(s not in diff for s in canaries.values())
    await box.assert_healthy()
    # Destroying the workspace does not follow the links either.
    await box.ws.close()
    assert all(p.read_text() == s for p, s in canaries.items())
    assert (tmp_path / "canary.txt").exists()


async def test_disk_fill_hits_workspace_quota(box, state_dir):
    """Threat: writing until the disk is full (in /workspace and /tmp) fills the host disk."""
    cfg = box.backend.config
    host_free = [os.statvfs(p).f_bavail * os.statvfs(p).f_frsize for p in (state_dir, "/tmp", "/")]
    fill = (
        "import errno, sys\n"
        "n = 0\n"
        "try:\n"
        "    with open(sys.argv[1], 'wb') as f:\n"
        "        while True:\n"
        "            f.write(b'x' * (1 << 20)); f.flush(); n += 1\n"
        "except OSError as e:\n"
        "    print(sys.argv[1], errno.errorcode[e.errno], n)\n"
    )
    await box.ws.write_text("fill.py", fill)
    r = await box.sh(
        "python fill.py /workspace/py.bin; dd if=/dev/zero of=/workspace/dd.bin bs=1M 2>&1 | grep -o 'No space.*'; "
        "python fill.py /tmp/py.bin; dd if=/dev/zero of=/tmp/dd.bin bs=1M 2>&1 | grep -o 'No space.*'",
        timeout=20,
    )
    assert not r.timed_out, r
    assert r.stdout.count("No space left on device") == 2 and r.stdout.count("ENOSPC") == 2, r
    filled = {line.split()[0]: int(line.split()[2]) for line in r.stdout.splitlines() if "ENOSPC" in line}
    assert cfg.disk_mb - 2 <= filled["/workspace/py.bin"] <= cfg.disk_mb, filled  # MiB written before the quota
    assert cfg.tmp_mb - 2 <= filled["/tmp/py.bin"] <= cfg.tmp_mb, filled
    upper = sum(p.stat().st_size for p in (box.ws_dir / "upper").rglob("*") if p.is_file())
    assert upper <= cfg.disk_mb << 20
    after = [os.statvfs(p).f_bavail * os.statvfs(p).f_frsize for p in (state_dir, "/tmp", "/")]
    for b, a in zip(host_free, after, strict=True):
        assert abs(b - a) < 32 << 20, (b, a)  # the sandbox wrote ~96 MiB, none of it to the host disk
    # Freeing the space makes the workspace usable again.
    r = await box.sh("rm -f dd.bin py.bin && echo fine > small.txt && cat small.txt")
    assert r.stdout == "fine\n", r
    await box.assert_healthy()


# -- network -----------------------------------------------------------------------------------
async def test_host_loopback_service_unreachable(box):
    """Threat: a command talks to a service listening on the host's loopback (or any host
    address): a database, a metadata proxy, the environment server itself."""
    hits: list[str] = []

    async def handle(reader, writer):
        hits.append("hit")
        writer.close()

    local = await asyncio.start_server(handle, "127.0.0.1", 0)
    anywhere = await asyncio.start_server(handle, "0.0.0.0", 0)
    port, port_any = local.sockets[0].getsockname()[1], anywhere.sockets[0].getsockname()[1]
    addrs = ["127.0.0.1", "localhost"] + _host_addresses()
    try:
        probe_py = (
            "import socket, sys\n"
            "for host, port in [(h, int(p)) for h, p in (a.split(',') for a in sys.argv[1:])]:\n"
            "    try:\n"
            "        socket.create_connection((host, port), timeout=2); print('CONNECTED', host, port)\n"
            "    except OSError as e:\n"
            "        print('FAILED', host, port, e)\n"
        )
        pairs = [f"{a},{p}" for a in addrs for p in (port, port_any)]
        r = await box.sh(["python", "-c", probe_py, *pairs], timeout=20)
        assert "CONNECTED" not in r.stdout and r.stdout.count("FAILED") == len(pairs), r
        bash = "; ".join(
            f"(exec 3<>/dev/tcp/{a}/{p} && echo CONNECTED {a} {p})" for a in addrs for p in (port, port_any)
        )
        r = await box.sh(bash, timeout=20)
        assert "CONNECTED" not in r.stdout, r
        await asyncio.sleep(0.2)
        assert hits == []
        # Control: the servers do answer from the host.
        for p in (port, port_any):
            _, w = await asyncio.open_connection("127.0.0.1", p)
            w.close()
        await wait_until(lambda: len(hits) == 2, 5, "control connections")
    finally:
        local.close()
        anywhere.close()
    await box.assert_healthy()


def _host_addresses() -> list[str]:
    """The host's non-loopback IPv4 addresses (best effort)."""
    if shutil.which("ip") is None:
        return []
    text = subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True).stdout
    return [a for a in re.findall(r"inet (\d+\.\d+\.\d+\.\d+)/", text) if not a.startswith("127.")]


async def test_host_abstract_unix_socket_unreachable(box):
    """Threat: abstract unix sockets (no file, scoped by network namespace) reach host daemons."""
    name = f"vivace-test-{secrets.token_hex(4)}"
    hits: list[str] = []
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind("\0" + name)
    srv.listen()
    srv.setblocking(False)
    try:
        r = await box.sh(
            ["python", "-c", "import socket, sys; s = socket.socket(socket.AF_UNIX); s.connect('\\0' + sys.argv[1]); "
             "print('CONNECTED')", name]
        )  # fmt: skip
        assert "CONNECTED" not in r.stdout and "ConnectionRefusedError" in r.stderr, r
        with contextlib.suppress(BlockingIOError):
            srv.accept()
            hits.append("hit")
        assert hits == []
    finally:
        srv.close()
    await box.assert_healthy()


async def test_no_route_to_external_network(box):
    """Threat: exfiltration to, or downloads from, the outside world (TCP, UDP, DNS)."""
    py = (
        "import errno, socket\n"
        "for addr in [('1.1.1.1', 53), ('8.8.8.8', 443), ('93.184.216.34', 80)]:\n"
        "    try:\n"
        "        socket.create_connection(addr, timeout=2); print('CONNECTED', addr)\n"
        "    except OSError as e:\n"
        "        print('tcp', errno.errorcode.get(e.errno))\n"
        "u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
        "try:\n"
        "    u.sendto(b'x', ('8.8.8.8', 53)); print('SENT')\n"
        "except OSError as e:\n"
        "    print('udp', errno.errorcode.get(e.errno))\n"
        "try:\n"
        "    socket.getaddrinfo('example.com', 80); print('RESOLVED')\n"
        "except OSError:\n"
        "    print('dns failed')\n"
    )
    r = await box.sh(["python", "-c", py], timeout=15)
    assert r.stdout.split("\n")[:5] == ["tcp ENETUNREACH"] * 3 + ["udp ENETUNREACH", "dns failed"], r
    net = await box.sh("tail -n +2 /proc/net/route; echo --; awk '{print $NF}' /proc/net/ipv6_route; echo --; "
                       "tail -n +3 /proc/net/dev")  # fmt: skip
    v4, v6, devices = net.stdout.split("--\n")
    assert v4 == "" and set(v6.split()) == {"lo"}, net  # no IPv4 route at all, IPv6 only via loopback
    assert [line.split(":")[0].strip() for line in devices.splitlines()] == ["lo"], net  # the only interface
    await box.assert_healthy()


# -- processes ---------------------------------------------------------------------------------
async def test_cannot_signal_host_process(box):
    """Threat: killing host processes (even ones running as the sandbox's own uid)."""
    with host_process("sleep", "1000") as victim:
        r = await box.sh(
            f"kill -9 {victim.pid}; python -c 'import os; os.kill({victim.pid}, 9)'; pkill -9 sleep; "
            f"kill -9 {os.getpid()}; kill -9 -1; echo done"
        )
        assert "No such process" in r.stderr or "ProcessLookupError" in r.stderr, r
        await asyncio.sleep(0.1)
        assert victim.poll() is None  # still alive
    await box.assert_healthy()


async def test_host_proc_entries_not_visible(box, monkeypatch):
    """Threat: reading other processes' /proc entries (environ, cmdline) to steal secrets."""
    secret = secrets.token_hex(16)
    monkeypatch.setenv("VIVACE_TEST_SECRET", secret)
    env = {"PATH": "/usr/bin:/bin", "VIVACE_TEST_SECRET": secret}
    with host_process("sh", "-c", "sleep 1000", f"argv-{secret}", env=env) as victim:
        me = os.getpid()
        r = await box.sh(
            f"cat /proc/{victim.pid}/environ /proc/{victim.pid}/cmdline /proc/{me}/environ /proc/{me}/cmdline; "
            "cat /proc/1/environ; for p in /proc/[0-9]*; do cat $p/environ $p/cmdline; done; echo; "
            "ls /proc | grep -E '^[0-9]+$' | tr '\\n' ' '",
        )
        assert secret not in out(r) and "VIVACE_TEST_SECRET" not in out(r), r
        own = await box.sh(f"cat /proc/{me}/cmdline")
        assert own.exit_code != 0 and "pytest" not in own.stdout
        visible = [int(p) for p in r.stdout.splitlines()[-1].split()]
        assert victim.pid not in visible and me not in visible and len(visible) < 10, visible
    await box.assert_healthy()


async def test_cannot_ptrace_host_process(box):
    """Threat: attaching a debugger to a host process to read or rewrite its memory."""
    with host_process("sleep", "1000") as victim:
        py = (
            "import ctypes, errno, sys\n"
            "libc = ctypes.CDLL(None, use_errno=True)\n"
            "for pid in map(int, sys.argv[1:]):\n"
            "    rc = libc.ptrace(16, pid, 0, 0)\n"  # PTRACE_ATTACH
            "    print(pid, rc, errno.errorcode.get(ctypes.get_errno()))\n"
        )
        r = await box.sh(["python", "-c", py, str(victim.pid), str(os.getpid()), "1"])
        lines = r.stdout.splitlines()
        assert lines[0] == f"{victim.pid} -1 ESRCH" and lines[1] == f"{os.getpid()} -1 ESRCH", r
        assert lines[2] == "1 -1 EPERM", r  # the namespace's init runs as root: not traceable either
        status = Path(f"/proc/{victim.pid}/status").read_text()
        assert re.search(r"^TracerPid:\s+0$", status, re.M) and victim.poll() is None
    await box.assert_healthy()


async def test_fork_bomb_is_bounded(box):
    """Threat: a fork bomb exhausts the host's process table."""
    limit = box.backend.config.pids_max
    # The shell forks the bomb's first process (`bomb &`) and nothing after it. Calling `bomb` from the
    # shell itself would fork the pipeline's two halves from there, and if the bomb filled the limit
    # between those two forks, bash would sleep through its fork retries (1 + 2 + 4 + 8 s) past the timeout.
    bomb = "sleep 3 & s=$!; bomb() { bomb | bomb & }; bomb & wait $s; echo survived"
    task = asyncio.create_task(box.sh(bomb, timeout=8))
    peak = 0
    while not task.done():
        with contextlib.suppress(OSError, ValueError):
            peak = max(peak, int(box.cg_file("pids", "pids.current").read_text()))
        await asyncio.sleep(0.01)
    r = await task
    assert not r.timed_out and r.stdout == "survived\n" and r.duration_s < 8, r  # the shell itself kept working
    assert 0 < peak <= limit, peak
    events = box.cg_file("pids", "pids.events").read_text()
    assert int(re.search(r"max (\d+)", events).group(1)) > 0  # the limit was hit, i.e. the bomb was real
    # The host still forks freely.
    host = subprocess.run(["sh", "-c", "for i in $(seq 50); do true & done; wait; echo ok"], capture_output=True)
    assert host.stdout == b"ok\n"
    await box.assert_healthy()


async def test_memory_exhaustion_is_killed(box):
    """Threat: allocating beyond memory_mb starves the host of memory."""
    limit = box.backend.config.memory_mb << 20
    hog = "a = []\nwhile True:\n    a.append(b'\\x01' * (16 << 20))\n"
    r = await box.sh(["python", "-c", hog], timeout=20)
    assert not r.timed_out and r.exit_code != 0, r
    assert r.oom_killed and r.exit_code == 137, r
    peak_file = box.cg_file("memory", "memory.peak" if box.backend.cgroups.v2 else "memory.max_usage_in_bytes")
    if peak_file.exists():
        assert int(peak_file.read_text()) <= limit
    # Many processes together are bounded by the same limit.
    r = await box.sh(f"for i in 1 2 3 4; do python -c \"x = b'1' * {limit // 3}; import time; time.sleep(2)\" & done; wait",
                     timeout=20)  # fmt: skip
    assert not r.timed_out and r.oom_killed, r
    await box.assert_healthy()


async def test_inode_exhaustion_is_bounded(repo, state_dir):
    """Threat: creating millions of empty files (no data blocks) pins host kernel memory."""
    config = SandboxConfig(backend="isolated", state_dir=state_dir, memory_mb=48, pids_max=16, disk_mb=64, tmp_mb=8)
    backend = IsolatedBackend(config)
    try:
        snapshot = backend.snapshot(str(repo))
        box = Box(backend, snapshot, await backend.create(snapshot))
        py = (
            "import os, time\n"
            "os.mkdir('many'); n = 0; end = time.time() + 15\n"
            "try:\n"
            "    while time.time() < end:\n"
            "        os.close(os.open(f'many/{n}', os.O_CREAT | os.O_WRONLY)); n += 1\n"
            "    print('TIMEUP', n)\n"
            "except OSError as e:\n"
            "    print('stopped', e)\n"
        )
        r = await box.sh(["python", "-c", py], timeout=20)
        assert "TIMEUP" not in r.stdout and (r.oom_killed or "stopped" in r.stdout), r
        usage = box.cg_file("memory", "memory.current" if backend.cgroups.v2 else "memory.usage_in_bytes")
        assert int(usage.read_text()) <= 48 << 20  # the inodes' kernel memory is charged to the workspace
        # The tmpfs inode cap stops the flood before the memory limit: the workspace can still
        # clean up after itself from inside.
        assert "No space left" in r.stdout and not r.oom_killed, r
        assert (await box.sh("rm -rf many && echo cleaned", timeout=20)).stdout == "cleaned\n"
        await box.assert_healthy()
    finally:
        await backend.aclose()


async def test_endless_loop_times_out_and_leaves_nothing(box):
    """Threat: a command that never ends (with a child that ignores its parent dying)."""
    marker = f"loop-{secrets.token_hex(4)}"
    r = await box.sh(f"sh -c 'trap \"\" TERM HUP; while :; do :; done' {marker} & while :; do :; done # {marker}",
                     timeout=1.5)  # fmt: skip
    assert r.timed_out, r
    assert 1.4 <= r.duration_s < 1.5 + 3, r
    assert not box.backend.cgroups.pids(box.cg)  # nothing left in the workspace's cgroup...
    assert host_procs_with(marker) == [] and pgrep(marker) == ""  # ...nor anywhere on the host
    await box.assert_healthy()


async def test_gigabytes_of_output_are_capped(box):
    """Threat: flooding stdout/stderr (GBs) exhausts the host's memory or stalls the caller."""
    import resource

    limit = box.backend.config.output_limit_bytes
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    total = 1 << 30
    r = await box.sh(f"yes | head -c {total}; yes err | head -c {total // 4} >&2", timeout=30)
    assert not r.timed_out and r.exit_code == 0, r
    assert r.duration_s < 20, r
    kept = len(r.stdout.encode()) - len(f"\n[... {r.stdout_dropped} bytes of output dropped ...]\n")
    assert kept == limit and r.stdout_dropped == total - limit
    assert r.stderr_dropped == total // 4 - limit
    # Endless output: the timeout ends it, the output stays capped.
    r = await box.sh("cat /dev/zero & cat /dev/zero >&2", timeout=2)
    assert r.timed_out and r.duration_s < 2 + 5, r
    assert len(r.stdout) < limit + 100 and len(r.stderr) < limit + 100
    assert r.stdout_dropped > 0 and r.stderr_dropped > 0
    rss_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    assert (rss_after - rss_before) * 1024 < 200 << 20  # KiB on Linux; never buffered whole
    await box.assert_healthy()


async def test_background_processes_do_not_survive_exec(box):
    """Threat: a command leaves daemons behind (to keep running after its exec, or later)."""
    nonce = f"1000.{secrets.randbelow(10**6):06d}"
    daemon = "import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n        os.closerange(0, 3)\n        time.sleep(1000)\n"
    r = await box.sh(
        f"sleep {nonce} & setsid sleep {nonce} & nohup sleep {nonce} >/dev/null 2>&1 & "
        f"(sleep {nonce} >/dev/null 2>&1 &); python -c '{daemon}' {nonce}; echo started",
        timeout=10,
    )
    assert r.stdout == "started\n" and not r.timed_out and r.duration_s < 5, r
    await box.assert_no_processes()
    assert host_procs_with(nonce) == [] and pgrep(nonce) == ""
    r = await box.sh(f"pgrep -f '^sleep {nonce}' || echo none")
    assert r.stdout.endswith("none\n"), r
    await box.assert_healthy()


# -- privilege and kernel interfaces ----------------------------------------------------------------
async def test_host_environment_not_inherited(box, monkeypatch):
    """Threat: secrets in the server's environment (tokens, keys) leak into commands."""
    secret = secrets.token_hex(16)
    monkeypatch.setenv("VIVACE_TEST_SECRET", secret)
    r = await box.sh("env; cat /proc/self/environ; cat /proc/$PPID/environ; cat /proc/1/environ", env={"MINE": "1"})
    assert secret not in out(r) and "VIVACE_TEST_SECRET" not in out(r), r
    assert "MINE=1" in r.stdout  # what the caller passes explicitly does arrive
    r = await box.sh(["python", "-c", "import os; print(sorted(os.environ))"])
    assert "VIVACE_TEST_SECRET" not in r.stdout, r
    await box.assert_healthy()


async def test_runs_unprivileged(box):
    """Threat: commands run as root or can regain privileges (capabilities, setuid binaries)."""
    r = await box.sh("id -u; id -g; grep -E '^(Cap(Inh|Prm|Eff|Bnd|Amb)|NoNewPrivs):' /proc/self/status")
    lines = r.stdout.split()
    assert lines[0] == lines[1] == str(SANDBOX_UID) and lines[0] != "0", r
    status = dict(zip(lines[2::2], lines[3::2], strict=True))
    assert all(int(status[f"Cap{k}:"], 16) == 0 for k in ("Inh", "Prm", "Eff", "Bnd", "Amb")), status
    assert status["NoNewPrivs:"] == "1"
    escalations = {
        "su": "su root -c 'id -u' </dev/null",
        "sudo": "sudo -n id -u",
        "setuid": "python -c 'import os; os.setuid(0); print(os.getuid())'",
        "mount-suid": "mount -t tmpfs none /tmp && echo MOUNTED",
        "chown": "touch f && chown 0:0 f && echo CHOWNED",
    }
    for name, cmd in escalations.items():
        r = await box.sh(cmd)
        assert r.exit_code != 0 and r.stdout.strip() not in ("0", "MOUNTED", "CHOWNED"), (name, r)
    await box.assert_healthy()


async def test_caller_environment_never_reaches_the_privileged_stage(box):
    """Threat: a variable the caller passes (a task's env, an environment-server client's) steers the
    dynamic loader of setpriv, which runs as root with every capability until it drops them: an
    LD_PRELOAD library from the workspace would run there, as root, and can reach the host's files
    through the bind mounts. The loader's own trace (LD_DEBUG) shows which programs a variable reached."""
    r = await box.sh(["true"], env={"LD_DEBUG": "libs"})
    started = re.findall(r"initialize program: (\S+)", r.stderr)
    assert started == ["true"], r.stderr[-2000:]  # neither setpriv nor env: only the command itself
    r = await box.sh("echo $MINE; echo $LD_DEBUG", env={"MINE": "a b=c", "LD_DEBUG": "nonsense-option"})
    assert r.stdout.startswith("a b=c\nnonsense-option\n"), r  # the command still gets every variable
    r = await box.sh(["a=b", "x"])  # a program name with "=" is not taken for an assignment
    assert r.exit_code == 127 and "a=b" in r.stderr, r
    await box.assert_healthy()


async def test_kernel_keyring_is_closed(box):
    """Threat: the kernel keeps keyrings per uid, and every sandbox runs as the same uid: a key one
    rollout adds would be read by another workspace later (a channel between episodes), and filling
    the uid's key quota would break keyrings for every other sandbox, on the host, for good."""
    from vivace.sandbox.seccomp import _KEYRING_CALLS, keyring_filter

    numbers = dict(_KEYRING_CALLS)[platform.machine()][0][1]  # add_key, request_key, keyctl
    call = (
        "import ctypes, os, sys\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "libc.syscall.restype = ctypes.c_long\n"
        f"add, request, keyctl = {numbers}\n"
        "USER = -4\n"  # KEY_SPEC_USER_KEYRING
        "r = libc.syscall(add, b'user', b'vivace-key', b'secret', 6, USER) if sys.argv[1] == 'add' else "
        "libc.syscall(request, b'user', b'vivace-key', None, 0)\n"
        "print(r, os.strerror(ctypes.get_errno()) if r < 0 else '')\n"
    )
    r = await box.sh(["python", "-c", call, "add"])
    assert r.stdout.startswith("-1 Function not implemented"), r
    other = await box.backend.create(box.snapshot)  # another workspace: same uid, so same keyrings
    try:
        r = await other.exec(["python", "-c", call, "find"], timeout=10)
        assert r.stdout.startswith("-1 Function not implemented"), r
    finally:
        await other.close()
    assert len(keyring_filter()) % 8 == 0 and keyring_filter("sparc") is None  # whole instructions; none unknown
    await box.assert_healthy()


async def test_a_timeout_kills_only_its_own_command(box):
    """Threat: one command's timeout takes down the other commands of the workspace (the agent's grep
    and lint run at once): they would fail as if killed, with no timeout to say why."""
    slow, quick = await asyncio.gather(box.sh("sleep 100", timeout=1), box.sh("sleep 3; echo finished", timeout=20))
    assert slow.timed_out and slow.exit_code == 137, slow
    assert quick.exit_code == 0 and quick.stdout == "finished\n" and not quick.timed_out, quick
    await box.assert_healthy()


async def test_hostname_is_not_the_hosts(box):
    """Threat: the sandbox learns or changes the host's identity (UTS namespace)."""
    host = socket.gethostname()
    r = await box.sh("hostname; cat /proc/sys/kernel/hostname; hostname evil; echo evil > /proc/sys/kernel/hostname")
    names = r.stdout.split()
    assert names == ["sandbox", "sandbox"] and host not in names, r
    assert socket.gethostname() == host
    await box.assert_healthy()


async def test_kernel_interfaces_are_closed(box):
    """Threat: tampering with kernel settings, devices or logs (core_pattern, /sys, mknod, dmesg)."""
    core = Path("/proc/sys/kernel/core_pattern").read_text()
    r = await box.sh(
        "cat /proc/sys/kernel/core_pattern > /proc/sys/kernel/core_pattern && echo WROTE-CORE; "
        "echo 1 > /proc/sys/vm/drop_caches && echo WROTE-DROP; ls /sys && echo HAS-SYS; "
        "mknod /tmp/disk b 8 0 && echo MKNOD; dmesg >/dev/null && echo DMESG; "
        "ls /dev | grep -E '^(sd|vd|nvme|loop|mem|kmem|port)' && echo BLOCKDEV; true"
    )
    for flag in ("WROTE-CORE", "WROTE-DROP", "HAS-SYS", "MKNOD", "DMESG", "BLOCKDEV"):
        assert flag not in r.stdout, (flag, r)
    assert Path("/proc/sys/kernel/core_pattern").read_text() == core
    await box.assert_healthy()


async def test_mount_attempts_only_affect_the_sandbox(box):
    """Threat: mounting over, or unmounting, paths to change what the host or other workspaces see."""
    own = box.backend.owner
    before = host_mounts(own)
    r = await box.sh(
        "mount -t tmpfs none /workspace && echo M1; mount --bind / /workspace && echo M2; umount -l /usr && echo M3; "
        "python -c 'import ctypes; l = ctypes.CDLL(None, use_errno=True); "
        'print("M4" if l.mount(b"none", b"/tmp", b"tmpfs", 0, None) == 0 else "no")\'; '
        "unshare -rm sh -c 'mount -t tmpfs none /workspace && echo userns > /workspace/from-userns && echo U1; "
        "mount --bind /tmp /usr && echo U2; umount -l /workspace; cat /workspace/from-userns'; true"
    )
    assert not any(f"M{i}" in r.stdout for i in range(1, 5)), r
    after = host_mounts(own)
    assert after == before, (after - before, before - after)
    assert not (box.ws.root / "from-userns").exists()
    r = await box.sh("ls /workspace; ls /usr | head -1")
    assert "README.md" in r.stdout and "from-userns" not in r.stdout and "bin" in r.stdout, r
    await box.assert_healthy()
