"""Snapshot sources (dir, tarball, git@commit), the content-keyed cache, config validation, CLI."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path

import pytest
from pydantic import ValidationError

from conftest import unprivileged
from vivace.config import SandboxConfig, load_config, load_preset
from vivace.sandbox import SandboxError, SnapshotSource
from vivace.sandbox.snapshot import materialize


def _git(repo: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}  # fmt: skip
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True, env=env).stdout


def test_dir_snapshot_is_cached_by_content(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.txt").write_text("one")
    cache = tmp_path / "cache"
    s1 = materialize(SnapshotSource(str(src)), cache)
    s2 = materialize(SnapshotSource(str(src)), cache)
    assert s1.key == s2.key and (s1.root / "a.txt").read_text() == "one"
    (src / "a.txt").write_text("two!")
    s3 = materialize(SnapshotSource(str(src)), cache)
    assert s3.key != s1.key and (s3.root / "a.txt").read_text() == "two!"
    assert (s1.root / "a.txt").read_text() == "one"  # the old snapshot is untouched


def test_tarball_snapshot(tmp_path):
    tar_path = tmp_path / "repo.tar.gz"
    with tarfile.open(tar_path, "w:gz") as tar:
        data = b"print('hi')\n"
        info = tarfile.TarInfo("pkg/main.py")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    snap = materialize(SnapshotSource(str(tar_path)), tmp_path / "cache")
    assert (snap.root / "pkg/main.py").read_bytes() == b"print('hi')\n"


@pytest.mark.parametrize("member", ["../evil.txt", "link-out"])
def test_tarball_with_escaping_member_is_refused(tmp_path, member):
    tar_path = tmp_path / "bad.tar"
    with tarfile.open(tar_path, "w") as tar:
        info = tarfile.TarInfo(member)
        if member == "link-out":
            info.type, info.linkname = tarfile.SYMTYPE, "../../../../etc/passwd"
            tar.addfile(info)
        else:
            info.size = 1
            tar.addfile(info, io.BytesIO(b"x"))
    with pytest.raises(SandboxError, match="cannot extract"):
        materialize(SnapshotSource(str(tar_path)), tmp_path / "cache")
    assert not (tmp_path / "evil.txt").exists()
    assert not list((tmp_path / "cache").glob(".*tmp*"))  # no half-built snapshot left


def test_corrupt_tarball_is_refused(tmp_path):
    bad = tmp_path / "bad.tar.gz"
    bad.write_bytes(b"not a tarball at all")
    with pytest.raises(SandboxError):
        materialize(SnapshotSource(str(bad)), tmp_path / "cache")


def _committed(repo: Path, files: dict[str, str]) -> Path:
    """`repo` as a git repository whose one commit holds `files` (and whatever `repo` already held)."""
    for rel, text in files.items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(text)
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "one")
    return repo


def test_git_snapshot_at_commit(tmp_path):
    repo = _committed(tmp_path / "repo", {"f.py": "v1\n"})
    first = _git(repo, "rev-parse", "HEAD").strip()
    (repo / "f.py").write_text("v2\n")
    (repo / "g.py").write_text("new\n")
    _git(repo, "commit", "-qam", "two")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "three")
    old = materialize(SnapshotSource(str(repo), commit=first), tmp_path / "cache")
    head = materialize(SnapshotSource(str(repo), commit="HEAD"), tmp_path / "cache")
    assert (old.root / "f.py").read_text() == "v1\n" and not (old.root / "g.py").exists()
    assert (head.root / "f.py").read_text() == "v2\n" and (head.root / "g.py").exists()
    assert not (old.root / ".git").exists()
    with pytest.raises(SandboxError, match="rev-parse"):
        materialize(SnapshotSource(str(repo), commit="no-such-rev"), tmp_path / "cache")


def test_git_snapshot_is_the_commits_tree_as_committed(tmp_path):
    """`git archive` made these snapshots: a symlink pointing outside the repository stopped its
    extraction (the workspace came out empty with no error, or, with more than a pipe's worth of files
    after the link, it hung), and the commit's .gitattributes dropped files (export-ignore) and
    rewrote others (export-subst). The snapshot is now the tree as committed."""
    repo = tmp_path / "repo"
    (repo / "pkg").mkdir(parents=True)
    os.symlink("/etc/hostname", repo / "a_link")  # sorts first: everything after it was lost
    os.symlink("../../outside", repo / "pkg/up_link")
    os.symlink("main.py", repo / "pkg/alias.py")
    (repo / "pkg/main.py").write_text("# version: $Format:%H$\n")
    (repo / "pkg/test_main.py").write_text("def test_f(): pass\n")
    (repo / "run.sh").write_text("#!/bin/sh\necho hi\n")
    (repo / "run.sh").chmod(0o755)
    (repo / "z.bin").write_bytes(os.urandom(300_000))  # more than a pipe holds, after the links
    _committed(repo, {".gitattributes": "pkg/test_main.py export-ignore\npkg/main.py export-subst\n"})
    snap = materialize(SnapshotSource(str(repo), commit="HEAD"), tmp_path / "cache")
    root = snap.root
    assert sorted(p.relative_to(root).as_posix() for p in root.rglob("*")) == sorted(
        [".gitattributes", "a_link", "pkg", "pkg/alias.py", "pkg/main.py", "pkg/test_main.py", "pkg/up_link",
         "run.sh", "z.bin"])  # fmt: skip
    assert os.readlink(root / "a_link") == "/etc/hostname" and os.readlink(root / "pkg/up_link") == "../../outside"
    assert (root / "pkg/alias.py").read_text() == "# version: $Format:%H$\n"  # through the link, unrewritten
    assert (root / "z.bin").read_bytes() == (repo / "z.bin").read_bytes()
    assert os.access(root / "run.sh", os.X_OK) and not os.access(root / "pkg/main.py", os.X_OK)


def test_git_snapshot_keeps_a_submodule_as_an_empty_directory(tmp_path):
    repo = _committed(tmp_path / "repo", {"f.py": "x = 1\n"})
    head = _git(repo, "rev-parse", "HEAD").strip()
    _git(repo, "update-index", "--add", "--cacheinfo", f"160000,{head},vendor/lib")  # a gitlink, as a submodule
    _git(repo, "commit", "-qm", "two")
    root = materialize(SnapshotSource(str(repo), commit="HEAD"), tmp_path / "cache").root
    assert (root / "vendor/lib").is_dir() and not list((root / "vendor/lib").iterdir())
    assert (root / "f.py").read_text() == "x = 1\n"


def test_missing_source(tmp_path):
    with pytest.raises(SandboxError, match="does not exist"):
        materialize(SnapshotSource(str(tmp_path / "nope")), tmp_path / "cache")


# -- repositories as developers have them ------------------------------------------------------
def _git_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}  # the snapshot's own .git decides


def _linked_checkout(tmp_path: Path, layout: str) -> tuple[Path, Path]:
    """(the checkout to snapshot, the git directory its `.git` file names) for a linked worktree of a
    repository (`worktree`), of a bare one (`bare-worktree`), or a submodule checked out in another.
    The repository's info/exclude ignores *.log."""
    main = tmp_path / "main"
    main.mkdir()
    _git(main, "init", "-q")
    (main / ".gitignore").write_text("build/\n")
    (main / "app.py").write_text("x = 1\n")
    _git(main, "add", "-A")
    _git(main, "commit", "-qm", "base")
    if layout == "submodule":
        sup = tmp_path / "super"
        sup.mkdir()
        _git(sup, "init", "-q")
        _git(sup, "-c", "protocol.file.allow=always", "submodule", "add", "-q", str(main), "vendor/lib")
        checkout, common = sup / "vendor/lib", sup / ".git/modules/vendor/lib"
        gitdir = common
    else:
        if layout == "bare-worktree":
            _git(tmp_path, "clone", "-q", "--bare", str(main), "bare.git")
        common = tmp_path / "bare.git" if layout == "bare-worktree" else main / ".git"
        _git(common, "worktree", "add", "-q", "-b", "feature", str(tmp_path / "wt"))
        checkout, gitdir = tmp_path / "wt", common / "worktrees/wt"
    (common / "info").mkdir(exist_ok=True)
    (common / "info/exclude").write_text("*.log\n")
    return checkout, gitdir


