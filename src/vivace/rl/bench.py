"""`vivace train bench-pipeline`: the rollout pipeline's throughput, synchronous vs asynchronous.

Each mode is a real training run (`controller.train`: engine, harness, workspaces, trainer, weight
sync) on the heavy-tailed synthetic environment of rl/synthetic.py (`latency_episode`), with the
same tasks, seeds and resources; only the pipeline settings differ:

    sync          batch barrier: a step's episodes start together, the next step's after the update
    async         rollouts never stop; the trainer takes the first complete groups (max_staleness k)
    async-abort   as async, but episodes in flight at a weight update are aborted and re-queued

Reported per mode: trajectories trained per minute (over the steps' wall time, startup excluded),
the samplers' busy fraction (time inside an engine step / wall time), the staleness of trained
samples (versions between the trainer and a sample's oldest token), p50/p99 episode time, and
the pipeline counts (started, finished, re-queued, aborted).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from vivace.bench.results import result_rows
from vivace.config import VivaceConfig
from vivace.rl.controller import train
from vivace.rl.metrics import percentile
from vivace.rl.runs import new_run_dir
from vivace.rl.synthetic import latency_episode
from vivace.rl.workers import LocalWorkers, RayWorkers
from vivace.tasks.format import RepoSpec, Task, TestSpec

MODES: dict[str, dict[str, Any]] = {
    "sync": {"pipeline": "sync"},
    "async": {"pipeline": "async", "partial_episodes": "continue"},
    "async-abort": {"pipeline": "async", "partial_episodes": "abort"},
}


def _tasks(repo: Path, n: int = 8) -> list[Task]:
    return [
        Task(id=f"pipeline-{i}", repo=RepoSpec(path=str(repo)), request=f"Run the environment (task {i}).",
             tests=TestSpec(command="true", fail_to_pass=["t::a"], pass_to_pass=[]))
        for i in range(n)
    ]  # fmt: skip


async def bench_pipeline(
    cfg: VivaceConfig,
    work_dir: Path,
    *,
    modes: list[str],
    median_s: float,
    sigma: float,
    turns: tuple[int, int],
    local: bool = False,
    say: Callable[[str], None] = lambda s: None,
) -> dict[str, Any]:
    from vivace.sandbox import open_backend

    unknown = [m for m in modes if m not in MODES]
    if unknown:
        raise ValueError(f"unknown mode(s) {unknown}; choose from {', '.join(MODES)}")
    repo = work_dir / "repo"
    repo.mkdir(parents=True, exist_ok=True)
    (repo / "main.py").write_text("def step():\n    return 1\n")
    backend = open_backend(cfg.sandbox)  # only to take the snapshot: the workers open their own
    try:
        snapshot = backend.snapshot(str(repo))
    finally:  # left open, its owner directory stayed for the next command to sweep as a dead process's
        await backend.aclose()
    tasks = _tasks(repo)
    results: dict[str, Any] = {}
    for mode in modes:
        mcfg = cfg.model_copy(deep=True)
        # (no supervised term: the synthetic environment has no expert to record)
        mcfg.train = mcfg.train.model_copy(update={**MODES[mode], "runs_dir": work_dir / "runs", "sft_expert": 0})
        run_dir = new_run_dir(mcfg, f"{mode}-{time.strftime('%H%M%S')}")
        episode = latency_episode(snapshot, median_s=median_s, sigma=sigma, turns=turns, seed=mcfg.train.seed)
        workers = LocalWorkers(mcfg, episode) if local else RayWorkers(mcfg, episode)
        rows: list[dict] = []

        def on_step(row: dict, mode: str = mode, rows: list = rows, steps: int = mcfg.train.steps) -> None:
            rows.append(row)
            say(f"{mode}: step {row['step']}/{steps}, {row['step_s']:.1f} s, sampler busy {row['sampler_busy']:.0%}")

        await train(mcfg, run_dir, tasks=tasks, episode=episode, workers=workers, on_step=on_step)
        results[mode] = measure(run_dir, rows)
    if "sync" in results:
        base = results["sync"]["trajectories_per_min"]
        for r in results.values():
            r["speedup_vs_sync"] = r["trajectories_per_min"] / base if base else None
    return {
        "workload": {"tool_latency": f"log-normal, median {median_s} s, sigma {sigma}", "turns": list(turns),
                     "steps": cfg.train.steps, "tasks_per_step": cfg.train.tasks_per_step,
                     "group_size": cfg.train.group_size, "rollout_concurrency": cfg.train.rollout_concurrency,
                     "max_staleness": cfg.train.max_staleness, "sampler_replicas": cfg.train.sampler_replicas,
                     "workers": "local" if local else "ray"},
        "modes": results,
    }  # fmt: skip


def measure(run_dir: Path, rows: list[dict]) -> dict[str, Any]:
    """A mode's numbers from its run directory (trajectories, timeline) and metrics rows."""
    wall = sum(r["step_s"] for r in rows)
    trained = sum(r["rollouts"] for r in rows)
    busy = sum(r["sampler_busy"] * r["step_s"] for r in rows) / wall if wall else 0.0
    staleness: Counter[int] = Counter()
    for row in rows:  # step N trains with weights version N - 1
        for _, sample in result_rows(run_dir / "trajectories" / f"step_{row['step']}.jsonl", "trajectory row"):
            tokens = (sample["trajectory"] or {}).get("tokens")
            sampled = [v for v, m in zip(tokens["versions"], tokens["loss_mask"], strict=True) if m] if tokens else []
            if sampled:
                staleness[row["step"] - 1 - min(sampled)] += 1
    timeline = [event for _, event in result_rows(run_dir / "timeline.jsonl", "timeline row")]
    finished = [t["end_s"] - t["start_s"] for t in timeline if t["outcome"] == "finished"]
    last = rows[-1] if rows else {}
    return {
        "trajectories_per_min": 60.0 * trained / wall if wall else 0.0,
        "trained_trajectories": trained,
        "wall_s": wall,
        "sampler_busy": busy,
        "staleness": {str(k): v for k, v in sorted(staleness.items())},
        "episode_s_p50": percentile(finished, 0.5),
        "episode_s_p99": percentile(finished, 0.99),
        "episodes_started": last.get("episodes_started", 0),
        "episodes_finished": last.get("episodes_finished", 0),
        "episodes_requeued": last.get("episodes_requeued", 0),
        "episodes_aborted": last.get("episodes_aborted_update", 0) + last.get("episodes_aborted_stale", 0),
        "run_dir": str(run_dir),
    }
