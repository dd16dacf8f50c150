"""Workspace diffs and --apply on awkward repositories (odd line breaks, ignored build output,
removed directories, non-UTF-8 names), --apply's care for the developer's own files (links, owner,
modes, directories, paths it cannot write, failed writes), and the bounded snapshot cache."""

from __future__ import annotations

import asyncio
import errno
import functools
import os
import re
import resource
import shutil
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ISOLATION_PROBLEM, DirWorkspace, git, make_backend
from vivace.sandbox import SnapshotSource
from vivace.sandbox import apply as apply_mod
from vivace.sandbox import local as local_mod
from vivace.sandbox.apply import ApplyReport, export_changes
from vivace.sandbox.client import EnvClient
from vivace.sandbox.diff import changed_paths, tree_diff, walk_files
from vivace.sandbox.paths import MAX_READ_BYTES, ConfinedFS
from vivace.sandbox.snapshot import evict, materialize

BACKENDS = ["plain"] + ([] if ISOLATION_PROBLEM else ["isolated"])


def _git_repo(root: Path, files: dict[str, bytes]) -> Path:
    root.mkdir()
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    git(root, "init", "-q")
    git(root, "add", "-A")
    assert git(root, "commit", "-qm", "base").returncode == 0
    return root


def _applies(repo: Path, diff: str) -> subprocess.CompletedProcess:
    return git(repo, "apply", "--check", "-", input=diff.encode())


def _diff(base: Path, work: Path) -> str:
    return tree_diff(base, work, set(walk_files(base)) | set(walk_files(work)), [".git"])


# -- 1: only "\n" ends a line ---------------------------------------------------------------
def test_diff_breaks_lines_at_newline_only_and_applies(tmp_path):
    odd = ["\f", "a\rb", "\u2028", "\u2029", "\x85", "\v", "\x1c", "\x1d", "\x1e"]
    lines = [f"line {i} {odd[i % len(odd)]} end\n" for i in range(100)]
    base = _git_repo(tmp_path / "base", {"odd.txt": "".join(lines).encode()})
    work = tmp_path / "work"
    shutil.copytree(base, work)
    lines[71] = "edited line 72\n"
    (work / "odd.txt").write_text("".join(lines), newline="")
    diff = _diff(base, work)
    assert "@@ -69,7 +69,7 @@" in diff  # line 72 with three lines of context each side
    assert _applies(base, diff).returncode == 0, _applies(base, diff).stderr


# -- 2: untracked files the repository's git ignore rules ignore ----------------------------
@pytest.mark.parametrize("kind", BACKENDS)
async def test_ignored_files_are_left_out_of_diff_and_apply(kind, tmp_path, monkeypatch, state_dir):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))  # where git finds global excludes
    (tmp_path / "xdg/git").mkdir(parents=True)
    (tmp_path / "xdg/git/ignore").write_text("*.globalignored\n")
    repo = _git_repo(tmp_path / "repo", {".gitignore": b"build/\nnode_modules/\n*.secret\n", "app.py": b"x = 1\n"})
    (repo / "tracked.secret").write_text("t\n")
    git(repo, "add", "-f", "tracked.secret")
    git(repo, "commit", "-qm", "tracked despite .gitignore")
    (repo / "present.secret").write_text("in the snapshot, untracked\n")
    (repo / ".git/info/exclude").write_text("*.log\n")
    backend = make_backend(kind, state_dir)
    try:
        ws = await backend.create(backend.snapshot(str(repo)))
        made = "mkdir -p build node_modules/pkg src && touch build/a.o node_modules/pkg/i.js new.secret x.log z.globalignored"
        await ws.exec(f"{made} && echo 2 > tracked.secret && echo 2 > present.secret && echo y > src/new.py")
        diff = await ws.diff()
        # An untracked ignored file the snapshot holds is left out when changed, as git status leaves it out: a
        # test run rewriting __pycache__/, `npm install` updating node_modules/, were half-applied before.
        assert changed_paths(diff) == ["src/new.py", "tracked.secret"]
        assert diff.startswith("# 5 new files and 1 changed or removed file left out of this diff")
        assert "build/, new.secret, node_modules/, present.secret" in diff
        assert _applies(repo, diff).returncode == 0
        await export_changes(ws, diff, repo)
    finally:
        await backend.aclose()
    assert (repo / "src/new.py").exists() and (repo / "tracked.secret").read_text() == "2\n"
    assert (repo / "present.secret").read_text() == "in the snapshot, untracked\n"
    assert not any((repo / p).exists() for p in ["build", "node_modules", "new.secret", "x.log", "z.globalignored"])


def test_ignore_rules_need_a_git_checkout(tmp_path):
    base = tmp_path / "base"
    base.mkdir()
    (base / ".gitignore").write_text("build/\n")
    work = tmp_path / "work"
    shutil.copytree(base, work)
    (work / "build").mkdir()
    (work / "build/a.o").write_text("o\n")
    assert changed_paths(_diff(base, work)) == ["build/a.o"]  # no .git: nothing to ask git


def test_new_files_a_submodule_ignores_are_left_out(tmp_path):
    """Inside a submodule its own ignore rules decide, as `git status` there would: its build output
    (*.o) was in the diff, and --apply wrote it."""
    lib = _git_repo(tmp_path / "lib", {".gitignore": b"*.o\n", "lib.py": b"x = 1\n"})
    base = _git_repo(tmp_path / "base", {".gitignore": b"build/\n", "main.py": b"y = 1\n"})
    assert (
        git(base, "-c", "protocol.file.allow=always", "submodule", "add", "-q", str(lib), "vendor/lib").returncode == 0
    )
    work = tmp_path / "work"
    shutil.copytree(base, work, symlinks=True)
    for rel in ["vendor/lib/a.o", "vendor/lib/new.py", "vendor/lib/build/keep.txt", "top.o", "build/x"]:
        (work / rel).parent.mkdir(parents=True, exist_ok=True)
        (work / rel).write_text("new\n")
    diff = _diff(base, work)
    # The superproject's build/ rule is not the submodule's, nor the submodule's *.o the superproject's.
    assert changed_paths(diff) == ["top.o", "vendor/lib/build/keep.txt", "vendor/lib/new.py"]
    assert diff.startswith("# 2 new files left out of this diff") and "(build/, vendor/)" in diff