@pytest.mark.parametrize("layout", ["worktree", "bare-worktree", "submodule"])
def test_a_linked_checkout_gets_a_git_directory_of_its_own(tmp_path, layout):
    """A worktree's or submodule's `.git` is a file naming a git directory outside it, which a sandbox
    cannot reach (git there: "not a git repository") or, on the plain backend, reaches and writes
    (`git status` rewrote the real worktree's index). The snapshot holds a copy of it instead."""
    checkout, gitdir = _linked_checkout(tmp_path, layout)
    real = {p: p.read_bytes() for p in gitdir.parent.parent.rglob("*") if p.is_file()}
    snap = materialize(SnapshotSource(str(checkout)), tmp_path / "cache")
    assert (snap.root / ".git").is_dir() and (snap.root / "app.py").read_text() == "x = 1\n"
    work = tmp_path / "work"  # what the plain backend does: a copy, where git may write
    shutil.copytree(snap.root, work, symlinks=True)
    (work / "app.py").write_text("x = 2\n")
    (work / "x.log").write_text("log\n")

    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=work, capture_output=True, text=True, env=_git_env())
        assert done.returncode == 0, done.stderr
        return done.stdout

    assert git("status", "--short").splitlines() == [" M app.py"]  # x.log: the repository's exclude applies
    branch = "feature" if "worktree" in layout else "master"
    assert git("rev-parse", "--abbrev-ref", "HEAD").strip() == branch
    assert git("rev-parse", "--show-toplevel").strip() == str(work)
    git("add", "-A")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "agent")
    assert {p: p.read_bytes() for p in gitdir.parent.parent.rglob("*") if p.is_file()} == real  # untouched
    assert (checkout / "app.py").read_text() == "x = 1\n"
    again = materialize(SnapshotSource(str(checkout)), tmp_path / "cache")
    assert again.key == snap.key and not again.built
    _git(checkout, "commit", "-q", "--allow-empty", "-m", "more")  # changes only the git directory
    assert materialize(SnapshotSource(str(checkout)), tmp_path / "cache").key != snap.key


