"""File operations confined to a workspace root.

Every path is walked one component at a time from an open directory descriptor with
O_NOFOLLOW, resolving symlinks by hand, so neither `..`, an absolute path nor a symlink
(even one swapped in by a command running concurrently) can lead outside the root.
Symlinks that stay inside the root are followed; absolute targets under the sandbox mount
point (`/workspace/...`) count as inside (not for a tree no sandbox mounts: `mount=None`).
Writes replace a file by renaming a finished temporary file over it, so no reader sees a
half-written file. Reads stop one byte past the read limit, even on a file still growing.
`resolve` is the walk itself, for callers with an operation of their own (sandbox/apply.py).

Not covered: hard links made inside the workspace to files outside it (the isolated
backend cannot create those; the plain backend is not a security boundary anyway). A write
gives the file a new inode, so other hard links to it keep the old content; writes are not
fsynced (atomic against readers and process crashes, not power loss).
"""

from __future__ import annotations

import errno
import hashlib
import os
import posixpath
import secrets
import stat as stat_mod
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

from vivace.sandbox.base import (
    DirEntry,
    FileKind,
    FileStat,
    NotAFileError,
    PathEscapeError,
    SymlinkLoop,
    WorkspaceFileNotFound,
)

WORKSPACE_MOUNT = "/workspace"  # where the workspace appears inside the sandbox
MAX_SYMLINKS = 40
MAX_READ_BYTES = 64 * 1024 * 1024
_DIR_FLAGS = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _kind(mode: int) -> FileKind:
    if stat_mod.S_ISREG(mode):
        return "file"
    if stat_mod.S_ISDIR(mode):
        return "dir"
    if stat_mod.S_ISLNK(mode):
        return "symlink"
    return "other"


def _split(path: str, original: str, mount: str | None = WORKSPACE_MOUNT) -> list[str]:
    if mount and (path.startswith(mount + "/") or path == mount):
        path = path[len(mount) :].lstrip("/") or "."
    if path.startswith("/"):
        raise PathEscapeError(
            f"{original!r}: absolute paths are outside the workspace; use a path relative to the workspace root"
        )
    if "\0" in path:
        raise PathEscapeError(f"{original!r}: path contains a NUL byte")
    return [p for p in path.split("/") if p not in ("", ".")]


def _check_lexical(parts: list[str], original: str) -> None:
    """Refuse a path whose `..` climb above the root on paper, whatever exists on disk."""
    depth = 0
    for p in parts:
        depth += -1 if p == ".." else 1
        if depth < 0:
            raise PathEscapeError(f"{original!r} leads outside the workspace")


def _open_final(dfd: int, name: str, flags: int, path: str) -> int:
    """Open the last component of a resolved path, never through a symlink; typed errors
    except FileNotFoundError, which callers treat differently."""
    try:
        return os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=dfd)
    except IsADirectoryError:
        raise NotAFileError(f"{path!r} is a directory") from None
    except OSError as e:
        if e.errno == errno.ELOOP:  # a symlink swapped in after resolution
            raise PathEscapeError(f"{path!r} changed while resolving") from None
        raise


def _identity(st: os.stat_result) -> tuple[int, int]:
    return st.st_dev, st.st_ino


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _take_owner_and_mode(fd: int, old: os.stat_result) -> None:
    """Give a replacement file the owner and permission bits of the file it replaces (chown
    first: it clears set-id bits)."""
    st = os.fstat(fd)
    if (st.st_uid, st.st_gid) != (old.st_uid, old.st_gid):
        os.fchown(fd, old.st_uid, old.st_gid)
    os.fchmod(fd, stat_mod.S_IMODE(old.st_mode))


def _bounded_content(f) -> bytes:
    """A file's bytes; past MAX_READ_BYTES a NUL-led digest stands in (compared, shown as binary)."""
    data = f.read(MAX_READ_BYTES + 1)
    if len(data) <= MAX_READ_BYTES:
        return data
    return b"\0large file sha256:" + _content_digest(f.fileno()).encode()


_BLOCK = 1 << 20
_ZEROS = bytes(_BLOCK)


