"""Rollouts: G episodes per task through the benchmark's own episode function, turned into
trainer samples with group-relative advantages.

Each rollout is `bench.runner.run_task` — the same sandboxed workspace, agent loop, tools and
scorer as `vivace bench` and `vivace agent` — so the reward is exactly the benchmark's total
score. A group is kept only when its rewards differ; a sample is kept only when its tokens are
at most `max_staleness` policy versions behind the trainer. What was dropped is counted.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from vivace.bench.runner import run_task
from vivace.config import VivaceConfig
from vivace.harness.trajectory import Trajectory
from vivace.rl.advantages import group_advantages
from vivace.rl.trainer import Sample
from vivace.tasks.format import Task

TRUNCATED = ("max_turns", "max_tokens", "timeout")


@dataclass
class Rollout:
    task_id: str
    trajectory: Trajectory | None
    reward: float
    components: dict[str, float] = field(default_factory=dict)
    resolved: bool = False
    details: dict[str, Any] = field(default_factory=dict)
    error: str | None = None

    @property
    def truncated(self) -> bool:
        return self.trajectory is not None and self.trajectory.stop_reason in TRUNCATED


async def rollout_groups(
    policy: Any, tasks: list[Task], cfg: VivaceConfig, backend: Any, episode: Any = run_task
) -> list[list[Rollout]]:
    """`group_size` episodes of every task, at most `rollout_concurrency` at once. `episode` is
    `bench.runner.run_task` (the benchmark's episode and score) unless a synthetic environment
    (rl/synthetic.py) replaces it."""
    sem = asyncio.Semaphore(cfg.train.rollout_concurrency)

    async def one(task: Task) -> Rollout:
        async with sem:
            try:
                traj, score = await episode(policy, task, cfg, backend)
            except Exception as e:  # an environment failure is counted, not trained on
                return Rollout(task.id, None, 0.0, error=f"{type(e).__name__}: {e}")
        components = {k: getattr(score, k) for k in ("correctness", "adherence", "efficiency", "claims", "format")}
        return Rollout(task.id, traj, score.total, components, score.resolved, score.details)

    g = cfg.train.group_size
    flat = await asyncio.gather(*(one(t) for t in tasks for _ in range(g)))
    return [list(flat[i : i + g]) for i in range(0, len(flat), g)]


def to_samples(groups: list[list[Rollout]], cfg: VivaceConfig, version: int) -> tuple[list[Sample], dict[str, float]]:
    """Samples with advantages from scored groups, and counts of what was left out and why."""
    tc = cfg.train
    samples: list[Sample] = []
    counts = {"groups": len(groups), "groups_zero_variance": 0, "rollouts_failed": 0, "samples_masked_truncated": 0,
              "samples_too_stale": 0, "samples_without_tokens": 0}  # fmt: skip
    advantages: list[float] = []
    for group in groups:
        ok = [r for r in group if r.error is None]
        counts["rollouts_failed"] += len(group) - len(ok)
        if len(ok) < 2:
            counts["groups_zero_variance"] += 1
            continue
        adv = group_advantages([r.reward for r in ok], tc.advantage, [r.truncated for r in ok], tc.mask_truncated)
        if adv is None:
            counts["groups_zero_variance"] += 1
            continue
        for r, a in zip(ok, adv, strict=True):
            tokens = r.trajectory.tokens if r.trajectory else None
            if a is None:
                counts["samples_masked_truncated"] += 1
            elif tokens is None or not any(tokens.loss_mask):
                counts["samples_without_tokens"] += 1
            elif (
                min(v for v, m in zip(tokens.versions, tokens.loss_mask, strict=True) if m) < version - tc.max_staleness
            ):
                counts["samples_too_stale"] += 1
            else:
                samples.append(Sample(tokens.ids, tokens.loss_mask, tokens.logprobs, tokens.versions, a))
                advantages.append(a)
    counts["samples"] = len(samples)
    if advantages:
        mean = sum(advantages) / len(advantages)
        counts.update(adv_mean=mean, adv_abs_mean=sum(map(abs, advantages)) / len(advantages),
                      adv_min=min(advantages), adv_max=max(advantages))  # fmt: skip
    return samples, counts