@pytest.mark.parametrize("layout", ["worktree", "absolute"])
def test_submodules_in_the_snapshot_use_its_git_directory(tmp_path, layout):
    """A submodule checked out in a linked worktree names its git directory inside the worktree's
    (`../../../main/.git/worktrees/wt/modules/vendor/lib`), and older git wrote a submodule's as an
    absolute path: in the snapshot the first led nowhere (git status failed, even at the top), the
    second to the developer's real repository, which git in a plain sandbox wrote. Each now names
    the snapshot's copy, nested submodules too."""
    inner = tmp_path / "inner"
    lib = tmp_path / "lib"
    for repo in (inner, lib):
        repo.mkdir()
        _git(repo, "init", "-q")
        (repo / "f.py").write_text("x = 1\n")
        if repo == lib:
            _git(lib, "-c", "protocol.file.allow=always", "submodule", "add", "-q", str(inner), "deep/inner")
        _git(repo, "add", "-A")
        _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "base")
    main = tmp_path / "main"
    main.mkdir()
    _git(main, "init", "-q")
    _git(main, "-c", "protocol.file.allow=always", "submodule", "add", "-q", str(lib), "vendor/lib")
    _git(main, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "sub")
    update = ["-c", "protocol.file.allow=always", "submodule", "update", "--init", "--recursive", "-q"]
    _git(main, *update)
    checkout = main
    if layout == "worktree":
        _git(main, "worktree", "add", "-q", str(tmp_path / "wt"))
        checkout = tmp_path / "wt"
        _git(checkout, *update)
    else:  # as git before 1.7.10 wrote them
        for sub in ("vendor/lib", "vendor/lib/deep/inner"):
            named = (main / sub / (main / sub / ".git").read_text()[len("gitdir: ") :].strip()).resolve()
            (main / sub / ".git").write_text(f"gitdir: {named}\n")
    real = {p: p.read_bytes() for p in main.rglob("*") if p.is_file()}
    snap = materialize(SnapshotSource(str(checkout)), tmp_path / "cache")
    work = tmp_path / "work"  # what the plain backend does: a copy, where git may write
    shutil.copytree(snap.root, work, symlinks=True)
    for sub in ("vendor/lib", "vendor/lib/deep/inner"):
        (work / sub / "f.py").write_text("x = 2\n")
        done = subprocess.run(["git", "status", "--short"], cwd=work / sub, capture_output=True, text=True,
                              env=_git_env())  # fmt: skip
        assert done.returncode == 0 and " M f.py" in done.stdout.splitlines(), done.stderr
        top = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=work / sub, capture_output=True,
                             text=True, env=_git_env())  # fmt: skip
        assert top.stdout.strip() == str(work / sub)
    done = subprocess.run(["git", "status", "--short"], cwd=work, capture_output=True, text=True, env=_git_env())
    assert done.returncode == 0 and done.stdout.splitlines() == [" m vendor/lib"], done.stderr
    assert {p: p.read_bytes() for p in main.rglob("*") if p.is_file()} == real  # the real repository untouched


