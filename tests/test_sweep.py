"""Crash recovery: what a dead process leaves behind is swept by the next backend to start.

Killing (SIGKILL) a process that holds 50 live workspaces, then starting again, leaves no
mount, cgroup, process or directory behind. The holder runs as a separate Python process
(a helper script written to tmp_path) so that it can really be SIGKILLed mid-flight.
"""

from __future__ import annotations

import logging
import os
import re
import secrets
import select
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from vivace.config import SandboxConfig
from vivace.sandbox.base import WorkspaceClosedError
from vivace.sandbox.isolated import probe
from vivace.sandbox.local import owner_alive

ISOLATION_PROBLEM = probe()
needs_isolation = pytest.mark.skipif(ISOLATION_PROBLEM is not None, reason=f"isolated backend: {ISOLATION_PROBLEM}")

HOLDER = textwrap.dedent(
    """
    import asyncio, os, sys
    from pathlib import Path

    from vivace.config import SandboxConfig
    from vivace.sandbox.isolated import IsolatedBackend
    from vivace.sandbox.plain import PlainBackend

    kind, state, repo, count, busy, nonce = sys.argv[1:7]
    count, busy = int(count), int(busy)


    def running(nonce):
        n = 0
        for d in os.listdir("/proc"):
            try:
                if d.isdigit() and Path(f"/proc/{d}/cmdline").read_bytes() == f"sleep\\0{nonce}\\0".encode():
                    n += 1
            except OSError:
                pass
        return n


    async def main():
        if kind == "isolated":
            config = SandboxConfig(backend="isolated", state_dir=state, memory_mb=64, pids_max=16, disk_mb=4, tmp_mb=4)
            backend = IsolatedBackend(config)
        else:
            backend = PlainBackend(SandboxConfig(backend="plain", state_dir=state))
        snapshot = backend.snapshot(repo)
        workspaces = await asyncio.gather(*(backend.create(snapshot) for _ in range(count)))
        tasks = [asyncio.create_task(ws.exec(f"sleep {nonce}", timeout=3600)) for ws in workspaces[:busy]]
        while running(nonce) < busy:
            assert not any(t.done() for t in tasks), [t.result() for t in tasks if t.done()]
            await asyncio.sleep(0.05)
        print("ready", backend.owner, flush=True)
        await asyncio.Event().wait()


    asyncio.run(main())
    """
)


