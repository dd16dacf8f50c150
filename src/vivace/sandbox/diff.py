"""Unified, git-style diff of a workspace tree against its base snapshot.

Backends tell which paths may have changed (overlayfs: whatever is in the upper layer;
a plain copy: everything) and this module compares those paths between the two trees
through ConfinedFS, so a command racing the diff cannot lead it outside the workspace.
The output is `git diff --binary`'s and applies with `git apply`: UTF-8 text is diffed by lines, and
any other change is a `GIT binary patch` (with a "Binary files ... differ" note after it for a
reader). Git shows text that is not UTF-8 (latin-1 source, say) as lines too; here it is a binary
patch, so that the diff stays a valid Unicode str (saved in JSON, sent to a model, printed) and
still restores every byte. A tree is walked a directory
at a time from descriptors, at any depth; one it cannot read fails the diff. When the base is a
git checkout, new files its ignore rules ignore (build output, node_modules/) are left out,
as `git status` would leave them out, and a comment line at the top says how many.

Writing such a diff back onto the directory the snapshot came from is sandbox/apply.py's.

A base copied from a subdirectory of a checkout has no .git of its own; when asked (`outer`,
what `vivace agent --repo pkg/` sets), that checkout's rules decide, read from the checkout.

Not covered: ignore rules of a base without .git otherwise (a plain directory, a `git archive`
snapshot), .gitignore edits made in the workspace (the base's rules decide), and the content of a
binary file over ConfinedFS's read limit (64 MiB): only noted, so `git apply` refuses such a diff.
"""

from __future__ import annotations

import base64
import difflib
import errno
import fnmatch
import hashlib
import logging
import os
import posixpath
import stat
import subprocess
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path

from vivace.sandbox.base import SandboxError, TooLarge
from vivace.sandbox.paths import ConfinedFS

log = logging.getLogger(__name__)

_NO_NEWLINE = "\\ No newline at end of file\n"
# C escapes git uses in quoted path names; other control and non-ASCII bytes become \ooo.
_ESCAPES = {7: "a", 8: "b", 9: "t", 10: "n", 11: "v", 12: "f", 13: "r", 0x22: '"', 0x5C: "\\"}
_UNESCAPES = {v: k for k, v in _ESCAPES.items()}


def ignored(rel: str, patterns: Iterable[str]) -> bool:
    return any(fnmatch.fnmatch(part, pat) for part in rel.split("/") for pat in patterns)


def walk_tree(root: Path | str, rel: str = "") -> Iterator[tuple[str, int, list[str]]]:
    """os.walk(root/rel) without recursion and without following a link: for each directory, top
    down and in os.walk's order, (its path relative to `root`, '' for the root; a descriptor of it,
    open until the walk goes on; the names in it that are not directories, links to directories
    last as os.walk lists them). The root itself is trusted (it may be a /proc/self/fd link to a
    detached mount); below it each directory is opened from its parent's descriptor with O_NOFOLLOW
    and must be the one its parent listed, so a link swapped in by a command racing the walk is not
    followed, and no path is ever spelled out: a command can make a tree thousands of levels deep,
    past PATH_MAX and Python's recursion limit (hence an explicit stack). One descriptor is held at
    a time; the walk climbs back through `..`, checking each directory is the one it left. A
    directory removed or replaced meanwhile is skipped (logged when replaced); one that cannot be
    read raises SandboxError, as a diff that left its files out would pass for "unchanged"."""
    fd = _open_below(root, _parts(rel), _READ_DIR)
    if fd is None:
        return
    try:
        sub, ident = rel, _ident(fd)
        # The directories entered, top down: (path, (st_dev, st_ino), subdirectories left, last first).
        levels: list[tuple[str, tuple[int, int], list[tuple[str, tuple[int, int]]]]] = []
        while True:
            files, links, subdirs = _list_dir(fd, root, sub)
            yield sub, fd, files + links
            levels.append((sub, ident, subdirs[::-1]))  # popped in listing order, as os.walk visits them
            while True:  # on to the next subdirectory of the deepest directory with one left
                rel_dir, _, pending = levels[-1]
                if not pending:
                    levels.pop()
                    if not levels:
                        return
                    parent = _climb(fd, levels[-1][1], root, rel_dir)
                    os.close(fd)
                    fd = parent
                    continue
                name, ident = pending.pop()
                sub = os.path.join(rel_dir, name)
                child = _enter(fd, name, ident, root, sub)
                if child is not None:
                    os.close(fd)
                    fd = child
                    break
    finally:
        os.close(fd)