def test_unreadable_paths_are_left_out_and_named(tmp_path):
    """A file or directory the user cannot read (left by a container as another user, say) used to
    stop the snapshot with a traceback of shutil.Error; it is left out, and named."""
    src = tmp_path / "src"
    (src / "locked").mkdir(parents=True)
    (src / "locked/inner.txt").write_text("x")
    (src / "noexec").mkdir()
    (src / "noexec/inner.txt").write_text("x")
    (src / "secret.txt").write_text("s")
    (src / "ok.txt").write_text("ok")
    code = (
        "import json, sys; from pathlib import Path; from vivace.sandbox import SnapshotSource, SandboxError;"
        "from vivace.sandbox.snapshot import materialize\n"
        "snap = materialize(SnapshotSource(sys.argv[1]), Path(sys.argv[2]))\n"
        "print(json.dumps([list(snap.unreadable), sorted(p.name for p in snap.root.iterdir())]))\n"
        "try: materialize(SnapshotSource(sys.argv[1] + '/locked'), Path(sys.argv[2]))\n"
        "except SandboxError as e: print(e)\n"
    )
    os.chmod(src / "secret.txt", 0)
    os.chmod(src / "locked", 0)
    os.chmod(src / "noexec", 0o644)  # listed, not searchable
    try:
        done = subprocess.run([*unprivileged(), sys.executable, "-c", code, str(src), str(tmp_path / "cache")],
                              capture_output=True, text=True, timeout=60)  # fmt: skip
    finally:
        for d in ("locked", "noexec"):
            os.chmod(src / d, 0o755)
    assert done.returncode == 0, done.stderr
    first, refused = done.stdout.splitlines()
    assert json.loads(first) == [["locked/", "noexec/", "secret.txt"], ["ok.txt"]]
    assert refused == f"snapshot source '{src}/locked' cannot be read (permission denied)"


def test_paths_removed_while_snapshotting_are_passed_over(tmp_path, monkeypatch):
    """A directory in use changes while it is listed and copied: a path gone by the time it is
    looked at is left out (it was a FileNotFoundError traceback), the rest is copied."""
    src = tmp_path / "src"
    for rel in ["a/1.txt", "a/2.txt", "b/3.txt", "c/4.txt", "listed.txt", "keep.txt"]:
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_text(rel)
    real_lstat, real_copy = os.lstat, shutil.copy2

    def lstat(path, *args, **kw):  # removed between the listing and its lstat
        if os.fspath(path) == str(src / "listed.txt"):
            raise FileNotFoundError(2, "No such file or directory", path)
        return real_lstat(path, *args, **kw)

    def copy2(s, d, **kw):  # the first copy makes the writer remove a file and a directory
        shutil.rmtree(src / "b", ignore_errors=True)
        Path(src / "a/2.txt").unlink(missing_ok=True)
        return real_copy(s, d, **kw)

    monkeypatch.setattr(os, "lstat", lstat)
    monkeypatch.setattr(shutil, "copy2", copy2)
    snap = materialize(SnapshotSource(str(src)), tmp_path / "cache")
    monkeypatch.undo()
    got = sorted(str(p.relative_to(snap.root)) for p in snap.root.rglob("*") if p.is_file())
    assert "keep.txt" in got and "c/4.txt" in got and "b/3.txt" not in got and not (snap.root / "b").exists()
    assert set(got) <= {"a/1.txt", "a/2.txt", "c/4.txt", "keep.txt", "listed.txt"}


