"""A synthetic environment for checking that RL learns at all: the real harness, tools and
workspace, a request, and a reward any policy can earn by chance.

The reward is 1 when the policy's first turn contains a tool call block (a `<tool_call>` it
opened, well formed or not) and 0 otherwise: an untrained tiny model does this now and then, so a
group of rollouts has mixed rewards and the policy gradient has something to push on. Used by the
learnability test (tests/test_rl_learn.py), which also runs the same settings with the
advantage's sign flipped: learning must go up in one run and not in the other.
"""

from __future__ import annotations

from typing import Any

from vivace.bench.score import Score
from vivace.config import VivaceConfig
from vivace.harness.agent import run_episode
from vivace.harness.trajectory import Trajectory
from vivace.tasks.format import Task


def called_a_tool(traj: Trajectory) -> float:
    return 1.0 if traj.turns and traj.turns[0].tool_calls else 0.0


def synthetic_episode(repo_snapshot: Any, reward=called_a_tool, sign: float = 1.0):
    """An `episode` function for `rollout_groups`: the task's request in a workspace of
    `repo_snapshot`, rewarded by `reward(trajectory)` (times `sign`, -1 to flip the objective)."""

    async def episode(policy: Any, task: Task, cfg: VivaceConfig, backend: Any) -> tuple[Trajectory, Score]:
        ws = await backend.create(repo_snapshot)
        try:
            traj = await run_episode(policy, ws, task.request, cfg.agent, task_id=task.id)
        finally:
            await ws.close()
        r = reward(traj)
        score = Score(task_id=task.id, total=sign * r, correctness=r, adherence=0.0, efficiency=0.0, claims=1.0,
                      format=1.0, resolved=r >= 1.0)  # fmt: skip
        return traj, score

    return episode
