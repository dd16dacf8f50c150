"""Base snapshots: a directory, a tarball, or a git repository at a commit, materialised once.

A snapshot is copied into the machine-wide cache under a key derived from its content
(a directory's file listing with sizes, mtimes and ctimes, a tarball's bytes, a git commit id), so
a thousand workspaces of one task share one copy and every process on the machine reuses
it. Materialising writes to a temporary name and renames atomically: concurrent processes
never see a half-built snapshot. Workspaces never write to it (overlayfs keeps it as the
lower layer; the plain backend copies it).

The cache is bounded: `evict` removes the least recently used snapshots beyond a byte budget,
sparing those a live holder (a backend) has claimed and those used within the last hour.
Beside each snapshot, `<key>.used` holds its size and its mtime is the last use.

A directory's key covers each path's size, mtime, mode, inode and ctime: a file rewritten with its
size and mtime kept (rsync -a, cp -p, tar x, touch -r) still has a new ctime, which no command can
set back. A directory that changed since its last snapshot (`vivace agent` on a repository being
worked on) is snapshotted again, but a file unchanged since that snapshot (the same source inode
and ctime as when that snapshot copied it) is hard-linked from it instead of copied, so a
repository with a 2 GB virtualenv costs its changed files, not 2 GB and half a minute, per run.
`.source-<hash>` names the newest snapshot of each directory and what each of its files was copied
from. Snapshots are never written, so sharing their files is safe; the source's own files are
never linked.

A directory snapshot holds what can be read of the directory as it is while the copy runs:
sockets, FIFOs and devices are left out, and so are files and directories the caller cannot read
(`Snapshot.unreadable` names them) and whatever is removed while the copy runs (the directory may
be in use). A git worktree or a submodule checkout, whose `.git` is a file naming a git directory
elsewhere, gets a `.git` directory of its own in the snapshot (that git directory, with the main
repository's objects and refs for a linked worktree), so git inside a sandbox sees the repository
the developer sees, and never writes to the real one. A submodule's own `.git` file, which names
its git directory inside the repository's (`.git/modules/...`, or the worktree's for a submodule of
a linked worktree; by absolute path in repositories older git made), is rewritten to name the
snapshot's copy of it, and that copy's `core.worktree` to name the submodule in the snapshot.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import logging
import os
import posixpath
import re
import secrets
import shutil
import stat
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from vivace.files import write_atomic
from vivace.sandbox.base import SandboxError
from vivace.sandbox.paths import copy_sparse

SourceKind = Literal["dir", "tar", "git"]

log = logging.getLogger(__name__)

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
    # dir only: when the directory lies below the top of a git checkout (a developer's `--repo
    # pkg/`), that checkout's ignore rules decide which new files diffs leave out, as `git status`
    # there would. Off for task repositories, whose rules are their own wherever they are kept.
    enclosing_ignore_rules: bool = False

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
    # A directory's paths left out because they cannot be read ("name/" for a directory), as listed
    # now: empty for other sources.
    unreadable: tuple[str, ...] = field(default=(), compare=False)


def materialize(
    source: SnapshotSource,
    cache_dir: Path,
    owner: tuple[int, int] | None = None,
    holder: Path | None = None,
    exclude: Path | None = None,
) -> Snapshot:
    """Return the cached snapshot for `source`, building it on first use. With `holder` (a
    directory that exists as long as its user may use the snapshot), `evict` spares it. `exclude`
    (the sandbox's state directory, which holds the cache) is left out of a directory that holds it:
    `--repo ~` copied the snapshot being built into itself until a path grew too long."""
    kind = source.resolved_kind()
    path = Path(source.path).expanduser().resolve()
    exclude = Path(exclude).resolve() if exclude is not None else None
    left_out = frozenset({exclude.relative_to(path).as_posix()} if exclude and path in exclude.parents else ())
    if not path.exists():
        raise SandboxError(f"snapshot source {source.path!r} does not exist")
    if kind == "dir" and not os.access(path, os.R_OK | os.X_OK):
        raise SandboxError(f"snapshot source {source.path!r} cannot be read (permission denied)")
    git_dirs = _linked_git_dirs(path) if kind == "dir" else None
    unreadable: list[str] = []
    owned = f"-u{owner[0]}" if owner else ""  # ownership is part of what the cache holds
    key = _key(kind, path, source.commit, git_dirs, unreadable, left_out) + owned
    cache_dir.mkdir(parents=True, exist_ok=True)
    with _cache_lock(cache_dir, exclusive=False):  # an eviction sees this use, or ran before it
        if holder:
            (holder / f"{CLAIM_PREFIX}{key}").touch()
        cached = (cache_dir / key).is_dir()
        if cached:
            _record_use(cache_dir / key)

    newest = cache_dir / f".source-{hashlib.sha256(os.fsencode(path) + owned.encode()).hexdigest()[:24]}"

    made: list[_Reuse] = []  # what this process's build copied its files from, once it ran

    def build(tmp: Path) -> None:
        if kind == "dir":
            reuse = _previous_snapshot(cache_dir, newest)
            made.append(reuse)
            skip = set(unreadable) | ({".git"} if git_dirs else set()) | {f"{d}/" for d in left_out}
            try:
                _copy_dir(path, tmp, reuse, skip, unreadable)
                if git_dirs:
                    _copy_git_dir(*git_dirs, tmp, reuse)
                if git_dirs:
                    _relink_submodules(path, tmp, [d for d in git_dirs if d is not None])
                elif _real_dir(tmp / ".git"):
                    _relink_submodules(path, tmp, [(path / ".git").resolve()])
            except OSError as e:  # the cache's disk full, say
                raise SandboxError(f"cannot snapshot {path} into {cache_dir}: {e}") from e
        elif kind == "tar":
            _extract_tar(path, tmp)
        else:
            _extract_git(path, source.commit or "HEAD", tmp)
        if owner:
            _chown_tree(tmp, owner)

    if cached:
        return Snapshot(key=key, root=cache_dir / key, source=source, unreadable=tuple(sorted(unreadable)))
    root = build_once(cache_dir / key, build)
    _record_use(root)  # a new snapshot's size
    if made:  # not when another process built it meanwhile: its own record is the one that holds
        write_atomic(newest, _pointer(key, made[0].now))
    return Snapshot(key=key, root=root, source=source, built=True, unreadable=tuple(sorted(set(unreadable))))


def enclosing_checkout(path: Path) -> Path | None:
    """The top of the git checkout that the directory `path` lies in, when `path` is not that top
    itself: a snapshot of `path` then holds no `.git`, so git fails inside the sandbox and the
    diff cannot leave out what that repository's ignore rules ignore. None when `path` has its
    own `.git` or no directory above it has one."""
    path = path.expanduser().resolve()
    for d in (path, *path.parents):
        if os.path.lexists(d / ".git"):
            return d if d != path else None
    return None


def checkout_prefix(path: Path) -> tuple[Path, str] | None:
    """(top, prefix) when the directory `path` lies below the top of a git checkout: `prefix` is
    its path inside that checkout with a trailing slash ("pkg/sub/")."""
    top = enclosing_checkout(path)
    if top is None:
        return None
    return top, Path(path).expanduser().resolve().relative_to(top).as_posix() + "/"


@dataclass
class _Reuse:
    """Hard-linking a new snapshot's unchanged files from the previous snapshot of the same directory."""

    previous: Path | None  # that snapshot; None when there is none still cached
    # Its files: path -> (source st_ino, source st_ctime_ns, the copy's own st_ino), as copied.
    then: dict[str, tuple[int, int, int]]
    now: dict[str, tuple[int, int, int]] = field(default_factory=dict)  # the same, for the new snapshot


def _previous_snapshot(cache_dir: Path, pointer: Path) -> _Reuse:
    """The snapshot `pointer` names (its key on the first line, then what its files were copied
    from), when it is still cached."""
    try:
        key, _, listing = pointer.read_bytes().partition(b"\n")
        name = key.decode().strip()
        then = {}
        for record in filter(None, listing.split(b"\0")):
            ino, ctime, copy_ino, rel = record.split(b" ", 3)
            then[os.fsdecode(rel)] = (int(ino), int(ctime), int(copy_ino))
    except (OSError, ValueError):  # none yet, or one this version cannot read: every file is copied
        return _Reuse(None, {})
    cached = name and not name.startswith(".") and (cache_dir / name).is_dir()
    return _Reuse(cache_dir / name, then) if cached else _Reuse(None, {})


def _pointer(key: str, copied: dict[str, tuple[int, int, int]]) -> bytes:
    """What `_previous_snapshot` reads back: the key, then each file's record (NUL-ended: any byte
    but NUL may be in a name)."""
    records = (b"%d %d %d " % ids + os.fsencode(rel) + b"\0" for rel, ids in copied.items())
    return key.encode() + b"\n" + b"".join(records)


def _copy_dir(src: Path, dest: Path, reuse: _Reuse, skip: set[str], unreadable: list[str]) -> None:
    """Copy directory `src` into the directory `dest`: directories, regular files and symlinks, with
    their modes and times, leaving out sockets, FIFOs and devices, the paths in `skip` (relative;
    "name/" for a directory) and whatever is removed meanwhile. A file that turns out unreadable is
    added to `unreadable`. Each file unchanged since `reuse.previous` (an earlier snapshot of `src`)
    copied it is hard-linked from there; a link that fails (that snapshot evicted meanwhile, a link
    limit) falls back to a copy."""
    _copy_tree(str(src), str(dest), "", reuse, skip, unreadable)
    with suppress(OSError):
        shutil.copystat(src, dest)


def _copy_tree(src: str, dest: str, rel: str, reuse: _Reuse, skip: set[str], unreadable: list[str]) -> None:
    """`_copy_dir` of `src` (at `rel` in the snapshot) into the existing directory `dest`."""
    try:
        with os.scandir(src) as it:
            entries = list(it)
    except (FileNotFoundError, NotADirectoryError):  # removed meanwhile
        return
    except PermissionError:  # made unreadable since it was listed
        unreadable.append(f"{rel}/")
        return
    for entry in entries:
        name = f"{rel}/{entry.name}" if rel else entry.name
        target = os.path.join(dest, entry.name)
        try:
            st = entry.stat(follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode) and f"{name}/" not in skip:
                made = not os.path.isdir(target)  # not when a git directory's overlay adds to it
                os.makedirs(target, 0o700, exist_ok=True)
                try:
                    _copy_tree(entry.path, target, name, reuse, skip, unreadable)
                    shutil.copystat(entry.path, target)
                except FileNotFoundError:
                    if made:
                        shutil.rmtree(target)
                    raise
            elif stat.S_ISLNK(st.st_mode) and name not in skip:
                _remove_file(target)
                os.symlink(os.readlink(entry.path), target)
                shutil.copystat(entry.path, target, follow_symlinks=False)
            elif stat.S_ISREG(st.st_mode) and name not in skip:
                _remove_file(target)
                _copy_file(entry.path, target, name, st, reuse)
        except PermissionError:
            unreadable.append(name)
        except OSError as e:  # removed, or replaced by another kind of file, while being copied: left out
            if e.errno not in _CHANGED_MEANWHILE and not isinstance(e, shutil.SpecialFileError):
                raise


# What copying a path that is removed or replaced meanwhile fails with.
_CHANGED_MEANWHILE = {errno.ENOENT, errno.ENOTDIR, errno.EISDIR, errno.ELOOP}


def _copy_file(src: str, dest: str, rel: str, st: os.stat_result, reuse: _Reuse) -> None:
    """Copy file `src` (lstat `st`; `rel` in the snapshot) to `dest`, or hard-link it from the previous
    snapshot when that copied it from the same source inode with the same ctime: a write, chmod or
    rename since sets a new one, and no command can set it back (size and mtime it can: rsync -a,
    cp -p, touch -r). Notes in `reuse.now` what `dest` was copied from."""
    source = (st.st_ino, st.st_ctime_ns)
    if reuse.previous is not None and rel in reuse.then:
        old = reuse.previous / rel
        try:
            then = os.lstat(old)
            if stat.S_ISREG(then.st_mode) and reuse.then[rel] == (*source, then.st_ino) and (
                st.st_size, st.st_mtime_ns, st.st_mode
            ) == (then.st_size, then.st_mtime_ns, then.st_mode):  # fmt: skip
                os.link(old, dest)
                reuse.now[rel] = reuse.then[rel]
                return
        except OSError:
            pass
    if st.st_blocks * 512 < st.st_size:  # holes (a disk image made with truncate): copied as holes
        with open(os.open(src, os.O_RDONLY | os.O_NOFOLLOW), "rb") as fin, open(dest, "xb") as fout:
            copy_sparse(fin.fileno(), fout.fileno(), st.st_size)
        shutil.copystat(src, dest, follow_symlinks=False)
    else:
        shutil.copy2(src, dest, follow_symlinks=False)  # (sendfile: a sparse file came out dense)
    reuse.now[rel] = (*source, os.lstat(dest).st_ino)


def _remove_file(path: str) -> None:
    """Make room at `path` for a file (a git directory's overlay replaces what is there)."""
    with suppress(FileNotFoundError):
        os.unlink(path)


def _linked_git_dirs(path: Path) -> tuple[Path, Path | None] | None:
    """(git directory, common directory or None) when `path/.git` is a file naming a git directory
    elsewhere ("gitdir: ..."): a linked worktree (whose git directory names the main repository's
    in `commondir`), a submodule checkout, a `--separate-git-dir` clone. None otherwise, or when
    that directory cannot be read (the `.git` file is then copied as it is)."""
    dot_git = path / ".git"
    try:
        if not stat.S_ISREG(dot_git.lstat().st_mode):
            return None
        text = dot_git.read_text(errors="replace")
    except OSError:
        return None
    if not text.startswith("gitdir: "):
        return None
    gitdir = (path / text[len("gitdir: ") :].strip()).resolve()
    try:
        common = (gitdir / (gitdir / "commondir").read_text().strip()).resolve()
    except FileNotFoundError:
        common = None
    except OSError:
        return None
    dirs = [gitdir] + ([common] if common else [])
    return (gitdir, common) if all(os.access(d, os.R_OK | os.X_OK) and d.is_dir() for d in dirs) else None


# In a linked worktree's git directory: how it finds the repository and its checkout, nothing to copy.
_WORKTREE_LINKS = {"commondir", "gitdir", "locked"}


def _copy_git_dir(gitdir: Path, common: Path | None, dest: Path, reuse: _Reuse) -> None:
    """Make `dest/.git` a git directory of its own for the checkout `dest`: a copy of `gitdir` or, for a
    linked worktree, of the main repository's `common` directory (its other worktrees left out)
    overlaid with the worktree's own files (HEAD, index, logs/HEAD, ...). Its config then names no
    other work tree (a submodule's `core.worktree`) and is not bare (a worktree of a bare repository)."""
    git = dest / ".git"
    git.mkdir()
    ignore: list[str] = []  # the git directory's own unreadable files do not concern the user
    sources = [(common, {"worktrees/"}), (gitdir, _WORKTREE_LINKS)] if common else [(gitdir, set())]
    for source, skip in sources:
        _copy_tree(str(source), str(git), ".git", reuse, {f".git/{n}" for n in skip}, ignore)
    with suppress(OSError):
        shutil.copystat(gitdir, git)
    if common and (git / "config.worktree").exists() and not (gitdir / "config.worktree").exists():
        os.unlink(git / "config.worktree")  # the main checkout's own settings
    config = str(git / "config")  # git config writes a new file: one linked from an older snapshot stays
    _git_config(config, "--unset", "core.worktree")
    if _git_config(config, "--get", "core.bare") == "true":
        _git_config(config, "core.bare", "false")


def _relink_submodules(src: Path, dest: Path, git_dirs: list[Path]) -> None:
    """Point each submodule checkout in the snapshot `dest` of `src` (found through `.gitmodules`,
    nested ones too) at the snapshot's copy of its git directory, when its `.git` file names one
    inside `git_dirs` (the git directories copied into `dest/.git`): a relative name may lead out of
    the snapshot (a linked worktree's submodules live in `.git/worktrees/<name>/modules`), and an
    absolute one leads to the developer's real repository, which git in the sandbox would write."""
    if not _real_dir(dest / ".git"):  # a link to a git directory elsewhere: nothing of it is ours to write
        return
    for rel in _submodule_paths(dest):
        dot_git = dest / rel / ".git"
        try:
            text = dot_git.read_text(errors="replace")
        except OSError:
            continue
        if not text.startswith("gitdir: "):
            continue
        named = (src / rel / text[len("gitdir: ") :].strip()).resolve()
        inside = next((named.relative_to(d) for d in git_dirs if named.is_relative_to(d)), None)
        if inside is None or not (dest / ".git" / inside).is_dir():
            continue
        copy = dest / ".git" / inside
        if not (_within(dest, dest / rel) and _within(dest, copy)):
            continue  # through a symlink: out of the snapshot
        relinked = f"gitdir: {os.path.relpath(copy, dest / rel)}\n"
        if relinked != text:
            write_atomic(dot_git, relinked)  # a new file: the old one may be linked from an older snapshot
        if _git_config(str(copy / "config"), "--get", "core.worktree"):
            _git_config(str(copy / "config"), "core.worktree", os.path.relpath(dest / rel, copy))


def _real_dir(path: Path) -> bool:
    return path.is_dir() and not path.is_symlink()


def _within(root: Path, path: Path) -> bool:
    """`path` (under `root`) names itself: no symlink on the way leads elsewhere."""
    return os.path.realpath(path) == os.path.join(os.path.realpath(root), os.path.relpath(path, root))


def _submodule_paths(root: Path, rel: str = "") -> Iterator[str]:
    """The submodule paths `.gitmodules` lists under `root/rel`, and theirs, relative to `root`."""
    if not (root / rel / ".gitmodules").is_file():
        return
    listed = _git_config(str(root / rel / ".gitmodules"), "--get-regexp", r"^submodule\..*\.path$")
    for line in listed.splitlines():
        sub = posixpath.normpath(posixpath.join(rel, line.split(" ", 1)[-1]))
        if sub.startswith("../") or sub == ".." or posixpath.isabs(sub):
            continue  # a hostile .gitmodules: nothing outside the snapshot is touched
        if _within(root, root / sub / ".git") and os.path.isfile(root / sub / ".git"):
            yield sub
            yield from _submodule_paths(root, sub)


def _git_config(config: str, *args: str) -> str:
    """`git config --file config ARGS`'s output; '' when it fails (a setting that is not there)."""
    try:
        proc = subprocess.run(["git", "config", "--file", config, *args], capture_output=True, text=True)
    except OSError:
        return ""
    return proc.stdout.strip()


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


def cached_tree(cache_dir: Path, key: str, build: Callable[[Path], None]) -> Path:
    """Directory `cache_dir/key`, made with `build(tmp)` on first use (as `build_once`) and kept as a
    cache: each use is recorded, and a build evicts the least recently used trees past the cache's
    size (`evict`, without claims: a tree is read only while it is being snapshotted, well within
    the idle time that spares it). What task-trees use: one per patched task was kept forever."""
    target = cache_dir / key
    built = not target.is_dir()
    build_once(target, build)
    _record_use(target)
    if built:
        try:
            evict(cache_dir, ())
        except OSError as e:  # a full cache must not stop the work it caches
            log.warning("could not evict old trees from %s: %s", cache_dir, e)
    return target


def evict(
    cache_dir: Path, holders: Iterable[Path], max_bytes: int = MAX_CACHE_BYTES, min_idle_s: float = MIN_IDLE_S
) -> list[str]:
    """Remove least recently used snapshots until the cache holds at most `max_bytes`, sparing
    those claimed in a `holders` directory and those used within `min_idle_s`; returns the
    keys removed. Skips the round when another process is evicting or claiming."""
    doomed = [Path(e) for e in _listdir(cache_dir) if ".evicted-" in e.name]  # left by a crash
    doomed += _abandoned_builds(cache_dir)
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


def claim(cache_dir: Path, holder: Path, key: str) -> None:
    """Mark cache entry `key` as used by `holder` (a directory that exists while its user may use the
    entry, as in `materialize`): `evict_replaced` then spares it. Made before the entry is looked up
    or built, so an eviction either sees the claim or has finished before the lookup."""
    with _cache_lock(cache_dir, exclusive=False):
        (holder / f"{CLAIM_PREFIX}{key}").touch()


def evict_replaced(cache_dir: Path, holders: Iterable[Path], prefix: str, current: str) -> list[str]:
    """Remove the entries named `prefix*` other than `current` that no holder claims: entries built
    from content that has since changed (the sandbox's /etc after the host's changed), which no new
    user will ask for; also what a killed process left of such entries. Returns the names removed;
    skips the round when another process holds the lock."""
    doomed = [Path(e) for e in _listdir(cache_dir) if e.name.startswith(f".{prefix}") and ".evicted-" in e.name]
    doomed += [p for p in _abandoned_builds(cache_dir) if p.name.startswith(f".{prefix}")]
    removed = []
    with _cache_lock(cache_dir, exclusive=True, wait=False) as locked:
        if locked:
            claimed = _claimed(holders)
            for e in _listdir(cache_dir):
                name = e.name
                if (
                    name.startswith(prefix)
                    and name != current
                    and name not in claimed
                    and e.is_dir(follow_symlinks=False)
                ):
                    doomed.append(cache_dir / f".{name}.evicted-{secrets.token_hex(4)}")
                    os.rename(cache_dir / name, doomed[-1])
                    removed.append(name)
    for trash in doomed:
        shutil.rmtree(trash, ignore_errors=True)
    return removed


_BUILDING = re.compile(r"^\..+\.tmp-(\d+)-[0-9a-f]{8}$")  # build_once's directory while it builds


def _abandoned_builds(cache_dir: Path) -> list[Path]:
    """Half-built snapshots whose builder is gone (killed, so its cleanup never ran): a large
    repository's left ~100 MB each time."""
    gone = []
    for entry in _listdir(cache_dir):
        if (m := _BUILDING.match(entry.name)) and not _alive(int(m.group(1))):
            gone.append(Path(entry))
    return gone


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _victims(cache_dir: Path, holders: Iterable[Path], max_bytes: int, min_idle_s: float) -> list[str]:
    """The keys to evict, least recently used first, to bring the cache within `max_bytes`."""
    roots = [Path(e) for e in _listdir(cache_dir) if e.is_dir(follow_symlinks=False) and not e.name.startswith(".")]
    entries = sorted((*_usage(root), root.name) for root in roots)  # (last use, bytes, key)
    total = sum(size for _, size, _ in entries)
    if total <= max_bytes:
        return []
    claimed = _claimed(holders)
    victims = []
    for last_use, size, key in entries:
        if total <= max_bytes:
            break
        if key not in claimed and time.time() - last_use >= min_idle_s:
            victims.append(key)
            total -= size
    return victims


def _claimed(holders: Iterable[Path]) -> set[str]:
    """The cache keys the `holders` directories claim (their `uses-<key>` files)."""
    return {e.name[len(CLAIM_PREFIX) :] for h in holders for e in _listdir(h) if e.name.startswith(CLAIM_PREFIX)}


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


def _key(
    kind: SourceKind,
    path: Path,
    commit: str | None,
    git_dirs: tuple[Path, Path | None] | None = None,
    unreadable: list[str] | None = None,
    left_out: frozenset[str] = frozenset(),
) -> str:
    """The cache key of a source; for a directory, from its listing (and that of the git directory
    its `.git` file names; not of the directories `left_out`), adding to `unreadable` the paths that
    cannot be read."""
    h = hashlib.sha256(kind.encode())
    if kind == "dir":
        # fsencode: a file name need not be UTF-8 (Python holds its stray bytes as surrogates).
        h.update(os.fsencode(path))
        _hash_listing(h, path, "", unreadable if unreadable is not None else [], left_out=left_out)
        if git_dirs:
            gitdir, common = git_dirs
            if common:
                _hash_listing(h, common, ".git-common/", [], left_out=frozenset({"worktrees"}))
            _hash_listing(h, gitdir, ".git/", [])
    elif kind == "tar":
        with open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
    else:
        h.update(_git(path, "rev-parse", "--verify", f"{commit or 'HEAD'}^{{commit}}").strip())
    return h.hexdigest()[:24]


def _hash_listing(h, root: Path, label: str, unreadable: list[str], left_out: frozenset[str] = frozenset()) -> None:
    """Feed `h` each path under `root` (as `label` + its relative path) with its size, mtime, mode,
    inode and ctime (a file rewritten with its size and mtime kept still has a new ctime), adding to
    `unreadable` the files and directories that cannot be read (a directory's contents are then not listed). A path removed meanwhile is passed over, as is each relative path in `left_out`."""
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root)
        blocked = set()
        for name in sorted(filenames) + sorted(dirnames):
            p = os.path.join(dirpath, name)
            rel = name if rel_dir == "." else os.path.join(rel_dir, name)
            if rel in left_out:
                blocked.add(name)
                continue
            try:
                st = os.lstat(p)
            except FileNotFoundError:  # removed meanwhile
                blocked.add(name)
                continue
            except PermissionError:  # its directory made unsearchable meanwhile
                unreadable.append(rel)
                blocked.add(name)
                continue
            if stat.S_ISDIR(st.st_mode) and not os.access(p, os.R_OK | os.X_OK):
                unreadable.append(f"{rel}/")
                blocked.add(name)
            elif stat.S_ISREG(st.st_mode) and not os.access(p, os.R_OK):
                unreadable.append(rel)
            h.update(os.fsencode(label + rel))
            h.update(f"\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_mode}\0{st.st_ino}\0{st.st_ctime_ns}\n".encode())
        dirnames[:] = sorted(d for d in dirnames if d not in blocked)