_PATH_DIR = os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC
_READ_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
# What opening a directory fails with once it is removed, or replaced by a file or a link.
_GONE = {errno.ENOENT, errno.ENOTDIR, errno.ELOOP}


def _parts(rel: str) -> list[str]:
    return [p for p in rel.split("/") if p not in ("", ".")]


def _open_below(root: Path | str, parts: list[str], flags: int) -> int | None:
    """root/parts[0]/.../parts[-1] opened with `flags`, each level from the one above (no path
    length limit), none of `parts` followed (the root itself is); None when one of them is missing,
    a link or not a directory. SandboxError when one cannot be opened for another reason."""
    fd = _open_at(None, os.fspath(root), flags if not parts else _PATH_DIR, root, "")
    for i, part in enumerate(parts):
        if fd is None:
            return None
        try:
            last = i == len(parts) - 1
            fd_below = _open_at(
                fd, part, (flags if last else _PATH_DIR) | os.O_NOFOLLOW, root, "/".join(parts[: i + 1])
            )
        finally:
            os.close(fd)
        fd = fd_below
    return fd


def _open_at(dir_fd: int | None, name: str, flags: int, root: Path | str, rel: str) -> int | None:
    try:
        return os.open(name, flags, dir_fd=dir_fd)
    except OSError as e:
        if e.errno in _GONE:
            return None
        raise _unreadable(root, rel, e) from e


def _enter(fd: int, name: str, ident: tuple[int, int], root: Path | str, rel: str) -> int | None:
    """The subdirectory `name` (at `rel`) of the directory `fd`, opened for listing if it is still the
    one listed (`ident`: its (st_dev, st_ino) then); None when it was removed or replaced meanwhile."""
    try:
        child = os.open(name, _READ_DIR | os.O_NOFOLLOW, dir_fd=fd)
    except FileNotFoundError:  # removed meanwhile: nothing left to compare
        return None
    except OSError as e:
        if e.errno not in _GONE:
            raise _unreadable(root, rel, e) from e
        child = None  # replaced by a file or a link
    if child is not None and _ident(child) == ident:
        return child
    if child is not None:
        os.close(child)
    log.warning("%s changed while the diff walked it; its files are not compared", rel)
    return None


def _climb(fd: int, ident: tuple[int, int], root: Path | str, rel: str) -> int:
    """The parent of the directory `fd` (at `rel`), which must be the one the walk came down from."""
    try:
        parent = os.open("..", _READ_DIR, dir_fd=fd)
    except OSError as e:
        raise _unreadable(root, posixpath.dirname(rel), e) from e
    if _ident(parent) != ident:
        os.close(parent)
        raise SandboxError(f"{_shown(rel)} in {root} was moved while the diff walked it")
    return parent


def _ident(fd: int) -> tuple[int, int]:
    st = os.fstat(fd)
    return st.st_dev, st.st_ino


def _list_dir(fd: int, root: Path | str, rel: str) -> tuple[list[str], list[str], list[tuple[str, tuple[int, int]]]]:
    """The entries of the directory `fd` (at `rel` in `root`) as (non-directories, links to
    directories, real directories with their (st_dev, st_ino)). An entry removed meanwhile counts
    as a file (compared, it is found missing); one that cannot be looked at raises SandboxError."""
    files: list[str] = []
    links: list[str] = []
    subdirs: list[tuple[str, tuple[int, int]]] = []
    try:
        with os.scandir(fd) as entries:
            for entry in entries:
                try:
                    if entry.is_symlink():
                        (links if _leads_to_dir(entry) else files).append(entry.name)
                    elif entry.is_dir(follow_symlinks=False):
                        st = entry.stat(follow_symlinks=False)
                        subdirs.append((entry.name, (st.st_dev, st.st_ino)))
                    else:
                        files.append(entry.name)
                except FileNotFoundError:
                    files.append(entry.name)
    except OSError as e:
        raise _unreadable(root, rel, e) from e
    return files, links, subdirs


def _leads_to_dir(link: os.DirEntry) -> bool:
    try:
        return link.is_dir()  # followed, as os.walk's classification does
    except OSError:  # a loop, or a target that cannot be looked at
        return False


def _unreadable(root: Path | str, rel: str, e: OSError) -> SandboxError:
    return SandboxError(f"cannot read {_shown(rel)} in {root} ({e.strerror}): the diff cannot leave its files out")


