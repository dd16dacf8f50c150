"""The Workspace contract: every backend (isolated, plain, HTTP client) must pass all of it."""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from vivace.sandbox import NotAFileError, PathEscapeError, WorkspaceClosedError, WorkspaceFileNotFound, process
from vivace.sandbox.paths import ConfinedFS


async def test_exec_runs_in_workspace_root(make_workspace):
    ws = await make_workspace()
    r = await ws.exec("cat README.md && echo err >&2 && exit 3")
    assert r.stdout == "# demo\n"
    assert r.stderr == "err\n"
    assert r.exit_code == 3
    assert not r.timed_out
    assert r.duration_s > 0


async def test_exec_argv_form_and_env(make_workspace):
    ws = await make_workspace()
    r = await ws.exec(["sh", "-c", 'printf "%s" "$GREETING"'], env={"GREETING": "hi there"})
    assert r.stdout == "hi there"
    # A PATH of the caller's own is the command's: the sandbox's launcher does not depend on it.
    r = await ws.exec(["/bin/sh", "-c", 'printf "%s" "$PATH"'], env={"PATH": "/nowhere"})
    assert (r.exit_code, r.stdout) == (0, "/nowhere"), r.stderr


async def test_commands_can_open_dev_stdout_and_dev_stderr(make_workspace):
    """Build and test scripts write to /dev/stdout and /dev/stderr by name (`tee /dev/stderr`); in the
    isolated sandbox the output pipes were root's, and the sandbox user could not open them (EACCES)."""
    ws = await make_workspace()
    r = await ws.exec("echo out > /dev/stdout; echo err > /dev/stderr; echo both | tee /dev/stderr", timeout=30)
    assert (r.exit_code, r.stdout, r.stderr) == (0, "out\nboth\n", "err\nboth\n"), r
    r = await ws.exec(["python", "-c", "open('/dev/stderr', 'w').write('py')"], timeout=30)
    assert (r.exit_code, r.stderr) == (0, "py"), r


async def test_toolchain_python_and_pytest_available(make_workspace):
    ws = await make_workspace()
    r = await ws.exec("python -m pytest -q tests 2>&1 | tail -1", timeout=60)
    assert "1 passed" in r.stdout, r.stdout


@pytest.mark.parametrize("env_option", [True, False], ids=["env", "no-env-option"])
async def test_commands_start_with_default_signals(make_workspace, env_option, monkeypatch):
    """Whatever the launcher ignores or blocks (Ray's processes block SIGINT and SIGTERM under `vivace
    train`, nohup ignores SIGHUP), a command starts as in a shell: a task's tests that rely on Ctrl-C,
    SIGTERM (`timeout`) or SIGHUP behave the same; also where env lacks --default-signal (coreutils < 8.31)."""
    if not env_option:
        monkeypatch.setattr(process, "default_signals", lambda: ())
    ws = await make_workspace()
    before = [signal.signal(signal.SIGINT, signal.SIG_IGN), signal.signal(signal.SIGHUP, signal.SIG_IGN)]
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, (signal.SIGINT, signal.SIGTERM))
    try:
        r = await ws.exec(["grep", "-E", "SigIgn|SigBlk", "/proc/self/status"])
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        signal.signal(signal.SIGINT, before[0])
        signal.signal(signal.SIGHUP, before[1])
    masks = dict(line.split() for line in r.stdout.splitlines())
    # Standard signals 1-31 (bit n-1); 32 and 33 are glibc's own, which no program can reset or set.
    assert r.exit_code == 0 and set(masks) == {"SigIgn:", "SigBlk:"}, r.stdout + r.stderr
    assert all(int(m, 16) & ((1 << 31) - 1) == 0 for m in masks.values()), r.stdout


async def test_timeout_reports_and_returns(make_workspace):
    ws = await make_workspace()
    r = await ws.exec("sleep 30", timeout=0.5)
    assert r.timed_out
    assert r.duration_s < 10
    assert (await ws.exec("echo alive")).stdout == "alive\n"


async def test_output_is_capped_head_and_tail(make_workspace):
    ws = await make_workspace()
    r = await ws.exec("seq 1 2000000; echo LAST")
    assert r.stdout.startswith("1\n2\n")
    assert r.stdout.rstrip().endswith("LAST")
    assert r.stdout_dropped > 0
    assert "bytes of output dropped" in r.stdout


async def test_workspaces_are_independent(make_workspace):
    a, b = await make_workspace(), await make_workspace()
    await a.write_text("pkg/calc.py", "changed\n")
    await a.exec("echo new > fresh.txt")
    assert (await b.read_text("pkg/calc.py")).startswith("def add")
    with pytest.raises(WorkspaceFileNotFound):
        await b.read_text("fresh.txt")