@pytest.mark.parametrize("kind", [*BACKENDS, "http"])
async def test_a_subdirectory_of_a_checkout_takes_that_checkouts_ignore_rules(kind, tmp_path, state_dir, request):
    """`vivace agent --repo pkg/`: the copy of pkg/ has no .git, so its build output was in the diff
    (and --apply wrote it). The checkout's rules now decide at pkg/'s place in it: an anchored
    `/pkg/gen/` applies, `/gen/` (the top's gen/) does not; pkg's own .gitignore applies too."""
    top = _git_repo(
        tmp_path / "top",
        {".gitignore": b"*.log\n/pkg/gen/\n/gen/\n", "pkg/.gitignore": b"out.txt\n", "pkg/app.py": b"x = 1\n"},
    )
    (top / "pkg/sub").mkdir()
    made = "mkdir -p gen sub/gen && touch a.log gen/g.py out.txt sub/gen/s.py new.py"
    if kind == "http":  # the setting travels to an environment server
        server = request.getfixturevalue("env_server")
        client = EnvClient(server.url, server.token)
        create, close = client.create, client.aclose
    else:
        backend = make_backend(kind, state_dir)
        create, close = (lambda source: backend.create(backend.snapshot(source))), backend.aclose
    try:
        diffs = {}
        for wanted in (True, False):
            ws = await create(SnapshotSource(str(top / "pkg"), enclosing_ignore_rules=wanted))
            await ws.exec(made)
            diffs[wanted] = await ws.diff()
            await ws.close()
    finally:
        await close()
    assert changed_paths(diffs[True]) == ["new.py", "sub/gen/s.py"]
    assert diffs[True].startswith("# 3 new files left out of this diff") and "(a.log, gen/, out.txt)" in diffs[True]
    # Task repositories kept inside some checkout (vivace's own bundled ones) are judged by nothing but
    # themselves: the rules are asked for.
    assert changed_paths(diffs[False]) == ["a.log", "gen/g.py", "new.py", "out.txt", "sub/gen/s.py"]


# -- 3: --apply prunes directories its deletions emptied -------------------------------------
@pytest.mark.parametrize("kind", BACKENDS)
async def test_apply_prunes_directories_emptied_by_deletions(kind, tmp_path, state_dir):
    repo = tmp_path / "repo"
    for rel in ["pkg/sub/a.py", "pkg/sub/inner/b.py", "pkg/keep.py", "a/b/c.py", "gone/x/y.py", "top.py"]:
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text("x\n")
    (repo / "empty").mkdir()
    (repo / "pkg/was_empty").mkdir()
    backend = make_backend(kind, state_dir)
    try:
        ws = await backend.create(backend.snapshot(str(repo)))
        await ws.exec("rm -r pkg/sub gone && mv a/b a/bb")
        await export_changes(ws, await ws.diff(), repo)
    finally:
        await backend.aclose()
    assert sorted(walk_files(repo)) == ["a/bb/c.py", "pkg/keep.py", "top.py"]
    assert not any((repo / d).exists() for d in ["pkg/sub", "a/b", "gone"])
    assert (repo / "empty").is_dir() and (repo / "pkg/was_empty").is_dir()  # empty before: not the agent's


@pytest.mark.parametrize("kind", BACKENDS)
async def test_directories_replaced_by_a_link_or_a_file_diff_and_apply_as_git_has_them(kind, tmp_path, state_dir):
    """The isolated backend listed a link or file that took a lower directory's place, but not the
    directory's files it hid: the diff made `d` a link without deleting d/a.py (git apply refuses it)
    and --apply left `d` as a directory still holding files."""
    repo = _git_repo(tmp_path / "repo", {"d/a.py": b"x\n", "e/b.py": b"y\n", "keep.txt": b"k\n"})
    backend = make_backend(kind, state_dir)
    try:
        ws = await backend.create(backend.snapshot(str(repo)))
        await ws.exec("rm -r d e && mkdir other && echo z > other/a.py && ln -s other d && echo f > e")
        diff = await ws.diff()
        assert changed_paths(diff) == ["d", "d/a.py", "e", "e/b.py", "other/a.py"]
        assert _applies(repo, diff).returncode == 0, _applies(repo, diff).stderr
        report = await export_changes(ws, diff, repo)
    finally:
        await backend.aclose()
    assert report.left == {}, report.left
    assert os.readlink(repo / "d") == "other" and (repo / "e").read_text() == "f\n"
    assert (repo / "other/a.py").read_text() == "z\n"


@pytest.mark.parametrize("kind", BACKENDS)
async def test_a_link_out_of_the_repository_replaced_by_a_directory_is_never_walked(kind, tmp_path, state_dir):
    """The repository holds `hostroot -> <a host directory>` and a command replaces the link with a
    directory holding a file named like one of the host directory's. The isolated diff walked the
    host directory through the snapshot's link (all of /usr, for `hostroot -> /`); a path whose parent
    in the snapshot is a link has no snapshot files under it. The diff is git's own (the link deleted,
    the file new) and applies."""
    host = tmp_path / "host"
    (host / "usr" / "bin").mkdir(parents=True)
    for i in range(3):
        (host / "usr" / "bin" / f"tool{i}").write_text("host\n")
    repo = _git_repo(tmp_path / "repo", {"README.md": b"# r\n"})
    os.symlink(host, repo / "hostroot")
    git(repo, "add", "-A")
    assert git(repo, "commit", "-qm", "link").returncode == 0
    change = "rm hostroot && mkdir hostroot && echo hi > hostroot/usr"
    as_git = tmp_path / "as_git"
    shutil.copytree(repo, as_git, symlinks=True)
    subprocess.run(change, shell=True, cwd=as_git, check=True)
    git(as_git, "add", "-A")
    git_diff = git(as_git, "-c", "core.pager=cat", "diff", "--cached", "--no-color", "--no-ext-diff").stdout.decode()
    backend = make_backend(kind, state_dir)
    try:
        ws = await backend.create(backend.snapshot(str(repo)))
        assert (await ws.exec(change)).exit_code == 0
        changed = await ws._in_thread(lambda trees: backend.changed_paths(ws, trees), upper=True)
        compared = {p for p in changed if not p.startswith(".git/")}
        assert sorted(compared) == ["hostroot", "hostroot/usr"]
        diff = await ws.diff()
        assert diff == "".join(line for line in git_diff.splitlines(True) if not line.startswith("index "))
        assert _applies(repo, diff).returncode == 0, _applies(repo, diff).stderr
        report = await export_changes(ws, diff, repo)
    finally:
        await backend.aclose()
    assert report.left == {}, report.left
    assert not (repo / "hostroot").is_symlink() and (repo / "hostroot" / "usr").read_text() == "hi\n"
    assert sorted(os.listdir(host / "usr" / "bin")) == ["tool0", "tool1", "tool2"]


def _walk_files_before(root: Path, rel: str = "") -> list[str]:
    """walk_files as it was, on os.walk (recursive): the reference for what it lists, and in what order."""
    out = []
    base = root / rel if rel else root
    if not base.is_dir() or base.is_symlink():
        return [rel] if rel and os.path.lexists(base) else []
    for dirpath, dirnames, filenames in os.walk(base):
        for name in filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
            out.append(os.path.relpath(os.path.join(dirpath, name), root))
    return out


