"""Did-you-mean hints for the file tools' errors: the nearest existing paths, the closest lines.

Why: a model that gets a path or an old_string slightly wrong (`museing/core.py` for
`museum/core.py`, a fragment with one letter off) otherwise has to find the right text again
somewhere far back in its context, or list directories and re-read the file. Naming the likely
target in the error itself turns the retry into a copy of the text just above it — the same
help editors and shells give a person, and the same text in training and in the product.

What: `similar_paths` ranks existing files against a missing path (same file name first, then
overall string similarity); `workspace_files` lists a workspace's files through its file API
(no command runs) with a bound on how many entries it visits; `closest_lines` finds the line
of a file most like an old_string that did not match. Pure functions apart from the listing,
so the warm start's synthetic retries (rl/sft_augment.py) build exactly the text the tools give
(the work bounds below count lines and tokens, never time, so the answer is the same anywhere).

How `closest_lines` stays fast on big files: a file of up to MAX_LINES_SCANNED lines is compared
line by line in full; in a longer one only the MAX_CANDIDATES lines sharing the most of
old_string's rarer tokens (found with C-speed substring search over the whole file) are compared,
so a target anywhere in the file is found, not only in its first lines.

Not covered: suggestions for directories that do not exist (list_dir names the nearest existing
parent instead), ignore files (.gitignore is not read: hidden and build directories are skipped),
matching across line breaks beyond the first non-blank line of old_string, and, in a long file,
a line that shares none of old_string's tokens (every word misspelt).
"""

from __future__ import annotations

import bisect
import difflib
import heapq
import itertools
import math
import posixpath
import re
from collections import deque

from vivace.sandbox.base import SandboxError

MAX_LISTED = 5_000  # entries visited when listing a workspace for suggestions (big repos: a partial list)
MAX_SUGGESTIONS = 3
SKIPPED_DIRS = frozenset({"node_modules", "__pycache__", "venv", ".venv", "build", "dist", "target"})
PATH_CUTOFF = 0.6  # difflib ratio below which a path is not offered
LINE_CUTOFF = 0.6  # share of old_string's characters a line must match to be offered
MAX_LINES_SCANNED = 5_000  # a file with at most this many lines is compared line by line in full
MAX_CANDIDATES = 1_000  # lines of a longer file compared: those sharing the most of old_string's rarer tokens
MAX_TOKENS = 24  # of old_string's first line (the longest) looked up in a longer file
MAX_TOKEN_HITS = 200_000  # occurrences located in all (rarest tokens first); commoner tokens are not used
MAX_KEY_CHARS = 200  # of old_string's first line, compared with each line
MAX_SHOWN_LINES = 10


async def workspace_files(ws, limit: int = MAX_LISTED) -> list[str]:
    """Regular files under the workspace root, breadth first, skipping hidden and build directories;
    at most `limit` directory entries are visited (the rest of a very large tree is not offered)."""
    found: list[str] = []
    queue, seen = deque(["."]), 0
    while queue and seen < limit:
        top = queue.popleft()
        try:
            entries = await ws.list(top)
        except (SandboxError, OSError):
            continue
        for e in sorted(entries, key=lambda e: e.name):
            seen += 1
            if e.name.startswith("."):
                continue
            path = e.name if top == "." else f"{top}/{e.name}"
            if e.kind == "dir" and e.name not in SKIPPED_DIRS:
                queue.append(path)
            elif e.kind == "file":
                found.append(path)
    return found


def similar_paths(wanted: str, files: list[str], n: int = MAX_SUGGESTIONS) -> list[str]:
    """Existing files a missing `wanted` probably meant: those with the same file name (nearest
    directory first) or, when none has it, the closest whole paths by difflib's ratio above PATH_CUTOFF."""
    want = posixpath.normpath(wanted.strip()).lstrip("/")
    if want in files:
        return []
    name = posixpath.basename(want)

    def score(p: str) -> float:
        return difflib.SequenceMatcher(None, want, p).ratio()

    same_name = sorted((p for p in files if posixpath.basename(p) == name), key=lambda p: (-score(p), p))
    return same_name[:n] or difflib.get_close_matches(want, files, n=n, cutoff=PATH_CUTOFF)


def path_hint(wanted: str, files: list[str]) -> str:
    """' Did you mean "X"?' (or 'one of "X", "Y"?') for a missing path; '' when nothing is close.
    Quoted, as a path argument is: the text after the quote tokenizes as it does in the call."""
    found = similar_paths(wanted, files)
    if not found:
        return ""
    quoted = ", ".join(f'"{p}"' for p in found)
    return f" Did you mean {quoted}?" if len(found) == 1 else f" Did you mean one of {quoted}?"


def closest_lines(text: str, old: str) -> tuple[int, list[str]] | None:
    """(1-based line number, lines) of the place in `text` most like `old`: the line that best
    contains old's first non-blank line (most of its characters in order, whitespace aside), and
    as many lines after it as old has. None when no line matches LINE_CUTOFF of it."""
    want = old.split("\n")
    while want and not want[0].strip():
        want.pop(0)
    if not want:
        return None
    key = want[0].strip()[:MAX_KEY_CHARS]
    lines = text.split("\n")
    scan = range(len(lines)) if len(lines) <= MAX_LINES_SCANNED else _candidates(text, lines, key)
    best_at, best = _best_line(key, lines, scan)
    if best_at < 0 or best < LINE_CUTOFF:
        return None
    span = lines[best_at : best_at + min(MAX_SHOWN_LINES, max(1, len(want)))]
    return best_at + 1, [line.rstrip("\r") for line in span]


def _best_line(key: str, lines: list[str], scan) -> tuple[int, float]:
    """(index, score) of the line among `scan` (ascending indices) that best contains `key`; (-1, 0.0) if none."""
    best, best_at = 0.0, -1
    for i in scan:
        s = lines[i].strip()
        if not s or min(1.0, len(s) / len(key)) - 1e-6 * len(s) <= best:
            continue  # empty, or too short to beat the best so far even if every character matched
        m = difflib.SequenceMatcher(None, key, s, autojunk=False)
        matched = sum(b.size for b in m.get_matching_blocks())
        share = matched / len(key)
        # Prefer lines that match more of old_string, then the shorter (more specific) line.
        score = share - 1e-6 * len(s)
        if score > best:
            best, best_at = score, i
    return best_at, best


def _candidates(text: str, lines: list[str], key: str) -> list[int]:
    """Indices (ascending) of the lines of a long file worth comparing with `key`: those sharing the
    most of key's tokens, each token weighted by its rarity in the file (like a one-line BM25)."""
    tokens = sorted(set(re.findall(r"\w+|[^\w\s]+", key)), key=lambda t: (-len(t), t))[:MAX_TOKENS]
    counts = sorted((n, t) for t in tokens if (n := text.count(t)))
    starts = list(itertools.accumulate((len(line) + 1 for line in lines), initial=0))
    weight: dict[int, float] = {}
    budget = MAX_TOKEN_HITS
    for n, token in counts:
        if n > budget and weight:
            break  # this and every later token are too common to narrow anything down
        w, last = math.log(1 + len(lines) / n), -1
        for m in itertools.islice(re.finditer(re.escape(token), text), budget):
            i = bisect.bisect_right(starts, m.start(), last + 1) - 1
            if i != last:  # a token counts once per line
                weight[i], last = weight.get(i, 0.0) + w, i
        budget -= min(n, budget)
    return sorted(heapq.nlargest(MAX_CANDIDATES, weight, key=lambda i: (weight[i], -i)))