def _shown(rel: str) -> str:
    """`rel` quoted for a message, its middle left out when it is long (a tree can be 2,000 levels deep)."""
    if not rel:
        return "the top directory"
    return quote_path(rel if len(rel) <= 200 else f"{rel[:100]}...{rel[-100:]}")


def walk_files(root: Path, rel: str = "") -> list[str]:
    """Every non-directory path under root/rel (relative to root), without following links: not
    those in rel's own components either. A `rel` beyond a link or a file of `root` has nothing
    under it (the snapshot's `hostroot -> /` holds no `hostroot/usr`); a `rel` that is itself a
    link or a file is that one path."""
    kind = _kind_at(root, rel)
    if kind is None:
        return []
    if kind != "dir":
        return [rel]
    return [os.path.join(rel_dir, name) for rel_dir, _, names in walk_tree(root, rel) for name in names]


def _kind_at(root: Path, rel: str) -> str | None:
    """'dir', 'other' (a file, a link, ...) or None (missing, or a link or file on the way) for root/rel,
    each of rel's components looked at without following it, from the directory above (at any depth)."""
    if not rel:  # the root itself: followed, unless it is a link (as walk_files always had it)
        return "dir" if os.path.isdir(root) and not os.path.islink(root) else None
    parts = _parts(rel)
    if not parts:
        return "dir"
    fd = _open_below(root, parts[:-1], _PATH_DIR)
    if fd is None:
        return None
    try:
        st = os.stat(parts[-1], dir_fd=fd, follow_symlinks=False)
    except OSError as e:
        if e.errno in _GONE:
            return None
        raise _unreadable(root, rel, e) from e
    finally:
        os.close(fd)
    return "dir" if stat.S_ISDIR(st.st_mode) else "other"


def _is_binary(data: bytes) -> bool:
    """Binary as git tells it (a NUL byte in the first 8000 bytes), or not UTF-8 (see the module's
    docstring)."""
    if b"\0" in data[:8000]:
        return True
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False


def _lines(data: bytes) -> list[str]:
    # Only "\n" ends a line for git; str.splitlines also breaks at \r, \f, \v, \x1c-\x1e, \x85
    # and U+2028/2029, which shifts hunk line numbers and makes the diff fail to apply.
    lines = [line + "\n" for line in data.decode("utf-8").split("\n")]
    last = lines.pop()  # what follows the final "\n": empty when the file ends with one
    if last != "\n":
        lines.append(last + _NO_NEWLINE)
    return lines


def quote_path(name: str) -> str:
    """`name` as git writes it in a diff: C-quoted when it holds a quote, a backslash, a control
    character or bytes that are not UTF-8 (os.fsencode's surrogates), else unchanged."""
    raw = os.fsencode(name)
    try:
        raw.decode("utf-8")
        plain = not any(b < 0x20 or b in (0x22, 0x5C, 0x7F) for b in raw)
    except UnicodeDecodeError:
        plain = False
    if plain:
        return name
    out = []
    for b in raw:
        if b in _ESCAPES:
            out.append("\\" + _ESCAPES[b])
        elif b < 0x20 or b >= 0x7F:
            out.append(f"\\{b:03o}")
        else:
            out.append(chr(b))
    return '"' + "".join(out) + '"'


def _unquote(text: str) -> tuple[bytes, str]:
    """The bytes of the C-quoted name `text` opens with, and what follows its closing quote."""
    out, i = bytearray(), 1
    while i < len(text):
        c = text[i]
        if c == '"':
            return bytes(out), text[i + 1 :]
        if c != "\\":
            out += c.encode()
            i += 1
        elif text[i + 1 : i + 2] in _UNESCAPES:
            out.append(_UNESCAPES[text[i + 1]])
            i += 2
        else:
            out.append(int(text[i + 1 : i + 4], 8) & 0xFF)
            i += 4
    raise ValueError(f"unterminated quoted name: {text!r}")