async def test_file_api_roundtrip(make_workspace):
    ws = await make_workspace()
    await ws.write_text("new/dir/file.txt", "héllo\n")
    assert await ws.read_text("new/dir/file.txt") == "héllo\n"
    assert (await ws.exec("cat new/dir/file.txt")).stdout == "héllo\n"
    # A file written through the API stays writable by commands (ownership is right).
    assert (await ws.exec("echo more >> new/dir/file.txt")).exit_code == 0
    await ws.write_bytes("bin.dat", b"\x00\xff")
    assert await ws.read_bytes("bin.dat") == b"\x00\xff"
    names = {e.name: e for e in await ws.list(".")}
    assert names["pkg"].kind == "dir" and names["README.md"].kind == "file"
    st = await ws.stat("README.md")
    assert st.kind == "file" and st.size == len("# demo\n")
    assert (await ws.stat("pkg/alias.py")).kind == "symlink"


async def test_inside_symlinks_are_followed(make_workspace):
    ws = await make_workspace()
    assert (await ws.read_text("pkg/alias.py")).startswith("def add")
    assert (await ws.read_text("pkg/../README.md")) == "# demo\n"
    assert (await ws.read_text("/workspace/README.md")) == "# demo\n"


@pytest.mark.parametrize("path", ["../outside", "/etc/passwd", "pkg/../../x", "a/../../b"])
async def test_escaping_paths_refused(make_workspace, path):
    ws = await make_workspace()
    ops = (ws.read_bytes, lambda p: ws.write_bytes(p, b"x"), ws.list, ws.stat, ws.remove)
    for op in ops:
        with pytest.raises(PathEscapeError):
            await op(path)


async def test_symlink_escape_refused(make_workspace):
    ws = await make_workspace()
    await ws.exec("ln -s /etc/passwd leak && ln -s ../../../../.. up && ln -s /etc etcdir")
    for path in ("leak", "up/etc/passwd", "etcdir/passwd"):
        with pytest.raises(PathEscapeError):
            await ws.read_bytes(path)
        with pytest.raises(PathEscapeError):
            await ws.write_bytes(path, b"pwned")
    with pytest.raises(PathEscapeError):
        await ws.list("etcdir")
    # Removing the link itself is fine and does not touch its target.
    await ws.remove("leak")
    assert Path("/etc/passwd").read_text()


async def test_errors_are_typed(make_workspace):
    ws = await make_workspace()
    with pytest.raises(WorkspaceFileNotFound):
        await ws.read_text("missing.txt")
    with pytest.raises(NotAFileError):
        await ws.read_text("pkg")
    with pytest.raises(NotAFileError):
        await ws.remove("pkg")  # non-empty directory without recursive
    await ws.remove("pkg", recursive=True)
    with pytest.raises(WorkspaceFileNotFound):
        await ws.stat("pkg/calc.py")


async def test_diff_against_base(make_workspace, repo, tmp_path):
    ws = await make_workspace()
    await ws.write_text("pkg/calc.py", "def add(a, b):\n    return a - b\n\n\ndef sub(a, b):\n    return a - b\n")
    await ws.exec("rm README.md && mkdir -p docs && echo guide > docs/guide.md && printf 'z\\x00' > data/blob.bin")
    await ws.exec("python -c 'import pkg.calc'")  # __pycache__ must not show up in the diff
    await ws.write_text("pkg/alias.py", "")  # through the symlink: edits calc.py's content
    diff = await ws.diff()
    assert "diff --git a/README.md b/README.md\ndeleted file mode 100644" in diff
    assert "+++ b/docs/guide.md" in diff and "+guide" in diff
    assert "Binary files a/data/blob.bin and b/data/blob.bin differ" in diff
    assert "__pycache__" not in diff
    # The diff applies cleanly to a pristine copy of the repository with git.
    subprocess.run(["cp", "-a", f"{repo}/.", str(tmp_path)], check=True)
    parts = diff.split("diff --git ")[1:]
    patch = tmp_path / "p.diff"
    patch.write_text("".join("diff --git " + p for p in parts if "Binary files" not in p))
    subprocess.run(["git", "apply", "--unsafe-paths", "-p1", str(patch)], cwd=tmp_path, check=True)
    assert not (tmp_path / "README.md").exists()
    assert (tmp_path / "docs/guide.md").read_text() == "guide\n"
    assert (tmp_path / "pkg/calc.py").read_text() == ""


async def test_diff_empty_when_unchanged_and_after_revert(make_workspace):
    ws = await make_workspace()
    assert await ws.diff() == ""
    original = await ws.read_text("pkg/calc.py")
    await ws.write_text("pkg/calc.py", "x\n")
    await ws.write_text("pkg/calc.py", original)
    assert await ws.diff() == ""