def test_walk_files_lists_what_os_walk_did_in_its_order_at_any_depth(tmp_path):
    root = tmp_path / "root"
    for rel in ("a/b/c.txt", "a/b/d/e.txt", "a/f.txt", "g.txt", "h/i/j.txt", "h/k.txt"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(rel)
    (root / "empty").mkdir()
    os.symlink("a/b", root / "link_dir")
    os.symlink("g.txt", root / "a" / "link_file")
    os.symlink("nowhere", root / "h" / "broken")
    os.mkfifo(root / "a" / "b" / "fifo")
    for rel in ("", "a", "a/b", "h", "g.txt", "link_dir", "missing"):
        assert walk_files(root, rel) == _walk_files_before(root, rel), rel
    deep = root / "deep"
    deep.mkdir()
    here = deep
    for i in range(1100):  # past the recursion limit: os.walk raised RecursionError
        here = here / "d"
        here.mkdir()
        if i % 250 == 0:
            (here / "f").write_text("x")
    (here / "leaf").write_text("x")
    levels = [0, 250, 500, 750, 1000]
    expected = ["/".join(["d"] * (i + 1) + ["f"]) for i in levels] + ["/".join(["d"] * 1100 + ["leaf"])]
    try:
        assert walk_files(deep) == expected
        assert walk_files(root, "deep") == ["deep/" + p for p in expected]
    finally:  # pytest's own clean-up of tmp_path recurses (RecursionError)
        ConfinedFS(root).remove("deep", recursive=True)


def test_walk_files_never_follows_a_link_on_the_way(tmp_path):
    """walk_files(lower, "hostroot/usr") built lower/hostroot/usr and walked what the link led to."""
    outside = tmp_path / "outside"
    (outside / "usr").mkdir(parents=True)
    (outside / "usr" / "f").write_text("x")
    root = tmp_path / "root"
    root.mkdir()
    os.symlink(outside, root / "hostroot")
    (root / "file").write_text("x")
    assert walk_files(root, "hostroot/usr") == [] and walk_files(root, "hostroot/usr/f") == []
    assert walk_files(root, "hostroot") == ["hostroot"]
    assert walk_files(root, "file/x") == [] and walk_files(root, "missing/x") == []
    assert sorted(walk_files(root)) == ["file", "hostroot"]


# -- 4: file names that are not UTF-8 --------------------------------------------------------
@pytest.mark.parametrize("kind", BACKENDS)
async def test_non_utf8_file_name_snapshots_diffs_and_applies(kind, tmp_path, state_dir):
    name = os.fsdecode(b"bad\xffname.txt")
    repo = _git_repo(tmp_path / "repo", {name: b"hello\n", "ok.txt": b"x\n"})
    backend = make_backend(kind, state_dir)
    try:
        ws = await backend.create(backend.snapshot(str(repo)))  # hashed the name: no UnicodeEncodeError
        await ws.exec('for f in bad*; do echo world >> "$f"; done')
        diff = await ws.diff()
        assert diff.startswith('diff --git "a/bad\\377name.txt" "b/bad\\377name.txt"\n')
        assert changed_paths(diff) == [name]
        assert _applies(repo, diff).returncode == 0
        await export_changes(ws, diff, repo)
    finally:
        await backend.aclose()
    assert (repo / name).read_bytes() == b"hello\nworld\n"


@pytest.mark.parametrize("name", ["tab\there", "new\nline", 'quo"te', "back\\slash", "h\u00e9llo", "sp ace"])
def test_awkward_names_round_trip_through_the_diff(tmp_path, name):
    base = _git_repo(tmp_path / "base", {"keep.txt": b"k\n"})
    work = tmp_path / "work"
    shutil.copytree(base, work)
    (work / name).write_text("new\n")
    diff = _diff(base, work)
    assert changed_paths(diff) == [name]
    assert _applies(base, diff).returncode == 0, _applies(base, diff).stderr


def test_a_file_that_became_a_link_and_back_applies_withgit(tmp_path):
    """git refuses a mode change between a file and a link ("new mode (120000) ... does not match old
    mode"); like git, the diff deletes one and creates the other. A link's target that is not UTF-8
    is diffed by its bytes (it raised UnicodeEncodeError)."""
    base = _git_repo(tmp_path / "base", {"f.txt": b"f\n", "g.txt": b"g\n"})
    os.symlink("g.txt", base / "l")
    git(base, "add", "-A")
    git(base, "commit", "-qm", "link")
    work = tmp_path / "work"
    shutil.copytree(base, work, symlinks=True)
    (work / "f.txt").unlink()
    os.symlink("g.txt", work / "f.txt")
    (work / "l").unlink()
    (work / "l").write_bytes(b"now a file\n")
    diff = _diff(base, work)
    assert changed_paths(diff) == ["f.txt", "l"]
    done = git(base, "apply", "-", input=diff.encode())
    assert done.returncode == 0, done.stderr
    assert os.readlink(base / "f.txt") == "g.txt" and (base / "l").read_bytes() == b"now a file\n"
    os.symlink(b"caf\xe9", os.fsencode(work / "n"))  # a binary patch, as any content that is not UTF-8 text
    assert changed_paths(_diff(base, work)) == ["n"]


def test_a_directory_replaced_by_a_link_loses_its_files_in_the_diff(tmp_path):
    """The diff read d/a.py through the new link d -> other, and showed it changed to other/a.py's
    content, where git (which tracks nothing beyond a link) has it deleted."""
    base = _git_repo(tmp_path / "base", {"d/a.py": b"x\n", "keep.txt": b"k\n"})
    work = tmp_path / "work"
    shutil.copytree(base, work, symlinks=True)
    shutil.rmtree(work / "d")
    (work / "other").mkdir()
    (work / "other" / "a.py").write_bytes(b"y\n")
    os.symlink("other", work / "d")
    diff = _diff(base, work)
    assert changed_paths(diff) == ["d", "d/a.py", "other/a.py"]
    assert "deleted file mode 100644" in diff.split("diff --git a/d/a.py")[1].split("diff --git")[0]
    done = git(base, "apply", "-", input=diff.encode())
    assert done.returncode == 0, done.stderr
    assert os.readlink(base / "d") == "other" and (base / "other" / "a.py").read_bytes() == b"y\n"


# -- 5: the snapshot cache is bounded ---------------------------------------------------------
def _source(tmp_path: Path, name: str) -> SnapshotSource:
    (tmp_path / name).mkdir()
    (tmp_path / name / "f.txt").write_text(name * 1000)
    return SnapshotSource(str(tmp_path / name))


def _age(cache: Path, key: str, seconds: float) -> None:
    past = os.stat(cache / f"{key}.used").st_mtime - seconds
    os.utime(cache / f"{key}.used", (past, past))


def test_evict_removes_least_recently_used_unclaimed_snapshots(tmp_path):
    cache, holder = tmp_path / "cache", tmp_path / "holder"
    holder.mkdir()
    oldest, claimed, old, recent = (
        materialize(_source(tmp_path, n), cache, holder=holder if n == "claimed" else None)
        for n in ["oldest", "claimed", "old", "recent"]
    )
    for snap, age in [(oldest, 400), (claimed, 300), (old, 200), (recent, 1)]:
        _age(cache, snap.key, age)
    total = sum(int((cache / f"{s.key}.used").read_text()) for s in [oldest, claimed, old, recent])
    assert evict(cache, [holder], max_bytes=total - 1, min_idle_s=60) == [oldest.key]  # least recent first
    assert evict(cache, [holder], max_bytes=0, min_idle_s=60) == [old.key]
    assert sorted(p.name for p in cache.iterdir() if p.is_dir()) == sorted([claimed.key, recent.key])
    assert not (cache / f"{old.key}.used").exists()
    assert materialize(SnapshotSource(str(tmp_path / "old")), cache).root.is_dir()  # rebuilt on demand


def test_evict_removes_builds_whose_builder_was_killed(tmp_path):
    """A build killed mid-way (its cleanup never ran) left its half-built tree, ~100 MB for a large
    repository, forever; one whose builder still runs is left alone."""
    cache = tmp_path / "cache"
    snap = materialize(_source(tmp_path, "a"), cache)
    dead = subprocess.Popen(["true"])
    dead.wait()
    killed = cache / f".{snap.key}x.tmp-{dead.pid}-0123abcd"
    running = cache / f".{snap.key}y.tmp-{os.getpid()}-0123abcd"
    for d in (killed, running):
        (d / "pkg").mkdir(parents=True)
        (d / "pkg" / "f.py").write_text("half")
    evict(cache, [], max_bytes=1 << 40)
    assert not killed.exists() and running.is_dir() and snap.root.is_dir()


async def test_backend_never_evicts_a_snapshot_in_use(tmp_path, monkeypatch):
    monkeypatch.setattr(local_mod, "evict", functools.partial(evict, max_bytes=0, min_idle_s=0))
    state = tmp_path / "state"
    done = make_backend("plain", state)
    unused = done.snapshot(_source(tmp_path, "unused"))
    await done.aclose()  # its claims go with it
    live = make_backend("plain", state)
    other = make_backend("plain", state)  # as another process on the machine would
    try:
        ws = await live.create(live.snapshot(_source(tmp_path, "used")))
        other.snapshot(_source(tmp_path, "other"))
        assert not unused.root.exists()
        assert ws.snapshot.root.is_dir() and await ws.diff() == ""
    finally:
        await live.aclose()
        await other.aclose()


def _claims(backend) -> set[str]:
    return {p.name.removeprefix("uses-") for p in backend.owner_dir.glob("uses-*")}


async def test_a_released_snapshot_is_evicted_once_its_last_workspace_is_closed(tmp_path, monkeypatch):
    """A backend claimed every snapshot it made until it ended, so an RL run or environment server over
    many repositories kept them all from the cache's eviction. A snapshot is claimed until released
    and while a workspace of it lives; then the next build's eviction may take it."""
    monkeypatch.setattr(local_mod, "evict", functools.partial(evict, max_bytes=0, min_idle_s=0))
    backend = make_backend("plain", tmp_path / "state")
    try:
        first = backend.snapshot(_source(tmp_path, "first"))
        twice = backend.snapshot(SnapshotSource(str(tmp_path / "first")))  # a second claim on it
        ws = await backend.create(first)
        backend.release(first)
        backend.release(twice)  # the caller is done with it; its workspace is not
        assert _claims(backend) == {first.key}
        backend.snapshot(_source(tmp_path, "second"))  # a build: evicts what nothing uses
        assert first.root.is_dir() and await ws.read_text("f.txt") == "first" * 1000
        await ws.close()
        assert first.key not in _claims(backend)
        backend.snapshot(_source(tmp_path, "third"))
        assert not first.root.exists()
        with pytest.raises(RuntimeError, match="released more often"):
            backend.release(first)
    finally:
        await backend.aclose()


async def test_episodes_leave_no_snapshot_claimed(tmp_path):
    """Every episode (bench and RL rollouts: run_task) gives its snapshot back when its workspace closes."""
    from vivace.harness.policies import NullPolicy
    from vivace.tasks.format import Task

    tasks = []
    for name in ("one", "two"):
        repo = tmp_path / name
        (repo / "pkg").mkdir(parents=True)
        (repo / "pkg" / "calc.py").write_text(f"NAME = {name!r}\n")
        hidden = "def test_name():\n    assert False\n"
        tasks.append(Task.model_validate({"id": name, "request": "fix it", "repo": {"path": str(repo)},
                                          "tests": {"fail_to_pass": ["tests/test_n.py::test_name"],
                                                    "files": {"tests/test_n.py": hidden}}}))  # fmt: skip
    from vivace.bench.runner import run_task
    from vivace.config import load_preset
    from vivace.sandbox import open_backend

    cfg = load_preset("default", sandbox={"backend": "plain", "state_dir": str(tmp_path / "state")})
    backend = open_backend(cfg.sandbox)
    seen = []
    try:
        for task in tasks:
            await run_task(NullPolicy(), task, cfg, backend)
            seen.append(_claims(backend))  # the backend lives on, as an RL run's does
    finally:
        await backend.aclose()
    assert seen == [set(), set()]


def test_a_changed_directory_is_snapshotted_again_sharing_its_unchanged_files(tmp_path):
    """A new snapshot of a directory hard-links what did not change since the last one (no second copy of
    a virtualenv), copies what did, and never links the source's own files (the developer's edits must
    not reach a snapshot). Links that cannot be made fall back to copies."""
    repo = tmp_path / "repo"
    (repo / "venv").mkdir(parents=True)
    for i in range(5):
        (repo / "venv" / f"lib{i}.py").write_text(f"lib {i}\n" * 100)
    (repo / "app.py").write_text("x = 1\n")
    (repo / "run.sh").write_text("echo\n")
    cache = tmp_path / "cache"
    first = materialize(SnapshotSource(str(repo)), cache)
    (repo / "app.py").write_text("x = 22\n")
    os.chmod(repo / "run.sh", 0o755)  # a mode change is a change
    (repo / "new.py").write_text("n\n")
    second = materialize(SnapshotSource(str(repo)), cache)
    assert second.key != first.key and second.built

    def ino(root: Path, rel: str) -> int:
        return (root / rel).stat().st_ino

    assert all(ino(second.root, f"venv/lib{i}.py") == ino(first.root, f"venv/lib{i}.py") for i in range(5))
    assert ino(second.root, "app.py") != ino(first.root, "app.py") and ino(second.root, "run.sh") != ino(
        first.root, "run.sh"
    )
    assert not any(ino(second.root, rel) == ino(repo, rel) for rel in ["app.py", "new.py", "venv/lib0.py"])
    assert (second.root / "app.py").read_text() == "x = 22\n" and (first.root / "app.py").read_text() == "x = 1\n"
    assert (second.root / "run.sh").stat().st_mode & 0o111 and (second.root / "new.py").read_text() == "n\n"

    shutil.rmtree(second.root)  # the newest snapshot is gone (evicted): the next one is a plain copy
    (repo / "app.py").write_text("x = 333\n")
    third = materialize(SnapshotSource(str(repo)), cache)
    assert (third.root / "app.py").read_text() == "x = 333\n"
    assert (third.root / "venv/lib3.py").read_text() == "lib 3\n" * 100
    assert (third.root / "venv/lib3.py").stat().st_nlink == 1


# -- 5: --apply after the developer went on working in the repository ------------------------
@pytest.mark.parametrize("kind", BACKENDS)
async def test_apply_never_overwrites_what_changed_in_the_repository_meanwhile(kind, tmp_path, state_dir):
    """The agent runs for minutes on a snapshot; the developer keeps editing. Apply merges a file both
    changed when the changes merge, and otherwise leaves the developer's version and says so."""
    lines = "".join(f"line {i}\n" for i in range(1, 21))
    files = {"merge.py": lines, "clash.py": "x = 1\n", "gone_here.py": "a\n", "gone_there.py": "b\n",
             "same.py": "s = 1\n", "agent_only.py": "q = 1\n", "bin.dat": "\0\1\2"}  # fmt: skip
    repo = _git_repo(tmp_path / "repo", {k: v.encode() for k, v in files.items()})
    backend = make_backend(kind, state_dir)
    try:
        ws = await backend.create(backend.snapshot(str(repo)))
        snapshot = ws.snapshot.root
        await ws.exec(
            "sed -i 's/^line 2$/agent 2/' merge.py && echo 'x = 2' > clash.py && echo edited > gone_here.py && "
            "rm gone_there.py && echo 's = 2' > same.py && echo 'q = 2' > agent_only.py && echo new > new.py && "
            "printf '\\0\\3' > bin.dat"
        )
        diff = await ws.diff()
        # Meanwhile, in the repository:
        (repo / "merge.py").write_text(lines.replace("line 19\n", "mine 19\n"))
        (repo / "clash.py").write_text("x = 3\n")
        (repo / "gone_here.py").unlink()
        (repo / "gone_there.py").write_text("b, edited\n")
        (repo / "same.py").write_text("s = 2\n")
        (repo / "bin.dat").write_bytes(b"\0\4")
        report = await export_changes(ws, diff, repo, base=snapshot)
    finally:
        await backend.aclose()
    left = report.left
    assert sorted(left) == ["bin.dat", "clash.py", "gone_here.py", "gone_there.py"]
    assert report.merged == ["merge.py"] and sorted(report.applied) == [
        "agent_only.py",
        "merge.py",
        "new.py",
        "same.py",
    ]
    assert all("changed in" in why for why in left.values())
    merged = (repo / "merge.py").read_text()
    assert merged == lines.replace("line 2\n", "agent 2\n").replace("line 19\n", "mine 19\n")
    assert (repo / "clash.py").read_text() == "x = 3\n" and not (repo / "gone_here.py").exists()
    assert (repo / "gone_there.py").read_text() == "b, edited\n" and (repo / "bin.dat").read_bytes() == b"\0\4"
    assert (repo / "same.py").read_text() == "s = 2\n"  # the same change on both sides
    assert (repo / "agent_only.py").read_text() == "q = 2\n" and (repo / "new.py").read_text() == "new\n"


# -- 6: --apply writes into the developer's own files ---------------------------------------


def _agent_ran(
    tmp_path: Path, files: dict[str, bytes], change, modes: dict[str, int] | None = None
) -> tuple[Path, Path, DirWorkspace, str]:
    """A repository holding `files` (with `modes`), its snapshot, and a workspace copy `change(work)`
    edited: (repo, snapshot, workspace, diff), the diff as a workspace makes it (.git and
    __pycache__ left out)."""
    repo = tmp_path / "repo"
    for rel, data in files.items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_bytes(data)
    for rel, mode in (modes or {}).items():
        os.chmod(repo / rel, mode)
    snapshot, work = tmp_path / "snapshot", tmp_path / "work"
    shutil.copytree(repo, snapshot, symlinks=True)
    shutil.copytree(repo, work, symlinks=True)
    change(work)
    diff = tree_diff(snapshot, work, set(walk_files(snapshot)) | set(walk_files(work)), [".git", "__pycache__"])
    return repo, snapshot, DirWorkspace(work), diff


async def test_apply_writes_files_in_place_keeping_hard_links_owner_and_xattrs(tmp_path):
    """A changed file keeps its inode: a hard link elsewhere sees the change, its owner and extended
    attributes stay (a rename of a new file over it dropped all three)."""
    repo, snapshot, ws, diff = _agent_ran(
        tmp_path, {"a.txt": b"old\n"}, lambda work: (work / "a.txt").write_bytes(b"new\n")
    )
    os.link(repo / "a.txt", tmp_path / "elsewhere.txt")
    try:
        os.setxattr(repo / "a.txt", "user.vivace_test", b"kept")
        xattrs = True
    except OSError:  # a filesystem without user xattrs
        xattrs = False
    owner = (4321, 4321) if os.geteuid() == 0 else (os.getuid(), os.getgid())
    os.chown(repo / "a.txt", *owner)
    inode = os.stat(repo / "a.txt").st_ino
    report = await export_changes(ws, diff, repo, base=snapshot)
    assert report.applied == ["a.txt"] and not report.left
    st = os.stat(repo / "a.txt")
    assert (st.st_ino, st.st_nlink, (st.st_uid, st.st_gid)) == (inode, 2, owner)
    assert (tmp_path / "elsewhere.txt").read_bytes() == b"new\n"
    if xattrs:
        assert os.getxattr(repo / "a.txt", "user.vivace_test") == b"kept"


async def test_apply_changes_only_the_permission_bits_the_diff_shows(tmp_path):
    """The diff shows only the executable bit (git's 100644/100755): that alone is applied. A private
    file the agent recreated stays private, a read-only one read-only; new files get git's modes."""
    modes = {"env": 0o600, "ro.txt": 0o444, "group.txt": 0o664, "run.sh": 0o755, "tool": 0o640}

    def change(work: Path) -> None:
        (work / "env").unlink()
        (work / "env").write_text("SECRET=2\n")  # recreated: 0644 in the workspace
        os.chmod(work / "ro.txt", 0o644)
        (work / "ro.txt").write_text("ro 2\n")
        (work / "group.txt").write_text("g 2\n")
        os.chmod(work / "run.sh", 0o644)  # the diff shows: old mode 100755, new mode 100644
        os.chmod(work / "tool", 0o744)  # ... and 100644 -> 100755
        (work / "new.sh").write_text("echo\n")
        os.chmod(work / "new.sh", 0o700)
        (work / "new.txt").write_text("n\n")
        os.chmod(work / "new.txt", 0o600)

    repo, snapshot, ws, diff = _agent_ran(tmp_path, {p: b"x\n" for p in modes}, change, modes)
    assert "old mode 100755\nnew mode 100644" in diff and "old mode 100644\nnew mode 100755" in diff
    umask = os.umask(0o022)
    os.umask(umask)
    report = await export_changes(ws, diff, repo, base=snapshot)
    assert not report.left
    got = {rel: stat.S_IMODE(os.stat(repo / rel).st_mode) for rel in [*modes, "new.sh", "new.txt"]}
    want = {"env": 0o600, "ro.txt": 0o444, "group.txt": 0o664, "run.sh": 0o644, "tool": 0o750}
    assert got == {**want, "new.sh": 0o777 & ~umask, "new.txt": 0o666 & ~umask}
    assert (repo / "env").read_text() == "SECRET=2\n" and (repo / "ro.txt").read_text() == "ro 2\n"


async def test_apply_never_removes_a_directory_holding_files_the_diff_does_not_remove(tmp_path):
    """The agent replaced directories by files. One held only what the diff removes: it becomes the
    file. The other still holds what the diff does not name (a file the developer added meanwhile,
    ignored __pycache__): it stays, with them, and the file is not applied (the whole directory
    used to be removed)."""

    def change(work: Path) -> None:
        for d in ("d", "e"):
            shutil.rmtree(work / d)
            (work / d).write_text(f"{d} is a file now\n")

    files = {"d/a.py": b"a\n", "d/__pycache__/a.pyc": b"c", "e/b.py": b"b\n", "e/sub/c.py": b"c\n"}
    repo, snapshot, ws, diff = _agent_ran(tmp_path, files, change)
    (repo / "d/mine.py").write_text("the developer's\n")
    report = await export_changes(ws, diff, repo, base=snapshot)
    assert list(report.left) == ["d"] and "still holds files" in report.left["d"]
    assert sorted(report.applied) == ["d/a.py", "e", "e/b.py", "e/sub/c.py"]
    assert sorted(walk_files(repo / "d")) == ["__pycache__/a.pyc", "mine.py"]
    assert (repo / "e").read_text() == "e is a file now\n"


async def test_apply_goes_on_past_paths_it_cannot_write_and_says_which(tmp_path):
    """Meanwhile the developer made `out` a symlink to a directory outside the repository and `pkg` a
    file. The agent's new files there are left, named, with why; nothing is written outside; the
    other changes are applied (the first error used to end the apply half-way, unreported)."""

    def change(work: Path) -> None:
        for rel in ("a.py", "out/new.py", "pkg/new.py", "z.py"):
            (work / rel).write_text("agent\n")

    files = {"a.py": b"a\n", "out/x.py": b"x\n", "pkg/y.py": b"y\n", "z.py": b"z\n"}
    repo, snapshot, ws, diff = _agent_ran(tmp_path, files, change)
    outside = tmp_path / "outside"
    outside.mkdir()
    shutil.rmtree(repo / "out")
    os.symlink(outside, repo / "out")
    shutil.rmtree(repo / "pkg")
    (repo / "pkg").write_text("a file now\n")
    report = await export_changes(ws, diff, repo, base=snapshot)
    assert report.applied == ["a.py", "z.py"] and sorted(report.left) == ["out/new.py", "pkg/new.py"]
    assert f"leads outside {repo} through a symlink" in report.left["out/new.py"]
    assert "not a directory" in report.left["pkg/new.py"]
    assert os.listdir(outside) == [] and (repo / "pkg").read_text() == "a file now\n"
    assert (repo / "a.py").read_text() == (repo / "z.py").read_text() == "agent\n"


async def test_apply_takes_a_link_to_slash_workspace_for_outside_the_repository(tmp_path):
    """Inside a sandbox /workspace is the workspace root; in a developer's repository (a dev container
    mounts one there) a link to /workspace/sub is some other directory. The agent's new file under
    such a link is left, not written into the repository's own sub/ (it used to be)."""
    repo, snapshot, ws, diff = _agent_ran(
        tmp_path, {"sub/keep.py": b"k\n", "l/x.py": b"x\n"}, lambda work: (work / "l/new.py").write_text("agent\n")
    )
    shutil.rmtree(repo / "l")
    os.symlink("/workspace/sub", repo / "l")
    report = await export_changes(ws, diff, repo, base=snapshot)
    assert report.applied == [] and "leads outside" in report.left["l/new.py"]
    assert sorted(os.listdir(repo / "sub")) == ["keep.py"]


@pytest.mark.parametrize("restore_fails", [False, True])
async def test_a_failed_write_puts_the_old_content_back(tmp_path, monkeypatch, restore_fails):
    """A write that fails half-way (disk full) leaves the file as it was, and the apply goes on; if
    putting the old content back fails too, the report says the file is half-written."""
    repo, snapshot, ws, diff = _agent_ran(
        tmp_path, {"a.txt": b"old " * 1000, "b.txt": b"b\n"},
        lambda work: [(work / rel).write_bytes(b"new " * 2000) for rel in ("a.txt", "b.txt")],
    )  # fmt: skip
    real, calls = apply_mod._write_at, []

    def disk_fills(fd: int, data: bytes, offset: int) -> None:
        calls.append(len(data))
        if len(calls) == 1 or restore_fails and len(calls) == 2:
            real(fd, bytes(data[:100]), offset)
            raise OSError(errno.ENOSPC, "No space left on device")
        real(fd, data, offset)

    monkeypatch.setattr(apply_mod, "_write_at", disk_fills)
    report = await export_changes(ws, diff, repo, base=snapshot)
    assert report.applied == ["b.txt"] and list(report.left) == ["a.txt"]
    assert (repo / "b.txt").read_bytes() == b"new " * 2000
    aside = [p for p in os.listdir(repo) if ".vivace-old-" in p]
    if restore_fails:
        assert report.left["a.txt"].startswith("LEFT HALF-WRITTEN") and "No space" in report.left["a.txt"]
        assert aside == [f".a.txt.vivace-old-{os.getpid()}"] and aside[0] in report.left["a.txt"]
        assert (repo / aside[0]).read_bytes() == b"old " * 1000  # kept for the user: named in the report
    else:
        assert report.left["a.txt"] == "not written: [Errno 28] No space left on device"
        assert (repo / "a.txt").read_bytes() == b"old " * 1000
        assert not aside


def test_a_kill_mid_write_leaves_the_old_content_beside_the_file(tmp_path, monkeypatch):
    """SIGKILL (or power loss) in the middle of writing a file over its old content: the old content
    was only in a temporary file gone with the process, so a killed --apply cut a 160 MB file to its
    first MiB for good. It is on disk beside the file until the write is done."""
    repo, snapshot, ws, diff = _agent_ran(
        tmp_path, {"a.txt": b"old " * 5000}, lambda work: (work / "a.txt").write_bytes(b"new " * 9000)
    )
    real = apply_mod._write_at

    def killed(fd: int, data: bytes, offset: int) -> None:
        real(fd, data[:100], offset)
        os.kill(os.getpid(), signal.SIGKILL)

    pid = os.fork()
    if pid == 0:  # the apply, in a child that dies mid-write
        monkeypatch.setattr(apply_mod, "_write_at", killed)
        try:
            asyncio.run(export_changes(ws, diff, repo, base=snapshot))
        finally:
            os._exit(3)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    assert (repo / "a.txt").read_bytes() != b"old " * 5000  # half-written: what a crash does in place
    assert (repo / f".a.txt.vivace-old-{pid}").read_bytes() == b"old " * 5000


def test_a_ctrl_c_during_a_write_lands_after_it(tmp_path, monkeypatch):
    """A second Ctrl-C raises KeyboardInterrupt wherever Python is. Held while a file is written, it
    lands after it: that file is whole and in the report, and the next one is not touched."""
    repo, snapshot, ws, diff = _agent_ran(
        tmp_path, {"a.txt": b"old\n" * 100, "b.txt": b"b\n"},
        lambda work: [(work / rel).write_bytes(b"new\n" * 100) for rel in ("a.txt", "b.txt")],
    )  # fmt: skip
    real = apply_mod._write_at

    def interrupted(fd: int, data: bytes, offset: int) -> None:
        real(fd, data[:10], offset)
        os.kill(os.getpid(), signal.SIGINT)
        real(fd, data[10:], offset + 10)

    monkeypatch.setattr(apply_mod, "_write_at", interrupted)
    report = ApplyReport()
    loop = asyncio.new_event_loop()  # not asyncio.run, whose handler turns the first Ctrl-C into a cancel
    try:
        with pytest.raises(KeyboardInterrupt):
            loop.run_until_complete(export_changes(ws, diff, repo, base=snapshot, report=report))
    finally:
        loop.close()
    assert report.applied == ["a.txt"] and not report.left
    assert (repo / "a.txt").read_bytes() == b"new\n" * 100 and (repo / "b.txt").read_bytes() == b"b\n"


async def test_apply_writes_binaries_over_the_read_limit(tmp_path, state_dir):
    """A binary the agent changed or made past the 64 MiB read limit (a model, a database fixture) was
    left: "not written: 'big.bin' is 68157440 bytes, over the 67108864-byte read limit"; it is copied
    in pieces, in place like any other file."""
    data = bytearray(os.urandom(1 << 16)) * ((MAX_READ_BYTES >> 16) + 16)
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "big.bin").write_bytes(data)
    inode = os.stat(repo / "big.bin").st_ino
    backend = make_backend("plain", state_dir)
    try:
        ws = await backend.create(backend.snapshot(str(repo)))
        grow = f"head -c {MAX_READ_BYTES + 5} /dev/zero > made.bin"
        await ws.exec(f"printf XYZ | dd of=big.bin bs=1 seek=1000 conv=notrunc 2>/dev/null && {grow}")
        diff = await ws.diff()
        assert changed_paths(diff) == ["big.bin", "made.bin"] and "Binary files a/big.bin and b/big.bin differ" in diff
        report = await export_changes(ws, diff, repo, base=ws.snapshot.root)
    finally:
        await backend.aclose()
    assert report.left == {} and sorted(report.applied) == ["big.bin", "made.bin"]
    data[1000:1003] = b"XYZ"
    assert (repo / "big.bin").read_bytes() == data and os.stat(repo / "big.bin").st_ino == inode
    assert (repo / "made.bin").read_bytes() == bytes(MAX_READ_BYTES + 5)


