"""Writing a workspace's changes back into the directory its snapshot came from (`vivace
agent --apply`): the one place vivace writes into a developer's own files.

What: `export_changes` makes the destination hold the workspace's version of every path a diff
names, as `git apply` would, and says in an `ApplyReport` what it wrote, merged and left.

Why this care: the repository is the user's. Existing files are written in place, so hard links,
owner, ACLs and extended attributes stay; a file the developer changed while the agent ran is
merged or left, never overwritten; a symlink leading out of the repository is never followed; a
failed write puts the old content back; Ctrl-C lands between files, so the report is always true.
Symlinks the agent made are written as links (git's mode 120000), but only those that lead to a
place inside the repository (`_link_refused`): an absolute one (`/workspace/x` is the sandbox's
mount point, meaningless here) or one leading out is left, and so are special files.

Not covered: atomicity against a crash or power loss in the middle of a file (see `_overwrite`;
the old content of the file being written is then on disk beside it, `.NAME.vivace-old-PID`, and
the files before it are written, those after it not), and a developer's save landing between the
check against the snapshot and the write (a window of microseconds per file). A link the developer already had whose target holds `..` after a name
(`u -> m/..`) may lead elsewhere once the apply makes `m` a link; links it writes never do.
"""

from __future__ import annotations

import errno
import os
import posixpath
import secrets
import signal
import stat as stat_mod
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import IO

from vivace.sandbox.base import FileStat, NotAFileError, PathEscapeError, SandboxError, WorkspaceFileNotFound
from vivace.sandbox.diff import changed_paths, header_path
from vivace.sandbox.paths import MAX_READ_BYTES, ConfinedFS, OpenFile, copy_sparse
from vivace.signals import signal_handler


@dataclass
class ApplyReport:
    """What `export_changes` did to the destination. Filled in as it goes, so a caller stopped
    part-way (Ctrl-C) still knows what was written."""

    applied: list[str] = field(default_factory=list)  # now as in the workspace: written, merged or removed
    merged: list[str] = field(default_factory=list)  # of `applied`: merged with edits made in dest meanwhile
    left: dict[str, str] = field(default_factory=dict)  # path -> why it is as it was (the diff has the agent's)