def _extract_tar(path: Path, dest: Path) -> None:
    try:
        with tarfile.open(path) as tar:
            tar.extractall(dest, filter="data")  # refuses absolute paths, `..`, device files
    except tarfile.ReadError as e:  # its message lists every compression tried, one line each
        raise SandboxError(f"{path} is a file but not a tar archive (.tar, .tar.gz, .tar.bz2, .tar.xz) that can be "
                           "read; give a directory, a tarball or a git repository") from e  # fmt: skip
    except (tarfile.TarError, OSError) as e:
        raise SandboxError(f"cannot extract snapshot tarball {path}: {e}") from e


def _git(repo: Path, *args: str) -> bytes:
    proc = subprocess.run(["git", "-C", str(repo), *args], capture_output=True)
    if proc.returncode != 0:
        raise SandboxError(f"git {' '.join(args)} in {repo} failed: {proc.stderr.decode(errors='replace').strip()}")
    return proc.stdout


def _extract_git(repo: Path, commit: str, dest: Path) -> None:
    """The commit's tree as committed: each blob's bytes with its mode, symlinks as links (whatever they
    point at, as a checkout writes them), submodules as empty directories. Not `git archive`, which
    applies the commit's .gitattributes (export-ignore drops files, export-subst rewrites them), and
    whose tar stream a link pointing outside stopped the extraction of, silently or for good."""
    entries = [_tree_entry(record) for record in _git(repo, "ls-tree", "-r", "-z", "--full-tree", commit).split(b"\0")
               if record]  # fmt: skip
    blobs = [e for e in entries if e[1] == "blob"]
    made: set[str] = set()  # directories written, each made once
    with tempfile.TemporaryFile() as wanted, tempfile.TemporaryFile() as errors:
        wanted.write(b"".join(oid + b"\n" for _, _, oid, _ in blobs))
        wanted.seek(0)
        # The ids come from a file and the contents are read as they come: neither pipe can stall the other.
        with subprocess.Popen(["git", "-C", str(repo), "cat-file", "--batch"], stdin=wanted,
                              stdout=subprocess.PIPE, stderr=errors) as proc:  # fmt: skip
            assert proc.stdout is not None
            for mode, _, oid, rel in blobs:
                header = proc.stdout.readline().split()
                if len(header) != 3 or header[0] != oid or header[1] != b"blob":
                    errors.seek(0)
                    said = errors.read().decode(errors="replace").strip() or b" ".join(header).decode(errors="replace")
                    raise SandboxError(f"git cat-file in {repo} did not give blob {oid.decode()} of {commit}: {said}")
                data = proc.stdout.read(int(header[2]) + 1)[:-1]  # each content ends with a newline of git's
                _write_entry(dest, rel, mode, data, made)
    for _, kind, _, rel in entries:
        if kind == "commit":  # a submodule: checked out empty, as `git clone` leaves one before `submodule update`
            _parent_dirs(dest, rel + "/", made)