def _spawn(
    holder: list, tmp_path: Path, kind: str, state: Path, repo: Path, count: int, busy: int, nonce: str
) -> subprocess.Popen:
    script = tmp_path / "holder.py"
    script.write_text(HOLDER)
    proc = subprocess.Popen(
        [sys.executable, str(script), kind, str(state), str(repo), str(count), str(busy), nonce],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    holder.append((proc, kind, state))
    return proc


def _wait_ready(proc: subprocess.Popen, timeout: float = 60.0) -> str:
    """The holder's owner id, once it printed `ready`."""
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    line = proc.stdout.readline() if ready else ""
    if not line.startswith("ready "):
        proc.kill()
        _, err = proc.communicate()
        pytest.fail(f"holder did not get ready: {line!r}\n{err}")
    return line.split()[1]


def _sigkill(proc: subprocess.Popen) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    assert proc.returncode == -signal.SIGKILL


@pytest.fixture
async def holder() -> AsyncIterator[list[tuple[subprocess.Popen, str, Path]]]:
    """Holder processes a test started, as (process, backend kind, state dir). Whatever the test
    did, they are killed at the end and what they left is swept, so a failure leaks nothing."""
    started: list[tuple[subprocess.Popen, str, Path]] = []
    yield started
    for proc, kind, state in started:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for stream in (proc.stdout, proc.stderr):
            if stream:
                stream.close()
        if kind == "isolated":
            from vivace.sandbox.isolated import IsolatedBackend

            backend = IsolatedBackend(isolated_config(state))
        else:
            from vivace.sandbox.plain import PlainBackend

            backend = PlainBackend(SandboxConfig(backend="plain", state_dir=state))
        await backend.aclose()  # its __init__ swept the dead holder


def detached_mount_fds(pid: int) -> list[str]:
    """A process's descriptors for the roots of detached mounts (they read as "/")."""
    fd_dir = Path(f"/proc/{pid}/fd")
    return [n for n in os.listdir(fd_dir) if os.readlink(fd_dir / n) == "/"]


def mounts_under(prefix: Path) -> list[str]:
    with open("/proc/self/mountinfo") as f:
        points = [line.split()[4] for line in f]
    return [p for p in points if p == str(prefix) or p.startswith(f"{prefix}/")]


def procs_with_cmdline(cmdline: bytes) -> list[int]:
    found = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            if Path(f"/proc/{d}/cmdline").read_bytes() == cmdline:
                found.append(int(d))
        except OSError:
            pass
    return found


def wait_gone(cmdline: bytes, within: float = 5.0) -> list[int]:
    deadline = time.monotonic() + within
    while (left := procs_with_cmdline(cmdline)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def isolated_config(state: Path) -> SandboxConfig:
    return SandboxConfig(backend="isolated", state_dir=state, memory_mb=64, pids_max=16, disk_mb=4, tmp_mb=4)


@needs_isolation
@pytest.mark.isolated
async def test_sigkilled_owner_of_50_workspaces_is_swept(tmp_path, repo, holder):
    """SIGKILL a process holding 50 live workspaces (5 running `sleep`); the next backend to
    start on the state dir removes every mount, cgroup, process and directory it left."""
    from vivace.sandbox.isolated import IsolatedBackend
    from vivace.sandbox.linux import Cgroups

    state = tmp_path / "state"
    nonce = f"1000.{secrets.randbelow(10**6):06d}"  # `sleep 1000`, recognisable as this test's
    sleep_cmdline = f"sleep\0{nonce}\0".encode()
    proc = _spawn(holder, tmp_path, "isolated", state, repo, count=50, busy=5, nonce=nonce)
    owner = _wait_ready(proc)
    owner_dir = state / "owners" / owner
    cgroups = Cgroups()
    prefix = f"{owner}."
    assert len([d for d in owner_dir.iterdir() if re.fullmatch(r"w\d+", d.name)]) == 50
    # A tmpfs and an overlay per workspace, held as detached mounts (fds showing "/"), none
    # of them in the host's mount table.
    assert len(detached_mount_fds(proc.pid)) == 100
    assert mounts_under(owner_dir) == []
    assert len([n for n in cgroups.names() if n.startswith(prefix)]) == 50
    assert len(procs_with_cmdline(sleep_cmdline)) == 5

    _sigkill(proc)
    assert not owner_alive(owner)
    # The detached mounts died with their descriptors; cgroups and directories remain for
    # the sweep.
    assert mounts_under(owner_dir) == []
    assert len([n for n in cgroups.names() if n.startswith(prefix)]) == 50

    backend = IsolatedBackend(isolated_config(state))  # __init__ sweeps
    try:
        assert mounts_under(state) == []
        assert [n for n in Cgroups().names() if n.startswith(prefix)] == []
        assert wait_gone(sleep_cmdline) == []
        assert not owner_dir.exists()
        assert [d.name for d in (state / "owners").iterdir()] == [backend.owner]
        # The new backend works on the swept state dir.
        ws = await backend.create(backend.snapshot(str(repo)))
        assert (await ws.exec("echo ok", timeout=10)).stdout == "ok\n"
    finally:
        await backend.aclose()
    assert mounts_under(state) == [] and list((state / "owners").iterdir()) == []


@needs_isolation
@pytest.mark.isolated
async def test_sweep_leaves_live_owners_of_other_state_dirs_alone(tmp_path, repo, holder):
    """Cgroups are machine-wide but state dirs are not: a backend starting on another state
    dir must not sweep (kill) the workspaces of a live process."""
    from vivace.sandbox.isolated import IsolatedBackend
    from vivace.sandbox.linux import Cgroups

    nonce = f"1000.{secrets.randbelow(10**6):06d}"
    sleep_cmdline = f"sleep\0{nonce}\0".encode()
    proc = _spawn(holder, tmp_path, "isolated", tmp_path / "state-a", repo, count=2, busy=1, nonce=nonce)
    owner = _wait_ready(proc)
    backend = IsolatedBackend(isolated_config(tmp_path / "state-b"))
    try:
        assert len([n for n in Cgroups().names() if n.startswith(f"{owner}.")]) == 2
        assert len(procs_with_cmdline(sleep_cmdline)) == 1
        assert mounts_under(tmp_path / "state-a") == []  # live workspaces are detached mounts
    finally:
        await backend.aclose()
    _sigkill(proc)
    # Once that owner is dead, any backend sweeps its cgroups, whatever its state dir...
    await IsolatedBackend(isolated_config(tmp_path / "state-b")).aclose()
    assert [n for n in Cgroups().names() if n.startswith(f"{owner}.")] == []
    assert wait_gone(sleep_cmdline) == []
    # ...and one on its own state dir sweeps its mounts and directories.
    later = IsolatedBackend(isolated_config(tmp_path / "state-a"))
    await later.aclose()
    assert mounts_under(tmp_path / "state-a") == []
    assert list((tmp_path / "state-a" / "owners").iterdir()) == []


async def test_plain_backend_sweeps_dead_owner_directories(tmp_path, repo, holder):
    """The plain backend has only directories to leave behind; the next start removes them."""
    from vivace.sandbox.plain import PlainBackend

    state = tmp_path / "state"
    proc = _spawn(holder, tmp_path, "plain", state, repo, count=5, busy=0, nonce="unused")
    owner = _wait_ready(proc)
    owner_dir = state / "owners" / owner
    assert sorted(d.name for d in owner_dir.iterdir() if re.fullmatch(r"w\d+", d.name)) == [f"w{i}" for i in range(5)]
    _sigkill(proc)
    assert owner_dir.exists()
    backend = PlainBackend(SandboxConfig(backend="plain", state_dir=state))
    try:
        assert not owner_dir.exists()
        assert [d.name for d in (state / "owners").iterdir()] == [backend.owner]
        assert backend.sweep() == 0  # nothing left to sweep; the live owner (us) is kept
    finally:
        await backend.aclose()
    assert list((state / "owners").iterdir()) == []


@needs_isolation
@pytest.mark.isolated
async def test_isolated_aclose_leaves_nothing(tmp_path, repo):
    """A normal shutdown, even with commands still running, leaves no mount, cgroup, process
    or directory behind."""
    import asyncio

    from vivace.sandbox.isolated import IsolatedBackend
    from vivace.sandbox.linux import Cgroups

    state = tmp_path / "state"
    nonce = f"1000.{secrets.randbelow(10**6):06d}"
    sleep_cmdline = f"sleep\0{nonce}\0".encode()
    backend = IsolatedBackend(isolated_config(state))
    snapshot = backend.snapshot(str(repo))
    workspaces = await asyncio.gather(*(backend.create(snapshot) for _ in range(10)))
    tasks = [asyncio.create_task(ws.exec(f"sleep {nonce}", timeout=3600)) for ws in workspaces[:3]]
    deadline = time.monotonic() + 10
    while len(procs_with_cmdline(sleep_cmdline)) < 3:
        assert time.monotonic() < deadline, "sleeps did not start"
        await asyncio.sleep(0.05)
    await backend.aclose()
    results = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 10)  # not left hanging
    assert all(isinstance(r, WorkspaceClosedError) and "the command was killed" in str(r) for r in results), results
    assert mounts_under(state) == []
    assert [n for n in Cgroups().names() if n.startswith(f"{backend.owner}.")] == []
    assert wait_gone(sleep_cmdline) == []
    assert list((state / "owners").iterdir()) == []
    assert backend.metrics.to_dict()["live"] == 0 and backend.live == {}


async def test_plain_aclose_leaves_nothing(tmp_path, repo):
    """A normal shutdown of the plain backend removes every workspace directory."""
    from vivace.sandbox.plain import PlainBackend

    state = tmp_path / "state"
    backend = PlainBackend(SandboxConfig(backend="plain", state_dir=state))
    snapshot = backend.snapshot(str(repo))
    for _ in range(5):
        ws = await backend.create(snapshot)
        assert (await ws.exec("echo ok > made.txt && cat made.txt", timeout=10)).stdout == "ok\n"
    await backend.aclose()
    assert list((state / "owners").iterdir()) == []
    assert backend.metrics.to_dict()["live"] == 0


def _backend(kind: str, state: Path):
    from vivace.sandbox.isolated import IsolatedBackend
    from vivace.sandbox.plain import PlainBackend

    return (
        IsolatedBackend(isolated_config(state))
        if kind == "isolated"
        else PlainBackend(SandboxConfig(backend="plain", state_dir=state))
    )


DEAD = "999999999-1-dead00"  # no such pid: a dead owner


@pytest.mark.parametrize("kind", ["plain", pytest.param("isolated", marks=needs_isolation)])
async def test_a_dead_owners_tree_deeper_than_the_recursion_limit_is_swept(kind, tmp_path):
    """shutil.rmtree(ignore_errors=True) raised RecursionError on a tree 1,100 levels deep, which any
    command can make: every later backend on the state dir failed to start."""
    state = tmp_path / "state"
    here = state / "owners" / DEAD / "w0" / "tree"
    here.mkdir(parents=True)
    for _ in range(1100):  # one level at a time: mkdir(parents=True) recurses
        here = here / "d"
        here.mkdir()
    (here / "leaf").write_text("x")
    backend = _backend(kind, state)
    try:
        assert not (state / "owners" / DEAD).exists()
    finally:
        await backend.aclose()


async def test_what_cannot_be_removed_is_logged_with_its_path_and_never_stops_a_backend(tmp_path, caplog, monkeypatch):
    """An immutable file (`chattr +i`, which a command run as root can set) made the plain backend's
    cleanup fail in silence. It is logged with the path; the backend starts all the same; and where
    chattr is, it is made removable and removed."""
    from vivace.sandbox import local

    state = tmp_path / "state"
    owner = state / "owners" / DEAD
    (owner / "w0" / "sub").mkdir(parents=True)
    stuck = owner / "w0" / "sub" / "f"
    stuck.write_text("x")
    if os.geteuid() != 0 or shutil.which("chattr") is None:
        pytest.skip("needs root and chattr to make an immutable file")
    if subprocess.run(["chattr", "+i", str(stuck)], capture_output=True).returncode != 0:
        pytest.skip(f"the filesystem of {tmp_path} has no immutable flag")
    try:
        # As on a machine without chattr (raising=False: the name is new with the fix this test checks).
        monkeypatch.setattr(local, "_clear_immutable", lambda path: False, raising=False)
        with caplog.at_level(logging.WARNING, logger="vivace.sandbox"):
            backend = _backend("plain", state)
        await backend.aclose()
        assert f"could not remove {owner}" in caplog.text and stuck.exists()
        monkeypatch.undo()
        await _backend("plain", state).aclose()
        assert not owner.exists()
    finally:
        if stuck.exists():
            subprocess.run(["chattr", "-i", str(stuck)], capture_output=True)


async def test_a_sweep_that_raises_never_stops_a_backend(tmp_path, caplog, monkeypatch):
    from vivace.sandbox.plain import PlainBackend

    state = tmp_path / "state"
    (state / "owners" / DEAD).mkdir(parents=True)

    def fails(self, owner_dir):
        raise RuntimeError("cannot sweep")

    monkeypatch.setattr(PlainBackend, "_sweep_owner", fails)
    with caplog.at_level(logging.WARNING, logger="vivace.sandbox"):
        backend = _backend("plain", state)
    await backend.aclose()
    assert f"could not sweep {state / 'owners' / DEAD}" in caplog.text and "cannot sweep" in caplog.text


def test_evict_replaced_spares_the_current_and_claimed_entries_and_removes_leftovers(tmp_path):
    from vivace.sandbox.snapshot import claim, evict_replaced

    cache, owners = tmp_path / "cache", tmp_path / "owners"
    for name in ("etc-old", "etc-claimed", "etc-now", "snapshots", ".etc-x.evicted-0123abcd"):
        (cache / name).mkdir(parents=True)
        (cache / name / "f").write_text("x")
    (owners / "live").mkdir(parents=True)
    claim(cache, owners / "live", "etc-claimed")
    dead_builder = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True)
    (cache / f".etc-new.tmp-{int(dead_builder.stdout)}-0123abcd").mkdir()  # a killed build's half

    removed = evict_replaced(cache, owners.iterdir(), "etc-", "etc-now")

    assert removed == ["etc-old"]
    assert sorted(p.name for p in cache.iterdir() if p.name != ".lock") == ["etc-claimed", "etc-now", "snapshots"]
    (owners / "live" / "uses-etc-claimed").unlink()  # its owner closed
    assert evict_replaced(cache, owners.iterdir(), "etc-", "etc-now") == ["etc-claimed"]


