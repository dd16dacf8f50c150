"""Fine-tuning the embedder on what agents actually looked for (`vivace index train-embedder`).

Pairs are mined from successful episodes (`resolved` rows of a `vivace bench` run's
results.jsonl): the queries are the request and every codebase_search query; the relevant
chunks are, in the task's starting tree, the chunks the final diff changed and the chunks of
line ranges the agent read in other files (a whole-file read of a small file counts it whole).
A search query is paired only with what was read or edited after it.

Training is contrastive with in-batch negatives (sentence-transformers'
MultipleNegativesRankingLoss) in a plain torch loop; batches never hold the same query or
chunk twice, so no positive is also a negative. Pairs are held out by task (a hash of the task
id), and held-out retrieval — each query against every chunk of its task's tree — is measured
for the base model and the tuned one in the same run. The tuned model is saved as a
sentence-transformers directory that `--model` and SearchConfig.model accept.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from vivace.search.chunking import Chunk, chunk_file
from vivace.search.embed import Embedder, EmbeddingCache, resolve_model
from vivace.search.index import embed_text

_OLD_RANGE = re.compile(r"^@@ -(\d+)(?:,(\d+))? ", re.M)
SMALL_FILE_CHUNKS = 3  # a whole-file read marks every chunk relevant only in files this small
log = logging.getLogger(__name__)


@dataclass
class TrainConfig:
    epochs: int = 2
    batch_size: int = 16  # pairs per step: each query's negatives are the other pairs' chunks
    lr: float = 3e-5
    holdout: float = 0.25  # fraction of tasks whose pairs are only evaluated
    seed: int = 0
    max_pairs_per_task: int = 12


@dataclass
class Episode:
    task_id: str
    queries: list[str]  # request first, then search queries
    chunks: list[Chunk]  # every chunk of the task's starting tree (the evaluation corpus)
    relevant: dict[str, set[int]] = field(default_factory=dict)  # query -> indices into chunks


def _resolved_trajectories(traces: Path) -> tuple[list[Path], int]:
    """The trajectories of resolved rows in every results.jsonl under `traces`, and the number of
    rows skipped because they are not JSON objects (a truncated last line, a stray value)."""
    found, bad = [], 0
    for results in sorted(Path(traces).rglob("results.jsonl")):
        bad_here = 0
        for row in _rows(results):
            if not isinstance(row, dict):
                bad_here += 1
            elif row.get("resolved") and isinstance(row.get("trajectory"), str):
                found.append(results.parent / row["trajectory"])
        if bad_here:
            log.warning("%s: %d rows are not JSON objects; skipped", results, bad_here)
        bad += bad_here
    return found, bad


def _rows(results: Path) -> Iterator[Any]:
    """Each non-blank line of a JSON-lines file, parsed (None where it is not JSON)."""
    for n, raw in enumerate(results.read_bytes().split(b"\n"), 1):  # not splitlines(): a row may hold a \r
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(f"{results}:{n}: not UTF-8 text ({e.reason} at byte {e.start})") from None
        if line.strip():
            try:
                yield json.loads(line)
            except ValueError:
                yield None


def _tree_chunks(root: Path, cache: dict[Path, list[Chunk]]) -> list[Chunk]:
    if root not in cache:
        from vivace.search import scan

        paths = [p for p, _ in scan.candidates(str(root))]
        texts = scan.read_many(str(root), paths, 500_000, 1 << 62)["texts"]
        cache[root] = [c for p in sorted(texts) if texts[p] is not None for c in chunk_file(p, texts[p])]
    return cache[root]


def _overlapping(chunks: list[Chunk], path: str, lo: int, hi: int) -> set[int]:
    return {i for i, c in enumerate(chunks) if c.path == path and c.start <= hi and lo <= c.end}


def mine_episodes(traces: Path, state_dir: Path) -> tuple[list[Episode], dict[str, int]]:
    """Episodes with their relevant chunks, from every resolved trajectory under `traces`."""
    from vivace.bench.patch import parse_patch
    from vivace.harness.trajectory import Trajectory
    from vivace.tasks.suites import load_suite

    tasks = {t.id: t for t in load_suite("bundled")}
    trees: dict[Path, list[Chunk]] = {}
    found, bad_rows = _resolved_trajectories(traces)
    episodes, skipped = [], {"unknown_task": 0, "unreadable": bad_rows, "no_relevant_chunk": 0}
    for path in found:
        try:
            traj = Trajectory.load(path)
        except (OSError, ValueError):
            skipped["unreadable"] += 1
            continue
        task = tasks.get(traj.task_id or "")
        if task is None:
            skipped["unknown_task"] += 1
            continue
        chunks = _tree_chunks(Path(task.source(cache_dir=state_dir).path or ""), trees)
        edited: set[int] = set()
        for change in parse_patch(traj.diff):
            for m in _OLD_RANGE.finditer(change.text):
                start, count = int(m.group(1)), int(m.group(2) or 1)
                edited |= _overlapping(chunks, change.path, start, start + max(count, 1) - 1)
        edited_paths = {chunks[i].path for i in edited}
        episode = Episode(task.id, [traj.request], chunks)
        pending: list[str] = []  # search queries waiting for what the agent looks at next
        later: set[int] = set(edited)
        for turn in traj.turns:
            for call in turn.tool_calls:
                args = call.arguments if isinstance(call.arguments, dict) else {}
                if call.name == "codebase_search" and isinstance(args.get("query"), str) and not call.is_error:
                    pending.append(args["query"])
                elif call.name == "read_file" and not call.is_error and args.get("path") not in edited_paths:
                    got = _read_range(chunks, str(args.get("path", "")), args)
                    for q in pending:
                        episode.relevant.setdefault(q, set()).update(got | edited)
                    later |= got
        for q in pending:
            episode.relevant.setdefault(q, set()).update(edited)
        episode.relevant[traj.request] = later
        episode.relevant = {q: r for q, r in episode.relevant.items() if r}
        episode.queries = [q for q in dict.fromkeys([traj.request, *pending]) if q in episode.relevant]
        if episode.queries:
            episodes.append(episode)
        else:
            skipped["no_relevant_chunk"] += 1
    return episodes, skipped


def _read_range(chunks: list[Chunk], path: str, args: dict[str, Any]) -> set[int]:
    in_file = {i for i, c in enumerate(chunks) if c.path == path}
    offset, limit = args.get("offset"), args.get("limit")
    if isinstance(offset, int) or isinstance(limit, int):
        lo = offset if isinstance(offset, int) else 1
        return _overlapping(chunks, path, lo, lo + (limit if isinstance(limit, int) else 10**9) - 1)
    return in_file if len(in_file) <= SMALL_FILE_CHUNKS else set()


def heldout(task_id: str, fraction: float, seed: int) -> bool:
    h = int.from_bytes(hashlib.blake2b(f"{seed}:{task_id}".encode(), digest_size=8).digest(), "big")
    return h / 2**64 < fraction


def evaluate(cache: EmbeddingCache, episodes: list[Episode], ks: tuple[int, ...] = (1, 5, 10)) -> dict[str, float]:
    """Dense retrieval of each query's relevant chunks among all chunks of its tree."""
    recall = {k: [] for k in ks}
    rr = []
    for ep in episodes:
        vectors = cache.embed([embed_text(c) for c in ep.chunks])
        for q in ep.queries:
            order = np.argsort(-(vectors @ cache.embedder.encode_query(q)), kind="stable")
            rel = ep.relevant[q]
            ranks = [int(np.flatnonzero(order == i)[0]) + 1 for i in rel]
            for k in ks:
                recall[k].append(sum(r <= k for r in ranks) / len(rel))
            rr.append(1 / min(ranks))
    n = max(1, len(rr))
    return {**{f"recall@{k}": sum(v) / n for k, v in recall.items()}, "mrr": sum(rr) / n, "queries": len(rr)}