_UNPRIVILEGED_APPLY = """
import asyncio, sys
from pathlib import Path
from vivace.sandbox.apply import export_changes
from vivace.sandbox.diff import tree_diff, walk_files
from vivace.sandbox.paths import MAX_READ_BYTES, ConfinedFS

class Workspace:
    def __init__(self, root):
        self.fs = ConfinedFS(root)
    async def stat(self, path):
        return self.fs.stat(path)
    async def read_bytes(self, path):
        return self.fs.read_bytes(path)
    async def readlink(self, path):
        return self.fs.readlink(path)

repo, snapshot, work = map(Path, sys.argv[1:])
diff = tree_diff(snapshot, work, set(walk_files(snapshot)) | set(walk_files(work)))
report = asyncio.run(export_changes(Workspace(work), diff, repo, base=snapshot))
print(report.applied, report.left)
"""


def test_apply_writes_a_read_only_file_and_leaves_it_read_only(tmp_path):
    """As `git apply` does (and the rename-based write did): the file gets the agent's change and
    keeps its mode, also for a user without the privilege to write a read-only file (root runs it
    without capabilities)."""

    def change(work: Path) -> None:
        for rel in ("ro.txt", "rw.txt"):
            ConfinedFS(work).write_bytes(rel, b"new\n")  # as the agent's write_file: keeps the mode

    repo, snapshot, _, _ = _agent_ran(tmp_path, {"ro.txt": b"old\n", "rw.txt": b"old\n"}, change, {"ro.txt": 0o444})
    inode = os.stat(repo / "ro.txt").st_ino
    drop = []
    if os.geteuid() == 0:
        if not shutil.which("setpriv"):
            pytest.skip("needs setpriv to run without root's capabilities")
        drop = ["setpriv", "--inh-caps=-all", "--bounding-set=-all", "--"]
    argv = [*drop, sys.executable, "-c", _UNPRIVILEGED_APPLY, str(repo), str(snapshot), str(tmp_path / "work")]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "['ro.txt', 'rw.txt'] {}", done.stdout + done.stderr
    st = os.stat(repo / "ro.txt")
    assert (repo / "ro.txt").read_bytes() == b"new\n" and stat.S_IMODE(st.st_mode) == 0o444 and st.st_ino == inode