def _tree_entry(record: bytes) -> tuple[bytes, str, bytes, str]:
    """(mode, kind, object id, path) of one `git ls-tree -z` record; a path a checkout would refuse
    (absolute, `..`, `.git`) is refused here too: it would land outside the snapshot or in its git directory."""
    meta, _, raw = record.partition(b"\t")
    mode, kind, oid = meta.split(b" ")
    rel = os.fsdecode(raw)
    if any(part in ("", ".", "..") or part.lower() == ".git" for part in rel.split("/")):
        raise SandboxError(f"the commit holds the path {rel!r}, which git itself would not check out")
    return mode, kind.decode(), oid, rel


def _write_entry(dest: Path, rel: str, mode: bytes, data: bytes, made: set[str]) -> None:
    _parent_dirs(dest, rel, made)
    target = dest / rel
    if mode == b"120000":
        os.symlink(os.fsdecode(data), target)
        return
    # O_EXCL | O_NOFOLLOW: a path given twice (a malformed tree) cannot write through a link made before.
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o755 if mode == b"100755" else 0o644)
    with open(fd, "wb") as f:
        f.write(data)


def _parent_dirs(dest: Path, rel: str, made: set[str]) -> None:
    """Makes the directories above `rel` not yet in `made`. mkdir never follows a link: a malformed tree
    naming `link/file` beside the symlink `link` (or a file) is refused, not written through."""
    parts = rel.split("/")[:-1]
    for depth in range(1, len(parts) + 1):
        if (d := "/".join(parts[:depth])) not in made:
            try:
                (dest / d).mkdir()
            except FileExistsError:
                raise SandboxError(
                    f"the commit writes {rel!r} through {d!r}, which it holds as a file or link"
                ) from None
            made.add(d)


def _chown_tree(root: Path, owner: tuple[int, int]) -> None:
    os.chown(root, *owner)
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            os.chown(os.path.join(dirpath, name), *owner, follow_symlinks=False)