async def export_changes(
    workspace, diff_text: str, dest: Path, base: Path | None = None, report: ApplyReport | None = None
) -> ApplyReport:
    """Make `dest` (the directory the workspace was made from) hold the workspace's version of
    every path in `diff_text`, as `git apply` of it would: changed and new files written, deleted
    ones removed, directories those removals emptied pruned, symlinks written as links (never
    followed) when they lead inside `dest` (`_link_refused`; one whose target does not exist yet is
    written too, as git stores it). Writes are confined to `dest`: a path that leads outside it
    through a symlink is left, never followed.

    A file that exists is written in place (`_overwrite`): it keeps its inode (hard links), owner,
    extended attributes and permission bits, of which only an executable-bit change the diff shows
    is applied. New files get 0666 or 0777 less the umask, as git gives them. A directory is never
    removed with anything in it that the diff does not remove (a file the agent put in its place
    is then left).

    With `base` (the snapshot the workspace started from), a path that changed in `dest` since
    then (the developer went on working while the agent ran) is never overwritten: a text file
    whose two sets of changes merge cleanly (`git merge-file`) gets the merge; anything else is
    left as it is in `dest`. A path that cannot be written (an error, a symlink leading outside)
    is left too, and the rest still applied. `report.left` says why for each path left, which the
    caller must show; pass `report` to see how far an interrupted apply got."""
    report = ApplyReport() if report is None else report
    # mount=None: in a developer's repository an absolute link to /workspace/x leads outside it.
    target = ConfinedFS(Path(dest), mount=None)
    before = ConfinedFS(base, mount=None) if base is not None else None
    files: dict[str, FileStat] = {}  # path -> its stat in the workspace, for the paths to write
    links: dict[str, str] = {}  # path -> its target in the workspace, for the symlinks to write
    gone: list[str] = []  # paths to remove
    # What the diff removes is gone, though the workspace's stat may find something there: beyond a
    # directory the agent replaced by a link it follows the link to its target's file of that name.
    # A special file, which a diff shows as removed, is the one exception: it is left, with why.
    removed = _header_paths(diff_text, "deleted file mode ") - _header_paths(diff_text, "new file mode ")
    for rel in changed_paths(diff_text):
        try:
            st = await workspace.stat(rel)
            if rel in removed and st.kind != "other":
                st = None
        except (WorkspaceFileNotFound, NotAFileError):  # NotAFileError: a parent is a file now
            st = None
        except (OSError, SandboxError) as e:
            report.left[rel] = f"not written: {e}"
            continue
        if st is not None and st.kind == "symlink":
            try:
                links[rel] = await _workspace_link(workspace, rel)
            except (OSError, SandboxError) as e:
                report.left[rel] = f"not written: {e}"
        elif st is not None and st.kind == "other":
            report.left[rel] = "a special file (a fifo, socket or device), which cannot be carried over"
        elif st is not None and st.kind == "file":
            files[rel] = st
        else:  # deleted (or replaced by a directory) in the workspace
            gone.append(rel)

    # Removals first, deepest first: a directory the agent replaced by a file is empty of what the
    # diff removes by the time the file is written, so it is never removed with anything else in it.
    emptied = set()
    for rel in sorted(gone, key=lambda r: r.count("/"), reverse=True):
        if (checked := _checked(rel, None, target, before, report, dest)) is None:
            continue
        verdict = checked[0]
        try:
            with _signals_held():
                if verdict == "apply" and target.entry(rel)[0] != "missing":
                    target.remove(rel)  # a symlink itself, not its target; a directory only when empty
                report.applied.append(rel)
            emptied.add(posixpath.dirname(rel))
        except NotAFileError:  # a directory holding files there now (a race aside: entry said it exists)
            report.left[rel] = f"a directory in {dest} that holds files"
        except (OSError, SandboxError) as e:
            report.left[rel] = _not_written(e, dest)
    parents = {d for rel in [*files, *links] for d in _ancestors(rel)}  # kept: they keep their mode and owner
    _prune_empty_dirs(target, emptied, keep=parents)

    mode_changed = _header_paths(diff_text, "old mode ")
    for rel, st in files.items():
        try:
            data = await _workspace_version(workspace, rel, st.size)
        except (OSError, SandboxError) as e:
            report.left[rel] = f"not written: {e}"
            continue
        write = partial(_write_file, target, rel, executable=bool(st.mode & 0o111), mode_changed=rel in mode_changed)
        try:
            _apply_entry(rel, data, "file", write, target, before, report, dest)
        finally:
            if isinstance(data, OpenFile):
                os.close(data.fd)
    for rel, to in links.items():  # last: what they lead to may be written above
        if (why := _link_refused(rel, to, target, dest)) is not None:
            report.left[rel] = why
            continue
        write = partial(_write_link, target, rel)
        _apply_entry(rel, os.fsencode(to), "symlink", write, target, before, report, dest)
    return report


async def _workspace_link(workspace, rel: str) -> str:
    """The target of the workspace's symlink `rel`, as written (never followed). Only this machine's
    workspaces can tell (`readlink`; the Workspace protocol has no call for it): a workspace on
    another machine (over HTTP) cannot, and its links are left."""
    readlink = getattr(workspace, "readlink", None)
    if readlink is None:
        raise SandboxError("a symlink in a workspace that cannot say where it points (not on this machine)")
    return await readlink(rel)