def test_a_directory_written_to_while_snapshotted(tmp_path):
    """As `vivace agent` meets a repository whose dev server or build writes files all the time."""
    src = tmp_path / "src"
    (src / "pkg").mkdir(parents=True)
    for i in range(300):
        (src / f"pkg/m{i}.py").write_text(f"X = {i}\n")
    stop = threading.Event()

    def writer() -> None:
        i = 0
        while not stop.is_set():
            d = src / "out" / f"d{i % 7}"
            d.mkdir(parents=True, exist_ok=True)
            (d / f"f{i}.txt").write_text("x" * (i % 300))
            (src / "out" / f"d{(i + 3) % 7}" / f"f{i - 40}.txt").unlink(missing_ok=True)
            if i % 97 == 0:
                shutil.rmtree(src / "out" / f"d{(i + 4) % 7}", ignore_errors=True)
            i += 1

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        for _ in range(8):
            snap = materialize(SnapshotSource(str(src)), tmp_path / "cache")
            assert len(list((snap.root / "pkg").iterdir())) == 300
    finally:
        stop.set()
        thread.join()


def test_config_validation_names_the_field():
    with pytest.raises(ValidationError, match="memory_mb"):
        SandboxConfig(memory_mb=1)
    with pytest.raises(ValidationError, match="backend"):
        SandboxConfig(backend="docker")
    with pytest.raises(ValidationError, match="extra"):
        SandboxConfig(memroy_mb=100)
    with pytest.raises(ValueError, match="valid presets: default, smoke, tiny"):
        load_preset("huge")
    assert load_preset("smoke").sandbox.memory_mb == 512
    assert load_preset("tiny", sandbox={"cpus": 2.0}).sandbox.cpus == 2.0


BAD_CONFIG_FILES = [  # (file name, bytes, words the error must hold besides the file's name)
    ("scalar.json", b'{"train": 5}', ['"train" must be a table of settings']),
    ("null.json", b'{"train": null}', ['"train" must be a table of settings']),
    ("string.json", b'{"train": "ab"}', ['"train" must be a table of settings']),
    ("pairs.json", b'{"train": [["steps", 7]]}', ['"train" must be a table of settings']),
    ("empty.json", b"", ["empty"]),
    ("bad.toml", b"[train]\nsteps = \n", ["not valid TOML", "line 2"]),
    ("trunc.json", b'{"train": {"steps": 3\n', ["not valid JSON", "line 2"]),
    ("latin1.json", b'\xff{"train": {}}', ["not UTF-8"]),
    ("typo.json", b'{"train": {"stepz": 3}}', ["train.stepz: unknown setting"]),
    ("typo.toml", b"[trian]\nsteps = 3\n", ["trian: unknown section"]),
    ("type.json", b'{"train": {"steps": "many"}}', ["train.steps: Input should be a valid integer"]),
    ("conf.yaml", b"train:\n  steps: 3\n", [".json or .toml", ".yaml"]),
    # Python's json reads Infinity and NaN, TOML has inf and nan: no setting takes them (NaN scores, an
    # OverflowError in every episode's timeout).
    ("score_inf.json", b'{"score": {"correctness": Infinity}}', ["score.correctness: Input should be a finite number"]),
    ("timeout_inf.json", b'{"sandbox": {"timeout_s": Infinity}}', ["sandbox.timeout_s", "finite"]),
    ("lr_nan.json", b'{"train": {"lr": NaN}}', ["train.lr", "finite"]),
    ("overflow.json", b'{"train": {"is_cap": 1e999}}', ["train.is_cap", "finite"]),
    ("wall_inf.toml", b"[agent]\nmax_wall_s = inf\n", ["agent.max_wall_s", "finite"]),
    # json.loads keeps the last of a key given twice; TOML refuses it, and so does a JSON config now.
    ("dupsec.json", b'{"train": {"steps": 1}, "train": {"lr": 0.001}}', ["section 'train' is given twice"]),
    ("dupkey.json", b'{"train": {"steps": 1, "steps": 5}}', ["setting 'train.steps' is given twice"]),
    ("device.json", b'{"engine": {"device": "banana"}}', ["engine.device", "unknown device 'banana'"]),
    # Another type is refused, not converted: `true` ran 1 step, "8" passed as 8, 1 turned a flag on.
    ("bool_int.json", b'{"train": {"steps": true}}', ["train.steps: Input should be a valid integer"]),
    ("str_int.json", b'{"agent": {"max_turns": "8"}}', ["agent.max_turns: Input should be a valid integer"]),
    ("str_float.toml", b'[train]\nlr = "1e-4"\n', ["train.lr: Input should be a valid number"]),
    ("float_int.json", b'{"train": {"steps": 40.0}}', ["train.steps: Input should be a valid integer"]),
    ("int_bool.json", b'{"agent": {"reproducible_output": 1}}', ["agent.reproducible_output", "valid boolean"]),
    ("int_str.json", b'{"train": {"suite": 5}}', ["train.suite: Input should be a valid string"]),
]


