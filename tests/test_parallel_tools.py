"""Acceptance: parallel tool calls make a turn as fast as its slowest call.

Every workspace operation gets 100 ms of injected latency (as a remote environment server
far away would add). Ten `read_file`s and a `grep` issued in one turn finish in under
300 ms; the same calls issued one per turn take over a second.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from conftest import ISOLATION_PROBLEM, make_backend
from vivace.harness.executor import ToolCall, execute
from vivace.harness.tools import default_tools
from vivace.harness.tools.base import ToolContext

LATENCY = 0.1


class LatencyWorkspace:
    """Delegates to a workspace after sleeping `delay` seconds on every operation."""

    def __init__(self, inner, delay: float):
        self._inner, self._delay = inner, delay
        self.id = inner.id

    def __getattr__(self, name):
        attr = getattr(self._inner, name)
        if not asyncio.iscoroutinefunction(attr):
            return attr

        async def delayed(*args, **kwargs):
            await asyncio.sleep(self._delay)
            return await attr(*args, **kwargs)

        return delayed


@pytest.fixture
async def slow_ctx(repo, state_dir):
    backend = make_backend("isolated" if ISOLATION_PROBLEM is None else "plain", state_dir)
    ws = await backend.create(backend.snapshot(str(repo)))
    for i in range(10):
        await ws.write_text(f"pkg/mod{i}.py", f"def f{i}():\n    return {i}\n")
    yield ToolContext(workspace=LatencyWorkspace(ws, LATENCY))
    await backend.aclose()


def _calls() -> list[ToolCall]:
    calls = [ToolCall(f"r{i}", "read_file", {"path": f"pkg/mod{i}.py"}) for i in range(10)]
    return calls + [ToolCall("g", "grep", {"pattern": "def f[0-9]", "path": "pkg"})]


async def test_one_parallel_turn_vs_one_call_per_turn(slow_ctx):
    tools = {t.name: t for t in default_tools()}
    t0 = time.monotonic()
    together = await execute(_calls(), tools, slow_ctx)
    parallel_s = time.monotonic() - t0

    t0 = time.monotonic()
    one_by_one = [(await execute([call], tools, slow_ctx))[0] for call in _calls()]
    serial_s = time.monotonic() - t0

    print(f"\n11 calls with {LATENCY * 1e3:.0f} ms latency each: one turn {parallel_s * 1e3:.0f} ms, "
          f"one call per turn {serial_s * 1e3:.0f} ms ({serial_s / parallel_s:.1f}x)")  # fmt: skip
    assert serial_s > 1.0
    assert parallel_s < serial_s / 3  # ~1/11 here; a ratio, so a loaded machine (make test's workers) slows both
    # Same results either way, in call order.
    assert [o.result for o in together] == [o.result for o in one_by_one]
    assert not any(o.result.is_error for o in together)
    assert "return 3" in together[3].result.text and "def f9" in together[10].result.text


async def test_edits_of_one_file_under_several_names_all_land(slow_ctx):
    """Three edits of pkg/mod0.py in one turn (plain, /workspace/ and through a symlink): each
    reads the file and writes it back, so running any two together would lose an edit."""
    await slow_ctx.workspace.exec("ln -s pkg/mod0.py alias0.py")
    tools = {t.name: t for t in default_tools()}
    calls = [
        ToolCall("1", "edit_file", {"path": "pkg/mod0.py", "old_string": "def f0", "new_string": "def g0"}),
        ToolCall("2", "edit_file", {"path": "/workspace/pkg/mod0.py", "old_string": "return 0", "new_string": "return 1"}),
        ToolCall("3", "edit_file", {"path": "alias0.py", "old_string": "():", "new_string": "(x):"}),
        ToolCall("4", "read_file", {"path": "pkg/mod1.py"}),
    ]  # fmt: skip
    outcomes = await execute(calls, tools, slow_ctx)
    assert [o.result.text.split(":")[0] for o in outcomes[:3]] == [
        "Edited pkg/mod0.py", "Edited /workspace/pkg/mod0.py", "Edited alias0.py"
    ]  # fmt: skip
    assert await slow_ctx.workspace.read_text("pkg/mod0.py") == "def g0(x):\n    return 1\n"
    assert outcomes[3].started_s < outcomes[0].started_s + outcomes[0].duration_s  # unrelated: ran alongside


async def test_parallel_writes_into_one_new_directory_all_land(repo, state_dir, monkeypatch):
    """Two write_file calls of one turn into a directory that does not exist yet both create it;
    the one that lost the race failed with "changed while resolving" (a path escape, to the model).
    Each write now lands, as in a shell (mkdir -p)."""
    backend = make_backend("isolated" if ISOLATION_PROBLEM is None else "plain", state_dir)
    try:
        ws = await backend.create(backend.snapshot(str(repo)))
        ctx = ToolContext(workspace=ws)
        calls = [
            ToolCall(f"w{i}", "write_file", {"path": f"new/deep/m{i}.py", "content": f"X = {i}\n"}) for i in range(8)
        ]
        outcomes = await execute(calls, {t.name: t for t in default_tools()}, ctx)
        assert not any(o.result.is_error for o in outcomes), [o.result.text for o in outcomes]
        # The race made certain: the directory appears between the walk's look and its mkdir.
        import vivace.sandbox.paths as paths

        real_mkdir = paths.os.mkdir

        def beaten_to_it(name, mode=0o777, *, dir_fd=None):
            real_mkdir(name, mode, dir_fd=dir_fd)
            raise FileExistsError(name)

        monkeypatch.setattr(paths.os, "mkdir", beaten_to_it)
        await ws.write_text("other/dir/a.py", "A = 1\n")
        monkeypatch.undo()
        assert await ws.read_text("other/dir/a.py") == "A = 1\n"
        assert [await ws.read_text(f"new/deep/m{i}.py") for i in range(8)] == [f"X = {i}\n" for i in range(8)]
    finally:
        await backend.aclose()