def _link_refused(rel: str, to: str, target: ConfinedFS, dest: Path) -> str | None:
    """Why the symlink `rel` -> `to` is not to be written into `target` (the repository `dest`), or
    None: its target, taken from the directory the link is in (through the repository's links,
    as the kernel takes it), must stay inside.

    The target must be `..`s, then names: a `..` after a name climbs from wherever that name leads
    when followed, and this apply may itself make it a link (`d -> .` makes `d/..` the repository's
    parent). So each link it writes leads inside whatever else it writes: what its `..`s reach is
    fixed by where the link is, and every link on its way down was checked the same way. A target
    that does not exist (yet) is fine: git stores such links, and one leads nowhere outside."""
    if to.startswith("/"):
        return f"a symlink to the absolute path {to}: in the sandbox that named the sandbox's file, not this machine's; not carried over"
    parts = [p for p in to.split("/") if p not in ("", ".")]
    ups = next((i for i, p in enumerate(parts) if p != ".."), len(parts))  # the leading `..`s
    names = parts[ups:]
    if ".." in names:
        return f"a symlink to {to}, with `..` after a name (where that leads depends on what the name is): not carried over"
    try:
        where = target.realpath(posixpath.dirname(rel) or ".")  # the directory the link will be in
    except (OSError, SandboxError) as e:  # one leading outside: the write would be refused too
        return _not_written(e, dest)
    here = [] if where == "." else where.split("/")
    if ups > len(here):
        return f"a symlink to {to}, which climbs out of {dest}: not carried over"
    try:
        target.realpath("/".join([*here[: len(here) - ups], *names]) or ".")
    except PathEscapeError as e:  # through a link leading out, or round a loop of links
        return f"a symlink to {to}, which leads outside {dest} ({e}): not carried over"
    except NotAFileError:  # a file where the target has a directory: it leads nowhere, as in the workspace
        pass
    except (OSError, SandboxError) as e:
        return _not_written(e, dest)
    return None


async def _workspace_version(workspace, rel: str, size: int) -> bytes | OpenFile:
    """The workspace's version of the file `rel`: its bytes or, past the read limit (a large binary)
    where the workspace can open a file to be read in pieces (a local one), the file opened."""
    if size > MAX_READ_BYTES and hasattr(workspace, "open_read"):
        return await workspace.open_read(rel, max_bytes=sys.maxsize)
    return await workspace.read_bytes(rel)


def _apply_entry(
    rel: str,
    data: bytes | OpenFile,
    kind: str,
    write: Callable[[bytes | OpenFile], None],
    target: ConfinedFS,
    before: ConfinedFS | None,
    report: ApplyReport,
    dest: Path,
) -> None:
    """Make `rel` in `target` the `kind` ("file" or "symlink") holding `data` (a link: its target)
    by `write(data)`, unless it changed there since the snapshot `before` (then merged or left);
    what was done goes into `report`."""
    if (checked := _checked(rel, data, target, before, report, dest, kind)) is None:
        return
    verdict, data = checked
    if verdict == "done":
        report.applied.append(rel)
        return
    try:
        with _signals_held():
            if not _make_room(target, rel):
                report.left[rel] = f"a directory in {dest} that still holds files the diff does not remove"
                return
            write(data)
            report.applied.append(rel)
            if verdict == "merged":
                report.merged.append(rel)
    except _HalfWritten as e:
        report.left[rel] = str(e)
    except (OSError, SandboxError) as e:
        report.left[rel] = _not_written(e, dest)


def _checked(
    rel: str, data, target: ConfinedFS, before: ConfinedFS | None, report: ApplyReport, dest: Path, kind: str = "file"
):
    """`_against_snapshot`, or None with `rel` recorded as left: it cannot be read in the destination
    (another user's file), or changed there in a way that does not merge with the agent's change."""
    try:
        verdict, data = _against_snapshot(rel, data, target, before, kind)
    except (OSError, SandboxError) as e:
        report.left[rel] = _not_written(e, dest)
        return None
    if verdict == "clash":
        report.left[rel] = f"changed in {dest} since the agent started, and the two changes do not merge"
        return None
    return verdict, data


def _against_snapshot(
    rel: str, data: bytes | OpenFile | None, target: ConfinedFS, before: ConfinedFS | None, kind: str = "file"
):
    """How `rel` in the destination stands against the snapshot `before`, given the workspace's
    version `data` (None: removed), a `kind` ("file" or "symlink", whose data is its target):
    ("apply", data) when unchanged there; ("merged", the merge) when both changed a text file and
    the changes merge; ("done", data) when the destination already holds the workspace's version;
    ("clash", None) otherwise (a link included: anything else there than the snapshot had)."""
    if before is None or (now := _state(target, rel)) == (was := _state(before, rel)):
        return "apply", data
    if (now[0], now[1]) == (kind, data) or (now[0] == "missing" and data is None):
        return "done", data  # the same change on both sides
    mergeable = kind == now[0] == was[0] == "file" and isinstance(data, bytes)
    if mergeable and (merged := _merged(now[1], was[1], data)) is not None:
        return "merged", merged
    return "clash", None


