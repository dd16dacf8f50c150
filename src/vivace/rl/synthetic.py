"""Synthetic environments: the real harness, engine and workspace with a made-up task.

`synthetic_episode`: checks that RL learns at all — a request, and a reward any policy can earn
by chance.

`second_turn_episode`: the same check one turn later, where an agent's credit usually lands — the
first turn's tool call is imposed (its tokens stay as sampled), and the reward is 1 when the
*second* turn calls a tool. It fails if the trainer's loss misses or misplaces the tokens of later
turns (a tool result sits between the turns, untrained), which the first-turn check cannot see.

The reward is 1 when the policy's first turn contains a tool call block (a `<tool_call>` it
opened, well formed or not) and 0 otherwise: an untrained tiny model does this now and then, so a
group of rollouts has mixed rewards and the policy gradient has something to push on. Used by the
learnability test (tests/test_rl_learn.py), which also runs the same settings with the
advantage's sign flipped: learning must go up in one run and not in the other.

`latency_episode`: the pipeline benchmark's environment (`vivace train bench-pipeline`) — each
episode lasts a drawn number of turns, and every turn but the last calls `env_step`, a tool whose
latency is log-normal (heavy-tailed, like real tool calls: most are quick, a few run for
minutes). The model's turns are really sampled by the engine and recorded token for token; only
the tool call of each turn is imposed (an untrained model rarely makes one), so the episode
shape, not the model's skill, sets the workload. The reward is noise: this measures the
pipeline, not learning.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import random
from typing import Any, ClassVar

from pydantic import Field

from vivace.bench.score import Score
from vivace.config import VivaceConfig
from vivace.harness.agent import run_episode
from vivace.harness.messages import AssistantTurn, ToolCall
from vivace.harness.policy import Conversation
from vivace.harness.tools.base import Access, ToolArgs, ToolContext, ToolResult
from vivace.harness.trajectory import Trajectory
from vivace.tasks.format import Task


def called_a_tool(traj: Trajectory, turn: int = 0) -> float:
    """1 when turn `turn` (0: the first) made a tool call, well formed or not."""
    return 1.0 if len(traj.turns) > turn and traj.turns[turn].tool_calls else 0.0


def synthetic_episode(repo_snapshot: Any, reward=called_a_tool, sign: float = 1.0, first_call: ToolCall | None = None):
    """An `episode` function for the rollout workers (rl/rollout.py `run_attempt`): the task's request in a workspace of
    `repo_snapshot`, rewarded by `reward(trajectory)` (times `sign`, -1 to flip the objective). With `first_call`
    the episode is two turns long and the first turn gets that call whatever it wrote."""

    async def episode(policy: Any, task: Task, cfg: VivaceConfig, backend: Any) -> tuple[Trajectory, Score]:
        limits = cfg.agent
        if first_call is not None:
            limits = limits.model_copy(update={"max_turns": 2})
            policy = _ImposedCalls(policy, 2, call=first_call, last=False)
        ws = await backend.create(repo_snapshot)
        try:
            traj = await run_episode(policy, ws, task.request, limits, task_id=task.id)
        finally:
            await ws.close()
        r = reward(traj)
        score = Score(task_id=task.id, total=sign * r, correctness=r, adherence=0.0, efficiency=0.0, claims=1.0,
                      format=1.0, resolved=r >= 1.0)  # fmt: skip
        return traj, score

    return episode


def second_turn_episode(repo_snapshot: Any, sign: float = 1.0, path: str = "main.py"):
    """`synthetic_episode` one turn later: turn 1 is sampled and given a `read_file(path)` call whatever it
    wrote; the reward is 1 when turn 2 calls a tool itself."""
    read = ToolCall("call_1", "read_file", {"path": path})
    return synthetic_episode(repo_snapshot, lambda traj: called_a_tool(traj, turn=1), sign, first_call=read)


class EnvStepArgs(ToolArgs):
    note: str = Field("", description="Anything; ignored.")


class EnvStep:
    """A tool that takes a log-normal time: median `median_s`, log-space spread `sigma`."""

    name: ClassVar[str] = "env_step"
    description: ClassVar[str] = "Advance the environment by one step."
    Args: ClassVar[type[ToolArgs]] = EnvStepArgs

    def __init__(self, rng: random.Random, median_s: float, sigma: float):
        self.rng, self.median_s, self.sigma = rng, median_s, sigma

    def access(self, args: EnvStepArgs) -> Access:
        return Access()

    async def run(self, args: EnvStepArgs, ctx: ToolContext) -> ToolResult:
        seconds = self.rng.lognormvariate(math.log(self.median_s), self.sigma)
        await asyncio.sleep(seconds)
        return ToolResult(f"step done in {seconds:.2f} s")


class _ImposedCalls:
    """Wraps a policy: its turns are sampled as usual, then every turn but the last gets `call`
    (default: one `env_step` call) and the last none, or (`last=False`) the calls it made itself.
    The tokens stay exactly what was sampled."""

    def __init__(self, inner: Any, turns: int, call: ToolCall | None = None, last: bool = True):
        self.inner, self.turns, self.name, self.done = inner, turns, inner.name, 0
        self.call, self.last = call, last

    async def act(self, conversation: Conversation) -> AssistantTurn:
        reply = await self.inner.act(conversation)
        self.done += 1
        if self.done < self.turns:
            calls = (self.call or ToolCall(f"call_{self.done}", "env_step", {}),)
        elif self.last:
            calls = ()
        else:
            return reply
        reply.message = dataclasses.replace(reply.message, tool_calls=calls)
        return reply


def latency_episode(repo_snapshot: Any, *, median_s: float = 1.0, sigma: float = 1.0, turns: tuple[int, int] = (2, 6),
                    seed: int = 0):  # fmt: skip
    """An `episode` function for the pipeline benchmark: `turns` (inclusive range, drawn per
    episode) turns, each but the last followed by an `env_step` of log-normal latency."""
    rng = random.Random(seed)

    async def episode(policy: Any, task: Task, cfg: VivaceConfig, backend: Any) -> tuple[Trajectory, Score]:
        n = rng.randint(*turns)
        limits = cfg.agent.model_copy(update={"max_turns": n, "max_tokens": 1 << 30})
        ws = await backend.create(repo_snapshot)
        try:
            traj = await run_episode(_ImposedCalls(policy, n), ws, task.request, limits, task_id=task.id,
                                     tools=[EnvStep(rng, median_s, sigma)])  # fmt: skip
        finally:
            await ws.close()
        r = rng.random()
        score = Score(task_id=task.id, total=r, correctness=r, adherence=0.0, efficiency=0.0, claims=1.0,
                      format=1.0, resolved=r >= 0.5)  # fmt: skip
        return traj, score

    return episode
