"""Expert data for the warm start (`vivace sft data`): the scripted oracle and its correct but
inefficient variants acting through the real harness, recorded as training sequences.

Every episode is `bench.runner.run_task` — the same workspace, tools, loop and scorer as the
benchmark and RL — with the oracle wrapped in `harness.policy.TeacherTokens`, so its turns become
exactly the token sequence a model would have to produce (loss mask 1 on assistant tokens, 0 on
the prompt and tool results: the masking RL uses). Only episodes the scorer marks resolved are
kept. One JSON line per episode:

    {"task_id", "style", "split", "reward", "turns", "tool_calls", "ids", "loss_mask", "messages"}

`messages` is the OpenAI-style export, for other trainers. Styles (bench/baselines.py):
efficient, serial (one call per turn), redundant (a needless listing, re-reads), no-tests. Edits
use minimal unique old_string fragments unless `minimal` is off.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

from vivace.aio import gather_all
from vivace.bench.baselines import STYLES, _Oracle
from vivace.bench.report import why_unresolved
from vivace.bench.runner import run_task
from vivace.config import VivaceConfig
from vivace.harness.chat import ChatFormat
from vivace.harness.policy import TeacherTokens
from vivace.tasks.format import Task


async def expert_data(
    cfg: VivaceConfig,
    tasks: list[Task],
    out: Path,
    *,
    model: str = "tiny",
    styles: tuple[str, ...] = STYLES,
    minimal: bool = True,
    max_tokens: int | None = None,
    styles_per_task: int | None = None,
    concurrency: int = 4,
    progress: Callable[[int, int], None] = lambda done, total: None,
) -> dict[str, Any]:
    """Runs every (task, style) episode and writes the resolved ones no longer than `max_tokens`
    (the model's context; None: any length) to `out` (JSONL); returns what was kept and why not.
    Until the last episode has run they go to `partial_path(out)`, which a stopped run leaves behind.
    `styles_per_task` k: task i gets only k styles, taken in turn from position i (a mix of
    behaviours at a fraction of the episodes)."""
    from vivace.model.checkpoint import load_tokenizer
    from vivace.sandbox import open_backend

    bad = [s for s in styles if s not in STYLES]
    if bad:
        raise ValueError(f"unknown style(s) {bad}; choose from {', '.join(STYLES)}")
    chat = ChatFormat(load_tokenizer(model))
    backend = open_backend(cfg.sandbox)
    sem = asyncio.Semaphore(concurrency)
    k = len(styles) if styles_per_task is None else max(1, min(styles_per_task, len(styles)))
    jobs = [(t, styles[(i + j) % len(styles)]) for i, t in enumerate(tasks) for j in range(k)]
    counts: Counter[str] = Counter()
    dropped: dict[str, str] = {}  # "task (style)" -> why its episode was not kept (errors and unresolved)
    done = 0
    out.parent.mkdir(parents=True, exist_ok=True)

    async def one(task: Task, style: str, f: Any) -> None:
        nonlocal done
        async with sem:
            try:
                traj, score = await run_task(TeacherTokens(_Oracle(task, style, minimal), chat), task, cfg, backend)
            except Exception as e:  # a broken task is counted and skipped, not fatal
                counts[f"error:{type(e).__name__}"] += 1
                dropped[f"{task.id} ({style})"] = f"{type(e).__name__}: {e}"[:300]
                traj = score = None
        done += 1
        progress(done, len(jobs))
        if score is None or traj.tokens is None:
            return
        if not score.resolved:
            counts[f"unresolved:{style}"] += 1
            dropped[f"{task.id} ({style})"] = why_unresolved(score.details, task.tests.timeout_s)
            return
        if max_tokens is not None and len(traj.tokens.ids) > max_tokens:
            counts[f"too_long:{style}"] += 1
            return
        counts[f"kept:{style}"] += 1
        counts["tokens"] += len(traj.tokens.ids)
        counts["trained_tokens"] += sum(traj.tokens.loss_mask)
        _append_line(f, json.dumps({
            "task_id": task.id, "style": style, "split": task.split, "reward": score.total, "turns": len(traj.turns),
            "tool_calls": traj.tool_calls, "ids": traj.tokens.ids, "loss_mask": traj.tokens.loss_mask,
            "messages": traj.to_messages(),
        }) + "\n")  # fmt: skip

    partial = partial_path(out)  # renamed to `out` when every episode has run: a stopped run is clearly partial
    try:
        try:  # "x": never over another run's partial set (one running now, or one stopped)
            f = partial.open("xb", buffering=0)  # unbuffered: each line is on disk whole, or not at all
        except FileExistsError:
            raise ValueError(f"{partial} exists: another run is writing it, or one was stopped; move it aside (it "
                             "is a usable partial set) or delete it, then run this again") from None  # fmt: skip
        with f:
            await gather_all(*(one(t, s, f) for t, s in jobs))
    finally:
        await backend.aclose()
    partial.replace(out)
    kept = sum(v for k, v in counts.items() if k.startswith("kept:"))
    failed = dict(sorted(dropped.items())[:20])  # a broken suite names its first tasks, not thousands
    return {"episodes": len(jobs), "kept": kept, "out": str(out), **dict(sorted(counts.items())),
            **({"not_kept": failed} if failed else {})}  # fmt: skip


def _append_line(f: BinaryIO, line: str) -> None:
    """Writes `line` whole to the unbuffered file `f`, or none of it: a write that fails part way (a disk
    that filled) is cut off again, so the file stays valid JSONL, every episode kept so far whole. The
    OSError is raised again, naming the file."""
    start, data = f.tell(), memoryview(line.encode())
    try:
        while data:
            data = data[f.write(data) :]
    except OSError as e:
        f.seek(start)  # and the next line goes there, not after a hole
        f.truncate()
        raise OSError(e.errno, e.strerror, f.name) from None


def partial_path(out: Path) -> Path:
    """Where `expert_data` writes `out` until every episode has run (left there when it is stopped)."""
    return out.with_name(out.name + ".partial")


async def anchor_data(
    cfg: VivaceConfig,
    tasks: list[Task],
    out: Path,
    *,
    n: int,
    seed: int = 0,
    progress: Callable[[int, int], None] = lambda done, total: None,
) -> dict[str, Any]:
    """The supervised term's data for an RL run (`train.sft_expert`): the efficient expert on `n` of the
    run's training tasks (a seeded draw), and one copy of each episode with its package renamed to a
    fresh name. The copies keep the policy practising what RL's tasks cannot show it: copying names
    it has never met, which held-out repositories are made of."""
    from vivace.harness.tools import default_tools
    from vivace.harness.tools.base import tool_schema
    from vivace.model.checkpoint import load_tokenizer
    from vivace.rl.sft_augment import augment_episodes

    drawn = random.Random(seed).sample(tasks, min(n, len(tasks)))
    recorded = out.with_suffix(".recorded.jsonl")
    await expert_data(cfg, drawn, recorded, model=cfg.train.model, styles=("efficient",),
                      concurrency=cfg.train.rollout_concurrency, progress=progress)  # fmt: skip
    chat = ChatFormat(load_tokenizer(cfg.train.model))
    tools = [tool_schema(t) for t in default_tools()]
    with recorded.open() as f:
        rows = [json.loads(line) for line in f if line.strip()]
    recorded.unlink()
    if not rows:  # nothing to write: no empty file for a resumed run to mistake for data
        return {"tasks": len(drawn), "episodes": 0, "renamed": 0}
    renamed = list(augment_episodes(iter(rows), chat, tools, variants=1, seed=seed, cuts=("whole",)))
    tmp = out.with_suffix(".tmp")
    with tmp.open("w") as f:  # written whole, then renamed: a run stopped here leaves no half file behind
        for row in rows + renamed:
            f.write(json.dumps({"ids": row["ids"], "loss_mask": row["loss_mask"]}) + "\n")
    tmp.replace(out)
    return {"tasks": len(drawn), "episodes": len(rows), "renamed": len(renamed)}