async def test_the_plain_diff_reads_only_what_changed_and_misses_no_change(tmp_path, state_dir, monkeypatch):
    """The plain backend's diff compared every file of both trees (seconds for a large repository).
    It now compares the paths in one tree only and those whose inode changed since the copy; a
    same-size edit whose mtime is set back, a chmod and a file renamed over another still show."""
    src = tmp_path / "src"
    for i in range(200):
        (src / f"d{i % 10}").mkdir(parents=True, exist_ok=True)
        (src / f"d{i % 10}/f{i}.py").write_text(f"x = {i:03d}\n")
    backend = make_backend("plain", state_dir)
    ws = await backend.create(backend.snapshot(SnapshotSource(path=str(src))))
    try:
        # 200 small files copy within one or two ticks of the filesystem's clock, all of them then
        # compared as possibly touched; stamp the copy's end a tick later, as a large copy's is.
        await asyncio.sleep(0.05)
        (ws.root.parent / ".copied").touch()
        await asyncio.sleep(0.05)  # the changes come a tick after, as any command's do
        root = ws.root
        hidden = root / "d1/f1.py"
        stamp = hidden.stat()
        hidden.write_text("x = 999\n")  # same size
        os.utime(hidden, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))  # mtime set back
        os.chmod(root / "d2/f2.py", 0o755)
        os.replace(root / "d3/f3.py", root / "d4/f4.py")
        (root / "d5/new.py").write_text("new\n")
        (root / "d6/f6.py").unlink()
        read = []
        real = ConfinedFS.entry
        monkeypatch.setattr(ConfinedFS, "entry", lambda self, path: read.append(path) or real(self, path))
        diff = await ws.diff()
        assert set(changed_paths(diff)) == {"d1/f1.py", "d2/f2.py", "d3/f3.py", "d4/f4.py", "d5/new.py", "d6/f6.py"}
        assert "+x = 999" in diff and "new mode 100755" in diff
        assert set(read) == set(changed_paths(diff))  # the 194 unchanged files were not read
    finally:
        await ws.close()
        await backend.aclose()


