"""The tool executor: parallel where accesses allow, call order otherwise, errors as results."""

from __future__ import annotations

import asyncio
import itertools
import os
import time
from pathlib import Path
from typing import ClassVar

from pydantic import Field

from vivace.harness.executor import ToolCall, execute
from vivace.harness.tools.base import EVERYTHING, Access, ToolArgs, ToolContext, ToolResult
from vivace.sandbox.base import FileStat
from vivace.sandbox.paths import ConfinedFS

DELAY = 0.1


class _Log:
    def __init__(self) -> None:
        self.events: list[tuple[str, str, float]] = []  # (call label, "start"|"end", time)


class _PathArgs(ToolArgs):
    path: str = Field(description="a path")


class FakeRead:
    name: ClassVar[str] = "read"
    description: ClassVar[str] = "reads"
    Args = _PathArgs

    def __init__(self, log: _Log):
        self.log = log

    def access(self, args: _PathArgs) -> Access:
        return Access(reads=frozenset({args.path}))

    async def run(self, args: _PathArgs, ctx: ToolContext) -> ToolResult:
        self.log.events.append((f"{self.name}:{args.path}", "start", time.monotonic()))
        await asyncio.sleep(DELAY)
        self.log.events.append((f"{self.name}:{args.path}", "end", time.monotonic()))
        return ToolResult(f"{self.name} {args.path}")


class FakeWrite(FakeRead):
    name: ClassVar[str] = "write"

    def access(self, args: _PathArgs) -> Access:
        return Access(writes=frozenset({args.path}))


class FakeShell(FakeRead):
    name: ClassVar[str] = "shell"

    def access(self, args: _PathArgs) -> Access:
        return Access(writes=frozenset({EVERYTHING}))


class FakeGrep(FakeRead):
    name: ClassVar[str] = "grep"

    def access(self, args: _PathArgs) -> Access:
        return Access(reads=frozenset({EVERYTHING}))


class Broken(FakeRead):
    name: ClassVar[str] = "broken"

    async def run(self, args: _PathArgs, ctx: ToolContext) -> ToolResult:
        raise RuntimeError("disk on fire")


def _tools(log: _Log) -> dict:
    return {cls.name: cls(log) for cls in (FakeRead, FakeWrite, FakeShell, FakeGrep, Broken)}


def _ctx() -> ToolContext:
    return ToolContext(workspace=None)  # type: ignore[arg-type]  # fakes never touch it


def _span(log: _Log, label: str) -> tuple[float, float]:
    start = next(t for name, kind, t in log.events if name == label and kind == "start")
    end = next(t for name, kind, t in log.events if name == label and kind == "end")
    return start, end


async def test_independent_reads_and_grep_run_together():
    log = _Log()
    calls = [ToolCall(str(i), "read", {"path": f"f{i}.py"}) for i in range(10)] + [ToolCall("g", "grep", {"path": "x"})]
    t0 = time.monotonic()
    outcomes = await execute(calls, _tools(log), _ctx())
    elapsed = time.monotonic() - t0
    assert elapsed < 6 * DELAY  # serial: 11 * DELAY; the margin is for a loaded machine (make test: 2+ workers)
    assert [o.result.text for o in outcomes] == [f"read f{i}.py" for i in range(10)] + ["grep x"]
    assert all(o.duration_s >= DELAY * 0.9 for o in outcomes)


async def test_conflicting_calls_keep_call_order():
    log = _Log()
    calls = [
        ToolCall("1", "write", {"path": "a.py"}),
        ToolCall("2", "read", {"path": "a.py"}),  # must see the write
        ToolCall("3", "read", {"path": "b.py"}),  # independent: runs with the write
        ToolCall("4", "shell", {"path": "-"}),  # after everything before it
        ToolCall("5", "read", {"path": "b.py"}),  # after the shell
    ]
    await execute(calls, _tools(log), _ctx())
    w, r_a, r_b = _span(log, "write:a.py"), _span(log, "read:a.py"), _span(log, "read:b.py")
    shell = _span(log, "shell:-")
    assert r_a[0] >= w[1]
    assert r_b[0] < w[1]  # overlapped with the write
    assert shell[0] >= max(w[1], r_a[1], r_b[1])
    second_b = [t for name, kind, t in log.events if name == "read:b.py" and kind == "start"][1]
    assert second_b >= shell[1]


async def test_bad_calls_become_errors_and_the_rest_still_runs():
    log = _Log()
    calls = [
        ToolCall("1", "teleport", {"path": "x"}),
        ToolCall("2", "read", {"pth": "x"}),
        ToolCall("3", "read", "not a dict"),
        ToolCall("4", "read", {"path": 7}),
        ToolCall("5", "broken", {"path": "x"}),
        ToolCall("6", "read", {"path": "ok.py"}),
    ]
    outcomes = await execute(calls, _tools(log), _ctx())
    texts = [o.result.text for o in outcomes]
    assert "unknown tool 'teleport'" in texts[0] and "read" in texts[0]  # lists the valid names
    assert "invalid arguments for read" in texts[1] and "path" in texts[1]
    assert "must be a JSON object" in texts[2]
    assert "invalid arguments for read" in texts[3]
    assert "broken failed: RuntimeError: disk on fire" in texts[4]
    assert texts[5] == "read ok.py" and not outcomes[5].result.is_error
    assert [o.format_error for o in outcomes] == [True, True, True, True, False, False]
    assert all(o.result.is_error for o in outcomes[:5])


