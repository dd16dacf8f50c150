"""Data that crosses the search boundary: what one hit is, and the retrieval modes.

Kept free of heavy imports: the harness imports it at start-up, long before any index exists.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Mode = Literal["bm25", "dense", "hybrid"]
MODES: tuple[Mode, ...] = ("bm25", "dense", "hybrid")
QUOTED_CHARS = 200  # of a query echoed back in a message


def quote_query(query: str) -> str:
    """The query as messages quote it (repr), cut: a huge query must not flood the agent's context."""
    return repr(query if len(query) <= QUOTED_CHARS else query[:QUOTED_CHARS] + "…")


@dataclass(frozen=True)
class SearchHit:
    path: str  # workspace-relative
    start_line: int  # 1-based, inclusive
    end_line: int
    score: float  # hybrid: reciprocal-rank-fusion score; bm25: BM25; dense: cosine similarity
    snippet: str  # a few lines of the hit, starting at snippet_line
    symbol: str | None = None  # the function or class the hit is in, when known
    snippet_line: int = 0  # line number of the snippet's first line (0: start_line)
