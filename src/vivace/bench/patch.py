"""Reading unified diffs: which files a change touches, how much, and each hunk's text.

Both the agent's diff (from the workspace) and a task's reference patch go through here, so
the scorer compares like with like. git's diffs and traditional ones (`diff -u`, `diff -ruN`,
other tools' patches, which `git apply` takes too) are read as `git apply` reads them.
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass, field
from typing import NamedTuple

from vivace.sandbox.diff import header_path, line_name, strip_component

_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
# `diff -N` names a file absent on one side with the epoch as its time (git apply reads it as /dev/null).
_EPOCH = re.compile(r"\t(?:1970-01-01|1969-12-31) \d\d:\d\d:\d\d(?:\.0+)? [+-]\d{4}\s*$")


class Hunk(NamedTuple):
    old: str  # the lines it replaces, as one text
    new: str  # the lines it puts in their place
    line: int  # where `old` starts in the old file (1-based; the line before it when `old` is empty)


@dataclass
class FileChange:
    path: str
    new_file: bool = False
    deleted: bool = False
    added: int = 0  # lines
    removed: int = 0
    added_lines: list[int] = field(default_factory=list)  # 1-based line numbers in the new file
    text: str = ""  # this file's section of the diff
    hunks: list[Hunk] = field(default_factory=list)

    @property
    def size(self) -> int:
        return self.added + self.removed


def parse_patch(diff: str) -> list[FileChange]:
    """The files a unified diff changes. Each path is read as `git apply` (-p1) reads it, so that a
    patch made with `git diff -R` (b/ a/) or `diff.mnemonicPrefix` (i/ w/) names the right file: from
    the `---`/`+++` lines, a rename's `rename to` line, or else the `diff --git` header (a mode change,
    a binary file). A file's section starts at its `diff --git` line or, in a traditional diff, at a
    `---` line followed by `+++` outside any hunk; a hunk is as long as its `@@` line says, so inside
    it a line reading "--- x" is a removed "-- x" (a YAML or Markdown rule), never a new file."""
    changes: list[FileChange] = []
    starts: list[int] = []  # the line each change's section starts at; it runs to the next one's
    current: FileChange | None = None
    hunk: _Hunk | None = None  # the hunk being read
    named = False  # the current section has its +++ line: a later ---/+++ pair starts the next file
    # Only "\n" ends a line in a diff: a content line may hold \r, \f or U+2028 (splitlines would break it).
    lines = [line + "\n" for line in diff.split("\n")]
    lines[-1] = lines[-1][:-1]
    for i, line in enumerate(lines):
        if current is not None and hunk is not None:
            if hunk.takes(line):
                hunk.read(line, current)
                continue
            current.hunks.append(hunk.as_hunk())  # past the hunk's last line (or a hunk cut short): headers again
            hunk = None
        if line.startswith("diff --git "):
            pair = line[len("diff --git ") :].rstrip("\n")
            current, named = FileChange(path=header_path(pair) or pair), False
            changes.append(current)
            starts.append(i)
        elif (
            line.startswith("--- ")
            and (current is None or named)
            and i + 1 < len(lines)
            and lines[i + 1].startswith("+++ ")
        ):
            current, named = FileChange(path=""), False  # a traditional diff's next file
            changes.append(current)
            starts.append(i)
        if current is None:
            continue
        if m := _HUNK.match(line):
            hunk, named = _Hunk(int(m.group(1)), int(m.group(2) or 1), int(m.group(4) or 1), int(m.group(3))), True
        else:
            named |= _read_header_line(current, line.rstrip("\n"))
    if current is not None and hunk is not None:
        current.hunks.append(hunk.as_hunk())
    for change, begin, end in zip(changes, starts, [*starts[1:], len(lines)], strict=False):  # [len] when none
        change.text = "".join(lines[begin:end])  # joined once: adding line by line took minutes on megabytes
    return [c for c in changes if c.path]


class _Hunk:
    """Reads one hunk's lines into its file's change: as many old and new lines as its @@ line says, and
    the "\\ No newline at end of file" mark after any of them."""

    def __init__(self, first_old_line: int, old: int, new: int, first_new_line: int):
        self.line, self.old_left, self.new_left, self.new_line = first_old_line, old, new, first_new_line
        self.old: list[str] = []
        self.new: list[str] = []
        self.last = ""  # the kind of the line read last: " ", "-" or "+"

    def takes(self, line: str) -> bool:
        kind = _kind(line)
        if kind == "\\":
            return self.last != ""
        return (kind == " " and self.old_left > 0 and self.new_left > 0) or (
            (kind == "-" and self.old_left > 0) or (kind == "+" and self.new_left > 0)
        )

    def read(self, line: str, change: FileChange) -> None:
        kind = _kind(line)
        if kind == "\\":  # the line before has no newline
            for side, kinds in ((self.old, " -"), (self.new, " +")):
                if self.last in kinds and side and side[-1].endswith("\n"):
                    side[-1] = side[-1][:-1]
            self.last = ""
            return
        body = line[1:] if line != "\n" else line  # an empty line: a blank context line stripped of its space
        if kind != "+":
            self.old_left -= 1
            self.old.append(body)
        if kind != "-":
            self.new_left -= 1
            self.new.append(body)
        if kind == "+":
            change.added += 1
            change.added_lines.append(self.new_line)
        elif kind == "-":
            change.removed += 1
        self.new_line += kind != "-"
        self.last = kind

    def as_hunk(self) -> Hunk:
        return Hunk("".join(self.old), "".join(self.new), self.line)


def _kind(line: str) -> str:
    return " " if line == "\n" else line[:1]


def _read_header_line(change: FileChange, line: str) -> bool:
    """One line of a file's section before its hunks: its path, and whether the file is new or deleted.
    True for the `+++` line, which ends a section's names."""
    if line.startswith(("new file mode", "deleted file mode")):
        change.new_file |= line.startswith("new")
        change.deleted |= line.startswith("deleted")
    elif line.startswith(("--- ", "+++ ")):
        name = line_name(line[4:])
        if name == "/dev/null" or _EPOCH.search(line):
            change.new_file |= line.startswith("-")
            change.deleted |= line.startswith("+")
            if not change.path:  # a traditional diff names the file on the other side alone
                change.path = strip_component(name) or name
        else:
            change.path = strip_component(name) or name
        return line.startswith("+++ ")
    elif line.startswith(("rename to ", "copy to ")):
        change.path = line_name(line.split(" ", 2)[2])  # no prefix on these lines
    return False


def is_test_path(path: str) -> bool:
    """Test code by the usual conventions: a tests/ directory anywhere, a test/ or testing/ directory at the
    top (inside a package those are often the library's own code: django/test/, numpy/testing/), and
    test modules by name (test_*.py, *_test.py, conftest.py)."""
    parts = path.split("/")
    name = posixpath.basename(path)
    return (
        "tests" in parts[:-1]
        or (len(parts) > 1 and parts[0] in ("test", "testing"))
        or name.startswith("test_")
        or name.endswith("_test.py")
        or name == "conftest.py"
    )