async def test_diff_of_removed_directory(make_workspace):
    ws = await make_workspace()
    await ws.exec("rm -rf pkg")
    diff = await ws.diff()
    assert "deleted file mode 100644" in diff and "a/pkg/calc.py" in diff and "a/pkg/__init__.py" in diff


async def test_concurrent_execs_in_one_workspace(make_workspace):
    ws = await make_workspace()
    results = await asyncio.gather(*(ws.exec(f"echo {i} > f{i}.txt && cat f{i}.txt") for i in range(8)))
    assert [r.stdout for r in results] == [f"{i}\n" for i in range(8)]


async def test_closed_workspace_refuses_work(make_workspace):
    ws = await make_workspace()
    await ws.close()
    await ws.close()  # idempotent
    with pytest.raises(WorkspaceClosedError):
        await ws.exec("true")
    with pytest.raises(WorkspaceClosedError):
        await ws.read_text("README.md")


async def test_write_replaces_a_file_whole_and_keeps_its_mode_and_owner(make_workspace):
    """A write never shows a reader half a file: it lands as a new file renamed over the old one,
    which keeps the old one's permissions and owner (a command can still append to it)."""
    ws = await make_workspace()
    r = await ws.exec("printf 'old\\n' > run.sh && chmod 755 run.sh && ln -s run.sh link.sh && stat -c %u:%g run.sh")
    assert r.exit_code == 0, r
    await ws.write_bytes("link.sh", b"new\n" * 1000)  # through an inside symlink: the target is replaced
    assert (await ws.stat("run.sh")).mode == 0o755 and (await ws.stat("link.sh")).kind == "symlink"
    after = await ws.exec("stat -c %u:%g run.sh && echo more >> run.sh && tail -1 run.sh && ls -A | grep -c vivace")
    assert after.stdout == f"{r.stdout}more\n0\n", after


def test_confined_write_is_atomic_for_readers(tmp_path):
    fs = ConfinedFS(tmp_path)
    fs.write_bytes("f.txt", b"old content\n")
    with open(tmp_path / "f.txt", "rb") as reader:  # opened before the write: sees all of the old file
        fs.write_bytes("f.txt", b"new\n")
        assert reader.read() == b"old content\n"
    assert (tmp_path / "f.txt").read_bytes() == b"new\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.txt"]  # no temporary file left behind
    (tmp_path / "d").mkdir()
    with pytest.raises(NotAFileError):
        fs.write_bytes("d", b"x")
    os.mkfifo(tmp_path / "pipe")
    with pytest.raises(NotAFileError):  # refused, not opened (which would block on a FIFO)
        fs.write_bytes("pipe", b"x")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d", "f.txt", "pipe"]


def test_confined_realpath_resolves_inside_links_only(tmp_path):
    fs = ConfinedFS(tmp_path)
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg/a.py").write_text("a = 1\n")
    os.symlink("pkg/a.py", tmp_path / "link.py")
    os.symlink("pkg", tmp_path / "ld")
    os.symlink("/workspace/pkg/a.py", tmp_path / "abs.py")
    os.symlink("/etc/passwd", tmp_path / "out")
    os.symlink("../../../..", tmp_path / "pkg/up")
    assert fs.realpath("link.py") == "pkg/a.py" and fs.realpath("/workspace/link.py") == "pkg/a.py"
    assert fs.realpath("ld/a.py") == fs.realpath("abs.py") == "pkg/a.py"
    assert fs.realpath("ld/new/deeper.py") == "pkg/new/deeper.py"  # as a write would create it
    assert fs.realpath("new/../link.py") == "pkg/a.py" and fs.realpath(".") == "."
    for escaping in ("out", "pkg/up/etc", "ld/up/x", "../x", "new/../../x"):
        with pytest.raises(PathEscapeError):
            fs.realpath(escaping)