def test_settings_of_the_right_type_still_load(tmp_path):
    """strict keeps what JSON and TOML mean: an integer for a float, strings for paths, lists, tables."""
    path = tmp_path / "ok.json"
    path.write_text(json.dumps({
        "sandbox": {"cpus": 2, "toolchain": ["."], "state_dir": str(tmp_path / "state")},
        "train": {"lr": 1, "families": ["wrong_keyword"], "sft_data": "x.jsonl", "mask_truncated": "solved"},
        "agent": {"max_result_chars": 4000, "reproducible_output": True},
    }))  # fmt: skip
    cfg = load_config("tiny", path)
    assert (cfg.sandbox.cpus, cfg.train.lr, cfg.agent.max_result_chars) == (2.0, 1.0, 4000)
    assert cfg.sandbox.toolchain == [Path(".")] and cfg.train.sft_data == Path("x.jsonl")
    assert cfg.sandbox.state_dir == tmp_path / "state" and cfg.train.mask_truncated == "solved"


@pytest.mark.parametrize("name,content,words", BAD_CONFIG_FILES, ids=[c[0] for c in BAD_CONFIG_FILES])
def test_config_file_errors_name_the_file_and_setting(tmp_path, name, content, words):
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(ValueError) as info:
        load_config("tiny", path)
    message = str(info.value)
    assert message.startswith(f"{path}: ") and "\n" not in message and "errors.pydantic.dev" not in message
    assert all(w in message for w in words), message


def test_no_float_setting_takes_infinity_or_nan():
    """Every float setting of every section refuses inf and nan (allow_inf_nan=False on their base), naming it;
    one added later is covered without a test of its own."""
    import math
    import typing

    from vivace.config import VivaceConfig

    checked = 0
    for field in VivaceConfig.model_fields.values():
        model = field.annotation
        for name, setting in model.model_fields.items():
            if float not in (setting.annotation, *typing.get_args(setting.annotation)):
                continue
            for value in (math.inf, -math.inf, math.nan):
                with pytest.raises(ValidationError, match=f"{name}\n.*finite number"):
                    model(**{name: value})
            checked += 1
    assert checked >= 20


@pytest.mark.parametrize("device", ["auto", "cpu", "cuda", "cuda:1", "mps"])
def test_engine_devices_the_engine_accepts_load(device, tmp_path):
    (tmp_path / "c.json").write_text(json.dumps({"engine": {"device": device}}))
    assert load_config("default", tmp_path / "c.json").engine.device == device


@pytest.mark.parametrize("device", ["banana", "", "cuda:", "cuda:x", "CPU", "cpu "])
def test_an_engine_device_is_checked_when_the_config_loads(device):
    from vivace.config import EngineConfig

    with pytest.raises(ValidationError, match="unknown device"):
        EngineConfig(device=device)


