"""How long codebase_search takes on a workspace whose semantic index is not built yet (a cold cache).

Makes a plain-backend workspace of REPO and a HybridSearch with the default embedding model and an empty
cache, runs two searches at once after another, waits for the index build to finish, then searches again.
Prints one JSON object: each search's seconds and whether it answered by terms (the build not ready), and
the seconds the build went on after the second search. `python scripts/codebase_search_cold.py REPO`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path

from vivace.config import SandboxConfig
from vivace.harness.tools.base import ToolContext, parse_args
from vivace.harness.tools.search import CodebaseSearch
from vivace.sandbox.plain import PlainBackend
from vivace.search.backend import HybridSearch
from vivace.search.config import SearchConfig

QUERIES = ("parse a unified diff into file changes", "where the sandbox output pipes are created")


async def measure(repo: str) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        backend = PlainBackend(SandboxConfig(backend="plain", state_dir=Path(tmp) / "sandbox"))
        try:
            ws = await backend.create(backend.snapshot(repo))
            index = HybridSearch(SearchConfig(cache_dir=Path(tmp) / "search"))
            tool, ctx = CodebaseSearch(backend=index), ToolContext(workspace=ws)

            async def search(query: str) -> dict:
                t = time.monotonic()
                result = await tool.run(parse_args(tool, {"query": query}), ctx)
                return {"s": round(time.monotonic() - t, 1), "by_terms": "still being built" in result.text}

            out = {"first": await search(QUERIES[0]), "second": await search(QUERIES[1])}
            t = time.monotonic()
            while True:  # the build goes on in the background: poll until a search answers by meaning
                out["after_build"] = await search(QUERIES[0])
                if not out["after_build"]["by_terms"]:
                    break
                await asyncio.sleep(1)
            out["build_went_on_s"] = round(time.monotonic() - t, 1)
            return out
        finally:
            await backend.aclose()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("repo", help="a directory (a git checkout) to search")
    print(json.dumps(asyncio.run(measure(parser.parse_args().repo))))