def _content_digest(fd: int) -> str:
    """sha256 of a file's size and of its blocks that are not all zeros, each with its offset: equal
    for equal contents however they are stored, and read only where the file has data. A sparse file
    (`truncate -s 1P`, no disk used) was hashed byte by byte: days of one diff, and six such files held
    every worker thread of the process."""
    size = os.fstat(fd).st_size
    h = hashlib.sha256(b"%d\0" % size)
    for offset, block in data_blocks(fd, size):
        h.update(b"%d\0" % offset + block)
    return h.hexdigest()


def data_blocks(fd: int, size: int) -> Iterator[tuple[int, bytes]]:
    """(offset, bytes) of each aligned MiB block of the file's first `size` bytes that is not all zeros,
    in order, reading only where the file has data: holes are skipped with SEEK_DATA/SEEK_HOLE (where
    the filesystem cannot say, every block is read). What a copy must write to keep a sparse file sparse,
    and all a digest of its content needs."""
    at = 0  # a block boundary: the blocks before it are done
    while at < size:
        try:
            data = os.lseek(fd, at, os.SEEK_DATA)
            end = min(os.lseek(fd, data, os.SEEK_HOLE), size)
        except OSError as e:
            if e.errno == errno.ENXIO:  # no data past `at`: the rest is a hole
                return
            data, end = at, size  # the filesystem cannot say: read it all
        for offset in range(data // _BLOCK * _BLOCK, end, _BLOCK):  # whole aligned blocks: storage-blind
            block = os.pread(fd, min(_BLOCK, size - offset), offset)
            if block and block != _ZEROS[: len(block)]:
                yield offset, block
        at = -(-end // _BLOCK) * _BLOCK


def copy_sparse(src_fd: int, dest_fd: int, size: int) -> None:
    """Make the empty file `dest_fd` hold the first `size` bytes of `src_fd`, writing only the blocks
    that are not zeros (the rest stays holes): a 1 TiB `truncate`d file copies as no data, where a plain
    copy wrote a terabyte of zeros."""
    for offset, block in data_blocks(src_fd, size):
        view = memoryview(block)
        while view:
            n = os.pwrite(dest_fd, view, offset)
            view, offset = view[n:], offset + n
    os.ftruncate(dest_fd, size)


@dataclass(frozen=True)
class OpenFile:
    """A file opened for reading in pieces (`ConfinedFS.open_regular`); the holder closes `fd`."""

    fd: int
    size: int  # bytes, when it was opened
    head: bytes  # its first bytes, read with the open (all of it, for a file that small)


def _over_limit(path: str, size: int, max_bytes: int, growing: bool = False) -> str:
    what = f"over {size - 1} bytes and growing" if growing else f"{size} bytes"
    return f"{path!r} is {what}, over the {max_bytes}-byte read limit"


class ConfinedFS:
    """Byte-level file API over one directory tree; `owner` (uid, gid) is given to new files.
    `mount`: where the tree appears to the commands that make its symlinks (an absolute link
    under it stays inside); None for a tree no sandbox mounts (a developer's repository, where
    `/workspace/x` is some other directory and a link to it leads outside)."""

    def __init__(self, root: Path, owner: tuple[int, int] | None = None, mount: str | None = WORKSPACE_MOUNT):
        self.root = Path(root)
        self.owner = owner
        self.mount = mount

    # -- resolution ---------------------------------------------------------------------
    @contextmanager
    def resolve(
        self,
        path: str,
        *,
        follow_final: bool = True,
        create_parents: bool = False,
        trail: list[str] | None = None,
    ) -> Iterator[tuple[int, str | None]]:
        """Yield (dir_fd, name) for `path`; name None means the root itself. `trail`, when
        given, receives the resolved components of dir_fd (on a missing directory: those of
        its parent, the missing name and the components not yet walked)."""
        # The root itself is trusted (it may be a /proc/self/fd magic link to a detached mount).
        root = os.open(self.root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        # One descriptor besides the root's, however deep the path: `..` is opened from the current
        # directory and checked to be the directory walked through (its (st_dev, st_ino) in `ids`),
        # so the walk holds two descriptors at any depth and a directory moved meanwhile stops it.
        fd = root
        ids = [_identity(os.fstat(root))]  # the directories walked through, the root first
        names: list[str] = []  # the components below the root, one per ids[1:]
        if trail is None:
            trail = []

        def enter(new: int) -> None:
            nonlocal fd
            if fd != root:
                os.close(fd)
            fd = new

        try:
            pending = _split(path, path, self.mount)
            _check_lexical(pending, path)
            links = 0
            while pending:
                comp = pending.pop(0)
                if comp == "..":
                    if len(ids) == 1:
                        raise PathEscapeError(f"{path!r} leads outside the workspace")
                    ids.pop()
                    names.pop()
                    if len(ids) == 1:
                        enter(root)
                        continue
                    parent = os.open("..", _DIR_FLAGS, dir_fd=fd)
                    enter(parent)
                    if _identity(os.fstat(fd)) != ids[-1]:
                        raise PathEscapeError(f"{path!r}: a directory on the way changed while resolving")
                    continue
                final = not pending
                try:
                    st = os.stat(comp, dir_fd=fd, follow_symlinks=False)
                except FileNotFoundError:
                    if final:
                        trail[:] = names
                        yield fd, comp
                        return
                    if not create_parents:
                        trail[:] = [*names, comp, *pending]
                        raise WorkspaceFileNotFound(f"{path!r}: no such directory {comp!r}") from None
                    try:
                        os.mkdir(comp, 0o755, dir_fd=fd)
                        if self.owner:
                            os.chown(comp, *self.owner, dir_fd=fd, follow_symlinks=False)
                    except FileExistsError:
                        pass  # made meanwhile (a parallel write into the same new directory): judged below
                    try:
                        st = os.stat(comp, dir_fd=fd, follow_symlinks=False)
                    except FileNotFoundError as e:  # a concurrent command removed it again
                        raise PathEscapeError(f"{path!r}: {comp!r} changed while resolving") from e
                if stat_mod.S_ISLNK(st.st_mode) and (follow_final or not final):
                    links += 1
                    if links > MAX_SYMLINKS:
                        raise SymlinkLoop(f"{path!r}: too many levels of symbolic links")
                    try:
                        target = os.readlink(comp, dir_fd=fd)
                    except OSError as e:  # replaced (EINVAL) or removed (ENOENT) since the stat above
                        raise PathEscapeError(f"{path!r}: {comp!r} changed while resolving") from e
                    if target.startswith("/"):
                        mount = self.mount
                        if not (mount and (target == mount or target.startswith(mount + "/"))):
                            raise PathEscapeError(f"{path!r}: symlink {comp!r} points outside the workspace ({target})")
                        enter(root)
                        del ids[1:]
                        names.clear()
                    pending = _split(target, path, self.mount) + pending
                    continue
                if final:
                    trail[:] = names
                    yield fd, comp
                    return
                if not stat_mod.S_ISDIR(st.st_mode):
                    raise NotAFileError(f"{path!r}: {comp!r} is not a directory")
                try:
                    child = os.open(comp, _DIR_FLAGS, dir_fd=fd)
                except OSError as e:  # swapped for a symlink between stat and open
                    raise PathEscapeError(f"{path!r}: {comp!r} changed while resolving") from e
                enter(child)
                ids.append(_identity(os.fstat(fd)))
                names.append(comp)
            trail[:] = names
            yield fd, None
        finally:
            if fd != root:
                os.close(fd)
            os.close(root)

    # -- operations ---------------------------------------------------------------------
    def open_regular(self, path: str, max_bytes: int = MAX_READ_BYTES, head_bytes: int = 0) -> OpenFile:
        """The regular file at `path` opened read-only, with its first `head_bytes`: walked inside
        the root, the last component opened with O_NOFOLLOW (a symlink swapped in meanwhile is
        refused), so the descriptor reads this file whatever is renamed or linked there after.
        NotAFileError for a directory, a special file or one over `max_bytes`; the caller closes
        `fd` (the environment server streams a file from it)."""
        with self.resolve(path) as (dfd, name):
            if name is None:
                raise NotAFileError(f"{path!r} is a directory")
            try:
                fd = _open_final(dfd, name, os.O_RDONLY | os.O_NONBLOCK, path)
            except FileNotFoundError:
                raise WorkspaceFileNotFound(f"{path!r}: no such file") from None
            except OSError as e:
                if e.errno == errno.ENXIO:  # a UNIX socket (open(2) refuses them so)
                    raise NotAFileError(f"{path!r} is not a regular file (a socket)") from None
                raise
        try:
            st = os.fstat(fd)
            if stat_mod.S_ISDIR(st.st_mode):
                raise NotAFileError(f"{path!r} is a directory; list it instead")
            if not stat_mod.S_ISREG(st.st_mode):
                raise NotAFileError(f"{path!r} is not a regular file")
            if st.st_size > max_bytes:
                raise NotAFileError(_over_limit(path, st.st_size, max_bytes))
            head = os.pread(fd, min(head_bytes, st.st_size), 0) if head_bytes and st.st_size else b""
        except BaseException:
            os.close(fd)
            raise
        return OpenFile(fd, st.st_size, head)

    def read_bytes(self, path: str, max_bytes: int = MAX_READ_BYTES) -> bytes:
        opened = self.open_regular(path, max_bytes)
        try:
            chunks, size = [], 0
            # At most one byte past the limit: a file a command is still growing is refused, not
            # read to whatever size it reaches meanwhile.
            while size <= max_bytes and (chunk := os.read(opened.fd, min(1 << 20, max_bytes + 1 - size))):
                chunks.append(chunk)
                size += len(chunk)
            if size > max_bytes:
                raise NotAFileError(_over_limit(path, size, max_bytes, growing=True))
            return b"".join(chunks)
        finally:
            os.close(opened.fd)

    def write_bytes(self, path: str, data: bytes) -> None:
        """Replace the file's content atomically: a reader (or a crash) sees the old content or
        the new one, never a mix."""
        with self.resolve(path, create_parents=True) as (dfd, name):
            if name is None:
                raise NotAFileError(f"{path!r} is a directory")
            try:
                old: os.stat_result | None = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            except FileNotFoundError:
                old = None
            if old is not None:
                if stat_mod.S_ISLNK(old.st_mode):  # a symlink swapped in after resolution
                    raise PathEscapeError(f"{path!r} changed while resolving")
                if not stat_mod.S_ISREG(old.st_mode):
                    kind = "a directory" if stat_mod.S_ISDIR(old.st_mode) else "not a regular file"
                    raise NotAFileError(f"{path!r} is {kind}")
            try:
                self._replace(dfd, name, path, data, old)
            except PermissionError:
                if old is None:
                    raise
                # Not allowed to create a file beside it, or to give the new file the old one's
                # owner (not root): write in place rather than take the file from its owner.
                self._write_in_place(dfd, name, path, data)

    def _replace(self, dfd: int, name: str, path: str, data: bytes, old: os.stat_result | None) -> None:
        """Write `data` to a temporary file beside `name`, give it the old file's owner and mode
        (or the workspace's owner), and rename it over `name`."""
        tmp = f".{name[:200]}.vivace-{secrets.token_hex(6)}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=dfd)
        try:
            try:
                if old is not None:
                    _take_owner_and_mode(fd, old)
                elif self.owner:
                    os.fchown(fd, *self.owner)
                _write_all(fd, data)
            finally:
                os.close(fd)
            # rename replaces a symlink swapped in meanwhile; it never follows one.
            os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        except BaseException as e:
            with suppress(FileNotFoundError):
                os.unlink(tmp, dir_fd=dfd)
            if isinstance(e, IsADirectoryError):  # a directory swapped in after the check
                raise NotAFileError(f"{path!r} is a directory") from None
            raise

    def _write_in_place(self, dfd: int, name: str, path: str, data: bytes) -> None:
        fd = _open_final(dfd, name, os.O_WRONLY, path)
        try:
            if not stat_mod.S_ISREG(os.fstat(fd).st_mode):
                raise NotAFileError(f"{path!r} is not a regular file")
            os.ftruncate(fd, 0)
            _write_all(fd, data)
        finally:
            os.close(fd)

    def readlink(self, path: str) -> str:
        """Where the symlink `path` points, as written (never followed); a str with surrogate escapes,
        which os.symlink turns back into the same bytes."""
        with self.resolve(path, follow_final=False) as (dfd, name):
            if name is None:
                raise NotAFileError(f"{path!r} is the workspace itself")
            return os.readlink(name, dir_fd=dfd)

    def realpath(self, path: str) -> str:
        """`path` workspace-relative with every symlink resolved ("." for the root), walked like
        every other operation (PathEscapeError for a link leading outside); components below a
        missing directory are taken as written, as a write would create them."""
        for _ in range(MAX_SYMLINKS):
            trail: list[str] = []
            try:
                with self.resolve(path, trail=trail) as (_, name):
                    return "/".join([*trail, name] if name else trail) or "."
            except WorkspaceFileNotFound:
                # trail: the resolved directories, the missing one, then the rest as written.
                rest = posixpath.normpath("/".join(trail))
                if rest == ".." or rest.startswith("../"):
                    raise PathEscapeError(f"{path!r} leads outside the workspace") from None
                if ".." not in trail:
                    return rest
                path = rest  # `..` may climb out of the missing directory: walk the rest again
        raise PathEscapeError(f"{path!r}: too many levels of symbolic links")

    def entry(self, path: str) -> tuple[str, bytes | None, int]:
        """(kind, content, git mode) of `path` without following a final symlink: kind is
        'missing', 'file', 'symlink' or 'dir' ('dir' also for sockets and the like).
        Used by diffs, which must not be led outside by a link swapped in meanwhile."""
        try:
            with self.resolve(path, follow_final=False) as (dfd, name):
                if name is None:
                    return "dir", None, 0
                st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
                if stat_mod.S_ISLNK(st.st_mode):
                    return "symlink", os.fsencode(os.readlink(name, dir_fd=dfd)), 0o120000
                if not stat_mod.S_ISREG(st.st_mode):
                    return "dir", None, 0
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
                with os.fdopen(fd, "rb") as f:
                    st = os.fstat(f.fileno())
                    if not stat_mod.S_ISREG(st.st_mode):
                        return "dir", None, 0
                    data = _bounded_content(f)
                return "file", data, 0o100755 if st.st_mode & 0o111 else 0o100644
        except (FileNotFoundError, NotADirectoryError, WorkspaceFileNotFound, PathEscapeError, NotAFileError):
            return "missing", None, 0
        except OSError as e:
            if e.errno == errno.ELOOP:  # swapped for a link between stat and open
                return "missing", None, 0
            raise

    def list(self, path: str = ".") -> list[DirEntry]:
        with self.resolve(path) as (dfd, name):
            try:
                fd = os.open(name or ".", os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
            except FileNotFoundError:
                raise WorkspaceFileNotFound(f"{path!r}: no such directory") from None
            except NotADirectoryError:
                raise NotAFileError(f"{path!r} is not a directory") from None
            try:
                out = []
                for n in sorted(os.listdir(fd)):
                    try:
                        st = os.stat(n, dir_fd=fd, follow_symlinks=False)
                    except FileNotFoundError:
                        continue  # removed while listing
                    out.append(DirEntry(name=n, kind=_kind(st.st_mode), size=st.st_size))
                return out
            finally:
                os.close(fd)

    def stat(self, path: str) -> FileStat:
        with self.resolve(path, follow_final=False) as (dfd, name):
            try:
                st = os.stat(name or ".", dir_fd=dfd, follow_symlinks=False)
            except FileNotFoundError:
                raise WorkspaceFileNotFound(f"{path!r}: no such file or directory") from None
            rel = "/".join(_split(path, path, self.mount)) or "."
            return FileStat(
                path=rel, kind=_kind(st.st_mode), size=st.st_size, mode=st.st_mode & 0o7777, mtime=st.st_mtime
            )

    def remove(self, path: str, recursive: bool = False) -> None:
        with self.resolve(path, follow_final=False) as (dfd, name):
            if name is None:
                raise PathEscapeError("refusing to remove the workspace root")
            try:
                st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            except FileNotFoundError:
                raise WorkspaceFileNotFound(f"{path!r}: no such file or directory") from None
            if stat_mod.S_ISDIR(st.st_mode):
                if recursive:
                    rmtree_at(dfd, name)
                else:
                    try:
                        os.rmdir(name, dir_fd=dfd)
                    except OSError as e:
                        if e.errno == errno.ENOTEMPTY:
                            raise NotAFileError(f"{path!r} is a non-empty directory; pass recursive=True") from None
                        raise
            else:
                os.unlink(name, dir_fd=dfd)


def rmtree_at(dfd: int, name: str, one_file_system: bool = False) -> None:
    """Remove `name` in the directory `dfd`, with everything under it, as shutil.rmtree(name,
    dir_fd=dfd) would, but at any depth: shutil recurses once per level (RecursionError past
    about 1,000, a tree any command can make) and holds a descriptor per level. This holds one
    (and the names still to remove): it walks down by opening each directory with O_NOFOLLOW and
    back up through `..`, checking that each is still the directory it came from, so a directory
    moved away under the walk (even out of the workspace) stops it with an error rather than lead
    it there. Links are removed, never followed. `one_file_system`: a directory on another
    filesystem (a mount left behind) is not entered, and removing its parent fails. Raises the
    first error (OSError, or PathEscapeError for a directory that changed)."""
    st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
    if not stat_mod.S_ISDIR(st.st_mode):
        os.unlink(name, dir_fd=dfd)
        return
    fd = _open_dir_checked(dfd, name, st)
    # From the top down: each directory entered, as (its name, its (st_dev, st_ino), its subdirectories
    # still to remove).
    levels: list[tuple[str, tuple[int, int], list[tuple[str, os.stat_result]]]] = []
    try:
        levels.append((name, (st.st_dev, st.st_ino), _clear_files(fd)))
        while True:
            pending = levels[-1][2]
            if pending:
                sub, sub_st = pending.pop()
                if one_file_system and sub_st.st_dev != st.st_dev:
                    raise OSError(errno.EXDEV, f"{sub!r} is on another filesystem (a mount?): not entered")
                child = _open_dir_checked(fd, sub, sub_st)
                os.close(fd)
                fd = child
                levels.append((sub, (sub_st.st_dev, sub_st.st_ino), _clear_files(fd)))
                continue
            done, _, _ = levels.pop()
            if not levels:  # the top: its parent is the caller's directory
                os.rmdir(done, dir_fd=dfd)
                return
            parent = os.open("..", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=fd)
            os.close(fd)
            fd = parent
            got = os.fstat(fd)
            if (got.st_dev, got.st_ino) != levels[-1][1]:
                raise PathEscapeError(f"{done!r} was moved while it was being removed")
            os.rmdir(done, dir_fd=fd)
    finally:
        os.close(fd)


def _open_dir_checked(dfd: int, name: str, st: os.stat_result) -> int:
    """`name` in `dfd` opened as a directory, never through a link, and checked to be the one `st` found."""
    fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
    got = os.fstat(fd)
    if (got.st_dev, got.st_ino) != (st.st_dev, st.st_ino):
        os.close(fd)
        raise PathEscapeError(f"{name!r} changed while it was being removed")
    return fd


def _clear_files(fd: int) -> list[tuple[str, os.stat_result]]:
    """Unlink everything in the directory `fd` but its subdirectories; those, last listed first."""
    with os.scandir(fd) as it:
        entries = [(entry.name, entry.stat(follow_symlinks=False)) for entry in it]
    subdirs = []
    for entry_name, entry_st in entries:
        if stat_mod.S_ISDIR(entry_st.st_mode):
            subdirs.append((entry_name, entry_st))
        else:
            os.unlink(entry_name, dir_fd=fd)
    subdirs.reverse()  # popped in listing order
    return subdirs
