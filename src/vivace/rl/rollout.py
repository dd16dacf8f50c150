"""Rollouts: G episodes per task through the benchmark's own episode function, turned into
trainer samples with group-relative advantages.

Each rollout is `bench.runner.run_task` — the same sandboxed workspace, agent loop, tools and
scorer as `vivace bench` and `vivace agent` — so the reward is the benchmark's total score, plus
the training-only milestone rewards when configured (`train.milestone_read/_edit`: a non-test
file read, an edit that applied; rl.metrics.milestones). A group is kept only when its rewards
differ (with `group_filter = "correctness"`, only when its outcomes do); a sample is kept only
when its tokens are at most `max_staleness` policy versions behind the trainer. What was
dropped is counted.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from vivace.bench.runner import run_task
from vivace.config import VivaceConfig
from vivace.harness.policy import TokenPolicy
from vivace.harness.trajectory import Trajectory
from vivace.inference.samplers import StickyRouter
from vivace.rl.advantages import group_advantages
from vivace.rl.metrics import code_calls, milestones
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
    milestones: dict[str, bool] = field(default_factory=dict)  # rl.metrics.milestones of the trajectory

    @property
    def truncated(self) -> bool:
        return self.trajectory is not None and self.trajectory.stop_reason in TRUNCATED


@dataclass
class EpisodeResult:
    """What a rollout worker returns for one episode attempt. `status`: ok (a scored rollout),
    sampler_lost (the sampler replica serving it died: re-queue it), env_failed (the workspace or
    the episode raised: re-queue it, up to the attempt limit)."""

    status: str
    rollout: Rollout | None = None
    sampler: int | None = None  # replica index that served it
    error: str | None = None
    dead_samplers: list[int] = field(default_factory=list)  # replicas found dead on the way (to replace)


async def run_attempt(
    replicas: list[Any], chat: Any, params: Any, name: str, task: Task, cfg: VivaceConfig, backend: Any,
    episode: Any = None, is_loss: Any = lambda e: False,
) -> EpisodeResult:  # fmt: skip
    """One episode on the least-loaded sampler replica (sticky for its later turns), scored by
    `episode`: `bench.runner.run_task` (the benchmark's episode and score) unless a synthetic
    environment (rl/synthetic.py) replaces it (None: run_task). `is_loss(exc)` says an exception means the replica
    is gone (a dead Ray actor)."""
    episode = episode or run_task
    router = StickyRouter(replicas, is_loss)
    policy = TokenPolicy(router, chat, name=name, params=params)
    try:
        traj, score = await episode(policy, task, cfg, backend)
    except Exception as e:
        status = "sampler_lost" if router.lost is not None else "env_failed"
        return EpisodeResult(status, sampler=router.chosen, error=f"{type(e).__name__}: {e}",
                             dead_samplers=sorted(router.seen_dead))  # fmt: skip
    if router.lost is not None:  # the loop recorded the failure as the episode's end: not a real one
        return EpisodeResult("sampler_lost", sampler=router.lost, error=traj.error,
                             dead_samplers=sorted(router.seen_dead | {router.lost}))  # fmt: skip
    components = {k: getattr(score, k) for k in ("correctness", "adherence", "efficiency", "claims", "format")}
    reached = milestones(traj)
    # Training-only milestone rewards on top of the benchmark score (0 unless configured).
    bonus = cfg.train.milestone_read * reached["read"] + cfg.train.milestone_edit * reached["edit"]
    rollout = Rollout(task.id, traj, score.total + bonus, components, score.resolved, score.details,
                      milestones=reached)  # fmt: skip
    return EpisodeResult("ok", rollout, sampler=router.chosen, dead_samplers=sorted(router.seen_dead))


def to_samples(groups: list[list[Rollout]], cfg: VivaceConfig, version: int) -> tuple[list[Sample], dict[str, float]]:
    """Samples with advantages from scored groups, and counts of what was left out and why."""
    tc = cfg.train
    samples: list[Sample] = []
    counts = {"groups": len(groups), "groups_zero_variance": 0, "groups_same_correctness": 0, "rollouts_failed": 0,
              "samples_masked_truncated": 0, "turns_masked_malformed": 0, "turns_credited": 0,
              "samples_too_stale": 0, "samples_without_tokens": 0}  # fmt: skip
    rates = call_success_rates([r for g in groups for r in g if r.error is None]) if tc.call_credit > 0 else None
    advantages: list[float] = []
    staleness: list[int] = []
    for group in groups:
        ok = [r for r in group if r.error is None]
        counts["rollouts_failed"] += len(group) - len(ok)
        if len(ok) < 2:
            counts["groups_zero_variance"] += 1
            continue
        cut = [r.truncated and (tc.mask_truncated is True or r.resolved) for r in ok]
        adv = group_advantages([r.reward for r in ok], tc.advantage, cut, bool(tc.mask_truncated))
        if adv is not None and tc.group_filter == "correctness" and len({_outcome(r, tc) for r in ok}) < 2:
            counts["groups_same_correctness"] += 1
            adv = None
        elif adv is None:
            counts["groups_zero_variance"] += 1
        if adv is None and rates is None:
            continue
        for i, r in enumerate(ok):
            a = adv[i] if adv is not None else None
            if adv is not None and a is None:
                counts["samples_masked_truncated"] += 1
                if rates is None:
                    continue
            tokens = r.trajectory.tokens if r.trajectory else None
            if tokens is None or not any(tokens.loss_mask):
                counts["samples_without_tokens"] += 1
                continue
            oldest = min(v for v, m in zip(tokens.versions, tokens.loss_mask, strict=True) if m)
            if oldest < version - tc.max_staleness:
                counts["samples_too_stale"] += 1
                continue
            mask, token_adv = tokens.loss_mask, None
            if a is not None:
                a = a * tc.negative_scale if a < 0 else a
                if a > 0 and tc.mask_malformed:
                    mask, masked = without_malformed_turns(r.trajectory)
                    counts["turns_masked_malformed"] += masked
            if rates is not None:  # the episode's advantage (0 without one) plus each credited turn's own
                mask, token_adv, credited = with_call_credit(r.trajectory, mask, a or 0.0, rates, tc.call_credit,
                                                             keep_all=a is not None)  # fmt: skip
                counts["turns_credited"] += credited
            if not any(mask):
                counts["samples_without_tokens"] += 1
                continue
            samples.append(Sample(tokens.ids, mask, tokens.logprobs, tokens.versions, a or 0.0, token_adv))
            advantages.append(a or 0.0)
            staleness.append(version - oldest)
    counts["samples"] = len(samples)
    if staleness:  # versions behind the trainer of each kept sample's oldest token
        counts.update(staleness_mean=sum(staleness) / len(staleness), staleness_max=max(staleness))
    if advantages:
        mean = sum(advantages) / len(advantages)
        counts.update(adv_mean=mean, adv_abs_mean=sum(map(abs, advantages)) / len(advantages),
                      adv_min=min(advantages), adv_max=max(advantages))  # fmt: skip
    if rates is not None:
        counts.update({f"call_success_{name}": rate for name, rate in rates.items()})
    return samples, counts


def call_success_rates(rollouts: list[Rollout]) -> dict[str, float]:
    """Per credited tool, the share of its calls (rl.metrics.code_calls) that succeeded: the
    baseline each call's own credit is measured against."""
    outcomes: dict[str, list[bool]] = {}
    for r in rollouts:
        for turn in r.trajectory.turns if r.trajectory else []:
            for name, ok in code_calls(turn):
                outcomes.setdefault(name, []).append(ok)
    return {name: sum(oks) / len(oks) for name, oks in sorted(outcomes.items())}


def with_call_credit(
    traj: Trajectory, mask: list[int], advantage: float, rates: dict[str, float], weight: float, keep_all: bool
) -> tuple[list[int], list[float], int]:
    """(mask, per-position advantages, turns credited). Each turn's advantage is the episode's plus
    weight * (succeeded - rate) summed over its credited calls. keep_all: the mask stays as it
    was; else only the credited turns keep theirs (an episode with no advantage of its own). The
    k-th run of sampled tokens is the k-th turn; when they do not line up, nothing is credited."""
    runs = _runs(traj.tokens.loss_mask) if traj.tokens else []
    token_adv = [advantage] * len(mask)
    out = list(mask) if keep_all else [0] * len(mask)
    if len(runs) != len(traj.turns):
        return out, token_adv, 0
    credited = 0
    for (start, end), turn in zip(runs, traj.turns, strict=True):
        calls = code_calls(turn)
        if not calls:
            continue
        credit = weight * sum((1.0 if ok else 0.0) - rates[name] for name, ok in calls)
        token_adv[start:end] = [advantage + credit] * (end - start)
        out[start:end] = mask[start:end]
        credited += any(mask[start:end])
    return out, token_adv, credited


def _outcome(r: Rollout, tc: Any) -> tuple[bool, ...]:
    """What the correctness filter compares: solved or not, and each milestone that earns a reward."""
    rewarded = [k for k, w in (("read", tc.milestone_read), ("edit", tc.milestone_edit)) if w > 0]
    return (r.resolved, *(r.milestones.get(k, False) for k in rewarded))


def _runs(mask: list[int]) -> list[tuple[int, int]]:
    """[start, end) of each run of 1s: a token-level episode's sampled turns, in order."""
    runs, start = [], None
    for i, m in enumerate([*mask, 0]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            runs.append((start, i))
            start = None
    return runs


def without_malformed_turns(traj: Trajectory) -> tuple[list[int], int]:
    """The episode's loss mask with the turns that made a malformed tool call, or that were cut
    off at the turn's token limit, set to 0, and how many turns that was. The k-th run of 1s in
    the mask is the k-th turn's sampled tokens; when the runs do not line up one-to-one with the
    recorded turns, the mask is returned as it was."""
    mask = list(traj.tokens.loss_mask) if traj.tokens else []
    runs = _runs(mask)
    if len(runs) != len(traj.turns):
        return mask, 0
    masked = 0
    for (start, end), turn in zip(runs, traj.turns, strict=True):
        if turn.finish_reason == "length" or any(c.format_error for c in turn.tool_calls):
            mask[start:end] = [0] * (end - start)
            masked += 1
    return mask, masked