def test_config_file_type_ignores_the_suffix_case(tmp_path):
    for name in ("upper.TOML", "mixed.Toml"):
        (tmp_path / name).write_text("[train]\nsteps = 3\n")
        assert load_config("tiny", tmp_path / name).train.steps == 3
    (tmp_path / "upper.JSON").write_text('{"train": {"steps": 4}}')
    assert load_config("tiny", tmp_path / "upper.JSON").train.steps == 4
    (tmp_path / "dir.json").mkdir()
    with pytest.raises(ValueError, match="dir.json: cannot read it"):
        load_config("tiny", tmp_path / "dir.json")
    with pytest.raises(ValueError, match="must be a table of settings"):
        load_preset("tiny", train=5)


def _vivace(*args: str, state_dir: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "VIVACE_STATE_DIR": str(state_dir)}
    return subprocess.run([sys.executable, "-m", "vivace.cli", *args], capture_output=True, text=True, env=env,
                          timeout=120)  # fmt: skip


def test_cli_sandbox_run(repo, state_dir):
    r = _vivace("sandbox", "run", "--repo", str(repo), "--keep-diff", "--", "sh", "-c",
                "echo changed >> README.md; echo out; echo err >&2; exit 7", state_dir=state_dir)  # fmt: skip
    assert r.returncode == 7, r.stderr
    assert r.stdout.startswith("out\n")
    assert "+changed" in r.stdout and "diff --git a/README.md b/README.md" in r.stdout
    assert "err" in r.stderr
    assert (repo / "README.md").read_text() == "# demo\n"  # the source repository is untouched


def test_cli_errors_are_actionable(repo, state_dir, tmp_path):
    r = _vivace("sandbox", "run", "--repo", str(repo), state_dir=state_dir)
    assert r.returncode == 2 and "no command given" in r.stderr
    r = _vivace("sandbox", "run", "--repo", str(tmp_path / "missing"), "--", "true", state_dir=state_dir)
    assert r.returncode == 2 and "does not exist" in r.stderr
    r = _vivace("config", "show", "--preset", "nope", state_dir=state_dir)
    assert r.returncode == 2 and "valid presets" in r.stderr


def _rewrite_keeping_size_and_mtime(path: Path, data: bytes) -> None:
    """What rsync -a, cp -p, tar x and touch -r do: new content, the same size, mode and mtime; a tick
    of the filesystem's clock after the last change, as a real rewrite comes (one in the same tick
    has the same ctime)."""
    time.sleep(0.05)
    before = os.lstat(path)
    assert len(data) == before.st_size
    path.write_bytes(data)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))


def test_a_file_rewritten_with_its_size_and_mtime_kept_is_snapshotted_anew(tmp_path):
    """The cache key held each file's size, mtime and mode only: a file rewritten keeping all three was
    served from the old snapshot, and a new snapshot (made for another change) hard-linked its old copy.
    Its ctime, which no command can set back, now tells; an unchanged directory still hits the cache."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("f.txt", "same.txt", "keep.txt"):
        (src / name).write_bytes(b"AAAA\n")
        os.utime(src / name, (1_000_000_000, 1_000_000_000))
    cache = tmp_path / "cache"
    first = materialize(SnapshotSource(str(src)), cache)
    assert materialize(SnapshotSource(str(src)), cache).key == first.key  # unchanged: the cached one

    _rewrite_keeping_size_and_mtime(src / "f.txt", b"BBBB\n")
    second = materialize(SnapshotSource(str(src)), cache)
    assert second.key != first.key and second.built
    assert (second.root / "f.txt").read_bytes() == b"BBBB\n" and (first.root / "f.txt").read_bytes() == b"AAAA\n"
    assert (second.root / "keep.txt").stat().st_ino == (first.root / "keep.txt").stat().st_ino  # still shared

    os.replace(src / "f.txt", src / "moved.txt")  # another change: a new snapshot, linking what did not change
    _rewrite_keeping_size_and_mtime(src / "same.txt", b"CCCC\n")
    third = materialize(SnapshotSource(str(src)), cache)
    assert (third.root / "same.txt").read_bytes() == b"CCCC\n"
    assert (third.root / "same.txt").stat().st_ino != (second.root / "same.txt").stat().st_ino
    assert (third.root / "keep.txt").stat().st_ino == (first.root / "keep.txt").stat().st_ino
    assert materialize(SnapshotSource(str(src)), cache).key == third.key