def test_confined_fs_of_an_unmounted_tree_keeps_slash_workspace_outside(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub/f").write_text("in\n")
    os.symlink("/workspace/sub", tmp_path / "l")
    assert ConfinedFS(tmp_path).read_bytes("l/f") == ConfinedFS(tmp_path).read_bytes("/workspace/sub/f") == b"in\n"
    for path in ("l/f", "/workspace/sub/f"):
        with pytest.raises(PathEscapeError):
            ConfinedFS(tmp_path, mount=None).read_bytes(path)


def test_a_read_stops_one_byte_past_the_limit_of_a_file_still_growing(tmp_path, monkeypatch):
    """The size is checked at the open; a command appending meanwhile must not make the read take
    whatever the file grows to."""
    (tmp_path / "log").write_bytes(b"x" * 50)
    fs, real = ConfinedFS(tmp_path), ConfinedFS.open_regular

    def grows(self, path, max_bytes, head_bytes=0):
        opened = real(self, path, max_bytes, head_bytes)
        with open(tmp_path / "log", "ab") as f:
            f.write(b"y" * 1000)
        return opened

    monkeypatch.setattr(ConfinedFS, "open_regular", grows)
    with pytest.raises(NotAFileError, match="growing, over the 100-byte read limit"):
        fs.read_bytes("log", max_bytes=100)


def test_confined_paths_hundreds_of_levels_down_need_two_descriptors(tmp_path):
    """ConfinedFS held a descriptor for each level it walked: with 256 of them, a write, a read or a
    climb through `..` 400 levels down ran out and was refused as a path "changed while resolving"
    (at the usual 1,024: past about 1,000 levels, a tree any command can make). It now holds the
    root's and the current directory's."""
    fs = ConfinedFS(tmp_path)
    deep = "d/" * 400
    limits = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(256, limits[0]), limits[1]))
    try:
        fs.write_bytes(deep + "f.txt", b"deep\n")  # makes the 400 directories on the way
        _symlink_deep(tmp_path, 402, "up", "../../f.txt")  # in the 402nd d: two levels up
        assert fs.read_bytes(deep + "f.txt") == b"deep\n"
        assert fs.read_bytes(deep + "d/d/up") == b"deep\n"
        assert fs.read_bytes(deep + "d/../../" + "d/" + "f.txt") == b"deep\n"
        assert fs.realpath(deep + "d/d/up") == deep + "f.txt"
        assert [e.name for e in fs.list(deep)] == ["d", "f.txt"]
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, limits)
        fs.remove("d", recursive=True)


def _symlink_deep(root: Path, levels: int, name: str, target: str) -> None:
    """A link `name` -> `target` in root/d/.../d (`levels` deep, made where missing), walked a level at
    a time: its path is past what one call takes."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(levels):
            with contextlib.suppress(FileExistsError):
                os.mkdir("d", dir_fd=fd)
            below = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = below
        os.symlink(target, name, dir_fd=fd)
    finally:
        os.close(fd)


def test_confined_climb_through_a_directory_moved_meanwhile_is_refused(tmp_path, monkeypatch):
    """`..` is opened from the directory reached and must be the one walked through: a directory a
    command moves elsewhere in the workspace during the walk stops it, rather than lead `..` into
    the directory it was moved to."""
    (tmp_path / "a" / "b" / "c").mkdir(parents=True)
    (tmp_path / "a" / "b" / "x").write_text("right\n")
    (tmp_path / "z").mkdir()
    (tmp_path / "z" / "x").write_text("wrong\n")
    fs, real_fstat, calls = ConfinedFS(tmp_path), os.fstat, []

    def fstat(fd):
        calls.append(fd)
        if len(calls) == 4:  # the root, a, b, then c just entered: a command moves c away
            os.rename(tmp_path / "a" / "b" / "c", tmp_path / "z" / "c")
        return real_fstat(fd)

    monkeypatch.setattr(os, "fstat", fstat)
    with pytest.raises(PathEscapeError, match="changed while resolving"):
        fs.read_bytes("a/b/c/../x")


@pytest.mark.parametrize("kind", ["isolated", "plain"])
async def test_a_relative_state_dir_works_from_where_it_was_given(kind, tmp_path, monkeypatch):
    # bwrap resolved the relative bind sources under it from elsewhere: every command failed.
    from conftest import make_backend
    from vivace.sandbox import SnapshotSource

    (tmp_path / "repo").mkdir()
    (tmp_path / "repo" / "a.txt").write_text("x")
    monkeypatch.chdir(tmp_path)
    backend = make_backend(kind, Path("state"))
    ws = await backend.create(backend.snapshot(SnapshotSource(path="repo")))
    try:
        assert (await ws.exec(["cat", "a.txt"])).stdout == "x"
    finally:
        await ws.close()


# -- deep trees and background children ---------------------------------------------------------
DEEP = 1100  # levels: past Python's recursion limit (1000), which os.walk and shutil.rmtree hit
MAKE_DEEP = f"python -c \"import os\nfor _ in range({DEEP}):\n    os.mkdir('d'); os.chdir('d')\nopen('leaf.txt', 'w').write('deep\\\\n')\""


def _procs_with(marker: str) -> list[int]:
    """Pids of this machine whose command line holds `marker`."""
    found = []
    for d in os.listdir("/proc"):
        try:
            if d.isdigit() and marker.encode() in Path(f"/proc/{d}/cmdline").read_bytes().replace(b"\0", b" "):
                found.append(int(d))
        except OSError:
            continue
    return found


async def test_a_tree_deeper_than_the_recursion_limit_diffs_and_is_removed(make_workspace):
    """A command can make a tree 1,100 levels deep: the diff names its file (it raised RecursionError),
    and remove(recursive=True), the delete_file tool's call, removes it (it raised too)."""
    ws = await make_workspace()
    assert (await ws.exec(MAKE_DEEP)).exit_code == 0
    diff = await ws.diff()
    assert "b/" + "d/" * DEEP + "leaf.txt" in diff and "+deep" in diff
    await ws.remove("d", recursive=True)
    r = await ws.exec("ls")
    assert "d" not in r.stdout.split(), r
    assert await ws.diff() == ""


