"""`vivace index build|search|bench|train-embedder`: the semantic codebase index from the command
line (registered on the app in cli.py). The index a command builds is saved in the search cache
(`--cache-dir`, default ~/.cache/vivace/search), so `search` after `build` embeds nothing
unless files changed, and then only their changed chunks."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from vivace.cli import (
    LoggedProgress,
    app,
    check_out,
    err,
    fail,
    out,
    print_json,
    run_cancelling_on_sigterm,
    seed_in_range,
    sigterm_interrupts,
    stopped_by_signal,
)

index_app = typer.Typer(help="Semantic codebase index: build, search, benchmark, fine-tune the embedder.")
app.add_typer(index_app, name="index")

RepoOpt = Annotated[Path, typer.Option("--repo", help="Repository directory to index.")]
ModelOpt = Annotated[
    str | None, typer.Option("--model", help="Embedding model: a sentence-transformers directory (default: packaged).")
]
CacheOpt = Annotated[Path | None, typer.Option("--cache-dir", help="Search cache (default ~/.cache/vivace/search).")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print results as JSON.")]


def _config(model: str | None, cache_dir: Path | None, **kw: Any):
    from vivace.search.config import SearchConfig

    if cache_dir is not None:
        check_out(cache_dir, directory=True, option="--cache-dir")
    updates = {k: v for k, v in {"model": model, "cache_dir": cache_dir, **kw}.items() if v is not None}
    try:
        return SearchConfig(**updates)
    except ValueError as e:
        fail(str(e))


@contextlib.contextmanager
def _model_errors() -> Iterator[None]:
    """Exit 2 with the message when the model turns out unusable: it loads on first use, deep
    inside a build or a search, not when the index is set up."""
    from vivace.search.embed import EmbedderUnavailable

    try:
        yield
    except EmbedderUnavailable as e:
        fail(str(e))


def _indexer(config):
    from vivace.search.embed import EmbedderUnavailable, shared
    from vivace.search.tree import Indexer

    try:
        return Indexer(config, shared(config.model, config.cache_dir / "embeddings" if config.cache_dir else None))
    except EmbedderUnavailable as e:
        fail(str(e))


def _repo(repo: Path) -> Path:
    if not repo.is_dir():
        fail(f"{repo} is not a directory; pass the repository with --repo DIR")
    return repo.resolve()


STAGES = {"chunked": "chunking files", "embedded": "embedding chunks"}


class _Stopped(Exception):
    """Ctrl-C: raised from the build's progress callback, between two embedding batches."""


