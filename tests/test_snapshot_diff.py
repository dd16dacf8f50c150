"""Workspace diffs and --apply on awkward repositories (odd line breaks, ignored build output,
removed directories, non-UTF-8 names), and the bounded snapshot cache."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import ISOLATION_PROBLEM, make_backend
from vivace.sandbox import SnapshotSource
from vivace.sandbox import local as local_mod
from vivace.sandbox.diff import changed_paths, export_changes, tree_diff, walk_files
from vivace.sandbox.snapshot import evict, materialize

BACKENDS = ["plain"] + ([] if ISOLATION_PROBLEM else ["isolated"])


def _git(repo: Path, *args: str, input: bytes | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}  # fmt: skip
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, input=input, env=env)


def _git_repo(root: Path, files: dict[str, bytes]) -> Path:
    root.mkdir()
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    _git(root, "init", "-q")
    _git(root, "add", "-A")
    assert _git(root, "commit", "-qm", "base").returncode == 0
    return root


def _applies(repo: Path, diff: str) -> subprocess.CompletedProcess:
    return _git(repo, "apply", "--check", "-", input=diff.encode())


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


# -- 2: new files the repository's git ignore rules ignore -----------------------------------
@pytest.mark.parametrize("kind", BACKENDS)
async def test_new_ignored_files_are_left_out_of_diff_and_apply(kind, tmp_path, monkeypatch, state_dir):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))  # where git finds global excludes
    (tmp_path / "xdg/git").mkdir(parents=True)
    (tmp_path / "xdg/git/ignore").write_text("*.globalignored\n")
    repo = _git_repo(tmp_path / "repo", {".gitignore": b"build/\nnode_modules/\n*.secret\n", "app.py": b"x = 1\n"})
    (repo / "tracked.secret").write_text("t\n")
    _git(repo, "add", "-f", "tracked.secret")
    _git(repo, "commit", "-qm", "tracked despite .gitignore")
    (repo / "present.secret").write_text("in the snapshot, untracked\n")
    (repo / ".git/info/exclude").write_text("*.log\n")
    backend = make_backend(kind, state_dir)
    try:
        ws = await backend.create(backend.snapshot(str(repo)))
        made = "mkdir -p build node_modules/pkg src && touch build/a.o node_modules/pkg/i.js new.secret x.log z.globalignored"
        await ws.exec(f"{made} && echo 2 > tracked.secret && echo 2 > present.secret && echo y > src/new.py")
        diff = await ws.diff()
        assert changed_paths(diff) == ["present.secret", "src/new.py", "tracked.secret"]
        assert diff.startswith("# 5 new files left out of this diff") and "build/, new.secret, node_modules/" in diff
        assert _applies(repo, diff).returncode == 0
        await export_changes(ws, diff, repo)
    finally:
        await backend.aclose()
    assert (repo / "src/new.py").exists() and (repo / "tracked.secret").read_text() == "2\n"
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
        left = await export_changes(ws, diff, repo, base=snapshot)
    finally:
        await backend.aclose()
    assert sorted(left) == ["bin.dat", "clash.py", "gone_here.py", "gone_there.py"]
    assert all("changed in" in why for why in left.values())
    merged = (repo / "merge.py").read_text()
    assert merged == lines.replace("line 2\n", "agent 2\n").replace("line 19\n", "mine 19\n")
    assert (repo / "clash.py").read_text() == "x = 3\n" and not (repo / "gone_here.py").exists()
    assert (repo / "gone_there.py").read_text() == "b, edited\n" and (repo / "bin.dat").read_bytes() == b"\0\4"
    assert (repo / "same.py").read_text() == "s = 2\n"  # the same change on both sides
    assert (repo / "agent_only.py").read_text() == "q = 2\n" and (repo / "new.py").read_text() == "new\n"
