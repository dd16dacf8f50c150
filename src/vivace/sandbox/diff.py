"""Unified, git-style diff of a workspace tree against its base snapshot.

Backends tell which paths may have changed (overlayfs: whatever is in the upper layer;
a plain copy: everything) and this module compares those paths between the two trees
through ConfinedFS, so a command racing the diff cannot lead it outside the workspace.
The output applies with `git apply`; binary files are noted, not dumped. When the base is a
git checkout, new files its ignore rules ignore (build output, node_modules/) are left out,
as `git status` would leave them out, and a comment line at the top says how many.

Writing such a diff back onto the directory the snapshot came from is sandbox/apply.py's.

A base copied from a subdirectory of a checkout has no .git of its own; when asked (`outer`,
what `vivace agent --repo pkg/` sets), that checkout's rules decide, read from the checkout.

Not covered: ignore rules of a base without .git otherwise (a plain directory, a `git archive`
snapshot), and .gitignore edits made in the workspace (the base's rules decide).
"""

from __future__ import annotations

import difflib
import fnmatch
import logging
import os
import posixpath
import stat
import subprocess
from collections.abc import Iterable, Iterator
from pathlib import Path

from vivace.sandbox.paths import ConfinedFS

log = logging.getLogger(__name__)

_NO_NEWLINE = "\\ No newline at end of file\n"
# C escapes git uses in quoted path names; other control and non-ASCII bytes become \ooo.
_ESCAPES = {7: "a", 8: "b", 9: "t", 10: "n", 11: "v", 12: "f", 13: "r", 0x22: '"', 0x5C: "\\"}
_UNESCAPES = {v: k for k, v in _ESCAPES.items()}


def ignored(rel: str, patterns: Iterable[str]) -> bool:
    return any(fnmatch.fnmatch(part, pat) for part in rel.split("/") for pat in patterns)


def walk_tree(root: Path | str, rel: str = "") -> Iterator[tuple[str, str, list[str]]]:
    """os.walk(root/rel) without recursion and without following a link: for each directory, top
    down and in os.walk's order, (its path relative to `root`, '' for the root; its full path; the
    names in it that are not directories, links to directories last as os.walk lists them). The
    root itself is trusted (it may be a /proc/self/fd link to a detached mount); below it each
    directory is opened with O_NOFOLLOW and must be the one its parent listed, so a link swapped in
    by a command racing the walk is not followed. An explicit stack: a command can make a tree
    thousands of levels deep, past Python's recursion limit. A directory that cannot be read is
    skipped, as os.walk skips it (logged unless it was removed meanwhile)."""
    top = os.path.join(root, rel) if rel else os.fspath(root)
    stack: list[tuple[str, str, tuple[int, int] | None]] = [(rel, top, None)]
    while stack:
        rel_dir, path, expected = stack.pop()
        listed = _list_dir(path, expected, follow=not rel_dir)
        if listed is None:
            continue
        files, links, subdirs = listed
        yield rel_dir, path, files + links
        for name, ident in reversed(subdirs):  # popped in listing order, as os.walk visits them
            stack.append((os.path.join(rel_dir, name), os.path.join(path, name), ident))


def _list_dir(path: str, expected: tuple[int, int] | None, follow: bool) -> tuple[list[str], list[str], list] | None:
    """The entries of the directory `path` as (non-directories, links to directories, real
    directories with their (st_dev, st_ino)); None when it cannot be read or is no longer the
    directory `expected` (its identity when its parent was listed). `follow`: the root only."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except OSError as e:
        _unreadable(path, e)
        return None
    files: list[str] = []
    links: list[str] = []
    subdirs: list[tuple[str, tuple[int, int]]] = []
    try:
        st = os.fstat(fd)
        if expected is not None and (st.st_dev, st.st_ino) != expected:
            log.warning("%s changed while the diff walked it; its files are not compared", path)
            return None
        with os.scandir(fd) as entries:
            for entry in entries:
                try:
                    is_dir = entry.is_dir()  # follows a link, as os.walk's classification does
                    real_dir = is_dir and not entry.is_symlink()
                    ident = entry.stat(follow_symlinks=False) if real_dir else None
                except OSError:
                    is_dir = real_dir = False
                if real_dir:
                    subdirs.append((entry.name, (ident.st_dev, ident.st_ino)))
                else:
                    (links if is_dir else files).append(entry.name)
    except OSError as e:
        _unreadable(path, e)
        return None
    finally:
        os.close(fd)
    return files, links, subdirs


def _unreadable(path: str, e: OSError) -> None:
    if not isinstance(e, (FileNotFoundError, NotADirectoryError)):  # removed or replaced meanwhile
        log.warning("cannot read %s (%s); its files are not compared", path, e)


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
    each of rel's components looked at without following it."""
    if not rel:  # the root itself: followed, unless it is a link (as walk_files always had it)
        return "dir" if os.path.isdir(root) and not os.path.islink(root) else None
    path = os.fspath(root)
    parts = [p for p in rel.split("/") if p not in ("", ".")]
    for i, part in enumerate(parts):
        path = os.path.join(path, part)
        try:
            st = os.lstat(path)
        except OSError:
            return None
        if not stat.S_ISDIR(st.st_mode):
            return "other" if i == len(parts) - 1 else None
    return "dir"