def _open(indexer, repo: Path, quiet: bool, share: bool = True):
    """The repository's index: its saved base (plus the files changed since), else a new build.
    `share`: reuse the last base of `repo` for a changed tree (False: `repo` gets its own base)."""
    from vivace.search.tree import DirectorySource

    if share and (last := indexer.store.last_root(repo)):
        with _model_errors():  # loading a saved base asks the model for its width
            indexer.store.get(last)  # in memory now: a changed tree reuses it with an overlay
    progress = LoggedProgress(quiet=quiet, transient=True)
    tasks: dict[str, Any] = {}  # stage -> its own task: a finished stage's count never hides the next one's
    stop = threading.Event()

    def step(stage: str, done: int, total: int) -> None:
        if stop.is_set():  # runs in the build's thread, which asyncio cannot cancel
            raise _Stopped
        if stage not in tasks:
            tasks[stage] = progress.add_task(STAGES.get(stage, stage), total=total)
        progress.update(tasks[stage], completed=done, total=total)

    async def run():
        try:
            return await indexer.open(DirectorySource(repo, indexer.config), step, share)
        except asyncio.CancelledError:  # Ctrl-C: stop the embedding thread instead of waiting for it
            stop.set()
            raise

    received: list[int] = []
    try:
        with progress, _model_errors(), sigterm_interrupts(received):
            state = asyncio.run(run())
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM (`timeout`, a job's limit): what was embedded is saved
        raise stopped_by_signal(
            received, "the embeddings computed so far are saved; the next build resumes there"
        ) from None
    indexer.store.set_last_root(repo, state.view.base.root)
    return state


@index_app.command("build")
def index_build(repo: RepoOpt, model: ModelOpt = None, cache_dir: CacheOpt = None, as_json: JsonOpt = False) -> None:
    """Index DIR (chunk, embed, BM25); saved in the cache, keyed by the tree's Merkle root."""
    repo = _repo(repo)
    indexer = _indexer(_config(model, cache_dir))
    t0, encoded = time.perf_counter(), indexer.cache.embedder.encoded  # the embedder may be shared in-process
    state = _open(indexer, repo, as_json, share=False)  # this tree's own base, whatever was built before
    report = {
        "repo": str(repo), "root": state.view.root, "files": len(state.view.tree.files),
        "chunks": len(state.view.chunks()), "chunks_embedded": indexer.cache.embedder.encoded - encoded,
        "files_skipped": state.skipped, "files_over_max_files": state.over_max_files,
        "seconds": time.perf_counter() - t0, "cache_dir": str(indexer.config.cache_dir),
        "saved": indexer.store.saved(state.view.base.root),
    }  # fmt: skip
    if as_json:
        print_json(report)
        return
    skipped = f"; {report['files_skipped']} skipped (binary, too large or unreadable)" if state.skipped else ""
    if state.over_max_files:
        skipped += f"; {state.over_max_files} files over max_files={indexer.config.max_files} not indexed"
    where = escape(report["cache_dir"])
    saved = f"saved under {where}" if report["saved"] else f"NOT saved: {where} could not be written (see above)"
    out.print(
        f"indexed {report['files']} files as {report['chunks']} chunks ({report['chunks_embedded']} embedded now"
        f"{skipped}) in {report['seconds']:.1f} s; {saved}"
    )


@index_app.command("search")
def index_search(
    query: Annotated[str, typer.Argument(help="What to look for, in words or identifiers.")],
    repo: RepoOpt,
    k: Annotated[int, typer.Option("--k", min=1, max=200, help="Number of results.")] = 10,
    mode: Annotated[str, typer.Option("--mode", help="bm25, dense or hybrid.")] = "hybrid",
    model: ModelOpt = None,
    cache_dir: CacheOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Search DIR's index (built or brought up to date first)."""
    from vivace.harness.display import visible, visible_line
    from vivace.search.types import MODES, quote_query

    if mode not in MODES:
        fail(f"unknown --mode {mode!r}; modes: {', '.join(MODES)}")
    if not query.strip():
        fail("the query is empty; say what to look for, in words or identifiers")
    repo = _repo(repo)
    state = _open(_indexer(_config(model, cache_dir)), repo, as_json)
    with _model_errors():
        hits = state.view.search(query, k, mode)  # type: ignore[arg-type]
    if as_json:
        print_json([asdict(h) for h in hits])
        return
    if not hits:
        out.print(f"No results for {quote_query(query)}.", markup=False, highlight=False, soft_wrap=True)
    for h in hits:
        # A repository's text is shown with its control characters as escapes (`visible`): a file holding
        # ESC sequences must not drive the terminal of whoever searches it.
        symbol = f" ({escape(visible_line(h.symbol))})" if h.symbol else ""
        out.print(f"[bold]{escape(visible_line(h.path))}:{h.start_line}-{h.end_line}[/]{symbol}  [dim]{h.score:.4f}[/]",
                  highlight=False)  # fmt: skip
        first = h.snippet_line or h.start_line
        for i, line in enumerate(h.snippet.split("\n")):
            out.print(f"{first + i:>6}  {visible(line)}", markup=False, highlight=False)


@index_app.command("bench")
def index_bench(
    files: Annotated[
        int, typer.Option(min=1, help="Files of the synthetic repository (throughput, incremental).")
    ] = 2_000,
    chunks: Annotated[int, typer.Option(min=1, help="Chunks at least in the latency index.")] = 20_000,
    workspaces: Annotated[int, typer.Option(min=1, help="Workspaces over one snapshot (sharing).")] = 100,
    model: ModelOpt = None,
    cache_dir: Annotated[
        Path | None, typer.Option("--cache-dir", help="Reuse and keep embeddings here (default: none, all cold).")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Localization (recall@1/5/10, MRR per mode), throughput, incremental re-indexing, sharing, latency."""
    from vivace.search.bench import run_bench

    if cache_dir is not None:
        check_out(cache_dir, directory=True, option="--cache-dir")
    cfg = _config(model, None).model_copy(update={"cache_dir": cache_dir})
    received: list[int] = []  # SIGTERM cancels the run as Ctrl-C does, so its temporary directory is removed
    try:
        with _model_errors():
            result = run_cancelling_on_sigterm(
                received, run_bench(cfg, files, chunks, workspaces, say=lambda s: err.print(f"[dim]{escape(s)}[/]"))
            )
    except (KeyboardInterrupt, asyncio.CancelledError):
        raise stopped_by_signal(received, "nothing was measured to the end; no result is printed") from None
    if as_json:
        print_json(result)
        return
    _print_bench(result)


def _print_bench(r: dict[str, Any]) -> None:
    loc = r["localization"]
    table = Table(title=f"Localization: {loc['tasks']} bug tasks (answer = files of the reference patch)")
    for col in ("mode", "recall@1", "recall@5", "recall@10", "MRR"):
        table.add_column(col, justify="right")
    for mode in ("bm25", "dense", "hybrid"):
        m = loc[mode]
        table.add_row(mode, *(f"{m[x]:.3f}" for x in ("recall@1", "recall@5", "recall@10", "mrr")))
    out.print(table)
    t = r["throughput"]
    b = t["index_build"]
    out.print(f"raw encode: {t['raw_encode']['chunks_per_s']:.1f} chunks/s; index build: {b['chunks_per_s']:.1f} "
              f"chunks/s ({b['chunks']} chunks, {b['chunks_embedded']} embedded, {b['files']} files, "
              f"{b['seconds']:.1f} s, of which encoding {b['encode_seconds']:.1f} s)")  # fmt: skip
    for kind, inc in r["incremental"].items():
        out.print(
            f"incremental ({kind}): refresh after one edit p50 {inc['refresh_p50_ms']:.0f} ms, max "
            f"{inc['refresh_max_ms']:.0f} ms; the next query finds it first {inc['found_top1']}/{inc['edits']}, "
            f"in the top 10 {inc['found_top10']}/{inc['edits']}"
        )
    s = r["sharing"]
    out.print(f"sharing: {s['workspaces']} workspaces, {s['bases_built']} base built, {s['chunk_texts_embedded']} "
              f"chunk texts embedded for a {s['base_chunks']}-chunk base")  # fmt: skip
    lat = r["latency"]
    modes = ", ".join(
        f"{m} p50 {lat[m]['p50_ms']:.1f} ms (p90 {lat[m]['p90_ms']:.1f})" for m in ("bm25", "dense", "hybrid")
    )
    out.print(f"latency over {lat['chunks']} chunks: {modes}")
    if "tool_call_workspace" in lat:
        out.print(
            f"tool call through a workspace (refresh scan + search): p50 {lat['tool_call_workspace']['p50_ms']:.1f} ms"
        )


@index_app.command("train-embedder")
def index_train_embedder(
    traces: Annotated[Path, typer.Option("--traces", help="Run directory (or parent) of `vivace bench` trajectories.")],
    out_dir: Annotated[Path, typer.Option("--out", help="Where the fine-tuned model directory is written.")] = Path(
        "runs/embedder"
    ),
    epochs: Annotated[int, typer.Option(min=1, help="Passes over the training pairs.")] = 2,
    batch_size: Annotated[int, typer.Option(min=2, help="Pairs per step (the in-batch negatives).")] = 16,
    lr: Annotated[float, typer.Option(help="Learning rate (AdamW).")] = 3e-5,
    holdout: Annotated[float, typer.Option(min=0.05, max=0.9, help="Fraction of tasks held out.")] = 0.25,
    seed: Annotated[
        int, typer.Option(callback=seed_in_range, help="Seed of the held-out split and the shuffling.")
    ] = 0,
    model: ModelOpt = None,
    state_dir: Annotated[Path | None, typer.Option("--state-dir", help="Where task trees are built.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Fine-tune the embedder on (query, chunk) pairs mined from successful trajectories; report
    held-out retrieval before and after."""
    from vivace.search.finetune import TrainConfig, train_embedder

    if not traces.exists():
        fail(f"{traces} does not exist; pass a `vivace bench --out` directory with --traces")
    if not 0 < lr < float("inf"):  # NaN too; inf trained NaN weights and saved them
        fail(f"--lr {lr:g}: give a learning rate above 0, e.g. 3e-5")
    check_out(out_dir, directory=True)
    cfg = TrainConfig(epochs=epochs, batch_size=batch_size, lr=lr, holdout=holdout, seed=seed)
    try:
        report = train_embedder(traces, out_dir, model, cfg, state_dir, say=lambda s: err.print(f"[dim]{escape(s)}[/]"))
    except ValueError as e:
        fail(str(e))
    if as_json:
        print_json(report)
        return
    b, a = report["before"], report["after"]
    out.print(f"pairs: {report['train_pairs']} train, {report['heldout_pairs']} held out "
              f"({report['heldout_tasks']} tasks); saved {escape(str(report['model_dir']))}")  # fmt: skip
    out.print(
        f"held-out dense recall@5: {b['recall@5']:.3f} -> {a['recall@5']:.3f}; MRR {b['mrr']:.3f} -> {a['mrr']:.3f}"
    )