def _state(fs: ConfinedFS, rel: str) -> tuple[str, bytes | None, int]:
    """`fs.entry(rel)`, with a directory counted as missing, as diffs count it (its files are
    paths of their own): a directory the apply itself emptied and removed has not changed."""
    kind, data, mode = fs.entry(rel)
    if kind == "dir":  # or a socket, fifo or device
        with suppress(OSError, SandboxError):
            if fs.stat(rel).kind == "dir":
                return "missing", None, 0
    return kind, data, mode


def _not_written(e: BaseException, dest: Path) -> str:
    if isinstance(e, PathEscapeError):  # its text speaks of "the workspace", which here is `dest`
        return f"not written: it leads outside {dest} through a symlink ({e})"
    if isinstance(e, OSError) and str(e.filename).startswith("/proc/self/fd/"):
        return f"not written: {e.strerror}"  # the descriptor's name would say nothing
    return f"not written: {e}"


def _ancestors(rel: str) -> Iterator[str]:
    while rel := posixpath.dirname(rel):
        yield rel


def _header_paths(diff_text: str, prefix: str) -> set[str]:
    """The paths whose section header in `diff_text` has a line starting with `prefix` (`old mode `,
    `deleted file mode `); a hunk's lines start with a space, + or -, so no content line reads like one."""
    out, rel = set(), None
    for line in diff_text.split("\n"):
        if line.startswith("diff --git "):
            rel = header_path(line[len("diff --git ") :])
        elif line.startswith(prefix) and rel is not None:
            out.add(rel)
    return out


def _make_room(target: ConfinedFS, rel: str) -> bool:
    """Remove a symlink, or an empty directory, at `rel` for a file to take its place; False when
    a directory that still holds something is in the way."""
    kind = target.entry(rel)[0]
    if kind in ("file", "missing"):
        return True
    try:
        target.remove(rel)  # a symlink itself, never its target; a directory only when empty
    except NotAFileError:
        return False
    return True


class _HalfWritten(Exception):
    """A file left with part of its new content: writing failed, and so did putting the old back."""


_HELD_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextmanager
def _signals_held() -> Iterator[None]:
    """Hold Ctrl-C, SIGTERM and SIGHUP until the block ends: they land between two files, never in
    the middle of one (the report then says what was written). Python runs handlers in the main
    thread whichever thread the signal reaches, so the handlers are swapped, not the signal mask;
    elsewhere nothing is held (a failed write still puts the old content back)."""
    caught: list[int] = []
    try:
        with signal_handler(lambda n, _: caught.append(n), _HELD_SIGNALS):
            yield
    finally:
        for sig in caught:  # now, to the handlers they were meant for
            signal.raise_signal(sig)


def _write_file(target: ConfinedFS, rel: str, data: bytes | OpenFile, executable: bool, mode_changed: bool) -> None:
    """Make the file `rel` under `target` hold `data` (bytes, or an opened file's content): written in
    place when it exists (executable bits set or cleared only when `mode_changed`), else created (with
    missing parent directories).
    Resolved as every ConfinedFS operation is, so it never writes outside `target`."""
    with target.resolve(rel, create_parents=True) as (dfd, name):
        if name is None:
            raise NotAFileError(f"{rel!r} is a directory")
        try:
            pfd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
        except FileNotFoundError:
            _create(dfd, name, data, 0o777 if executable else 0o666)
            return
        try:
            st = os.fstat(pfd)
            if stat_mod.S_ISLNK(st.st_mode):  # swapped in after `_make_room`
                raise PathEscapeError(f"{rel!r} changed while resolving")
            if not stat_mod.S_ISREG(st.st_mode):
                raise NotAFileError(f"{rel!r} is not a regular file")
            mode = stat_mod.S_IMODE(st.st_mode)
            if mode_changed:  # as git sets them: x where r, or none
                mode = (mode | (mode & 0o444) >> 2 | 0o100) if executable else mode & ~0o111
            _overwrite(pfd, data, mode, dfd, name)
        finally:
            os.close(pfd)


