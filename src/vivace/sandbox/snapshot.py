"""Base snapshots: a directory, a tarball, or a git repository at a commit, materialised once.

A snapshot is copied into the machine-wide cache under a key derived from its content
(a directory's file listing with sizes and mtimes, a tarball's bytes, a git commit id), so
a thousand workspaces of one task share one copy and every process on the machine reuses
it. Materialising writes to a temporary name and renames atomically: concurrent processes
never see a half-built snapshot. Workspaces never write to it (overlayfs keeps it as the
lower layer; the plain backend copies it).
"""

from __future__ import annotations

import hashlib
import os
import secrets
import shutil
import stat
import subprocess
import tarfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from vivace.sandbox.base import SandboxError

SourceKind = Literal["dir", "tar", "git"]


@dataclass(frozen=True)
class SnapshotSource:
    """Where a workspace's base comes from."""

    path: str  # a directory, a tarball (.tar, .tar.gz, ...) or a git repository
    kind: SourceKind | None = None  # None: tarball if a file, git if `commit` is set, else dir
    commit: str | None = None  # git only: any revision git understands (sha, tag, branch)

    def resolved_kind(self) -> SourceKind:
        if self.kind:
            return self.kind
        if os.path.isfile(self.path):
            return "tar"
        return "git" if self.commit else "dir"


@dataclass(frozen=True)
class Snapshot:
    key: str  # content-derived cache key
    root: Path  # the materialised tree; never written after creation
    source: SnapshotSource


def materialize(source: SnapshotSource, cache_dir: Path, owner: tuple[int, int] | None = None) -> Snapshot:
    """Return the cached snapshot for `source`, building it on first use."""
    kind = source.resolved_kind()
    path = Path(source.path).expanduser().resolve()
    if not path.exists():
        raise SandboxError(f"snapshot source {source.path!r} does not exist")
    key = _key(kind, path, source.commit)
    if owner:
        key += f"-u{owner[0]}"  # ownership is part of what the cache holds

    def build(tmp: Path) -> None:
        if kind == "dir":
            shutil.copytree(path, tmp, symlinks=True, ignore=_special_files, dirs_exist_ok=True)
        elif kind == "tar":
            _extract_tar(path, tmp)
        else:
            _extract_git(path, source.commit or "HEAD", tmp)
        if owner:
            _chown_tree(tmp, owner)

    return Snapshot(key=key, root=build_once(cache_dir / key, build), source=source)


def build_once(target: Path, build: Callable[[Path], None]) -> Path:
    """Make directory `target` with `build(tmp)` unless it exists, atomically: concurrent
    builders (threads or processes) never see a half-built tree, and one of them wins."""
    if target.is_dir():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.parent / f".{target.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        tmp.mkdir()
        build(tmp)
        os.chmod(tmp, 0o755)
        try:
            os.rename(tmp, target)
        except OSError:
            if not target.is_dir():  # not merely a lost race: a real error
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _key(kind: SourceKind, path: Path, commit: str | None) -> str:
    h = hashlib.sha256(kind.encode())
    if kind == "dir":
        h.update(str(path).encode())
        for dirpath, dirnames, filenames in os.walk(path):
            dirnames.sort()
            for name in sorted(filenames) + dirnames:
                p = os.path.join(dirpath, name)
                st = os.lstat(p)
                h.update(f"{os.path.relpath(p, path)}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_mode}\n".encode())
    elif kind == "tar":
        with open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
    else:
        h.update(_git(path, "rev-parse", "--verify", f"{commit or 'HEAD'}^{{commit}}").strip())
    return h.hexdigest()[:24]


def _special_files(directory: str, names: list[str]) -> list[str]:
    """copytree ignore hook: skip sockets, fifos and devices (they cannot be copied)."""
    return [n for n in names if not _is_plain(os.lstat(os.path.join(directory, n)).st_mode)]


def _is_plain(mode: int) -> bool:
    return stat.S_ISREG(mode) or stat.S_ISLNK(mode) or stat.S_ISDIR(mode)


def _extract_tar(path: Path, dest: Path) -> None:
    try:
        with tarfile.open(path) as tar:
            tar.extractall(dest, filter="data")  # refuses absolute paths, `..`, device files
    except (tarfile.TarError, OSError) as e:
        raise SandboxError(f"cannot extract snapshot tarball {path}: {e}") from e


def _git(repo: Path, *args: str) -> bytes:
    proc = subprocess.run(["git", "-C", str(repo), *args], capture_output=True)
    if proc.returncode != 0:
        raise SandboxError(f"git {' '.join(args)} in {repo} failed: {proc.stderr.decode(errors='replace').strip()}")
    return proc.stdout


def _extract_git(repo: Path, commit: str, dest: Path) -> None:
    proc = subprocess.Popen(
        ["git", "-C", str(repo), "archive", "--format=tar", commit], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert proc.stdout is not None
    try:
        with tarfile.open(fileobj=proc.stdout, mode="r|") as tar:
            tar.extractall(dest, filter="data")
    except tarfile.TarError:
        pass  # git's own error below is the useful one
    err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    if proc.wait() != 0:
        raise SandboxError(f"git archive {commit} in {repo} failed: {err.strip()}")


def _chown_tree(root: Path, owner: tuple[int, int]) -> None:
    os.chown(root, *owner)
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            os.chown(os.path.join(dirpath, name), *owner, follow_symlinks=False)