async def test_a_background_child_neither_holds_the_command_nor_outlives_it(make_workspace):
    """`(sleep) & exit 3` is done when the shell exits: exit 3, no timeout (the plain backend waited
    for the child's copy of the output pipes until the timeout); and nothing it started in the
    background runs on after the command, as in the isolated sandbox's PID namespace."""
    ws = await make_workspace()
    nonce = f"{os.getpid() % 1000}.{time.monotonic_ns() % 10**6}"
    r = await ws.exec(f"(sleep 1{nonce}) & sleep 2{nonce} >/dev/null 2>&1 & echo started; exit 3", timeout=6)
    assert (r.exit_code, r.timed_out, r.stdout) == (3, False, "started\n"), r
    assert r.duration_s < 4, r
    deadline = time.monotonic() + 3
    while _procs_with(f"sleep 1{nonce}") + _procs_with(f"sleep 2{nonce}") and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert _procs_with(f"sleep 1{nonce}") + _procs_with(f"sleep 2{nonce}") == []


async def test_plain_setsid_daemon_holds_exec_only_briefly_and_dies_when_no_command_runs(plain_ws):
    """A daemon that left the command's process group (setsid) keeps the output open, but the command
    is over when its shell exits (after DRAIN_S of reading). It lived on until the workspace closed, so
    it could rewrite the tests while the scorer ran them; now it dies once no command of the workspace
    runs (its cwd is in there), as in the isolated backend, and not while another command still runs."""
    nonce = f"3{os.getpid() % 1000}.{time.monotonic_ns() % 10**6}"
    other = asyncio.create_task(plain_ws.exec("until [ -f go ]; do sleep 0.05; done", timeout=30))
    await asyncio.sleep(0.2)
    r = await plain_ws.exec(f"setsid sleep {nonce} & sleep 0.3; echo started", timeout=8)
    assert (r.exit_code, r.timed_out, r.stdout) == (0, False, "started\n"), r
    assert r.duration_s < 0.3 + process.DRAIN_S + 1.5, r
    assert not other.done() and _procs_with(f"sleep {nonce}"), "alive while a command of the workspace runs"
    await plain_ws.write_text("go", "")
    assert (await other).exit_code == 0
    deadline = time.monotonic() + 3  # killed as the last command ended; gone once init reaps it
    while _procs_with(f"sleep {nonce}") and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert _procs_with(f"sleep {nonce}") == []
    assert not plain_ws.closed
    await plain_ws.close()


async def test_plain_setsid_daemon_deeper_than_path_max_dies(plain_ws):
    """A plain workspace's daemons are found by their working directory's path, which a directory
    deeper than PATH_MAX does not have to read (ENAMETOOLONG): such a daemon outlived the workspace."""
    nonce = f"4{os.getpid() % 1000}.{time.monotonic_ns() % 10**6}"
    daemon = ("import os, time\nfor i in range(30):\n    os.mkdir('d' * 200); os.chdir('d' * 200)\n"
              f"os.execvp('sleep', ['sleep', '{nonce}'])")  # fmt: skip
    holder = asyncio.create_task(plain_ws.exec("sleep 3", timeout=8))  # keeps it alive until close
    await asyncio.sleep(0.2)
    r = await plain_ws.exec(f'setsid python3 -c "{daemon}" >/dev/null 2>&1 </dev/null & sleep 1; echo started')
    assert r.stdout == "started\n", r
    assert _procs_with(f"sleep {nonce}"), "the daemon should be running"
    await _close_and_see_gone(plain_ws, f"sleep {nonce}")
    with contextlib.suppress(Exception):
        await holder


async def _close_and_see_gone(ws, command: str) -> None:
    """Close `ws`, then expect no process running `command` within 3 s (killed, reaped by init)."""
    await ws.close()
    deadline = time.monotonic() + 3
    while _procs_with(command) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert _procs_with(command) == []


