"""Running one assistant turn's tool calls: in parallel where safe, results in call order.

Each call declares which workspace paths it reads and writes (`Tool.access`). A call waits
only for the earlier calls of the turn it conflicts with (a write against a read or a
write of the same path; a shell command conflicts with everything), so ten `read_file`s
and a `grep` run at once, while `edit_file(a)` then `read_file(a)` keep their order. What
the model sees is the same as running the calls one by one, in order — only faster.
Paths are compared by what they name: `/workspace/a` is `a`, and a symlink inside the
workspace is resolved (through the workspace's own confined file API) to the file it
points to, so two edits of one file under two names keep their order too.

A call naming an unknown tool or carrying malformed arguments gets an error result (and
counts as a format error); a tool that raises gets an error result too. Nothing here ends
an episode.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from vivace.harness.messages import ToolCall
from vivace.harness.tools.base import (
    EVERYTHING,
    Access,
    Tool,
    ToolContext,
    ToolResult,
    norm_path,
    parse_args,
    shown,
)
from vivace.sandbox.base import Workspace, WorkspaceFileNotFound

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
    declared = [None if isinstance(item, ToolResult) else item[2] for item in prepared]
    resolve = _resolver(ctx.workspace) if _may_alias(declared) else None
    tasks: list[asyncio.Task[ToolOutcome]] = []
    accesses: list[asyncio.Task[Access] | None] = []  # each call's access with symlinks resolved
    barrier: asyncio.Task[ToolOutcome] | None = None  # the last call so far that may change any path
    try:
        for call, item in zip(calls, prepared, strict=True):
            if isinstance(item, ToolResult):
                tasks.append(asyncio.ensure_future(_rejected(call, item, t0)))
                accesses.append(None)
                continue
            access = asyncio.ensure_future(_real_access(item[2], resolve, barrier))
            earlier = [(a, t) for a, t in zip(accesses, tasks, strict=True) if a is not None]
            tasks.append(asyncio.ensure_future(_run(call, item, access, earlier, ctx, t0)))
            accesses.append(access)
            if EVERYTHING in item[2].writes:
                barrier = tasks[-1]
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in [*tasks, *accesses]:
            if task is not None:
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
    call: ToolCall,
    prepared: tuple[Tool, Any, Access],
    access: asyncio.Task[Access],
    earlier: list[tuple[asyncio.Task[Access], asyncio.Task[ToolOutcome]]],
    ctx: ToolContext,
    t0: float,
) -> ToolOutcome:
    mine = await access
    for other, task in earlier:
        if mine.conflicts(await other):
            await asyncio.wait([task])  # its outcome does not matter, only that it finished
    tool, args, _ = prepared
    start = time.monotonic()
    try:
        result = await tool.run(args, ctx)
    except Exception as e:  # a tool bug or a workspace failure: the model gets an error, the episode goes on
        result = ToolResult(f"Error: {tool.name} failed: {type(e).__name__}: {e}", True, {"exception": repr(e)})
    # Every tool's text passes here: a name that is not UTF-8, wherever a tool shows it, becomes \xNN.
    result = dataclasses.replace(result, text=shown(result.text))
    return ToolOutcome(call, result, start - t0, time.monotonic() - start)


# -- which real paths a call touches ----------------------------------------------------------------

Resolver = Callable[[str], Awaitable[str]]


def _may_alias(accesses: list[Access | None]) -> bool:
    """Whether resolving symlinks could add an ordering: two calls name paths and one of them
    writes a particular path (a shell command already conflicts with everything)."""
    named = [a for a in accesses if a is not None and (a.reads or a.writes)]
    return len(named) > 1 and any(a.writes - {EVERYTHING} for a in named)


def _resolver(workspace: Any) -> Resolver | None:
    """How to find the real path behind a workspace path. A local workspace resolves it with its
    own confined file API (`ConfinedFS.realpath`: never a host path, never outside the root);
    any other workspace only tells, through `stat`, whether a symlink is on the way, and a
    path it cannot resolve stands for everything."""
    realpath = getattr(workspace, "realpath", None)  # LocalWorkspace.realpath
    if callable(realpath):
        return realpath
    if callable(getattr(workspace, "stat", None)):
        return lambda path: _without_symlinks(workspace, path)
    return None


async def _without_symlinks(workspace: Workspace, path: str) -> str:
    """`path` when no component of it is a symlink, else EVERYTHING."""
    parts = path.split("/")
    prefixes = ["/".join(parts[: n + 1]) for n in range(len(parts))]
    stats = await asyncio.gather(*(workspace.stat(p) for p in prefixes), return_exceptions=True)
    for st in stats:
        if isinstance(st, WorkspaceFileNotFound):
            break  # nothing exists below a missing component
        if isinstance(st, BaseException) or st.kind == "symlink":
            return EVERYTHING
    return path


async def _real_access(access: Access, resolve: Resolver | None, barrier: asyncio.Task | None) -> Access:
    """`access` with each path's real path added beside its spelling; resolved after `barrier`
    (a shell command of the same turn may create or replace symlinks)."""
    if resolve is None or not (access.reads or access.writes):
        return access
    if barrier is not None:
        await asyncio.wait([barrier])
    paths = sorted(access.reads | access.writes)
    real = dict(zip(paths, await asyncio.gather(*(_real_paths(p, resolve) for p in paths)), strict=True))
    return Access(
        reads=frozenset().union(*(real[p] for p in access.reads)),
        writes=frozenset().union(*(real[p] for p in access.writes)),
    )


async def _real_paths(path: str, resolve: Resolver) -> frozenset[str]:
    if path == EVERYTHING:
        return frozenset({path})
    spelled = norm_path(path)
    try:
        real = await resolve(spelled)
    except Exception:  # leads outside, not a directory, workspace closed: the tool reports it
        return frozenset({path, spelled})
    return frozenset({path, spelled, real})