def _write_link(target: ConfinedFS, rel: str, to: bytes) -> None:
    """Make `rel` under `target` a symlink to `to`: made beside it under a temporary name and renamed
    over the file or link there (a rename replaces a link, never follows one; `_make_room` has removed
    an empty directory), so `rel` is the old entry or the new link at every moment. Resolved as
    every ConfinedFS operation is (its directory may be reached through a link inside), so it never
    writes outside `target`."""
    with target.resolve(rel, follow_final=False, create_parents=True) as (dfd, name):
        if name is None:
            raise NotAFileError(f"{rel!r} is a directory")
        tmp = f".{name[:200]}.vivace-{secrets.token_hex(6)}.tmp"
        os.symlink(os.fsdecode(to), tmp, dir_fd=dfd)
        try:
            os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        except BaseException:
            with suppress(OSError):
                os.unlink(tmp, dir_fd=dfd)
            raise


def _create(dfd: int, name: str, data: bytes | OpenFile, mode: int) -> None:
    """A new file `name` holding `data` (O_EXCL: never through a symlink); removed again if the write fails."""
    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=dfd)
    try:
        try:
            _write_all(fd, data)
        finally:
            os.close(fd)
    except BaseException:
        with suppress(OSError):
            os.unlink(name, dir_fd=dfd)
        raise


def _overwrite(pfd: int, data: bytes | OpenFile, mode: int, dfd: int, name: str) -> None:
    """Make the regular file `pfd` (an O_PATH descriptor; `name` in directory `dfd`) hold `data` and have
    permission bits `mode`.

    In place, not by renaming a new file over it: a rename gives the path a new inode, so another
    hard link keeps the old content, and the new file has the writer's owner, the directory's
    default ACL and SELinux label and none of the old one's extended attributes; in the user's own
    repository those are theirs to keep. The price is atomicity: a reader during the write may see
    old and new bytes mixed, and so may everyone after a crash (power loss, SIGKILL) in the middle.
    So the old content is copied aside first (`_kept_aside`: beside the file, on disk, where a crash
    leaves it for the user), put back if a write fails (disk full, quota, I/O error), and the caller
    holds Ctrl-C meanwhile. (A copy of the *new* content written first would not help: it is whole in
    memory, or a file in the workspace, already; what a failed in-place write destroys is the old one.)"""
    proc = f"/proc/self/fd/{pfd}"  # this very inode: no path is walked again
    was = stat_mod.S_IMODE(os.fstat(pfd).st_mode)
    try:
        fd = os.open(proc, os.O_RDWR | os.O_CLOEXEC)
        during = mode
    except PermissionError:
        # Read-only to us: written all the same, as `git apply` writes it, and its mode given back after.
        fd, during = None, mode | 0o600
    after = was  # the mode to leave it with: `mode` once written
    try:
        if during != was:
            try:
                os.chmod(proc, during)
            except PermissionError:  # nothing written yet
                raise PermissionError(errno.EPERM, "its mode is not yours to change (another user's file)") from None
        if fd is None:
            fd = os.open(proc, os.O_RDWR | os.O_CLOEXEC)
        with _kept_aside(fd, dfd, name) as old:
            try:
                os.ftruncate(fd, _write_all(fd, data))
            except BaseException as e:
                _put_back(fd, old, e)
                raise
        after = mode
    finally:
        with suppress(OSError):  # a write by a non-root user also clears set-id bits
            if stat_mod.S_IMODE(os.fstat(pfd).st_mode) != after:
                os.chmod(proc, after)
        if fd is not None:
            os.close(fd)


