"""What `pip install vivace` (not editable) gets: the wheel must hold every file the package reads at run
time (bundled repositories with their dotfiles, task data, the shipped model) and nothing that running a
bundled repository's tests in place leaves behind, which would then be in every task's workspace."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _tracked(prefix: str) -> list[str]:
    done = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", prefix], capture_output=True)
    if done.returncode != 0:
        pytest.skip("not a git checkout")
    return [p for p in done.stdout.decode().split("\0") if p]


def test_the_wheel_holds_the_tracked_package_files_and_no_test_leftovers(tmp_path):
    tree = tmp_path / "tree"
    for rel in ["pyproject.toml", "README.md", *_tracked("src")]:
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, tree / rel)
    repo = tree / "src/vivace/tasks/repos/ledger"  # as if its tests had been run in place
    (repo / "ledger/__pycache__").mkdir()
    (repo / "ledger/__pycache__/book.cpython-311.pyc").write_bytes(b"\0")
    (repo / ".pytest_cache/v/cache").mkdir(parents=True)
    (repo / ".pytest_cache/v/cache/lastfailed").write_text("{}")
    (repo / ".pytest_cache/.gitignore").write_text("*\n")
    (repo / ".coverage").write_text("")

    build = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(tmp_path)]
    done = subprocess.run([*build, str(tree)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    (wheel,) = tmp_path.glob("vivace-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    shipped = {n for n in names if n.startswith("vivace/")}
    assert shipped == {p.removeprefix("src/") for p in _tracked("src/vivace")}
    assert "vivace/tasks/repos/_blank/.gitignore" in shipped and "vivace/model/assets/tiny/model.safetensors" in shipped
    metadata = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert (
        "Requires-Dist: pytest>=8\n" in metadata
    )  # not only as an extra: tasks' tests run with the installed environment's pytest