async def test_cancelling_a_turn_cancels_its_calls():
    log = _Log()
    calls = [ToolCall(str(i), "read", {"path": f"{i}"}) for i in range(3)]
    task = asyncio.create_task(execute(calls, _tools(log), _ctx()))
    await asyncio.sleep(DELAY / 3)
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        pass
    await asyncio.sleep(DELAY)
    assert not [e for e in log.events if e[1] == "end"]


# -- one file under several names -------------------------------------------------------------------


class _FsWorkspace:
    """Just what the executor uses to resolve paths: a local workspace's confined file API."""

    def __init__(self, root: Path):
        self.fs = ConfinedFS(root)

    async def realpath(self, path: str) -> str:
        return self.fs.realpath(path)


class _StatOnlyWorkspace:
    """A workspace that only says what kind each path is (as a remote one does)."""

    def __init__(self, root: Path):
        self._fs = ConfinedFS(root)

    async def stat(self, path: str) -> FileStat:
        return self._fs.stat(path)


class Linker(FakeShell):
    """A shell command that makes `c.py` a symlink to `a.py` in `root`."""

    name: ClassVar[str] = "linker"
    root: ClassVar[Path]

    async def run(self, args: _PathArgs, ctx: ToolContext) -> ToolResult:
        os.symlink("a.py", self.root / "c.py")
        return await super().run(args, ctx)


def _serial(log: _Log, *labels: str) -> bool:
    spans = sorted(_span(log, label) for label in labels)
    return all(later[0] >= earlier[1] for earlier, later in itertools.pairwise(spans))


def _tree(root: Path) -> None:
    (root / "a.py").write_text("a = 1\n")
    (root / "sub").mkdir()
    os.symlink("a.py", root / "link.py")
    os.symlink("sub", root / "ld")
    os.symlink("/etc/passwd", root / "out")


async def test_one_file_under_two_names_keeps_call_order(tmp_path):
    _tree(tmp_path)
    log = _Log()
    calls = [
        ToolCall("1", "write", {"path": "a.py"}),
        ToolCall("2", "write", {"path": "/workspace/a.py"}),  # the mount point spelling
        ToolCall("3", "write", {"path": "link.py"}),  # a symlink to a.py
        ToolCall("4", "write", {"path": "ld/x.py"}),  # through a symlinked directory
        ToolCall("5", "read", {"path": "sub/x.py"}),
        ToolCall("6", "write", {"path": "out"}),  # leads outside: resolved no further, still runs
        ToolCall("7", "write", {"path": "b.py"}),
    ]
    outcomes = await execute(calls, _tools(log), ToolContext(workspace=_FsWorkspace(tmp_path)))  # type: ignore[arg-type]
    assert [o.result.text for o in outcomes][:3] == ["write a.py", "write /workspace/a.py", "write link.py"]
    assert _serial(log, "write:a.py", "write:/workspace/a.py", "write:link.py")
    assert _span(log, "read:sub/x.py")[0] >= _span(log, "write:ld/x.py")[1]
    first = _span(log, "write:a.py")
    assert _span(log, "write:b.py")[0] < first[1] and _span(log, "write:out")[0] < first[1]  # independent


async def test_symlinks_made_earlier_in_the_turn_are_seen(tmp_path):
    (tmp_path / "a.py").write_text("a = 1\n")
    log = _Log()
    tools = {**_tools(log), "linker": Linker(log)}
    Linker.root = tmp_path
    calls = [
        ToolCall("1", "linker", {"path": "-"}),
        ToolCall("2", "write", {"path": "a.py"}),
        ToolCall("3", "write", {"path": "c.py"}),  # a symlink to a.py only once the command ran
    ]
    await execute(calls, tools, ToolContext(workspace=_FsWorkspace(tmp_path)))  # type: ignore[arg-type]
    assert _serial(log, "linker:-", "write:a.py", "write:c.py")


async def test_unresolvable_symlinks_conflict_with_everything(tmp_path):
    _tree(tmp_path)
    log = _Log()
    calls = [ToolCall("1", "write", {"path": "a.py"}), ToolCall("2", "write", {"path": "link.py"})]
    await execute(calls, _tools(log), ToolContext(workspace=_StatOnlyWorkspace(tmp_path)))  # type: ignore[arg-type]
    assert _serial(log, "write:a.py", "write:link.py")
    log = _Log()
    calls = [ToolCall("1", "write", {"path": "a.py"}), ToolCall("2", "write", {"path": "sub/b.py"})]
    await execute(calls, _tools(log), ToolContext(workspace=_StatOnlyWorkspace(tmp_path)))  # type: ignore[arg-type]
    assert not _serial(log, "write:a.py", "write:sub/b.py")  # no symlink on the way: still together