@pytest.mark.parametrize("content", [b"", b"not an archive\n"])
def test_a_file_that_is_no_tarball_is_refused_in_one_line_saying_what_to_give(tmp_path, content):
    from vivace.sandbox.base import SandboxError

    (tmp_path / "notes.txt").write_bytes(content)
    with pytest.raises(SandboxError) as e:
        materialize(SnapshotSource(str(tmp_path / "notes.txt")), tmp_path / "cache")
    assert "\n" not in str(e.value) and "give a directory, a tarball or a git repository" in str(e.value)


# -- 7: paths longer than PATH_MAX, and directories the diff cannot read ----------------------
@pytest.mark.parametrize("kind", BACKENDS)
async def test_a_file_deeper_than_path_max_is_diffed_and_applied(kind, tmp_path, state_dir):
    """The walk opened each directory by its full path: past 4096 bytes (ENAMETOOLONG) it logged "cannot
    read" and left the subtree out, so a file the agent wrote there was missing from the diff and from
    --apply, with "(no changes)" and exit 0. Each directory is now opened from its parent's descriptor."""
    deep = "/".join([f"{i:02d}" + "d" * 198 for i in range(22)]) + "/f.txt"  # 4,400 bytes, 22 levels
    repo = _git_repo(tmp_path / "repo", {"a.txt": b"a\n"})
    backend = make_backend(kind, state_dir)
    try:
        ws = await backend.create(backend.snapshot(str(repo)))
        await ws.write_text(deep, "deep\n")
        diff = await ws.diff()
        assert changed_paths(diff) == [deep] and diff.endswith("+deep\n"), diff[-300:]
        report = await export_changes(ws, diff, repo)
    finally:
        await backend.aclose()
    assert report.applied == [deep] and not report.left
    assert ConfinedFS(repo, mount=None).read_bytes(deep) == b"deep\n"