@contextmanager
def _kept_aside(fd: int, dfd: int, name: str) -> Iterator[IO[bytes]]:
    """The old content of `fd`, copied before it is written over. Beside it as `.NAME.vivace-old-PID`,
    flushed to disk, and removed once the block ends, unless it ends with the file half-written
    (`_HalfWritten` then names it): a SIGKILL or power loss mid-write leaves it there, where the
    160 MB file a killed `--apply` cut to 1 MiB had its old content only in a temporary file gone with
    the process. Where the directory cannot hold it (not writable, full), a temporary file as before."""
    aside = f".{name[:200]}.vivace-old-{os.getpid()}"
    old = _copied_beside(fd, dfd, aside)
    if old is None:
        aside, old = "", tempfile.SpooledTemporaryFile(max_size=MAX_READ_BYTES)
        os.lseek(fd, 0, os.SEEK_SET)
        while chunk := os.read(fd, 1 << 20):
            old.write(chunk)
    keep = False
    try:
        yield old
    except _HalfWritten as e:
        if not aside:
            raise
        keep = True
        raise _HalfWritten(f"{e}; its old content is in {aside} beside it") from e.__cause__
    finally:
        old.close()
        if aside and not keep:
            with suppress(OSError):
                os.unlink(aside, dir_fd=dfd)


def _copied_beside(fd: int, dfd: int, aside: str) -> IO[bytes] | None:
    """`fd`'s content in a new file `aside` of directory `dfd`, on disk (holes kept); None where it cannot be."""
    try:
        afd = os.open(aside, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dfd)
    except OSError:
        return None
    copy = os.fdopen(afd, "w+b")
    try:
        copy_sparse(fd, afd, os.fstat(fd).st_size)
        os.fsync(afd)
    except OSError:
        copy.close()
        os.unlink(aside, dir_fd=dfd)
        return None
    return copy


def _put_back(fd: int, old, error: BaseException) -> None:
    """Write the copy `old` back over `fd`; _HalfWritten (from `error`) when that fails too."""
    old.seek(0)
    offset = 0
    try:
        while chunk := old.read(1 << 20):
            _write_at(fd, chunk, offset)
            offset += len(chunk)
        os.ftruncate(fd, offset)
    except OSError as again:
        why = f"writing it failed ({error}), and so did putting its old content back ({again})"
        raise _HalfWritten(f"LEFT HALF-WRITTEN: {why}") from error


def _write_all(fd: int, data: bytes | OpenFile) -> int:
    """Write `data` (bytes, or the whole of an opened file, a MiB at a time) from the start of `fd`;
    returns how many bytes that is."""
    if isinstance(data, bytes):
        _write_at(fd, data, 0)
        return len(data)
    # Only the blocks that hold data: a file made sparse in the workspace (`truncate -s 100G`, no disk
    # used there) was written into the repository as 100 GB of zeros. Emptied first, so that the holes
    # are holes and not the old content (which the caller has copied aside).
    size = os.fstat(data.fd).st_size
    os.ftruncate(fd, 0)
    copy_sparse(data.fd, fd, size)
    return size


def _write_at(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        view, offset = view[n:], offset + n


def _merged(ours: bytes, base: bytes, theirs: bytes) -> bytes | None:
    """The three-way merge of two text versions of one base (git merge-file), or None when they
    conflict, a version is binary or git cannot run."""
    with tempfile.TemporaryDirectory() as tmp:
        files = []
        for name, data in (("ours", ours), ("base", base), ("theirs", theirs)):
            (Path(tmp) / name).write_bytes(data)
            files.append(str(Path(tmp) / name))
        try:
            done = subprocess.run(["git", "merge-file", "-p", "--quiet", *files], capture_output=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            return None
    return done.stdout if done.returncode == 0 else None  # >0: conflicts; <0: binary (a large file's digest is NUL-led)


def _prune_empty_dirs(target: ConfinedFS, dirs: set[str], keep: set[str] = frozenset()) -> None:
    """Remove each of `dirs` that is now empty, and its parents that this empties, never the
    root nor one in `keep`: a package directory left empty would still import (as a namespace package)."""
    for d in sorted(dirs, key=lambda d: d.count("/"), reverse=True):  # deepest first
        while d and d not in keep:
            try:
                if target.stat(d).kind != "dir":
                    break
                target.remove(d)  # not recursive: fails on a directory that still holds something
            except (NotAFileError, WorkspaceFileNotFound, PathEscapeError):
                break
            d = posixpath.dirname(d)