def file_diff(rel: str, base: ConfinedFS, work: ConfinedFS, memo: dict | None = None) -> str:
    """The diff of one path between `base` and `work` trees; '' when unchanged. A file that became a
    symlink (or back) is a deletion and a creation, as git writes it: `git apply` refuses a mode
    change between the two kinds. A path beyond a symlinked directory is absent, as git has it: a
    directory replaced by a link loses its files, and does not take on those of the link's target.
    `memo`: the directories found beyond a link or not, kept across the calls of one diff."""
    memo = {} if memo is None else memo
    a_kind, a, a_mode = ("missing", None, 0) if _beyond_link(base, rel, memo, "a") else base.entry(rel)
    b_kind, b, b_mode = ("missing", None, 0) if _beyond_link(work, rel, memo, "b") else work.entry(rel)
    if a_kind == "dir":
        a_kind, a = "missing", None
    if b_kind == "dir":
        b_kind, b = "missing", None
    if a_kind == b_kind and a == b and a_mode == b_mode:
        return ""
    if "missing" not in (a_kind, b_kind) and a_kind != b_kind:
        return _section(rel, a, a_mode, None, 0) + _section(rel, None, 0, b, b_mode)
    return _section(rel, a, a_mode, b, b_mode)


def _beyond_link(fs: ConfinedFS, rel: str, memo: dict, side: str) -> bool:
    """Whether a directory on the way to `rel` is a symlink in `fs` (`side` keys `memo` by tree).
    Each unknown directory on the way is looked at in one walk down from the root, never following a
    link: a tree can be thousands of levels deep, too deep to recurse or to resolve each level anew."""
    parent = posixpath.dirname(rel)
    if not parent:
        return False
    if (side, parent) not in memo:
        prefix = ""
        for part, beyond in zip(parent.split("/"), _links_on_way(fs.root, parent.split("/")), strict=True):
            prefix = f"{prefix}/{part}" if prefix else part
            memo[side, prefix] = beyond
    return memo[side, parent]


