"""Reading a benchmark's results.jsonl (what `vivace bench` streams, one row per episode). No heavy
imports: `tasks select` reads results too."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def result_rows(path: Path, what: str = "benchmark result row") -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, row) for each row of a results.jsonl (or any JSON-lines file of `what`s, such as
    a run's metrics.jsonl). A last line cut short (the process was killed while writing it) is left
    out; any other line that is not a JSON object raises ValueError naming the file and line. Reading
    errors (OSError, UnicodeDecodeError) are the caller's."""
    lines = path.read_text(encoding="utf-8-sig").split("\n")  # -sig: a byte-order mark is dropped
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            if n == len(lines):  # no newline after it: its write never finished
                continue
            raise ValueError(f"{path}:{n}: not a {what} (not JSON: {e.msg})") from None
        if not isinstance(row, dict):
            raise ValueError(f"{path}:{n}: not a {what} (a JSON {type(row).__name__}, not an object)")
        yield n, row
