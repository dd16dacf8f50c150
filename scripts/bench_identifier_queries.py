"""Hybrid search for a bare identifier: fusion alone against fusion with the identifier rule, one process.

Indexes REPO with the default embedding model (cache in CACHE), draws N code-shaped names (snake_case,
camelCase, with digits) that the repository's Python files define (seeded), and hybrid-searches each bare
name. Right at 1: the top hit's lines hold the definition (`def NAME` / `class NAME`). The two modes run
alternately twice after a warm-up pass; prints one JSON object.
`python scripts/bench_identifier_queries.py REPO CACHE [N]`.
"""

from __future__ import annotations

import ast
import asyncio
import json
import random
import re
import sys
import time
from pathlib import Path

from vivace.search import view as view_mod
from vivace.search.config import SearchConfig
from vivace.search.embed import shared
from vivace.search.tree import DirectorySource, Indexer


def defined_names(repo: Path) -> set[str]:
    names = set()
    for p in repo.rglob("*.py"):
        if any(part.startswith(".") for part in p.relative_to(repo).parts):
            continue
        try:
            tree = ast.parse(p.read_text())
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        kinds = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
        names |= {n.name for n in ast.walk(tree) if isinstance(n, kinds) and view_mod._CODE_NAME.fullmatch(n.name)}
    return names


def main() -> None:
    repo, cache_dir = Path(sys.argv[1]).resolve(), Path(sys.argv[2])
    n = int(sys.argv[3]) if len(sys.argv) > 3 else 100
    config = SearchConfig(cache_dir=cache_dir)
    state = asyncio.run(
        Indexer(config, shared(config.model, cache_dir / "embeddings")).open(DirectorySource(repo, config))
    )
    names = defined_names(repo)
    queries = random.Random(0).sample(sorted(names), min(n, len(names)))

    def lines(hit) -> str:
        return "\n".join((repo / hit.path).read_text().split("\n")[hit.start_line - 1 : hit.end_line])

    def score(label: str) -> dict:
        first = mrr = 0.0
        t0 = time.perf_counter()
        for q in queries:
            hits = state.view.search(q, 10, "hybrid")
            rx = re.compile(rf"(def|class)\s+{re.escape(q)}\b")
            ranks = [i for i, h in enumerate(hits) if rx.search(lines(h))]
            first += bool(ranks and ranks[0] == 0)
            mrr += 1 / (ranks[0] + 1) if ranks else 0.0
        ms = (time.perf_counter() - t0) * 1000 / len(queries)
        return {"mode": label, "definition_first": int(first), "mrr_at_10": round(mrr / len(queries), 3),
                "ms_per_query": round(ms, 1)}  # fmt: skip

    rule = view_mod._identifiers
    score("warm-up")
    results = []
    for _ in range(2):
        view_mod._identifiers = lambda text: set()  # no names: the order is fusion's alone
        results.append(score("fusion alone"))
        view_mod._identifiers = rule
        results.append(score("fusion + identifier rule"))
    print(json.dumps({"repo": str(repo), "chunks": len(state.view.chunks()), "names_defined": len(names),
                      "queries": len(queries), "results": results}, indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
