"""Rollouts: G episodes per task through the benchmark's own episode function, turned into
trainer samples with group-relative advantages.

Each rollout is `bench.runner.run_task` — the same sandboxed workspace, agent loop, tools and
scorer as `vivace bench` and `vivace agent` — so the reward is the benchmark's total score, plus
the training-only milestone rewards when configured (`train.milestone_read/_edit`: a non-test
file read, an edit that applied; rl.metrics.milestones). A group is kept only when its rewards
differ (with `group_filter = "correctness"`, only when its outcomes do; with "solved", also when
every rollout solved the task); a sample is kept only
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
from vivace.rl.metrics import milestones
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
    the episode raised, or an HTTP sampler's server failed: re-queue it, up to the attempt limit)."""

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
    # A sampler server (HTTP) down or failing, or a workspace that could not be diffed (so not scored):
    # nothing to train on.
    if traj.unavailable or traj.diff_failed:
        return EpisodeResult("env_failed", sampler=router.chosen, error=traj.error,
                             dead_samplers=sorted(router.seen_dead))  # fmt: skip
    components = {k: getattr(score, k) for k in ("correctness", "adherence", "efficiency", "claims", "format")}
    reached = milestones(traj)
    # Training-only milestone rewards on top of the benchmark score (0 unless configured).
    bonus = sum(w for k, w in _milestone_rewards(cfg.train).items() if reached[k])
    rollout = Rollout(task.id, traj, score.total + bonus, components, score.resolved, score.details,
                      milestones=reached)  # fmt: skip
    return EpisodeResult("ok", rollout, sampler=router.chosen, dead_samplers=sorted(router.seen_dead))


def to_samples(groups: list[list[Rollout]], cfg: VivaceConfig, version: int) -> tuple[list[Sample], dict[str, float]]:
    """Samples with advantages from scored groups, and counts of what was left out and why."""
    tc = cfg.train
    samples: list[Sample] = []
    counts = {"groups": len(groups), "groups_zero_variance": 0, "groups_same_correctness": 0, "rollouts_failed": 0,
              "samples_masked_truncated": 0, "turns_masked_malformed": 0,
              "samples_too_stale": 0, "samples_without_tokens": 0}  # fmt: skip
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
        if adv is not None and not _passes_filter(ok, tc):
            counts["groups_same_correctness"] += 1
            continue
        if adv is None:
            counts["groups_zero_variance"] += 1
            continue
        # A group kept because every rollout solved: its final turns say "answer now", which a policy that
        # cannot tell a solve from a failure learns as answering early (docs/benchmarks.md).
        skip_answer = tc.solved_mask_answer and all(r.resolved for r in ok)
        for r, a in zip(ok, adv, strict=True):
            tokens = r.trajectory.tokens if r.trajectory else None
            if a is None:
                counts["samples_masked_truncated"] += 1
            elif tokens is None or not any(tokens.loss_mask):
                counts["samples_without_tokens"] += 1
            elif (oldest := min(v for v, m in zip(tokens.versions, tokens.loss_mask, strict=True) if m)) < (
                version - tc.max_staleness
            ):
                counts["samples_too_stale"] += 1
            else:
                a = a * tc.negative_scale if a < 0 else a
                mask = tokens.loss_mask
                if a > 0 and tc.mask_malformed:
                    mask, masked = without_malformed_turns(r.trajectory)
                    counts["turns_masked_malformed"] += masked
                if skip_answer:  # the episode's own last turn (mask may have lost a malformed last turn already)
                    start, end = _runs(tokens.loss_mask)[-1]
                    mask = mask[:start] + [0] * (end - start) + mask[end:]
                if not any(mask):
                    counts["samples_without_tokens"] += 1
                    continue
                samples.append(Sample(tokens.ids, mask, tokens.logprobs, tokens.versions, a))
                advantages.append(a)
                staleness.append(version - oldest)
    if tc.loss_aggregation == "sequence" and samples:
        # The trainer divides by the step's token count; scaling by mean length / own length makes each
        # rollout's tokens sum to its advantage times the mean length, whatever its own length.
        mean = sum(s.n_generated for s in samples) / len(samples)
        for s in samples:
            s.advantage *= mean / s.n_generated
    counts["samples"] = len(samples)
    if staleness:  # versions behind the trainer of each kept sample's oldest token
        counts.update(staleness_mean=sum(staleness) / len(staleness), staleness_max=max(staleness))
    if advantages:
        mean = sum(advantages) / len(advantages)
        counts.update(adv_mean=mean, adv_abs_mean=sum(map(abs, advantages)) / len(advantages),
                      adv_min=min(advantages), adv_max=max(advantages))  # fmt: skip
    return samples, counts


def _milestone_rewards(tc: Any) -> dict[str, float]:
    """The training-only reward of each milestone of rl.metrics.milestones (0: off)."""
    return {"read": tc.milestone_read, "edit": tc.milestone_edit}


def _passes_filter(ok: list[Rollout], tc: Any) -> bool:
    """`group_filter` for a group whose rewards differ: reward keeps it; correctness only if its
    outcomes differ; solved also if every rollout solved the task (rewards then differ in how well)."""
    if tc.group_filter == "reward" or len({_outcome(r, tc) for r in ok}) > 1:
        return True
    return tc.group_filter == "solved" and all(r.resolved for r in ok)


def _outcome(r: Rollout, tc: Any) -> tuple[bool, ...]:
    """What the correctness filter compares: solved or not, and each milestone that earns a reward."""
    rewarded = [k for k, w in _milestone_rewards(tc).items() if w > 0]
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
