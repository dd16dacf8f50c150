"""`vivace index bench`: the semantic index measured end to end, in one run, on this machine.

- localization: each bundled bug task's request is the query, the files its reference patch
  touches are the answer; recall@1/5/10 and MRR of the ranked files, for BM25, dense and
  hybrid over the same index (tasks of one repository share its base index);
- throughput: the embedder's raw encode rate on chunk texts (the limit), next to a cold full
  index build of a synthetic FILES-file repository (scan, chunk, embed, BM25);
- incremental: one file of that repository changes, the index is refreshed (directory and a
  real workspace), and the next query must find the change;
- sharing: WORKSPACES workspaces over one snapshot embed its chunks once;
- latency: query time over a synthetic repository of at least CHUNKS chunks, per mode, plus a
  full tool call through a workspace (its refresh scan included).

Embeddings are cold (an in-memory cache) unless a cache directory is given, whose vectors are
then reused and extended (a warm build: the throughput line then measures the rest of the
pipeline). Times are wall clock on whatever else the machine is doing: the build also reports
the model's own rate during the build, the limit measured at the same moments.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from vivace.search.config import SearchConfig
from vivace.search.embed import Embedder, EmbeddingCache
from vivace.search.index import embed_text
from vivace.search.synth import write_synthetic_repo
from vivace.search.tree import DirectorySource, Indexer, WorkspaceSource
from vivace.search.types import MODES

Say = Callable[[str], None]
EDITS = [  # topics none of the bundled repositories touch, so the only right answer is the edit
    ("apply_loyalty_discount", "Reduce the order total by the customer's loyalty tier percentage."),
    ("celsius_to_fahrenheit", "Convert a temperature reading from Celsius to Fahrenheit."),
    ("luhn_checksum_valid", "Check a credit card number with the Luhn checksum algorithm."),
    ("retry_with_backoff", "Call a flaky network function again after exponentially growing pauses."),
    ("rgb_to_hex_color", "Format red, green and blue colour channels as a hex colour code."),
    ("body_mass_index", "Body mass index from a person's weight in kilograms and height in metres."),
    ("is_palindrome_word", "Whether a word reads the same backwards as forwards, ignoring case."),
    ("compound_interest", "Grow a savings deposit with compound interest over a number of years."),
    ("roman_numeral_value", "Integer value of a Roman numeral string like MCMXCIV."),
    ("fibonacci_number", "The n-th Fibonacci number computed iteratively."),
]


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[max(0, min(len(xs) - 1, round(q / 100 * (len(xs) - 1))))]


async def localization(indexer: Indexer, work: Path, say: Say) -> dict[str, Any]:
    from vivace.bench.patch import parse_patch
    from vivace.tasks.suites import load_suite

    tasks = load_suite("bugs")
    ranks: dict[str, list[int | None]] = {m: [] for m in MODES}
    for n, task in enumerate(tasks):
        root = Path(task.source(cache_dir=work / "tasks").path or "")
        state = await indexer.open(DirectorySource(root, indexer.config))
        answer = {c.path for c in parse_patch(task.reference_patch)}
        for mode in MODES:
            files = list(dict.fromkeys(h.path for h in state.view.search(task.request, 200, mode)))
            ranks[mode].append(next((i + 1 for i, p in enumerate(files) if p in answer), None))
        if n % 20 == 19:
            say(f"localization: {n + 1}/{len(tasks)} tasks")
    out: dict[str, Any] = {"tasks": len(tasks)}
    for mode, rs in ranks.items():
        row = {f"recall@{k}": sum(r is not None and r <= k for r in rs) / len(rs) for k in (1, 5, 10)}
        out[mode] = row | {"mrr": sum(1 / r for r in rs if r) / len(rs)}
    return out


def raw_encode(embedder: Embedder, texts: list[str]) -> dict[str, float]:
    embedder.encode(texts[:32])  # warm-up
    t0 = time.perf_counter()
    embedder.encode(texts)
    seconds = time.perf_counter() - t0
    return {"texts": len(texts), "seconds": seconds, "chunks_per_s": len(texts) / seconds}


async def incremental(indexer: Indexer, repo: Path, files: list[str], workspace: Any | None) -> dict[str, Any]:
    """Edit one file at a time (directory, then workspace); time the refresh; query the change."""
    out: dict[str, Any] = {}
    sources: list[tuple[str, Any]] = [("directory", DirectorySource(repo, indexer.config))]
    if workspace is not None:
        sources.append(("workspace", WorkspaceSource(workspace, indexer.config)))
    for kind, source in sources:
        state = await indexer.open(source)
        times, ranks, embedded = [], [], []
        for i, (name, doc) in enumerate(EDITS):
            path = files[(i * 197 + (kind == "workspace") * 13) % len(files)]
            code = f'\n\ndef {name}(value):\n    """{doc}"""\n    return value\n'
            if kind == "directory":
                text = (repo / path).read_text() + code
                (repo / path).write_text(text)
            else:
                text = (await workspace.read_text(path)) + code
                await workspace.write_text(path, text)
            line = text.split("\n").index(f"def {name}(value):") + 1
            before = indexer.cache.embedder.encoded if indexer.cache is not None else 0
            t0 = time.perf_counter()
            changed = await indexer.refresh(source, state)
            times.append(time.perf_counter() - t0)
            embedded.append((indexer.cache.embedder.encoded - before) if indexer.cache is not None else 0)
            hits = state.view.search(doc, 10, "hybrid")
            rank = next(
                (r + 1 for r, h in enumerate(hits) if h.path == path and h.start_line <= line <= h.end_line), None
            )
            ranks.append(rank if changed == 1 else None)
        out[kind] = {
            "edits": len(EDITS), "found_top1": sum(r == 1 for r in ranks), "found_top10": sum(r is not None for r in ranks),
            "refresh_p50_ms": pct(times, 50) * 1e3,
            "refresh_max_ms": max(times) * 1e3, "chunks_embedded_per_edit": statistics.mean(embedded),
        }  # fmt: skip
    return out


async def sharing(config: SearchConfig, embedder: Embedder, n: int, state_dir: Path) -> dict[str, Any]:
    """`n` workspaces over one snapshot, all searched at once, with a fresh embedding cache."""
    from vivace.config import SandboxConfig
    from vivace.sandbox.plain import PlainBackend
    from vivace.search.backend import HybridSearch
    from vivace.tasks.format import BUNDLED_REPOS

    backend = PlainBackend(SandboxConfig(backend="plain", state_dir=state_dir))
    search = HybridSearch(config.model_copy(update={"cache_dir": None}), EmbeddingCache(embedder))
    try:
        snap = backend.snapshot(str(BUNDLED_REPOS / "ledger"))
        workspaces = [await backend.create(snap) for _ in range(n)]
        before = embedder.calls
        t0 = time.perf_counter()
        await asyncio.gather(*(search.search(ws, "split an expense evenly", None, 5) for ws in workspaces))
        seconds = time.perf_counter() - t0
        bases = {id(search._indexes.get_for(ws).view.base) for ws in workspaces}
        base = search._indexes.get_for(workspaces[0]).view.base
        cache = search.indexer.cache
        return {
            "workspaces": n, "distinct_bases": len(bases), "bases_built": search.indexer.store.builds,
            "base_chunks": len(base.chunks), "chunk_texts_embedded": len(cache) if cache is not None else 0,
            "encode_calls": embedder.calls - before, "seconds_all_first_searches": seconds,
        }  # fmt: skip
    finally:
        await backend.aclose()


async def latency(indexer: Indexer, repo: Path, queries: list[str], workspace: Any | None) -> dict[str, Any]:
    state = await indexer.open(DirectorySource(repo, indexer.config))
    out: dict[str, Any] = {"chunks": len(state.view.chunks()), "queries": len(queries)}
    for mode in MODES:
        times = []
        for q in queries:
            indexer.cache.embedder.forget_queries() if indexer.cache is not None else None  # every search encodes its query
            t0 = time.perf_counter()
            state.view.search(q, 10, mode)
            times.append(time.perf_counter() - t0)
        out[mode] = {"p50_ms": pct(times, 50) * 1e3, "p90_ms": pct(times, 90) * 1e3}
    if workspace is not None:
        from vivace.search.backend import HybridSearch

        search = HybridSearch(indexer=indexer)
        await search.search(workspace, "warm up", None, 10)
        times = []
        for q in queries[:20]:
            indexer.cache.embedder.forget_queries() if indexer.cache is not None else None
            t0 = time.perf_counter()
            await search.search(workspace, q, None, 10)
            times.append(time.perf_counter() - t0)
        out["tool_call_workspace"] = {"p50_ms": pct(times, 50) * 1e3, "p90_ms": pct(times, 90) * 1e3}
    return out


async def run_bench(
    config: SearchConfig, files: int = 2_000, min_chunks: int = 20_000, workspaces: int = 100, say: Say = print
) -> dict[str, Any]:
    from vivace.config import SandboxConfig
    from vivace.sandbox.plain import PlainBackend
    from vivace.tasks.suites import load_suite

    embedder = Embedder(config.model)
    cache_dir = config.cache_dir
    config = config.model_copy(update={"cache_dir": None})  # bases are not saved: every run builds them
    indexer = Indexer(config, EmbeddingCache(embedder, cache_dir / "embeddings" if cache_dir else None))
    result: dict[str, Any] = {"model": str(embedder.path), "model_id": embedder.id}
    with tempfile.TemporaryDirectory(prefix="vivace-index-bench-") as tmp:
        work = Path(tmp)
        say("localization over the bundled bug tasks ...")
        result["localization"] = await localization(indexer, work, say)
        say(f"throughput: raw encode, then a cold build of a {files}-file repository ...")
        repo = work / "synth"
        paths = write_synthetic_repo(repo, files)
        from vivace.search.chunking import chunk_file

        sample = [embed_text(c) for p in paths[-200:] for c in chunk_file(p, (repo / p).read_text())][:512]
        result["throughput"] = {"raw_encode": raw_encode(embedder, sample)}
        t0, (encoded0, encode_s0) = time.perf_counter(), (embedder.encoded, embedder.encode_s)
        state = await indexer.open(DirectorySource(repo, config))
        seconds = time.perf_counter() - t0
        n, embedded, encode_s = len(state.view.chunks()), embedder.encoded - encoded0, embedder.encode_s - encode_s0
        result["throughput"]["index_build"] = {
            "files": files, "chunks": n, "chunks_embedded": embedded, "seconds": seconds, "chunks_per_s": n / seconds,
            "encode_seconds": encode_s, "encode_chunks_per_s_during_build": embedded / encode_s if encode_s else None,
        }  # fmt: skip
        backend = PlainBackend(SandboxConfig(backend="plain", state_dir=work / "state"))
        try:
            ws = await backend.create(backend.snapshot(str(repo)))
            say("incremental re-indexing ...")
            result["incremental"] = await incremental(indexer, repo, paths, ws)
            say(f"sharing: {workspaces} workspaces over one snapshot ...")
            result["sharing"] = await sharing(config, embedder, workspaces, work / "state")
            big = work / "synth-big"
            per_file = n / files
            write_synthetic_repo(big, max(files, int(min_chunks / per_file * 1.03) + 1))
            say(f"latency: index of >= {min_chunks} chunks ...")
            queries = [t.request for t in load_suite("bugs")] + [doc for _, doc in EDITS] * 8
            big_ws = await backend.create(backend.snapshot(str(big)))
            result["latency"] = await latency(indexer, big, queries[:200], big_ws)
        finally:
            await backend.aclose()
            indexer.cache.flush()
    return result
