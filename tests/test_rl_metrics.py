"""rl.metrics.behaviour: the per-episode behaviours the RL report compares before and after."""

from __future__ import annotations

from vivace.harness.trajectory import ToolRecord, Trajectory, Turn
from vivace.rl.metrics import behaviour


def call(name: str, args, *, error: bool = False, malformed: bool = False) -> ToolRecord:
    return ToolRecord(id="c", name=name, arguments=args, result="Error" if error else "ok", is_error=error,
                      format_error=malformed)  # fmt: skip


def episode(*turns: list[ToolRecord]) -> Trajectory:
    return Trajectory(request="fix it", policy="p", system_prompt="s", system_prompt_version="1",
                      turns=[Turn(content="", tool_calls=list(t)) for t in turns], stop_reason="max_turns")  # fmt: skip


def test_repeats_of_a_rejected_call_are_counted_once_each():
    bad = {"path": "pkg/core.py", "old_string": " x", "new_string": " y"}
    traj = episode(
        [call("read_file", {"path": "pkg/core.py"})],
        [call("edit_file", bad, error=True)],
        [call("edit_file", dict(reversed(list(bad.items()))), error=True)],  # same arguments, other key order
        [call("edit_file", bad, error=True), call("edit_file", {**bad, "old_string": " z"}, error=True)],
    )
    b = behaviour(traj)
    assert b["repeated_rejected_calls"] == 2
    assert b["tool_calls"] == 5 and b["turns"] == 4


def test_a_call_that_succeeded_may_be_repeated_and_a_changed_call_is_not_a_repeat():
    traj = episode(
        [call("run_terminal_cmd", {"command": "pytest -q"})],
        [call("edit_file", {"path": "a.py", "old_string": "1", "new_string": "2"}, error=True)],
        [call("edit_file", {"path": "a.py", "old_string": "1 ", "new_string": "2"})],
        [call("run_terminal_cmd", {"command": "pytest -q"})],
    )
    assert behaviour(traj)["repeated_rejected_calls"] == 0


def test_malformed_calls_with_raw_text_arguments_are_compared_as_text():
    raw = '{"name": "read_file", "arguments": {"path": "a\nb"}}'
    traj = episode(
        [call("read_file", raw, error=True, malformed=True)], [call("read_file", raw, error=True, malformed=True)]
    )
    b = behaviour(traj)
    assert b["repeated_rejected_calls"] == 1 and b["format_errors"] == 2