_UNPRIVILEGED_DIFF = """
import sys
from pathlib import Path
from vivace.sandbox.base import SandboxError
from vivace.sandbox.diff import tree_diff, walk_files

base, work = map(Path, sys.argv[1:])
try:
    print(tree_diff(base, work, set(walk_files(base)) | set(walk_files(work))))
except SandboxError as e:
    print("failed:", e)
"""


def test_a_workspace_directory_the_diff_cannot_read_fails_the_diff(tmp_path):
    """A directory a command made unreadable (chmod 000) was skipped with a log line: its files were
    left out of the diff, which then read as fewer changes, or none. The diff now fails (`vivace agent`
    exits 1, the repository untouched) and names the directory."""
    base = _git_repo(tmp_path / "base", {"keep.txt": b"k\n", "locked/old.txt": b"old\n"})
    work = tmp_path / "work"
    shutil.copytree(base, work)
    (work / "locked" / "old.txt").write_bytes(b"changed\n")
    (work / "locked" / "new.txt").write_bytes(b"new\n")
    os.chmod(work / "locked", 0)
    drop = []
    if os.geteuid() == 0:  # root reads it anyway: run without root's capabilities
        if not shutil.which("setpriv"):
            pytest.skip("needs setpriv to run without root's capabilities")
        drop = ["setpriv", "--inh-caps=-all", "--bounding-set=-all", "--"]
    try:
        argv = [*drop, sys.executable, "-c", _UNPRIVILEGED_DIFF, str(base), str(work)]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    finally:
        os.chmod(work / "locked", 0o755)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("failed: cannot read locked in ") and "Permission denied" in done.stdout, done.stdout


