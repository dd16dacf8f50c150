"""The plain backend's copy of a snapshot (`plain.copy_tree`): GNU cp, in one process or several over
parts of the tree, makes what shutil.copytree(symlinks=True) made, and shutil does it where cp is not
GNU cp or fails. The ctime-based diff (`PlainBackend.changed_paths`) still sees every change."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import stat
from pathlib import Path

import pytest

from conftest import make_backend
from vivace.sandbox import SnapshotSource, plain
from vivace.sandbox.diff import changed_paths

T0 = 1_000_000_123_456_789  # an mtime in ns, with nanoseconds a copy must keep
ODD = os.fsdecode(b"caf\xe9-\xff.txt")  # not UTF-8


def _tree(root: Path, outside: Path) -> None:
    """Every kind of entry a snapshot holds, with the modes, names and links that are easy to get wrong."""
    files = {
        "a.txt": (b"alpha\n", 0o644),
        "run.sh": (b"#!/bin/sh\necho hi\n", 0o755),
        "ro.txt": (b"read only\n", 0o444),
        "-rf": (b"dash\n", 0o644),
        "--help": (b"dashes\n", 0o600),
        ODD: (b"\xe9\n", 0o640),
        "sub/deep/x.py": (b"x = 1\n", 0o644),
        "sub/-d/y.py": (b"y = 2\n", 0o755),
        "locked/inside.txt": (b"in a read-only directory\n", 0o644),
        f"{ODD}-dir/z.txt": (b"z\n", 0o644),
    }
    for i in range(40):  # enough entries to share out among processes
        files[f"many/m{i:02d}.py"] = (f"m = {i}\n".encode(), 0o644 if i % 3 else 0o755)
    for rel, (data, mode) in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
        os.chmod(p, mode)
    (root / "empty").mkdir()
    (root / "e1/e2").mkdir(parents=True)
    os.link(root / "a.txt", root / "sub/hard")  # two names of one file: two files in the copy
    outside.write_text("outside the tree\n")
    links = {
        "rel": "a.txt",
        "dir_link": "sub",
        "dangling": "nowhere",
        "abs": str(outside),
        "abs_dangling": "/nonexistent/vivace",
        "sub/up": "../run.sh",
    }
    for rel, target in links.items():
        os.symlink(target, root / rel)
    try:
        os.setxattr(root / "a.txt", "user.vivace", b"kept")
    except OSError:  # no user xattrs on this filesystem
        pass
    for dirpath, dirnames, filenames in os.walk(root, topdown=False):  # children before their directory
        for i, name in enumerate(filenames + dirnames):
            os.utime(os.path.join(dirpath, name), ns=(T0, T0 + 1000 * i), follow_symlinks=False)
    os.chmod(root / "locked", 0o555)
    os.utime(root, ns=(T0, T0 + 7))


def _state(root: Path) -> dict[str, tuple]:
    """Each path's kind, mode, mtime and content (a link's target; a file's bytes and xattrs)."""
    out: dict[str, tuple] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in ["", *dirnames, *filenames]:
            p = os.path.join(dirpath, name) if name else dirpath
            st = os.lstat(p)
            rel = os.path.relpath(p, root)
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("link", st.st_mtime_ns, os.readlink(p))
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = ("dir", stat.S_IMODE(st.st_mode), st.st_mtime_ns)
            else:
                assert stat.S_ISREG(st.st_mode), rel
                data = Path(p).read_bytes()
                xattrs = {k: os.getxattr(p, k) for k in os.listxattr(p)} if hasattr(os, "listxattr") else {}
                out[rel] = ("file", stat.S_IMODE(st.st_mode), st.st_mtime_ns, data, xattrs)
    return out


def _no_shared_inodes(src: Path, dest: Path) -> None:
    seen = {os.lstat(os.path.join(d, n)).st_ino for d, _, names in os.walk(src) for n in names}
    for d, _, names in os.walk(dest):
        for n in names:
            st = os.lstat(os.path.join(d, n))
            if stat.S_ISREG(st.st_mode):
                assert st.st_ino not in seen and st.st_nlink == 1, os.path.join(d, n)


