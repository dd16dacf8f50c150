"""Synthetic repositories of any size for the index benchmarks, made from real code.

The Python files of the bundled repositories are copied N times over; each copy renames the
functions and classes it defines (`parse_date` -> `parse_date_c17`) and lives under its own
directory, so every chunk differs (nothing is served by the embedding cache) while the code
stays real in shape, length and vocabulary. Deterministic for the same arguments.
"""

from __future__ import annotations

import re
from pathlib import Path

from vivace.tasks.format import BUNDLED_REPOS

_DEFINES = re.compile(r"^\s*(?:async\s+)?(?:def|class)\s+([A-Za-z_]\w*)", re.M)


def _sources() -> list[tuple[str, str]]:
    out = []
    for path in sorted(BUNDLED_REPOS.rglob("*.py")):
        rel = path.relative_to(BUNDLED_REPOS).as_posix()
        if "__pycache__" not in rel and path.stat().st_size > 200:
            out.append((rel, path.read_text()))
    return out


def write_synthetic_repo(root: Path, n_files: int) -> list[str]:
    """Write `n_files` Python files under `root` (created); returns their relative paths."""
    sources = _sources()
    root.mkdir(parents=True, exist_ok=True)
    written = []
    for i in range(n_files):
        copy, (rel, text) = divmod(i, len(sources))[0], sources[i % len(sources)]
        names = sorted({n for n in _DEFINES.findall(text) if not n.startswith("__")}, key=len, reverse=True)
        if names:
            text = re.sub(r"\b(" + "|".join(map(re.escape, names)) + r")\b", rf"\1_c{copy}", text)
        path = f"copy{copy:03d}/{rel}"
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
        written.append(path)
    return written
