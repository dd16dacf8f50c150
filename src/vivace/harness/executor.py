"""Running one assistant turn's tool calls: in parallel where safe, results in call order.

Each call declares which workspace paths it reads and writes (`Tool.access`). A call waits
only for the earlier calls of the turn it conflicts with (a write against a read or a
write of the same path; a shell command conflicts with everything), so ten `read_file`s
and a `grep` run at once, while `edit_file(a)` then `read_file(a)` keep their order. What
the model sees is the same as running the calls one by one, in order — only faster.

A call naming an unknown tool or carrying malformed arguments gets an error result (and
counts as a format error); a tool that raises gets an error result too. Nothing here ends
an episode.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from vivace.harness.messages import ToolCall
from vivace.harness.tools.base import Access, Tool, ToolContext, ToolResult, parse_args

__all__ = ["ToolCall", "ToolOutcome", "execute"]


@dataclass(frozen=True)
class ToolOutcome:
    call: ToolCall
    result: ToolResult
    started_s: float  # seconds from the start of the turn's execution
    duration_s: float  # wall-clock seconds the tool ran (0 for rejected calls)
    format_error: bool = False  # unknown tool or malformed arguments


async def execute(calls: list[ToolCall], tools: Mapping[str, Tool], ctx: ToolContext) -> list[ToolOutcome]:
    """Run `calls` concurrently where their accesses allow; outcomes in call order."""
    t0 = time.monotonic()
    prepared: list[tuple[Tool, Any, Access] | ToolResult] = [_prepare(call, tools) for call in calls]
    tasks: list[asyncio.Task[ToolOutcome]] = []
    for i, call in enumerate(calls):
        item = prepared[i]
        if isinstance(item, ToolResult):
            tasks.append(asyncio.ensure_future(_rejected(call, item, t0)))
            continue
        deps = [
            tasks[j]
            for j in range(i)
            if not isinstance(prepared[j], ToolResult) and item[2].conflicts(prepared[j][2])  # type: ignore[index]
        ]
        tasks.append(asyncio.ensure_future(_run(call, item, deps, ctx, t0)))
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        raise


def _prepare(call: ToolCall, tools: Mapping[str, Tool]) -> tuple[Tool, Any, Access] | ToolResult:
    if call.error is not None:
        return ToolResult(
            f"Error: malformed tool call: {call.error}. Nothing was run; repeat the call with a tool name "
            "and a JSON object of arguments.",
            True,
        )
    tool = tools.get(call.name)
    if tool is None:
        names = ", ".join(sorted(tools))
        return ToolResult(f"Error: unknown tool {call.name!r}. Available tools: {names}.", True)
    args = parse_args(tool, call.arguments)
    if isinstance(args, ToolResult):
        return args
    return tool, args, tool.access(args)


async def _rejected(call: ToolCall, result: ToolResult, t0: float) -> ToolOutcome:
    return ToolOutcome(call, result, time.monotonic() - t0, 0.0, format_error=True)


async def _run(
    call: ToolCall, prepared: tuple[Tool, Any, Access], deps: list[asyncio.Task], ctx: ToolContext, t0: float
) -> ToolOutcome:
    for dep in deps:
        await asyncio.wait([dep])  # its outcome does not matter, only that it finished
    tool, args, _ = prepared
    start = time.monotonic()
    try:
        result = await tool.run(args, ctx)
    except Exception as e:  # a tool bug or a workspace failure: the model gets an error, the episode goes on
        result = ToolResult(f"Error: {tool.name} failed: {type(e).__name__}: {e}", True, {"exception": repr(e)})
    return ToolOutcome(call, result, start - t0, time.monotonic() - start)