def test_confined_recursive_remove_of_a_deep_tree_never_follows_links(tmp_path):
    """ConfinedFS.remove(recursive=True) removes 1,100 levels (shutil.rmtree raised RecursionError) and
    the links in them, never what they point to."""
    root, outside = tmp_path / "ws", tmp_path / "outside"
    (outside / "sub").mkdir(parents=True)
    (outside / "sub" / "keep.txt").write_text("keep\n")
    here = root / "top"
    here.mkdir(parents=True)
    for i in range(DEEP):
        here = here / "d"
        here.mkdir()
        if i % 100 == 0:
            os.symlink(outside, here / "to_outside")
            os.symlink(outside / "sub" / "keep.txt", here / "to_file")
            (here / "f.txt").write_text("x")
    (here / "leaf").write_text("x")
    (root / "other.txt").write_text("stays\n")
    ConfinedFS(root).remove("top", recursive=True)
    assert sorted(p.name for p in root.iterdir()) == ["other.txt"]
    assert (outside / "sub" / "keep.txt").read_text() == "keep\n"


@pytest.mark.parametrize("kind", ["plain", "isolated"])
async def test_a_directory_holding_the_state_directory_is_snapshotted_without_it(kind, tmp_path):
    """`vivace agent --repo ~` with the default state directory (~/.cache/vivace): the snapshot copied
    the snapshot being built into itself until a path was too long to make."""
    from conftest import make_backend

    home = tmp_path / "home"
    (home / "project").mkdir(parents=True)
    (home / "project" / "a.py").write_text("x = 1\n")
    backend = make_backend(kind, home / ".cache" / "vivace")
    try:
        snap = backend.snapshot(str(home))
        files = sorted(p.relative_to(snap.root).as_posix() for p in snap.root.rglob("*"))
        assert files == [".cache", "project", "project/a.py"]  # .cache's other contents would stay
        ws = await backend.create(snap)
        assert (await ws.exec("ls -A .cache; cat project/a.py", timeout=30)).stdout == "x = 1\n"
        assert backend.snapshot(str(home)).key == snap.key  # the cache's own growth is no change of the source
    finally:
        await backend.aclose()


@pytest.mark.parametrize("call", ["write", "diff"])
@pytest.mark.parametrize("kind", ["isolated", "plain"])
async def test_a_call_running_as_its_workspace_closes_never_reaches_another_workspace(
    kind, call, tmp_path, state_dir, monkeypatch
):
    """A call still running in its thread when the workspace closed went on reaching the tree by its
    root's name, /proc/self/fd/N on the isolated backend: the next workspace's mount took N, a diff
    returned that workspace's files and a write changed them. Held open for the call, the tree stays
    the closed one's; and a call that ends after its workspace closed answers "closed", not with what
    it read of a tree half gone (the plain backend's diff said every file was deleted)."""
    from conftest import git, make_backend
    from vivace.sandbox import local as local_mod

    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "f.txt").write_text("base\n")
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "base")
    started, release = threading.Event(), threading.Event()

    def held_back(real):
        def call(*args, **kwargs):
            started.set()
            release.wait(30)
            return real(*args, **kwargs)

        return call

    if call == "diff":
        monkeypatch.setattr(local_mod, "tree_diff", held_back(local_mod.tree_diff))
    else:
        monkeypatch.setattr(local_mod.ConfinedFS, "write_bytes", held_back(local_mod.ConfinedFS.write_bytes))
    backend = make_backend(kind, state_dir)
    try:
        snapshot = backend.snapshot(str(repo))
        first = await backend.create(snapshot)
        if call == "diff":
            assert (await first.exec("echo 'written by the first' > f.txt")).exit_code == 0
            running = asyncio.ensure_future(first.diff())
        else:
            running = asyncio.ensure_future(first.write_text("f.txt", "written by the first\n"))
        assert await asyncio.to_thread(started.wait, 30)
        await first.close()
        second = await backend.create(snapshot)
        assert (await second.exec("echo 'written by the second' > f.txt")).exit_code == 0
        release.set()
        with pytest.raises(WorkspaceClosedError, match="closed during the call"):
            await running
        assert await second.read_text("f.txt") == "written by the second\n"
        assert "+written by the second" in await second.diff()
    finally:
        release.set()
        await backend.aclose()


