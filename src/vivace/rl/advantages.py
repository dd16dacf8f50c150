"""Group-relative advantages: G rollouts of one task from the same start, each judged against
its siblings rather than against a learned value function.

- `mean`: A_i = r_i - mean(r) (Dr. GRPO: no division, so easy and hard groups weigh the same);
- `std`:  A_i = (r_i - mean(r)) / (std(r) + eps) (GRPO);
- `loo`:  A_i = r_i - mean(r_j, j != i) = G/(G-1) * (r_i - mean(r)) (RLOO: the baseline is
  independent of the sample it judges, so the estimate is unbiased).

A group whose rewards are all equal carries no signal (every advantage is 0): it is dropped
and counted. Episodes cut off by a limit (turns, tokens, time) did not finish, so their reward
says little about their actions: with `mask_truncated` they still count in their group's
baseline but get no loss of their own (advantage set to None).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

AdvantageMode = Literal["mean", "std", "loo"]
EPS = 1e-6


def group_advantages(
    rewards: Sequence[float],
    mode: AdvantageMode = "mean",
    truncated: Sequence[bool] | None = None,
    mask_truncated: bool = False,
) -> list[float | None] | None:
    """Advantages for one group, or None when the group has no signal (all rewards equal)."""
    n = len(rewards)
    if n < 2:
        raise ValueError("a group needs at least 2 rollouts to have a baseline")
    mean = sum(rewards) / n
    if max(rewards) - min(rewards) <= EPS:
        return None
    if mode == "mean":
        adv = [r - mean for r in rewards]
    elif mode == "std":
        std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / (n - 1))
        adv = [(r - mean) / (std + EPS) for r in rewards]
    elif mode == "loo":
        adv = [r - (mean * n - r) / (n - 1) for r in rewards]
    else:
        raise ValueError(f"unknown advantage mode {mode!r}: mean, std or loo")
    if mask_truncated and truncated is not None:
        return [None if t else a for a, t in zip(adv, truncated, strict=True)]
    return list(adv)