def _links_on_way(root: Path, parts: list[str]) -> list[bool]:
    """For each directory root/parts[0]/.../parts[i]: whether it or one above it is a symlink. One
    that is missing or a file has none below it (nothing is there to be one)."""
    out: list[bool] = []
    beyond = False
    fd = os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)  # the root itself is trusted
    try:
        for part in parts:
            if not beyond and fd >= 0:
                try:
                    st: os.stat_result | None = os.stat(part, dir_fd=fd, follow_symlinks=False)
                except OSError:
                    st = None
                if st is not None and stat.S_ISLNK(st.st_mode):
                    beyond = True
                else:
                    try:
                        below = os.open(part, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
                    except OSError:  # missing, a file, or swapped for a link meanwhile: no link below
                        below = -1
                    os.close(fd)
                    fd = below
            out.append(beyond)
    finally:
        if fd >= 0:
            os.close(fd)
    return out


def _section(rel: str, a: bytes | None, a_mode: int, b: bytes | None, b_mode: int) -> str:
    """One `diff --git` section for `rel` from content `a` to `b` (None: absent)."""
    header = [f"diff --git {quote_path('a/' + rel)} {quote_path('b/' + rel)}\n"]
    if a is None:
        header.append(f"new file mode {b_mode:o}\n")
    elif b is None:
        header.append(f"deleted file mode {a_mode:o}\n")
    elif a_mode != b_mode:
        header += [f"old mode {a_mode:o}\n", f"new mode {b_mode:o}\n"]
    if a == b:
        return "".join(header)
    old_name = quote_path(f"a/{rel}") if a is not None else "/dev/null"
    new_name = quote_path(f"b/{rel}") if b is not None else "/dev/null"
    if not (_is_binary(a or b"") or _is_binary(b or b"")):
        body = difflib.unified_diff(_lines(a or b""), _lines(b or b""), old_name, new_name, n=3)
        return "".join(header) + "".join(line if line.endswith("\n") else line + "\n" for line in body)
    noted = f"Binary files {old_name} and {new_name} differ\n"
    if (a or b"").startswith(_STAND_IN) or (b or b"").startswith(_STAND_IN):
        return "".join(header) + noted  # over the read limit: there is no content to patch with
    same_mode = f" {a_mode:o}" if a_mode == b_mode else ""
    header.append(f"index {_blob_id(a)}..{_blob_id(b)}{same_mode}\n")  # git apply checks the old content by it
    # The note after the patch is for a reader; git apply passes over text between sections.
    return "".join(header) + _binary_patch(a or b"", b or b"") + noted


# What ConfinedFS.entry holds for a file over its read limit (paths._bounded_content).
_STAND_IN = b"\0large file sha256:"


def _blob_id(data: bytes | None) -> str:
    """The git blob id (sha1) of `data`; all zeros for an absent file, as git writes it."""
    if data is None:
        return "0" * 40
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _binary_patch(old: bytes, new: bytes) -> str:
    """git's `GIT binary patch` from `old` to `new` (diff.c, emit_binary_diff): `new` whole, then `old`
    whole for `git apply -R`, each deflated and in base85 lines of up to 52 bytes."""
    return "GIT binary patch\n" + _literal(new) + _literal(old)


def _literal(data: bytes) -> str:
    packed = zlib.compress(data, 1)  # git's level unless core.compression says otherwise
    # 52 bytes are 13 base85 groups of 4, so each line's text is a slice of the whole encoding.
    encoded = base64.b85encode(packed, pad=True).decode("ascii")
    lines = [f"literal {len(data)}\n"]
    for start in range(0, len(packed), 52):
        n = min(52, len(packed) - start)
        size = chr(ord("A") + n - 1) if n <= 26 else chr(ord("a") + n - 27)  # the line's byte count
        lines.append(size + encoded[start // 4 * 5 : (start + n + 3) // 4 * 5] + "\n")
    return "".join(lines) + "\n"


def tree_diff(
    base: Path,
    work: Path,
    candidates: Iterable[str],
    ignore: Iterable[str] = (),
    outer: tuple[Path, str] | None = None,
    max_chars: int | None = None,
) -> str:
    """The diff of `work` against `base` over the `candidates` paths (see file_diff); TooLarge as soon
    as it is over `max_chars`, before the rest is read."""
    ignore = list(ignore)
    paths = sorted({c for c in candidates if c and not ignored(c, ignore)})
    # New, changed or removed alike (git status's view: a tracked file is never ignored): `npm install`
    # changing node_modules/ had its changes to existing files applied and its new files left out.
    left_out = git_ignored(base, paths, outer)
    base_fs, work_fs, memo = ConfinedFS(base), ConfinedFS(work), {}
    new = {p for p in left_out if not _lexists(base, p)}
    sections, size = [_left_out_note(left_out, new)], 0
    for rel in paths:
        if rel not in left_out:
            sections.append(file_diff(rel, base_fs, work_fs, memo))
            size += len(sections[-1])
            if max_chars is not None and size > max_chars:
                raise TooLarge(
                    f"the workspace's diff is over the limit of {max_chars:,} characters (reached at {_shown(rel)}, "
                    f"one of {len(paths):,} changed paths): read the files needed instead, or list what changed "
                    "with a command in the workspace (`git status`)"
                )
    return "".join(sections)


def _lexists(root: Path, rel: str) -> bool:
    """os.path.lexists(root/rel), also for a path too long to name (looked up a level at a time then)."""
    try:
        os.lstat(os.path.join(root, rel))
    except OSError as e:
        return e.errno == errno.ENAMETOOLONG and _kind_at(root, rel) is not None
    return True


def git_ignored(base: Path, paths: list[str], outer: tuple[Path, str] | None = None) -> set[str]:
    """Which of `paths` (untracked in `base`: a tracked path is never ignored) the ignore rules of
    the git checkout `base` ignore: its .gitignore files, .git/info/exclude and the user's global excludes, as git
    reads them; a path inside a submodule by the submodule's own rules, as `git status` there
    would. A `base` without .git is judged by `outer` when given: (the top of the checkout it was
    copied from, its prefix there, "pkg/"). Empty when neither applies or git fails (nothing is
    left out)."""
    own = os.path.lexists(os.path.join(base, ".git"))
    if not paths or not (own or outer):
        return set()
    # git refuses the whole batch for a path beyond a symlink or inside a submodule: each path goes
    # to the innermost checkout holding it, and one beyond a symlink to none.
    memo: dict[str, str | None] = {}
    by_repo: dict[str, list[str]] = {}
    for p in paths:
        repo = _checkout_of(base, posixpath.dirname(p), memo)
        if repo is not None:
            by_repo.setdefault(repo, []).append(p[len(repo) + 1 :] if repo else p)
    out = set()
    for repo, in_repo in by_repo.items():
        if not repo and not own:  # the copy's top: the outer checkout's rules, at the copy's place in it
            top, at = outer
            out |= {p[len(at) :] for p in _check_ignore(top, [at + p for p in in_repo]) if p.startswith(at)}
            continue
        prefix = f"{repo}/" if repo else ""
        out |= {prefix + p for p in _check_ignore(base / repo if repo else base, in_repo)}
    return out


def _check_ignore(repo: Path, paths: list[str]) -> set[str]:
    """`git check-ignore` of `paths` (relative) in the checkout `repo`; empty when git fails."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}  # e.g. GIT_INDEX_FILE from a hook
    argv = ["git", "-c", "safe.directory=*", "-c", "core.fsmonitor=false", f"--git-dir={repo}/.git"]
    argv += [f"--work-tree={repo}", "check-ignore", "-z", "--stdin"]  # tracked files are never "ignored"
    try:
        proc = subprocess.run(
            argv, input=b"\0".join(map(os.fsencode, paths)), capture_output=True, env=env, timeout=120
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        log.warning("git check-ignore in %s failed (%s); ignored files stay in the diff", repo, e)
        return set()
    if proc.returncode not in (0, 1):  # 1: nothing ignored
        log.warning("git check-ignore in %s failed: %s", repo, proc.stderr.decode(errors="replace").strip())
        return set()
    return {os.fsdecode(p) for p in proc.stdout.split(b"\0") if p}


def _checkout_of(base: Path, rel_dir: str, memo: dict[str, str | None]) -> str | None:
    """The innermost directory on `rel_dir` (relative to `base`; '' for `base` itself) that holds a
    `.git` in `base` (a submodule), or '' for none; None when a symlink is on the way (git refuses
    such a path). A directory missing from `base` (new in the workspace) is plain. Top down from the
    nearest directory already known, without recursion (a tree can be deeper than Python's limit)."""
    todo = []
    known = rel_dir
    while known and known not in memo:
        todo.append(known)
        known = posixpath.dirname(known)
    outer = memo[known] if known else ""
    for d in reversed(todo):
        here = os.path.join(base, d)
        if outer is not None and not os.path.islink(here):
            outer = d if os.path.lexists(os.path.join(here, ".git")) else outer
        else:
            outer = None
        memo[d] = outer
    return outer


def _left_out_note(left_out: set[str], new: set[str]) -> str:
    """A comment line (`git apply` skips text before the first header) naming what was left out, of
    which `new` are new files."""
    if not left_out:
        return ""
    groups = sorted({quote_path(p.split("/", 1)[0] + ("/" if "/" in p else "")) for p in left_out})
    shown = ", ".join(groups[:5]) + (", ..." if len(groups) > 5 else "")
    kinds = (("new", len(new)), ("changed or removed", len(left_out) - len(new)))
    counts = " and ".join(f"{n} {kind} file{'s' * (n != 1)}" for kind, n in kinds if n)
    return f"# {counts} left out of this diff: the repository's git ignore rules ignore them ({shown})\n"


def changed_paths(diff_text: str) -> list[str]:
    """The paths a diff made by `tree_diff` touches, in order (its headers are `a/P b/P`,
    each name C-quoted by `quote_path` where needed)."""
    paths = []
    for line in diff_text.split("\n"):  # content lines may hold \f, \r, U+2028: they are no line ends
        if line.startswith("diff --git "):
            rel = header_path(line[len("diff --git ") :])
            if rel is not None and (not paths or paths[-1] != rel):  # a change of kind: two sections
                paths.append(rel)
    return paths


def header_path(pair: str) -> str | None:
    """The path of a `diff --git A B` header (given without "diff --git "), read as `git apply` reads it:
    each side less its first component, whatever that is (a/ and b/; -R's b/ and a/; the mnemonic i/, w/,
    c/, o/). None when the two sides then differ: a rename, whose names are on lines of their own."""
    if pair.startswith('"'):
        try:
            a, rest = _unquote(pair)
            b, tail = _unquote(rest[1:]) if rest.startswith(' "') else (os.fsencode(rest[1:]), "")
        except ValueError:
            return None
        a_path, b_path = strip_component(os.fsdecode(a)), strip_component(os.fsdecode(b))
        return a_path if not tail and a_path is not None and a_path == b_path else None
    name = strip_component(pair) or ""
    # Names may hold spaces: the separator is the space after which the other side, less its first
    # component, repeats what comes before it (git's rule; the first such space).
    for i, c in enumerate(name):
        if c == " " and strip_component(name[i + 1 :]) == name[:i]:
            return name[:i]
    return None


def strip_component(name: str) -> str | None:
    """`name` less its first path component (`git apply -p1`); None when it has no such component."""
    top, slash, rest = name.partition("/")
    return rest if top and slash else None


def line_name(text: str) -> str:
    """The name on a `---`, `+++` or `rename to` line of a diff (given without its keyword): C-quoted,
    or plain up to a tab (git puts one after a name holding a space; `diff -u`, a timestamp)."""
    if text.startswith('"'):
        try:
            return os.fsdecode(_unquote(text)[0])
        except ValueError:
            pass
    return text.split("\t", 1)[0]
