"""The training loop: one controller owns it; the sampler, the rollouts and the trainer do the work.

Each step: take the next `tasks_per_step` tasks in the run's seeded order, roll out `group_size`
episodes of each on the current policy (the sampler's engine, continuously batched), score them
with the benchmark's scorer, turn rewards into group advantages, train one step, and send the new
weights to the sampler (bytes and seconds measured). Everything a step produced goes to the run
directory:

    runs/NAME/config.json         the whole configuration
    runs/NAME/metrics.jsonl       one line per step (rewards, components, advantages, loss, KL,
                                  throughput, weight sync, rollout times, agent behaviour)
    runs/NAME/tensorboard/        the same numbers as TensorBoard scalars
    runs/NAME/trajectories/step_N.jsonl   every rollout of step N (trajectory + reward)
    runs/NAME/checkpoints/step_N/ weights (HF directory), optimizer, step, data position, RNG
    runs/NAME/summary.json        the run's first and last numbers, written at the end

Resume (`--resume runs/NAME`): the last checkpoint's weights, optimizer and RNG are loaded and the
task order continues from its data position, so the run goes on as if never stopped; metrics of
steps after that checkpoint are discarded and recomputed.

The work runs on Ray actors by default (rl/workers.py: sampler, rollout workers, trainer ranks),
or in this process (`LocalWorkers`). Not covered here: the asynchronous pipeline and fault
handling (rollouts overlapping training, bounded by `max_staleness`), which come with the
pipeline issue.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.utils.tensorboard import SummaryWriter

from vivace.config import VivaceConfig
from vivace.rl.metrics import behaviour, mean, percentile
from vivace.rl.rollout import Rollout, to_samples
from vivace.rl.workers import RayWorkers
from vivace.tasks.format import Task
from vivace.tasks.suites import load_suite


class TaskOrder:
    """An endless, seeded order over the tasks: a fresh permutation every epoch; `position`
    (tasks handed out so far) is all a checkpoint needs to continue it."""

    def __init__(self, tasks: list[Task], seed: int, position: int = 0):
        if not tasks:
            raise ValueError("no tasks to train on: check --suite and the split")
        self.tasks, self.seed, self.position = tasks, seed, position

    def take(self, n: int) -> list[Task]:
        out = []
        for _ in range(n):
            epoch, i = divmod(self.position, len(self.tasks))
            perm = list(range(len(self.tasks)))
            random.Random(f"{self.seed}:{epoch}").shuffle(perm)
            out.append(self.tasks[perm[i]])
            self.position += 1
        return out


def new_run_dir(cfg: VivaceConfig, name: str | None) -> Path:
    name = name or time.strftime("train-%Y%m%d-%H%M%S")
    path = (cfg.train.runs_dir / name).resolve()  # absolute: actors write into it from their own cwd
    if (path / "metrics.jsonl").exists():
        raise FileExistsError(f"{path} already holds a run; resume it with --resume {path} or pick another --name")
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(cfg.model_dump_json(indent=2))
    return path


def latest_checkpoint(run_dir: Path) -> Path | None:
    steps = sorted(
        (int(p.name.split("_")[1]), p) for p in (run_dir / "checkpoints").glob("step_*") if (p / "state.json").is_file()
    )
    return steps[-1][1] if steps else None


async def train(
    cfg: VivaceConfig,
    run_dir: Path,
    resume: bool = False,
    on_step: Callable[[dict[str, Any]], None] | None = None,
    tasks: list[Task] | None = None,
    episode: Any = None,
    workers: Any = None,
) -> dict[str, Any]:
    """Runs (or resumes) the loop until `cfg.train.steps`; returns the summary. `tasks` and
    `episode` replace the suite and the benchmark episode (synthetic environments, tests);
    `workers` is where the work runs (default: Ray actors, see rl/workers.py)."""
    tc = cfg.train
    torch.manual_seed(tc.seed)
    tasks = tasks if tasks is not None else load_suite(tc.suite, split=tc.split)
    order = TaskOrder(tasks, tc.seed)
    start, ckpt = 0, None
    if resume:
        ckpt = latest_checkpoint(run_dir)
        if ckpt is not None:
            state = json.loads((ckpt / "state.json").read_text())
            order.position, start = state["data_position"], state["step"]
            torch.set_rng_state(torch.load(ckpt / "rng.pt", weights_only=False)["torch"])
        _truncate_metrics(run_dir, start)
    workers = workers or RayWorkers(cfg, episode)
    board = SummaryWriter(str(run_dir / "tensorboard"))
    try:
        await workers.start(start, ckpt)
        for step in range(start, tc.steps):
            row = await _step(step, order, workers, cfg, run_dir)
            with (run_dir / "metrics.jsonl").open("a") as f:
                f.write(json.dumps(row) + "\n")
            for key, value in row.items():
                if isinstance(value, int | float) and key != "step":
                    board.add_scalar(key, value, row["step"])
            board.flush()
            if on_step:
                on_step(row)
            if (step + 1) % tc.checkpoint_every == 0 or step + 1 == tc.steps:
                await _checkpoint(run_dir, workers, step + 1, order.position)
    finally:
        board.close()
        await workers.close()
    return write_summary(run_dir)


async def _step(step: int, order: TaskOrder, workers: Any, cfg: VivaceConfig, run_dir: Path) -> dict[str, Any]:
    t0 = time.perf_counter()
    tokens_before = await workers.sampled_tokens()
    groups = await workers.rollout(order.take(cfg.train.tasks_per_step))
    rollout_s = time.perf_counter() - t0
    generated = await workers.sampled_tokens() - tokens_before
    samples, counts = to_samples(groups, cfg, version=step)
    train_stats = await workers.train_step(samples) if samples else {}
    sync_bytes, sync_s = await workers.sync(step + 1)
    flat = [r for g in groups for r in g]
    _save_rollouts(run_dir, step, flat)
    row = _row(step, flat, counts, train_stats, rollout_s, generated, time.perf_counter() - t0)
    row.update(weight_sync_s=sync_s, weight_sync_bytes=sync_bytes)
    return row


def _row(step, flat: list[Rollout], counts, train_stats, rollout_s, generated, step_s) -> dict:
    ok = [r for r in flat if r.trajectory is not None]
    behaviours = [behaviour(r.trajectory) for r in ok]
    row: dict[str, Any] = {
        "step": step + 1,
        "rollouts": len(flat),
        "reward_mean": mean([r.reward for r in flat]),
        "success_rate": mean([1.0 if r.resolved else 0.0 for r in flat]),
        **{f"reward_{k}": mean([r.components.get(k, 0.0) for r in ok]) for k in ("correctness", "adherence", "efficiency", "claims", "format")},
        **counts,
        **train_stats,
        "sampling_tokens": generated,
        "sampling_tokens_per_s": generated / rollout_s if rollout_s else 0.0,
        "rollout_s": rollout_s,
        "episode_s_p50": percentile([r.trajectory.wall_s for r in ok], 0.5),
        "episode_s_p99": percentile([r.trajectory.wall_s for r in ok], 0.99),
        "unsupported_claims": mean([1.0 if r.details.get("unsupported_claims") else 0.0 for r in ok]),
        "step_s": step_s,
    }  # fmt: skip
    for key in ("turns", "tool_calls_per_turn", "reads_before_first_edit", "edits", "test_runs", "lint_calls"):
        row[f"agent_{key}"] = mean([b[key] for b in behaviours])
    return row


def _save_rollouts(run_dir: Path, step: int, flat: list[Rollout]) -> None:
    path = run_dir / "trajectories" / f"step_{step + 1}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for r in flat:
            f.write(json.dumps({"task_id": r.task_id, "reward": r.reward, "resolved": r.resolved, "error": r.error,
                                "trajectory": r.trajectory.model_dump() if r.trajectory else None}) + "\n")  # fmt: skip


async def _checkpoint(run_dir: Path, workers: Any, step: int, position: int) -> None:
    path = run_dir / "checkpoints" / f"step_{step}"
    await workers.save(path)
    torch.save({"torch": torch.get_rng_state()}, path / "rng.pt")
    (path / "state.json").write_text(json.dumps({"step": step, "data_position": position}))  # written last: complete


def _truncate_metrics(run_dir: Path, step: int) -> None:
    path = run_dir / "metrics.jsonl"
    if path.exists():
        keep = [line for line in path.read_text().splitlines() if line and json.loads(line)["step"] <= step]
        path.write_text("".join(line + "\n" for line in keep))


def write_summary(run_dir: Path) -> dict[str, Any]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line]
    first, last = rows[0], rows[-1]
    keys = ("reward_mean", "success_rate", "agent_turns", "agent_tool_calls_per_turn", "loss", "entropy")
    summary = {
        "steps": len(rows),
        "first": {k: first.get(k) for k in keys},
        "last": {k: last.get(k) for k in keys},
        "rollouts": sum(r["rollouts"] for r in rows),
        "wall_s": sum(r["step_s"] for r in rows),
        "checkpoint": str(latest_checkpoint(run_dir)),
    }
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary
