"""Expert demonstrations inside RL groups (`train.expert_weight`): off-policy guidance.

Each trained step, every task in the batch also gets one episode of the scripted oracle
(`bench.baselines._Oracle`, the warm start's expert, efficient style, minimal edits) through the
same harness, recorded as the tokens the policy would have had to sample (`TeacherTokens`). It
joins its group as one more member with advantage

    A_expert = expert_weight * (r_expert - mean(r_policy))

so it teaches most where the policy failed the task: a group whose rollouts all failed, which
plain group-relative RL drops, now trains on the demonstration. A group the policy already
solves as well as the oracle gives it nothing. Its tokens were not sampled by the policy, so
there is no sampler logprob: the trainer takes its own (`NaN` here, see `Trainer._forward`),
the importance weight is 1 and the token's gradient is A * grad log p, an advantage-weighted
imitation term. Mixing demonstrations into the policy's groups is the LUFFY recipe
(Yan et al. 2025); it differs from a KL anchor in what it holds: the demonstrated copy and fix,
tokens the policy rarely samples.

Unresolved oracle episodes (a task whose reference patch does not apply in its workspace) are
skipped and counted.
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

from vivace.bench.baselines import _Oracle
from vivace.bench.runner import run_task
from vivace.config import VivaceConfig
from vivace.harness.policy import TeacherTokens
from vivace.rl.rollout import Rollout
from vivace.rl.trainer import Sample
from vivace.tasks.format import Task


async def expert_samples(
    batch: list[tuple[Task, list[Rollout]]], cfg: VivaceConfig, chat: Any, backend: Any, version: int
) -> tuple[list[Sample], dict[str, float]]:
    """One demonstration per (task, policy rollouts) pair with a positive advantage, and counts."""
    weight = cfg.train.expert_weight
    results = await asyncio.gather(
        *(
            run_task(TeacherTokens(_Oracle(task, "efficient", minimal=True), chat), task, cfg, backend)
            for task, _ in batch
        ),
        return_exceptions=True,
    )
    samples: list[Sample] = []
    counts = {"expert_samples": 0, "expert_failed": 0, "expert_not_better": 0}
    advantages = []
    for (_, group), result in zip(batch, results, strict=True):
        if isinstance(result, BaseException) or not result[1].resolved or result[0].tokens is None:
            counts["expert_failed"] += 1
            continue
        traj, score = result
        rewards = [r.reward for r in group if r.error is None]
        advantage = weight * (score.total - (sum(rewards) / len(rewards) if rewards else 0.0))
        if advantage <= 0:
            counts["expert_not_better"] += 1
            continue
        ids, mask = traj.tokens.ids, traj.tokens.loss_mask
        samples.append(Sample(ids, list(mask), [math.nan] * len(ids), [version] * len(ids), advantage))
        advantages.append(advantage)
    counts["expert_samples"] = len(samples)
    if advantages:
        counts["expert_adv_mean"] = sum(advantages) / len(advantages)
    return samples, counts
