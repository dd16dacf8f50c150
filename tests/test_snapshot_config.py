"""Snapshot sources (dir, tarball, git@commit), the content-keyed cache, config validation, CLI."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from pydantic import ValidationError

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


def test_git_snapshot_at_commit(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    (repo / "f.py").write_text("v1\n")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "one")
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


def test_missing_source(tmp_path):
    with pytest.raises(SandboxError, match="does not exist"):
        materialize(SnapshotSource(str(tmp_path / "nope")), tmp_path / "cache")


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
]


@pytest.mark.parametrize("name,content,words", BAD_CONFIG_FILES, ids=[c[0] for c in BAD_CONFIG_FILES])
def test_config_file_errors_name_the_file_and_setting(tmp_path, name, content, words):
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(ValueError) as info:
        load_config("tiny", path)
    message = str(info.value)
    assert message.startswith(f"{path}: ") and "\n" not in message and "errors.pydantic.dev" not in message
    assert all(w in message for w in words), message


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
