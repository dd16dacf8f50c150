"""Reading git-style unified diffs: which files a change touches and how much.

Both the agent's diff (from the workspace) and a task's reference patch go through here, so
the scorer compares like with like.
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass, field

from vivace.sandbox.diff import header_path, line_name, strip_component

_HUNK = re.compile(r"^@@ -\d+(?:,\d+)? \+(\d+)(?:,\d+)? @@")


@dataclass
class FileChange:
    path: str
    new_file: bool = False
    deleted: bool = False
    added: int = 0  # lines
    removed: int = 0
    added_lines: list[int] = field(default_factory=list)  # 1-based line numbers in the new file
    text: str = ""  # this file's section of the diff

    @property
    def size(self) -> int:
        return self.added + self.removed


def parse_patch(diff: str) -> list[FileChange]:
    """The files a git-style diff changes. Each path is read as `git apply` (-p1) reads it, so that a
    patch made with `git diff -R` (b/ a/) or `diff.mnemonicPrefix` (i/ w/) names the right file: from
    the `---`/`+++` lines, a rename's `rename to` line, or else the `diff --git` header (a mode change,
    a binary file)."""
    changes: list[FileChange] = []
    current: FileChange | None = None
    in_hunks = False  # past the section's first @@: a "--- x" there is a removed line "-- x"
    new_line = 0
    # Only "\n" ends a line in a diff: a content line may hold \r, \f or U+2028 (splitlines would break it).
    lines = [line + "\n" for line in diff.split("\n")]
    lines[-1] = lines[-1][:-1]
    for line in lines:
        if line.startswith("diff --git "):
            pair = line[len("diff --git ") :].rstrip("\n")
            current, in_hunks = FileChange(path=header_path(pair) or pair), False
            changes.append(current)
        if current is None:
            continue
        current.text += line
        if m := _HUNK.match(line):
            new_line, in_hunks = int(m.group(1)), True
        elif not in_hunks:
            _read_header_line(current, line.rstrip("\n"))
        elif line.startswith("+"):
            current.added += 1
            current.added_lines.append(new_line)
            new_line += 1
        elif line.startswith("-"):
            current.removed += 1
        elif line.startswith(" "):
            new_line += 1
    return changes


def _read_header_line(change: FileChange, line: str) -> None:
    """One line of a file's section before its hunks: its path, and whether the file is new or deleted."""
    if line.startswith(("new file mode", "deleted file mode")):
        change.new_file |= line.startswith("new")
        change.deleted |= line.startswith("deleted")
    elif line.startswith(("--- ", "+++ ")):
        name = line_name(line[4:])
        if name == "/dev/null":
            change.new_file |= line.startswith("-")
            change.deleted |= line.startswith("+")
        else:
            change.path = strip_component(name) or name
    elif line.startswith(("rename to ", "copy to ")):
        change.path = line_name(line.split(" ", 2)[2])  # no prefix on these lines


def is_test_path(path: str) -> bool:
    """Test code by the usual conventions (a tests/ directory, test_*.py, *_test.py, conftest.py)."""
    parts = path.split("/")
    name = posixpath.basename(path)
    return (
        any(p in ("tests", "test", "testing") for p in parts[:-1])
        or name.startswith("test_")
        or name.endswith("_test.py")
        or name == "conftest.py"
    )