def _is_binary(data: bytes) -> bool:
    if b"\0" in data[:8192]:
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
    if _is_binary(a or b"") or _is_binary(b or b""):
        return "".join(header) + f"Binary files {old_name} and {new_name} differ\n"
    body = difflib.unified_diff(_lines(a or b""), _lines(b or b""), old_name, new_name, n=3)
    return "".join(header) + "".join(line if line.endswith("\n") else line + "\n" for line in body)


def tree_diff(
    base: Path, work: Path, candidates: Iterable[str], ignore: Iterable[str] = (), outer: tuple[Path, str] | None = None
) -> str:
    ignore = list(ignore)
    paths = sorted({c for c in candidates if c and not ignored(c, ignore)})
    left_out = git_ignored(base, [p for p in paths if not os.path.lexists(os.path.join(base, p))], outer)
    base_fs, work_fs, memo = ConfinedFS(base), ConfinedFS(work), {}
    return _left_out_note(left_out) + "".join(
        file_diff(rel, base_fs, work_fs, memo) for rel in paths if rel not in left_out
    )


def git_ignored(base: Path, new_paths: list[str], outer: tuple[Path, str] | None = None) -> set[str]:
    """Which of `new_paths` (absent from `base`) the ignore rules of the git checkout `base`
    ignore: its .gitignore files, .git/info/exclude and the user's global excludes, as git
    reads them; a path inside a submodule by the submodule's own rules, as `git status` there
    would. A `base` without .git is judged by `outer` when given: (the top of the checkout it was
    copied from, its prefix there, "pkg/"). Empty when neither applies or git fails (nothing is
    left out)."""
    own = os.path.lexists(os.path.join(base, ".git"))
    if not new_paths or not (own or outer):
        return set()
    # git refuses the whole batch for a path beyond a symlink or inside a submodule: each path goes
    # to the innermost checkout holding it, and one beyond a symlink to none.
    memo: dict[str, str | None] = {}
    by_repo: dict[str, list[str]] = {}
    for p in new_paths:
        repo = _checkout_of(base, posixpath.dirname(p), memo)
        if repo is not None:
            by_repo.setdefault(repo, []).append(p[len(repo) + 1 :] if repo else p)
    out = set()
    for repo, paths in by_repo.items():
        if not repo and not own:  # the copy's top: the outer checkout's rules, at the copy's place in it
            top, at = outer
            out |= {p[len(at) :] for p in _check_ignore(top, [at + p for p in paths]) if p.startswith(at)}
            continue
        prefix = f"{repo}/" if repo else ""
        out |= {prefix + p for p in _check_ignore(base / repo if repo else base, paths)}
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


def _left_out_note(left_out: set[str]) -> str:
    """A comment line (`git apply` skips text before the first header) naming what was left out."""
    if not left_out:
        return ""
    groups = sorted({quote_path(p.split("/", 1)[0] + ("/" if "/" in p else "")) for p in left_out})
    shown = ", ".join(groups[:5]) + (", ..." if len(groups) > 5 else "")
    n = len(left_out)
    return f"# {n} new file{'s' * (n != 1)} left out of this diff: the repository's git ignore rules ignore them ({shown})\n"


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
    """The path of a `diff --git A B` header (given without "diff --git "), None when A and B differ."""
    if pair.startswith('"'):
        try:
            a, rest = _unquote(pair)
            b, tail = _unquote(rest[1:]) if rest.startswith(' "') else (os.fsencode(rest[1:]), "")
        except ValueError:
            return None
        ok = not tail and a.startswith(b"a/") and b.startswith(b"b/") and a[2:] == b[2:]
        return os.fsdecode(a[2:]) if ok else None
    half = (len(pair) - 1) // 2
    a, b = pair[:half], pair[half + 1 :]
    return a[2:] if a.startswith("a/") and b.startswith("b/") and a[2:] == b[2:] else None