# -- 8: text that is not UTF-8, and binary files, as git diffs them -----------------------------
def test_non_utf8_text_and_binary_files_diff_as_git_does_and_apply(tmp_path):
    """A binary section with no `index` line made `git apply` reject the whole patch ("inconsistent old
    filename"). A binary change is now git's `GIT binary patch`, and so is text that is not UTF-8 (a
    latin-1 source edit; git shows it as lines, which would put undecodable bytes in the str): the diff
    is `git diff --binary`'s for the rest, and `git apply` makes every file byte for byte the
    workspace's, and takes it back with -R."""
    files = {"lat.py": b"caf\xe9 = 1\n", "x.bin": b"a\0b", "t.txt": b"t\n", "del.bin": b"gone\0x"}
    base = _git_repo(tmp_path / "base", files)
    work = tmp_path / "work"
    shutil.copytree(base, work)
    (work / "lat.py").write_bytes(b"caf\xe9 = 2\n")
    (work / "x.bin").write_bytes(b"a\0c")
    os.chmod(work / "x.bin", 0o755)
    (work / "t.txt").write_bytes(b"T\n")
    (work / "del.bin").unlink()
    (work / "new.bin").write_bytes(b"new\0")
    diff = _diff(base, work)
    ours = diff.encode("utf-8")  # a valid str: it is saved as JSON and shown to models
    sections = ["diff --git " + x for x in diff.split("diff --git ")[1:]]
    lat = next(x for x in sections if x.startswith("diff --git a/lat.py "))
    assert "GIT binary patch" in lat and "Binary files a/lat.py and b/lat.py differ" in lat
    git(work, "add", "-A")
    by_git = git(work, "diff", "--cached", "--binary", "--", "x.bin", "t.txt", "del.bin", "new.bin").stdout
    abbreviated_index = rb"index [0-9a-f]{7}\.\.[0-9a-f]{7} \d+\n"  # git's on text sections; vivace writes none
    expected = re.sub(abbreviated_index, b"", by_git)
    rest = "".join(x for x in sections if x != lat).encode()
    assert re.sub(rb"Binary files .* differ\n", b"", rest) == expected  # the note after each binary patch aside
    fresh = tmp_path / "fresh"
    shutil.copytree(base, fresh, ignore=shutil.ignore_patterns(".git"))  # no repository: no blobs to lean on
    done = subprocess.run(["git", "apply", "-"], cwd=fresh, input=ours, capture_output=True)
    assert done.returncode == 0, done.stderr
    for rel in ("lat.py", "x.bin", "t.txt", "new.bin"):
        assert (fresh / rel).read_bytes() == (work / rel).read_bytes(), rel
    assert not (fresh / "del.bin").exists() and os.stat(fresh / "x.bin").st_mode & 0o111
    undone = subprocess.run(["git", "apply", "-R", "-"], cwd=fresh, input=ours, capture_output=True)
    assert undone.returncode == 0, undone.stderr
    assert all((fresh / rel).read_bytes() == data for rel, data in files.items())


def test_a_binary_patch_over_many_lines_applies_as_git_writes_it(tmp_path):
    """Past 52 bytes of deflated data a binary patch spans lines, the last one short; what git reads
    back is the file itself (random bytes: git would write a delta, which is no shorter here)."""
    base = _git_repo(tmp_path / "base", {"blob.bin": b"\0" + os.urandom(5000)})
    work = tmp_path / "work"
    shutil.copytree(base, work)
    for size in (1, 26, 27, 52, 53, 4099):
        (work / f"new{size}.bin").write_bytes(b"\0" + os.urandom(size))
    (work / "blob.bin").write_bytes(b"\0" + os.urandom(3001))
    diff = _diff(base, work)
    done = git(base, "apply", "-", input=diff.encode())  # all ASCII: base85 and names
    assert done.returncode == 0, done.stderr
    assert all((base / p.name).read_bytes() == p.read_bytes() for p in work.iterdir() if p.suffix == ".bin")


def _make_deep(root: Path, levels: int, name: str, data: bytes) -> str:
    """root/name/name/.../f.txt, `levels` directories down, made a level at a time (past PATH_MAX)."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(levels):
            os.mkdir(name, dir_fd=fd)
            below = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = below
        out = os.open("f.txt", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd)
        os.write(out, data)
        os.close(out)
    finally:
        os.close(fd)
    return f"{name}/" * levels + "f.txt"


def test_a_file_hundreds_of_levels_down_is_diffed_with_few_descriptors(tmp_path):
    """300 levels (4,800 bytes of path) with 256 descriptors: the walk holds one, and the file is read
    from its own directory. ConfinedFS, holding one per level, took running out for a path changed
    meanwhile and read the file as missing (at the usual limit of 1,024: past about 1,000 levels)."""
    base = _git_repo(tmp_path / "base", {"a.txt": b"a\n"})
    work = tmp_path / "work"
    shutil.copytree(base, work)
    deep = _make_deep(work, 300, "d" * 15, b"deep\n")
    limits = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(256, limits[0]), limits[1]))
    try:
        diff = _diff(base, work)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, limits)
    assert changed_paths(diff) == [deep]
    assert diff.endswith(f"new file mode 100644\n--- /dev/null\n+++ b/{deep}\n@@ -0,0 +1 @@\n+deep\n")