@pytest.mark.parametrize("kind", ["isolated", "plain"])
async def test_a_command_killed_by_its_workspace_closing_answers_closed(kind, tmp_path, state_dir, monkeypatch):
    """A command still running when close's grace ends is killed by the teardown: its caller is told
    the workspace closed, not handed exit status 137, which reads as the command's own crash."""
    from conftest import make_backend
    from vivace.sandbox import local as local_mod

    monkeypatch.setattr(local_mod, "CLOSE_GRACE_S", 0.3)
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "f.txt").write_text("base\n")
    backend = make_backend(kind, state_dir)
    try:
        ws = await backend.create(backend.snapshot(str(repo)))
        running = asyncio.ensure_future(ws.exec("sleep 60", timeout=90))
        await asyncio.sleep(0.5)  # started
        t0 = time.monotonic()
        await ws.close()
        with pytest.raises(WorkspaceClosedError, match="closed during the call; the command was killed"):
            await running
        assert time.monotonic() - t0 < 20
        quick = await backend.create(backend.snapshot(str(repo)))
        done = asyncio.ensure_future(quick.exec("exit 3"))
        await asyncio.sleep(0.5)
        await quick.close()  # the command ended in the grace: its own status stands
        assert (await done).exit_code == 3
    finally:
        await backend.aclose()


def test_a_large_files_digest_reads_only_its_data_and_ignores_how_zeros_are_stored(tmp_path):
    """Files over the read limit are compared by digest. It hashed every byte, holes too, so one
    `truncate -s 1P` made a diff run for days; now holes are skipped, and a sparse file and a dense
    one of the same bytes still compare equal (only the contents count)."""
    from vivace.sandbox.paths import _content_digest

    huge = tmp_path / "huge.img"
    with open(huge, "wb") as f:
        f.truncate(1 << 43)  # 8 TiB (ext4 takes up to 16), no disk used
        f.seek(3 << 40)
        f.write(b"data in the middle")
    t0 = time.monotonic()
    with open(huge, "rb") as f:
        first = _content_digest(f.fileno())
    assert time.monotonic() - t0 < 5
    sparse, dense = tmp_path / "sparse", tmp_path / "dense"
    with open(sparse, "wb") as f:
        f.truncate(5 << 20)
        f.seek((2 << 20) + 7)
        f.write(b"x")
    dense.write_bytes(bytes((2 << 20) + 7) + b"x" + bytes((5 << 20) - (2 << 20) - 8))
    digest = {}
    for p in (sparse, dense):
        with open(p, "rb") as f:
            digest[p] = _content_digest(f.fileno())
    assert digest[sparse] == digest[dense] != first
    dense.write_bytes(bytes((2 << 20) + 7) + b"y" + bytes((5 << 20) - (2 << 20) - 8))
    longer = tmp_path / "longer"
    longer.write_bytes(bytes((2 << 20) + 7) + b"x" + bytes((5 << 20) - (2 << 20) - 7))  # one more zero
    for p in (dense, longer):
        with open(p, "rb") as f:
            assert _content_digest(f.fileno()) != digest[sparse]


async def test_a_sparse_petabyte_file_diffs_in_seconds(isolated_backend, repo):
    """One command's `truncate -s 1P`: the diff names it as binary, at once."""
    backend = isolated_backend
    ws = await backend.create(backend.snapshot(str(repo)))
    assert (await ws.exec("truncate -s 1P big.img")).exit_code == 0
    t0 = time.monotonic()
    diff = await ws.diff()
    assert time.monotonic() - t0 < 10
    assert "Binary files /dev/null and b/big.img differ" in diff


async def test_reading_a_socket_is_refused_as_not_a_regular_file(make_workspace):
    """A UNIX socket a command made: NotAFileError, as for a FIFO (it was a bare OSError, ENXIO)."""
    ws = await make_workspace()
    made = await ws.exec("python3 -c \"import socket; socket.socket(socket.AF_UNIX).bind('sock')\" && mkfifo fifo")
    assert made.exit_code == 0, made.stderr
    for name in ("sock", "fifo"):
        with pytest.raises(NotAFileError, match="not a regular file"):
            await ws.read_bytes(name)


def test_a_repository_too_deep_or_too_long_to_snapshot_is_a_sandbox_error(tmp_path, state_dir):
    """A tree 1,100 directories deep (which a command and --apply can make) and a path over PATH_MAX
    ended snapshots in RecursionError / a bare ENAMETOOLONG, and `vivace agent` in a traceback."""
    from conftest import make_backend
    from vivace.sandbox import SandboxError

    def nest(top, names):  # each level made relative to the one above: no path is ever spelled whole
        top.mkdir()
        fd = os.open(top, os.O_RDONLY)
        try:
            for name in names:
                os.mkdir(name, dir_fd=fd)
                fd, above = os.open(name, os.O_RDONLY, dir_fd=fd), fd
                os.close(above)
        finally:
            os.close(fd)
        return top

    backend = make_backend("plain", state_dir)
    try:
        with pytest.raises(SandboxError, match="nested too deep to copy"):
            backend.snapshot(str(nest(tmp_path / "deep", ["d"] * 1100)))
        with pytest.raises(SandboxError, match="holds a path too long"):  # 20 names of 250 bytes: 5,000
            backend.snapshot(str(nest(tmp_path / "long", [f"{i:02d}" + "d" * 248 for i in range(20)])))
    finally:  # rm copes with any depth (pytest's own clean-up recurses per level)
        subprocess.run(["rm", "-rf", str(tmp_path / "deep"), str(tmp_path / "long")], check=False)


