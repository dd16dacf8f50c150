"""Re-indenting an edit matched ignoring whitespace (edit_file's fallback): new_string's lines
take the file's indentation, level by level, as the matched lines show old_string's maps to it
(2 spaces to 4, 4 spaces to a tab); where no consistent mapping exists, `fit_lines` says why
instead of writing a file whose structure changed."""

from __future__ import annotations

import difflib
import itertools
from collections import Counter
from functools import cached_property


def fit_lines(want: list[str], matched: list[str], new_lines: list[str], lines: list[str], eol: str) -> list[str] | str:
    """new_string's lines as they go into the file (each ending in `eol`), or why they cannot.

    A new line equal to the old line it stands for, indentation included, keeps the matched file
    line's exact text; one that rewrites an old line and is indented like it gets that file line's
    indentation. Any other line's indentation (a line moved in or out a level among them: kept as
    it was, that change was lost while the edit said it was made) is mapped level by level, as the
    matched lines map old_string's indentation to the file's (2 spaces to 4, 4 spaces to a tab)."""
    same = difflib.SequenceMatcher(None, [w.strip() for w in want], [n.strip() for n in new_lines], autojunk=False)
    kept: dict[int, str] = {}  # new line -> the file line it leaves as it was
    stands_for: dict[int, int] = {}  # new line -> the old line it rewrites (line for line)
    for tag, i1, i2, j1, j2 in same.get_opcodes():
        if tag == "equal":
            kept.update((j1 + k, matched[i1 + k]) for k in range(i2 - i1)
                        if _indent(new_lines[j1 + k]) == _indent(want[i1 + k]))  # fmt: skip
        elif tag == "replace" and i2 - i1 == j2 - j1:
            stands_for.update((j1 + k, i1 + k) for k in range(i2 - i1))
    indents = _IndentMap(want, matched, new_lines, lines)
    body = []
    for j, line in enumerate(new_lines):
        if j in kept:
            body.append(kept[j])
        elif not line.strip():
            body.append(eol)
        else:
            indent = _indent(line)
            i = stands_for.get(j)
            # Indented like the old line it rewrites: indented like that line in the file.
            mapped = _indent(matched[i]) if i is not None and _indent(want[i]) == indent else indents.map(indent)
            if mapped is None:
                return indents.problem
            body.append(mapped + line[len(indent) :] + eol)
    return body


class _IndentMap:
    """How old_string's indentation maps to the file's, learned from the matched lines: an
    indentation seen there maps as seen, any other one by whole levels (indentation units)
    from the nearest one seen."""

    def __init__(self, want: list[str], matched: list[str], new_lines: list[str], lines: list[str]):
        self.seen: dict[str, set[str]] = {}
        for w, f in zip(want, matched, strict=True):
            if w.strip():
                self.seen.setdefault(_indent(w), set()).add(_indent(f))
        self.old_unit = _indent_unit([_indents(want), _indents(new_lines)])
        self._matched, self._lines = matched, lines
        self.problem = ""

    @cached_property
    def file_unit(self) -> str:
        unit = _indent_unit([_indents(self._matched)]) or _indent_unit([_indents(self._lines)])
        return unit or ("\t" if any(_indent(line).startswith("\t") for line in self._lines) else "    ")

    def map(self, indent: str) -> str | None:
        """The file's indentation for a new line indented `indent` in old_string's style; None
        (and `problem` set) when there is no consistent answer."""
        if indent in self.seen:
            if len(self.seen[indent]) == 1:
                return next(iter(self.seen[indent]))
            found = ", ".join(sorted(repr(f) for f in self.seen[indent]))
            self.problem = f"lines indented {indent!r} in old_string are indented differently in the file ({found})"
            return None
        known = {o: next(iter(f)) for o, f in self.seen.items() if len(f) == 1}
        self.problem = f"new_string indents a line with {indent!r}, which has no counterpart in the file"
        if not (unit := self.old_unit):
            return None
        file_unit = self.file_unit
        if inside := [o for o in known if indent.startswith(o)]:  # deeper than a seen indentation
            base = max(inside, key=len)
            extra, levels = indent[len(base) :], 0
            while extra.startswith(unit * (levels + 1)):
                levels += 1
            return known[base] + file_unit * levels + extra[len(unit) * levels :]  # the rest: alignment
        if outside := [o for o in known if o.startswith(indent)]:  # shallower than every one seen
            base = min(outside, key=len)
            extra = base[len(indent) :]
            levels = len(extra) // len(unit)
            target = known[base]
            if extra == unit * levels and target.endswith(file_unit * levels):
                return target[: len(target) - len(file_unit) * levels]
        return None


def _indents(lines: list[str]) -> list[str]:
    return [_indent(line) for line in lines if line.strip()]


def _indent_unit(runs: list[list[str]]) -> str | None:
    """The most common step by which one line is indented deeper than the line before it."""
    steps: Counter[str] = Counter()
    for run in runs:
        for prev, cur in itertools.pairwise(run):
            if cur != prev and cur.startswith(prev):
                steps[cur[len(prev) :]] += 1
    return min(steps, key=lambda s: (-steps[s], len(s))) if steps else None


def _indent(line: str) -> str:
    return line[: len(line) - len(line.lstrip())]