@needs_isolation
@pytest.mark.isolated
async def test_an_old_copy_of_etc_goes_once_no_live_backend_uses_it(tmp_path, repo):
    """Each content of the sandbox's /etc is built once into the state directory; a host whose /etc
    changes (a rebuilt container) used to leave every old copy there. A copy in use stays."""
    from vivace.sandbox.isolated import IsolatedBackend

    state = tmp_path / "state"
    stale = state / "etc-0000000000000000"  # an older host's copy
    stale.mkdir(parents=True)
    (stale / "passwd").write_text("root:x:0:0::/:/bin/sh\n")
    first = IsolatedBackend(isolated_config(state))
    assert not stale.exists()
    mine = [p.name for p in state.glob("etc-*")]
    assert len(mine) == 1

    # Another content (another sandbox uid is written into its passwd) while the first backend runs.
    other = isolated_config(state).model_copy(update={"sandbox_uid": 64000})
    second = IsolatedBackend(other)
    assert sorted(p.name for p in state.glob("etc-*")) != mine and (state / mine[0]).is_dir()
    ws = await first.create(first.snapshot(str(repo)))
    assert (await ws.exec("grep -c sandbox /etc/passwd", timeout=30)).exit_code == 0  # still bound
    await first.aclose()
    await second.aclose()

    third = IsolatedBackend(other)
    assert not (state / mine[0]).exists()
    assert len(list(state.glob("etc-*"))) == 1
    await third.aclose()
