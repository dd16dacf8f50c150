"""Reading git-style unified diffs: which files a change touches and how much.

Both the agent's diff (from the workspace) and a task's reference patch go through here, so
the scorer compares like with like.
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass, field

from vivace.sandbox.diff import header_path

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
    changes: list[FileChange] = []
    current: FileChange | None = None
    new_line = 0
    # Only "\n" ends a line in a diff: a content line may hold \r, \f or U+2028 (splitlines would break it).
    lines = [line + "\n" for line in diff.split("\n")]
    lines[-1] = lines[-1][:-1]
    for line in lines:
        if line.startswith("diff --git "):
            pair = line[len("diff --git ") :].rstrip("\n")
            path = header_path(pair)  # quoted names too
            if path is None:  # a rename or an unusual header: the new side's name
                half = (len(pair) - 1) // 2
                path = pair[half + 1 :][2:] if pair[half + 1 :].startswith("b/") else pair
            current = FileChange(path=path)
            changes.append(current)
        if current is None:
            continue
        current.text += line
        if line.startswith("new file mode") or line.startswith("--- /dev/null"):
            current.new_file = True
        elif line.startswith("deleted file mode") or line.startswith("+++ /dev/null"):
            current.deleted = True
        elif m := _HUNK.match(line):
            new_line = int(m.group(1))
        elif line.startswith("+") and not line.startswith("+++"):
            current.added += 1
            current.added_lines.append(new_line)
            new_line += 1
        elif line.startswith("-") and not line.startswith("---"):
            current.removed += 1
        elif line.startswith(" "):
            new_line += 1
    return changes


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
