"""Unified, git-style diff of a workspace tree against its base snapshot.

Backends tell which paths may have changed (overlayfs: whatever is in the upper layer;
a plain copy: everything) and this module compares those paths between the two trees
through ConfinedFS, so a command racing the diff cannot lead it outside the workspace.
The output applies with `git apply`; binary files are noted, not dumped.
"""

from __future__ import annotations

import difflib
import fnmatch
import os
from collections.abc import Iterable
from pathlib import Path

from vivace.sandbox.paths import ConfinedFS

_NO_NEWLINE = "\\ No newline at end of file\n"


def ignored(rel: str, patterns: Iterable[str]) -> bool:
    return any(fnmatch.fnmatch(part, pat) for part in rel.split("/") for pat in patterns)


def walk_files(root: Path, rel: str = "") -> list[str]:
    """Every non-directory path under root/rel (relative to root), without following links."""
    out = []
    base = root / rel if rel else root
    if not base.is_dir() or base.is_symlink():
        return [rel] if rel and os.path.lexists(base) else []
    for dirpath, dirnames, filenames in os.walk(base):
        for name in filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
            out.append(os.path.relpath(os.path.join(dirpath, name), root))
    return out


def _is_binary(data: bytes) -> bool:
    if b"\0" in data[:8192]:
        return True
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False


def _lines(data: bytes) -> list[str]:
    lines = data.decode("utf-8").splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n" + _NO_NEWLINE
    return lines


def file_diff(rel: str, base: ConfinedFS, work: ConfinedFS) -> str:
    """The diff of one path between `base` and `work` trees; '' when unchanged."""
    a_kind, a, a_mode = base.entry(rel)
    b_kind, b, b_mode = work.entry(rel)
    if a_kind == "dir":
        a_kind, a = "missing", None
    if b_kind == "dir":
        b_kind, b = "missing", None
    if a_kind == b_kind and a == b and a_mode == b_mode:
        return ""
    header = [f"diff --git a/{rel} b/{rel}\n"]
    if a is None:
        header.append(f"new file mode {b_mode:o}\n")
    elif b is None:
        header.append(f"deleted file mode {a_mode:o}\n")
    elif a_mode != b_mode:
        header += [f"old mode {a_mode:o}\n", f"new mode {b_mode:o}\n"]
    if a == b:
        return "".join(header)
    old_name = f"a/{rel}" if a is not None else "/dev/null"
    new_name = f"b/{rel}" if b is not None else "/dev/null"
    if _is_binary(a or b"") or _is_binary(b or b""):
        return "".join(header) + f"Binary files {old_name} and {new_name} differ\n"
    body = difflib.unified_diff(_lines(a or b""), _lines(b or b""), old_name, new_name, n=3)
    return "".join(header) + "".join(line if line.endswith("\n") else line + "\n" for line in body)


def tree_diff(base: Path, work: Path, candidates: Iterable[str], ignore: Iterable[str] = ()) -> str:
    ignore = list(ignore)
    paths = sorted({c for c in candidates if c and not ignored(c, ignore)})
    base_fs, work_fs = ConfinedFS(base), ConfinedFS(work)
    return "".join(file_diff(rel, base_fs, work_fs) for rel in paths)


def changed_paths(diff_text: str) -> list[str]:
    """The paths a diff made by `tree_diff` touches, in order (its headers are `a/P b/P`)."""
    paths = []
    for line in diff_text.splitlines():
        if not line.startswith("diff --git "):
            continue
        pair = line[len("diff --git ") :]
        half = (len(pair) - 1) // 2
        a, b = pair[:half], pair[half + 1 :]
        if a.startswith("a/") and b.startswith("b/") and a[2:] == b[2:]:
            paths.append(a[2:])
    return paths


async def export_changes(workspace, diff_text: str, dest: Path) -> list[str]:
    """Make `dest` (the directory the workspace was made from) hold the workspace's version of
    every path in `diff_text`: changed and new files are copied (with their mode), deleted ones
    removed. Writes are confined to `dest`. Returns the paths it could not carry over
    (symlinks and other special files), which the caller should report."""
    from vivace.sandbox.base import WorkspaceFileNotFound

    target = ConfinedFS(Path(dest))
    skipped = []
    for rel in changed_paths(diff_text):
        try:
            st = await workspace.stat(rel)
        except WorkspaceFileNotFound:
            st = None
        if st is None or st.kind == "dir":
            try:
                target.remove(rel)
            except WorkspaceFileNotFound:
                pass
            continue
        if st.kind != "file":
            skipped.append(rel)
            continue
        if target.entry(rel)[0] not in ("file", "missing"):
            target.remove(rel, recursive=True)  # a symlink or directory the workspace replaced by a file
        target.write_bytes(rel, await workspace.read_bytes(rel))
        os.chmod(Path(dest) / rel, st.mode & 0o7777)
    return skipped
