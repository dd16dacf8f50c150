"""Base snapshots: a directory, a tarball, or a git repository at a commit, materialised once.

A snapshot is copied into the machine-wide cache under a key derived from its content
(a directory's file listing with sizes and mtimes, a tarball's bytes, a git commit id), so
a thousand workspaces of one task share one copy and every process on the machine reuses
it. Materialising writes to a temporary name and renames atomically: concurrent processes
never see a half-built snapshot. Workspaces never write to it (overlayfs keeps it as the
lower layer; the plain backend copies it).

The cache is bounded: `evict` removes the least recently used snapshots beyond a byte budget,
sparing those a live holder (a backend) has claimed and those used within the last hour.
Beside each snapshot, `<key>.used` holds its size and its mtime is the last use.

A directory that changed since its last snapshot (`vivace agent` on a repository being worked on)
is snapshotted again, but a file unchanged since that snapshot (same size, mtime and mode: the
key's own test) is hard-linked from it instead of copied, so a repository with a 2 GB virtualenv
costs its changed files, not 2 GB and half a minute, per run. `.source-<hash>` names the newest
snapshot of each directory. Snapshots are never written, so sharing their files is safe; the
source's own files are never linked.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import secrets
import shutil
import stat
import subprocess
import tarfile
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from vivace.sandbox.base import SandboxError

SourceKind = Literal["dir", "tar", "git"]

# Enough for a training run's working set (hundreds of small task repos, or a few dozen
# ~100 MB SWE-bench checkouts) to stay cached, while `vivace agent` on a repo that changes
# between runs (each run is a new snapshot, sharing the files that did not change) stops at this.
MAX_CACHE_BYTES = 10 << 30
# A snapshot used this recently is never evicted, whoever uses it: callers of `materialize`
# that claim no use (task tree builders) copy out of it within seconds.
MIN_IDLE_S = 3600.0
CLAIM_PREFIX = "uses-"  # a holder directory's file `uses-<key>` claims that snapshot


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
    built: bool = field(default=False, compare=False)  # this call built it (the cache grew)


def materialize(
    source: SnapshotSource, cache_dir: Path, owner: tuple[int, int] | None = None, holder: Path | None = None
) -> Snapshot:
    """Return the cached snapshot for `source`, building it on first use. With `holder` (a
    directory that exists as long as its user may use the snapshot), `evict` spares it."""
    kind = source.resolved_kind()
    path = Path(source.path).expanduser().resolve()
    if not path.exists():
        raise SandboxError(f"snapshot source {source.path!r} does not exist")
    owned = f"-u{owner[0]}" if owner else ""  # ownership is part of what the cache holds
    key = _key(kind, path, source.commit) + owned
    cache_dir.mkdir(parents=True, exist_ok=True)
    with _cache_lock(cache_dir, exclusive=False):  # an eviction sees this use, or ran before it
        if holder:
            (holder / f"{CLAIM_PREFIX}{key}").touch()
        cached = (cache_dir / key).is_dir()
        if cached:
            _record_use(cache_dir / key)

    newest = cache_dir / f".source-{hashlib.sha256(os.fsencode(path) + owned.encode()).hexdigest()[:24]}"

    def build(tmp: Path) -> None:
        if kind == "dir":
            _copy_dir(path, tmp, _snapshot_named(cache_dir, newest))
        elif kind == "tar":
            _extract_tar(path, tmp)
        else:
            _extract_git(path, source.commit or "HEAD", tmp)
        if owner:
            _chown_tree(tmp, owner)

    if cached:
        return Snapshot(key=key, root=cache_dir / key, source=source)
    root = build_once(cache_dir / key, build)
    _record_use(root)  # a new snapshot's size
    if kind == "dir":
        _write_atomically(newest, key)
    return Snapshot(key=key, root=root, source=source, built=True)


def _snapshot_named(cache_dir: Path, pointer: Path) -> Path | None:
    """The snapshot whose key `pointer` holds, if it is still cached."""
    try:
        key = pointer.read_text().strip()
    except OSError:
        return None
    return cache_dir / key if key and not key.startswith(".") and (cache_dir / key).is_dir() else None


def _write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")
    tmp.write_text(text)
    os.replace(tmp, path)


def _copy_dir(src: Path, dest: Path, previous: Path | None) -> None:
    """Copy directory `src` into `dest`, hard-linking each file unchanged since `previous` (an earlier
    snapshot of `src`) from it. A link that fails (that snapshot evicted meanwhile, a link limit)
    falls back to a copy."""

    def copy(s: str, d: str) -> None:
        if previous is not None:
            old = previous / os.path.relpath(s, src)
            try:
                now, then = os.lstat(s), os.lstat(old)
                if stat.S_ISREG(then.st_mode) and (now.st_size, now.st_mtime_ns, now.st_mode) == (
                    then.st_size, then.st_mtime_ns, then.st_mode
                ):  # fmt: skip
                    os.link(old, d)
                    return
            except OSError:
                pass
        shutil.copy2(s, d)

    shutil.copytree(src, dest, symlinks=True, ignore=_special_files, dirs_exist_ok=True, copy_function=copy)


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


def evict(
    cache_dir: Path, holders: Iterable[Path], max_bytes: int = MAX_CACHE_BYTES, min_idle_s: float = MIN_IDLE_S
) -> list[str]:
    """Remove least recently used snapshots until the cache holds at most `max_bytes`, sparing
    those claimed in a `holders` directory and those used within `min_idle_s`; returns the
    keys removed. Skips the round when another process is evicting or claiming."""
    doomed = [Path(e) for e in _listdir(cache_dir) if ".evicted-" in e.name]  # left by a crash
    removed = []
    with _cache_lock(cache_dir, exclusive=True, wait=False) as locked:
        for key in _victims(cache_dir, holders, max_bytes, min_idle_s) if locked else []:
            doomed.append(cache_dir / f".{key}.evicted-{secrets.token_hex(4)}")
            os.rename(cache_dir / key, doomed[-1])  # atomic: no one finds a half-removed snapshot
            _used_file(cache_dir / key).unlink(missing_ok=True)
            removed.append(key)
    for trash in doomed:  # slow, and needs no lock once renamed away
        shutil.rmtree(trash, ignore_errors=True)
    return removed


def _victims(cache_dir: Path, holders: Iterable[Path], max_bytes: int, min_idle_s: float) -> list[str]:
    """The keys to evict, least recently used first, to bring the cache within `max_bytes`."""
    roots = [Path(e) for e in _listdir(cache_dir) if e.is_dir(follow_symlinks=False) and not e.name.startswith(".")]
    entries = sorted((*_usage(root), root.name) for root in roots)  # (last use, bytes, key)
    total = sum(size for _, size, _ in entries)
    if total <= max_bytes:
        return []
    claimed = {e.name[len(CLAIM_PREFIX) :] for h in holders for e in _listdir(h) if e.name.startswith(CLAIM_PREFIX)}
    victims = []
    for last_use, size, key in entries:
        if total <= max_bytes:
            break
        if key not in claimed and time.time() - last_use >= min_idle_s:
            victims.append(key)
            total -= size
    return victims


def _used_file(root: Path) -> Path:
    return root.parent / f"{root.name}.used"


def _record_use(root: Path) -> None:
    """Mark `root` as used now, noting its size the first time."""
    used = _used_file(root)
    try:
        os.utime(used)
    except FileNotFoundError:
        used.write_text(str(_tree_bytes(root)))


def _usage(root: Path) -> tuple[float, int]:
    """(last use, size in bytes) of a snapshot; one from before usage records counts as used
    when built, and gets its record now."""
    used = _used_file(root)
    try:
        return used.stat().st_mtime, int(used.read_text())
    except (FileNotFoundError, ValueError):
        size = _tree_bytes(root)
        used.write_text(str(size))
        os.utime(used, (root.stat().st_mtime,) * 2)
        return root.stat().st_mtime, size


def _tree_bytes(root: Path) -> int:
    """Disk the tree holds, a file shared with other snapshots (hard links) counted by its share."""
    total = 0
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            st = os.lstat(os.path.join(dirpath, name))
            total += st.st_blocks * 512 // (st.st_nlink if stat.S_ISREG(st.st_mode) else 1)
    return total


def _listdir(d: Path) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(d) as it:
            return list(it)
    except (FileNotFoundError, NotADirectoryError):  # a holder that just went away
        return []


@contextmanager
def _cache_lock(cache_dir: Path, exclusive: bool, wait: bool = True) -> Iterator[bool]:
    """flock on the cache: claims take it shared, eviction exclusive; yields whether it is held."""
    fd = os.open(cache_dir / ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        try:
            fcntl.flock(fd, (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)  # releases the lock


def _key(kind: SourceKind, path: Path, commit: str | None) -> str:
    h = hashlib.sha256(kind.encode())
    if kind == "dir":
        # fsencode: a file name need not be UTF-8 (Python holds its stray bytes as surrogates).
        h.update(os.fsencode(path))
        for dirpath, dirnames, filenames in os.walk(path):
            dirnames.sort()
            for name in sorted(filenames) + dirnames:
                p = os.path.join(dirpath, name)
                st = os.lstat(p)
                h.update(os.fsencode(os.path.relpath(p, path)))
                h.update(f"\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_mode}\n".encode())
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
