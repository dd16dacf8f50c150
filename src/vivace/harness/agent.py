"""The agent loop: one episode of a policy acting through the tools in one workspace.

`run_episode` is the only loop in vivace: `vivace agent` runs it on a developer's repo,
`vivace bench` on benchmark tasks, and RL rollouts on training tasks — so the model meets
the same prompt, tools, result texts and limits everywhere.

A turn: the policy answers; if the answer has no tool calls it is the final answer (stop
reason "done"); otherwise the calls run (in parallel where safe, see executor.py), their
results are appended as tool messages, and the next turn starts. Malformed output never
ends the episode — it comes back to the model as an error result. The episode ends early
on the turn, token and wall-clock limits (a conversation grown past the model's context is the
token limit: "max_tokens"), or when the policy itself fails ("error").

Not covered: scoring (bench) and what to do with the trajectory (rl, cli).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import Any

from vivace.config import AgentConfig
from vivace.harness.executor import ToolOutcome, execute
from vivace.harness.messages import AssistantTurn, Message, ToolCall
from vivace.harness.policy import ContextFull, Conversation, Policy, PolicyError, PolicyUnavailable
from vivace.harness.prompts import SYSTEM_PROMPT, SYSTEM_PROMPT_VERSION
from vivace.harness.tools import default_tools, tools_by_name
from vivace.harness.tools.base import MAX_RESULT_CHARS, Tool, ToolContext, ToolResult, tool_schema
from vivace.harness.trajectory import StopReason, Tokens, ToolRecord, Trajectory, Turn
from vivace.sandbox.base import Workspace

# How a timeout's error ends when the wall clock ran out with the policy still to answer (a slow
# endpoint, which the benchmark counts apart), not running tools.
WAITING_FOR_POLICY = "waiting for the policy"

# Finish reasons of a reply the server cut short for its own reasons (vLLM and SGLang say "abort" when
# the engine drops a request): partial text, never taken for the model's answer or calls.
DROPPED = frozenset({"abort", "error", "cancelled", "canceled"})

# Observer events, in order: per turn ("waiting", turn number) as the policy is asked, ("assistant",
# AssistantTurn), ("tool", ToolOutcome) per call in call order; finally ("end", Trajectory).
# Observers must not raise.
Observer = Callable[[str, Any], None]


class _Stop(Exception):
    def __init__(self, reason: StopReason, error: str | None = None, unavailable: bool = False):
        self.reason, self.error, self.unavailable = reason, error, unavailable  # see Trajectory.unavailable


def result_budget(limits: AgentConfig, policy: Policy) -> int:
    """Characters one tool result may hold: agent.max_result_chars when set, else MAX_RESULT_CHARS, or 3/4 of the
    policy's context in tokens when that is less. The tiny policy's tokenizer spends a token per ~2.5 characters
    of pytest -rA output: with its 8,192-token context, of which the system prompt and tools take 2,672, a
    20,000-character report overflows at once, and the 6,144 characters it is cut to take ~2,500 tokens."""
    if limits.max_result_chars is not None:
        return limits.max_result_chars
    context = getattr(policy, "context_tokens", None)
    return min(MAX_RESULT_CHARS, context * 3 // 4) if isinstance(context, int) and context > 0 else MAX_RESULT_CHARS


async def run_episode(
    policy: Policy,
    workspace: Workspace,
    request: str,
    limits: AgentConfig | None = None,
    *,
    tools: Sequence[Tool] | None = None,
    task_id: str | None = None,
    observer: Observer | None = None,
    system_prompt: str = SYSTEM_PROMPT,
    seed: int | None = None,
) -> Trajectory:
    """Run one episode and return its Trajectory; never raises for policy or tool failures.
    `seed`: the episode's sampling seed (Conversation.seed); None: the sampler's own randomness."""
    limits = limits or AgentConfig()
    tools = list(tools) if tools is not None else default_tools()
    by_name = tools_by_name(tools)
    conv = Conversation(
        messages=[Message("system", system_prompt), Message("user", request)],
        tools=[tool_schema(t) for t in tools],
        max_turn_tokens=limits.max_turn_tokens,
        seed=seed,
    )
    ctx = ToolContext(
        workspace=workspace,
        command_timeout_s=limits.command_timeout_s,
        reproducible_output=limits.reproducible_output,
    )
    notify = observer or (lambda kind, payload: None)
    turns: list[Turn] = []
    final = ""
    t0 = time.monotonic()
    deadline = t0 + limits.max_wall_s
    stop: _Stop | None = None
    try:
        for _ in range(limits.max_turns):
            turn_start = time.monotonic()
            notify("waiting", len(turns) + 1)
            reply = await _within(deadline, policy.act(conv), WAITING_FOR_POLICY)
            notify("assistant", reply)
            message = reply.message
            conv.messages.append(Message("assistant", message.content, message.tool_calls))
            turn = _turn(reply, time.monotonic() - turn_start)
            turns.append(turn)
            final = message.content or final
            if reply.finish_reason in DROPPED:  # the server gave up on the request: what came is no answer
                stop = _Stop("error", f"the endpoint ended the reply with finish_reason {reply.finish_reason!r} (it "
                                      "dropped the request), so its text is not an answer")  # fmt: skip
                break
            if not message.tool_calls:
                if reply.finish_reason == "content_filter":  # withheld, not answered: never scored as an answer
                    stop = _Stop("error", "the endpoint's content filter withheld the reply")
                else:
                    stop = _Stop("max_tokens" if reply.finish_reason == "length" else "done")
                break
            ctx.max_result_chars = result_budget(limits, policy)  # an endpoint's context is known after its first turn
            outcomes = await _within(
                deadline, _run_calls(list(message.tool_calls), by_name, ctx, limits), "running tools"
            )
            _record_tools(turn, outcomes)
            for o in outcomes:
                notify("tool", o)
                conv.messages.append(Message("tool", o.result.text, tool_call_id=o.call.id, name=o.call.name))
            if reply.prompt_tokens + reply.completion_tokens >= limits.max_tokens:
                stop = _Stop("max_tokens")
                break
        else:
            stop = _Stop("max_turns")
    except _Stop as s:
        stop = s
    except ContextFull as e:  # the conversation outgrew the model's context: its length limit, not a failure
        stop = _Stop("max_tokens", str(e))
    except PolicyError as e:
        stop = _Stop("error", str(e), unavailable=isinstance(e, PolicyUnavailable))
    except Exception as e:  # a bug in a policy is still recorded, not lost with the episode
        stop = _Stop("error", f"{type(e).__name__}: {e}")

    diff, diff_error = "", None
    try:
        diff = await workspace.diff()
    except Exception as e:  # the episode's record matters more than its diff
        diff_error = f"could not compute the workspace diff: {type(e).__name__}: {e}"
    assert stop is not None
    traj = Trajectory(
        task_id=task_id,
        request=request,
        policy=policy.name,
        system_prompt=system_prompt,
        system_prompt_version=SYSTEM_PROMPT_VERSION,
        turns=turns,
        final_message=final,
        diff=diff,
        stop_reason=stop.reason,
        error="; ".join(e for e in (stop.error, diff_error) if e) or None,
        diff_failed=diff_error is not None,
        unavailable=stop.unavailable,
        wall_s=time.monotonic() - t0,
        tokens=_tokens(conv),
    )
    notify("end", traj)
    return traj


async def _within(deadline: float, awaitable: Any, doing: str) -> Any:
    """Await with what is left of the episode's wall-clock budget. asyncio.timeout, not wait_for: on
    Python 3.11 wait_for returns the result when a cancel (a Ctrl-C, an aborted rollout) lands as the
    awaitable finishes, and the cancel is lost."""
    left = deadline - time.monotonic()
    try:
        if left <= 0:
            raise TimeoutError
        async with asyncio.timeout(left):
            return await awaitable
    except TimeoutError:
        if asyncio.iscoroutine(awaitable):
            awaitable.close()
        raise _Stop("timeout", f"the episode's wall-clock limit ran out while {doing}") from None


async def _run_calls(
    calls: list[ToolCall], by_name: dict[str, Tool], ctx: ToolContext, limits: AgentConfig
) -> list[ToolOutcome]:
    cap = limits.max_tool_calls_per_turn
    outcomes = await execute(calls[:cap], by_name, ctx)
    refused = ToolResult(
        f"Error: this turn made {len(calls)} tool calls but at most {cap} run per turn; this call was not "
        "run. Issue it again in a later turn.",
        True,
    )
    return outcomes + [ToolOutcome(c, refused, 0.0, 0.0) for c in calls[cap:]]


def _turn(reply: AssistantTurn, model_s: float) -> Turn:
    return Turn(
        content=reply.message.content,
        finish_reason=reply.finish_reason,
        model_s=model_s,
        prompt_tokens=reply.prompt_tokens,
        completion_tokens=reply.completion_tokens,
        policy_version=reply.policy_version,
        reasoning=reply.meta.get("reasoning"),
    )


def _record_tools(turn: Turn, outcomes: list[ToolOutcome]) -> None:
    turn.tool_calls = [
        ToolRecord(
            id=o.call.id,
            name=o.call.name,
            arguments=o.call.arguments,
            result=o.result.text,
            is_error=o.result.is_error,
            format_error=o.format_error,
            started_s=o.started_s,
            duration_s=o.duration_s,
            meta=o.result.meta,
        )
        for o in outcomes
    ]
    if outcomes:
        turn.tools_s = max(o.started_s + o.duration_s for o in outcomes) - min(o.started_s for o in outcomes)


def _tokens(conv: Conversation) -> Tokens | None:
    log = conv.tokens
    if log is None:
        return None
    return Tokens(ids=log.ids, loss_mask=log.loss_mask, logprobs=log.logprobs, versions=log.versions)