@pytest.mark.skipif(os.geteuid() != 0, reason="a command can mount only as root")
async def test_closing_a_plain_workspace_never_deletes_through_a_mount_its_commands_made(plain_backend, repo, tmp_path):
    """The plain backend runs commands as its caller; as root one can bind a host directory into
    its workspace. Close removed the workspace through that mount and emptied the host directory
    (one_file_system cannot see a bind mount of the same filesystem), then left the mount for good."""
    from vivace.sandbox.linux import mounts_under

    outside = tmp_path / "precious"
    outside.mkdir()
    (outside / "keep.txt").write_text("keep me\n")
    ws = await plain_backend.create(plain_backend.snapshot(str(repo)))
    made = await ws.exec(f"mkdir bound && mount --bind {outside} bound && ls bound")
    if made.exit_code != 0:
        pytest.skip(f"cannot bind-mount here: {made.stderr.strip()}")
    assert made.stdout.split() == ["keep.txt"]
    await ws.close()
    assert (outside / "keep.txt").read_text() == "keep me\n"
    assert mounts_under(plain_backend.state) == [] and not ws.root.exists()


@pytest.mark.parametrize("kind", ["isolated", "plain"])
async def test_sparse_files_stay_sparse_through_snapshot_and_apply(kind, tmp_path, state_dir):
    """A repository's 1 GiB disk image of holes was snapshotted as 1 GiB of zeros, and a file a command
    made with `truncate -s 512M` (no disk used in the workspace) was applied as 512 MiB of zeros: with
    `truncate -s 100G`, 100 GB onto the developer's disk. Holes are now copied as holes, data as data."""
    from conftest import make_backend
    from vivace.sandbox.apply import export_changes

    repo = tmp_path / "repo"
    repo.mkdir()
    with open(repo / "disk.img", "wb") as f:
        f.truncate(1 << 30)
    backend = make_backend(kind, state_dir)
    try:
        snapshot = backend.snapshot(str(repo))
        assert os.stat(Path(snapshot.root) / "disk.img").st_blocks * 512 < 1 << 20
        ws = await backend.create(snapshot)
        made = await ws.exec("truncate -s 512M big.bin && printf 'middle' | dd of=big.bin bs=1 seek=300000000 "
                             "conv=notrunc status=none")  # fmt: skip
        assert made.exit_code == 0, made.stderr
        report = await export_changes(ws, await ws.diff(), repo, base=snapshot.root)
        assert report.applied == ["big.bin"], report
        st = os.stat(repo / "big.bin")
        assert st.st_size == 512 << 20 and st.st_blocks * 512 < 4 << 20
        with open(repo / "big.bin", "rb") as f:
            assert os.pread(f.fileno(), 8, 300_000_000 - 1) == b"\0middle\0"
    finally:
        await backend.aclose()


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.parametrize("kind", ["isolated", "plain"])
async def test_file_calls_cancelled_while_queued_leave_no_descriptor_open(kind, repo, state_dir):
    """A file call holds the workspace's tree open from the event loop until its thread job ends. Cancelled
    while every pool thread was busy (an episode's timeout, an aborted rollout), the job never ran and the
    descriptors stayed open for good: 4 per cancelled read, stat and diff, and on the isolated backend
    each kept the closed workspace's tmpfs in memory."""
    from conftest import make_backend

    backend = make_backend(kind, state_dir)
    ws = await backend.create(backend.snapshot(str(repo)))
    await ws.read_bytes("README.md")  # the pool's threads exist before counting
    before = _open_fds()
    release = threading.Event()
    loop = asyncio.get_running_loop()
    busy = [loop.run_in_executor(None, release.wait, 30) for _ in range(64)]  # more than the pool's threads
    calls = [asyncio.ensure_future(c) for c in (ws.read_bytes("README.md"), ws.stat("README.md"), ws.diff())]
    await asyncio.sleep(0.1)
    for call in calls:
        call.cancel()
    await asyncio.sleep(0.1)  # the cancellations reach the pool's queue before a thread is free
    release.set()
    await asyncio.gather(*busy)
    for call in calls:
        with contextlib.suppress(asyncio.CancelledError):
            await call
    await asyncio.sleep(0.1)  # the jobs queued behind the busy ones have run (and found themselves cancelled)
    assert _open_fds() == before
    assert await ws.read_bytes("README.md") == b"# demo\n"  # later calls are unaffected
    await backend.aclose()