def _batches(pairs: list[tuple[str, str]], size: int, rng: random.Random) -> list[list[tuple[str, str]]]:
    """Shuffled batches in which no query and no chunk appears twice (in-batch negatives stay negative)."""
    rest = pairs[:]
    rng.shuffle(rest)
    out = []
    while rest:
        batch, seen_q, seen_p, left = [], set(), set(), []
        for q, p in rest:
            if len(batch) < size and q not in seen_q and p not in seen_p:
                batch.append((q, p))
                seen_q.add(q)
                seen_p.add(p)
            else:
                left.append((q, p))
        if len(batch) >= 2:  # a lone pair (all others clash with it) has no negatives: dropped
            out.append(batch)
        rest = left
    return out


def finetune(model_dir: Path, pairs: list[tuple[str, str]], cfg: TrainConfig, out_dir: Path, say: Callable) -> None:
    import torch
    from sentence_transformers import SentenceTransformer

    try:
        from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss
    except ImportError:  # sentence-transformers before 6
        from sentence_transformers.losses import MultipleNegativesRankingLoss

    torch.manual_seed(cfg.seed)
    model = SentenceTransformer(str(model_dir), device="cpu")
    loss_fn = MultipleNegativesRankingLoss(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
    rng = random.Random(cfg.seed)
    model.train()
    for epoch in range(cfg.epochs):
        losses_seen = []
        for batch in _batches(pairs, cfg.batch_size, rng):
            features = [_features(model, [q for q, _ in batch]), _features(model, [p for _, p in batch])]
            loss = loss_fn(features, torch.zeros(len(batch)))
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            losses_seen.append(loss.item())
        say(f"epoch {epoch + 1}/{cfg.epochs}: mean loss {np.mean(losses_seen):.4f} over {len(losses_seen)} steps")
    model.eval()
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save(str(out_dir))


def train_embedder(
    traces: Path,
    out_dir: Path,
    model: str | None,
    cfg: TrainConfig,
    state_dir: Path | None = None,
    say: Callable = print,
) -> dict[str, Any]:
    import tempfile

    t0 = time.perf_counter()
    if state_dir:
        episodes, skipped = mine_episodes(traces, Path(state_dir))
    else:  # the tasks' trees are built here only to be chunked: gone once the episodes are mined
        with tempfile.TemporaryDirectory(prefix="vivace-embedder-") as work:
            episodes, skipped = mine_episodes(traces, Path(work))
    test = [e for e in episodes if heldout(e.task_id, cfg.holdout, cfg.seed)]
    train = [e for e in episodes if not heldout(e.task_id, cfg.holdout, cfg.seed)]
    if not train or not test:
        raise ValueError(
            f"{len(episodes)} usable episodes under {traces} ({skipped}); need some to train and some held out — "
            "run `vivace bench` with more tasks (resolved episodes are used)"
        )
    pairs = []
    for ep in train:
        mine = [(q, embed_text(ep.chunks[i])) for q in ep.queries for i in sorted(ep.relevant[q])]
        pairs += mine[: cfg.max_pairs_per_task]
    if not _batches(pairs, cfg.batch_size, random.Random(cfg.seed)):
        raise ValueError(
            f"{len(episodes)} usable episodes under {traces} give {len(pairs)} training pairs from {len(train)} "
            "tasks, and no batch of 2 pairs with distinct queries and chunks (each query's negatives are the other "
            "pairs' chunks): nothing would train; run `vivace bench` with more tasks"
        )
    say(f"{len(episodes)} episodes: {len(pairs)} training pairs from {len(train)} tasks, {len(test)} tasks held out")
    base = Embedder(model)
    before = evaluate(EmbeddingCache(base), test)
    say(f"base model, held out: recall@5 {before['recall@5']:.3f}, MRR {before['mrr']:.3f}")
    finetune(resolve_model(model), pairs, cfg, out_dir, say)
    after = evaluate(EmbeddingCache(Embedder(out_dir)), test)
    say(f"fine-tuned, held out: recall@5 {after['recall@5']:.3f}, MRR {after['mrr']:.3f}")
    return {
        "model_dir": str(out_dir), "base_model": str(base.path), "episodes": len(episodes), "skipped": skipped,
        "train_tasks": len(train), "heldout_tasks": len(test), "train_pairs": len(pairs),
        "heldout_pairs": sum(len(e.relevant[q]) for e in test for q in e.queries), "config": cfg.__dict__,
        "before": before, "after": after, "seconds": time.perf_counter() - t0,
    }  # fmt: skip


def _features(model: Any, texts: list[str]) -> dict[str, Any]:
    """Tokenized inputs (`preprocess` in newer sentence-transformers, `tokenize` before it)."""
    return (getattr(model, "preprocess", None) or model.tokenize)(texts)