@pytest.fixture
def tree(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    _tree(src, tmp_path / "outside.txt")
    yield src
    for d, _, _ in os.walk(tmp_path):  # read-only directories, for tmp_path's removal without root
        os.chmod(d, 0o755)


@pytest.fixture(autouse=True)
def _no_remembered_failures(monkeypatch):
    monkeypatch.setattr(plain, "_CP_FAILED", set())


needs_gnu_cp = pytest.mark.skipif(plain._gnu_cp() is None, reason="this machine's cp is not GNU cp")


def _copytree_calls(monkeypatch) -> list[Path]:
    """The trees shutil.copytree is asked to copy from now on (not the subtrees it recurses into)."""
    calls: list[Path] = []
    real = shutil.copytree
    monkeypatch.setattr(plain.shutil, "copytree", lambda src, *a, **kw: calls.append(src) or real(src, *a, **kw))
    return calls


@needs_gnu_cp
def test_gnu_cp_copies_as_copytree_does(tree, tmp_path, monkeypatch, caplog):
    """Modes (the executable bit, read-only files and directories), mtimes to the nanosecond of files,
    directories and links, links copied as links (relative, absolute, dangling, to a directory),
    empty directories, names that are not UTF-8 or start with '-', xattrs; a second name of a file
    becomes a file of its own; nothing shares an inode with the snapshot."""
    if os.geteuid() == 0:  # a file of another user (a tarball extracted as root): the copy is the copier's
        os.lchown(tree / "run.sh", 4321, 4321)
    expected = _state(tree)
    reference = tmp_path / "by-copytree"
    shutil.copytree(tree, reference, symlinks=True)
    calls = _copytree_calls(monkeypatch)
    caplog.set_level(logging.DEBUG, logger=plain.__name__)
    plain.copy_tree(tree, tmp_path / "copy")
    assert calls == [] and "with GNU cp" in caplog.text
    got = _state(tmp_path / "copy")
    assert got == expected == _state(reference)
    assert got["a.txt"][4] == _state(tree)["a.txt"][4]  # xattrs (none where unsupported)
    assert got["abs"] == ("link", expected["abs"][1], str(tmp_path / "outside.txt"))
    _no_shared_inodes(tree, tmp_path / "copy")
    owners = {os.lstat(os.path.join(d, n)).st_uid for d, ds, fs in os.walk(tmp_path / "copy") for n in ds + fs}
    assert owners == {os.geteuid()} == {os.lstat(reference / "run.sh").st_uid}
    assert _state(tree) == expected  # the snapshot untouched


def test_without_gnu_cp_shutil_copies(tree, tmp_path, monkeypatch, caplog):
    """Where cp is not GNU cp (macOS, busybox) shutil.copytree makes the copy, as it always did."""
    monkeypatch.setattr(plain, "_gnu_cp", lambda: None)
    calls = _copytree_calls(monkeypatch)
    caplog.set_level(logging.DEBUG, logger=plain.__name__)
    expected = _state(tree)
    plain.copy_tree(tree, tmp_path / "copy")
    assert calls[:1] == [tree] and "not GNU cp" in caplog.text
    assert _state(tmp_path / "copy") == expected
    _no_shared_inodes(tree, tmp_path / "copy")


def test_a_failing_cp_leaves_the_copy_to_shutil(tree, tmp_path, monkeypatch, caplog):
    """A cp that fails after writing part of the copy: the part is removed and shutil copies the
    whole; the next copy of that snapshot goes to shutil straight away."""
    fake = tmp_path / "cp"
    fake.write_text(
        '#!/bin/sh\nfor a; do last=$a; done\nmkdir -p "$last/partial" 2>/dev/null\necho broken >&2\nexit 3\n'
    )
    fake.chmod(0o755)
    monkeypatch.setattr(plain, "_gnu_cp", lambda: str(fake))
    calls = _copytree_calls(monkeypatch)
    caplog.set_level(logging.DEBUG, logger=plain.__name__)
    expected = _state(tree)
    plain.copy_tree(tree, tmp_path / "copy")
    assert calls[:1] == [tree] and "could not copy" in caplog.text and "broken" in caplog.text
    assert _state(tmp_path / "copy") == expected
    plain.copy_tree(tree, tmp_path / "again")
    assert calls.count(tree) == 2 and "failed on it before" in caplog.text
    assert _state(tmp_path / "again") == expected


def _ctimes_at_or_before_the_stamp(ws) -> None:
    copied = os.stat(ws.root.parent / ".copied").st_ctime_ns
    for dirpath, dirnames, filenames in os.walk(ws.root):
        for name in ["", *dirnames, *filenames]:
            p = os.path.join(dirpath, name) if name else dirpath
            assert os.lstat(p).st_ctime_ns <= copied, p


@pytest.mark.parametrize("method", ["shutil", *(["cp"] if plain._gnu_cp() else [])])
async def test_the_ctime_diff_sees_every_change_after_either_copy(tmp_path, state_dir, monkeypatch, method):
    """Every path of a new workspace has its ctime at or before the copy's stamp, whichever way it was
    copied, so a same-size edit with its mtime set back still shows in the diff, as do a chmod, a new
    file and a removed one; an untouched workspace's diff is empty."""
    if method == "shutil":
        monkeypatch.setattr(plain, "_gnu_cp", lambda: None)
    src = tmp_path / "repo"
    for i in range(60):
        (src / f"d{i % 6}").mkdir(parents=True, exist_ok=True)
        (src / f"d{i % 6}/f{i}.py").write_text(f"x = {i:03d}\n")
    os.symlink("d0/f0.py", src / "link")
    (src / "empty").mkdir()
    backend = make_backend("plain", state_dir)
    snapshot = backend.snapshot(SnapshotSource(path=str(src)))
    ws = await backend.create(snapshot)
    try:
        _ctimes_at_or_before_the_stamp(ws)
        assert await ws.diff() == ""
        await asyncio.sleep(0.05)  # the changes come a clock tick after the copy, as any command's do
        edited = ws.root / "d1/f1.py"
        before = edited.stat()
        edited.write_text("x = 999\n")  # same size
        os.utime(edited, ns=(before.st_atime_ns, before.st_mtime_ns))  # mtime set back
        assert os.stat(edited).st_mtime_ns == before.st_mtime_ns and os.stat(edited).st_size == before.st_size
        os.chmod(ws.root / "d2/f2.py", 0o755)
        (ws.root / "d3/new.py").write_text("new\n")
        (ws.root / "d4/f4.py").unlink()
        diff = await ws.diff()
        assert set(changed_paths(diff)) == {"d1/f1.py", "d2/f2.py", "d3/new.py", "d4/f4.py"}
        assert "-x = 001" in diff and "+x = 999" in diff and "new mode 100755" in diff
        assert (snapshot.root / "d1/f1.py").read_text() == "x = 001\n"  # the snapshot untouched
    finally:
        await ws.close()
        await backend.aclose()
