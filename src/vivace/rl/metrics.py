"""Per-step metrics: rewards and their components, and how the agent behaves (the behaviours
RL is meant to shape: parallel tool calls, reading before editing, testing, fewer turns)."""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence

from vivace.bench.patch import is_test_path
from vivace.harness.trajectory import Trajectory

READS = {"read_file", "grep", "glob_file_search", "codebase_search", "list_dir"}
EDITS = {"edit_file", "write_file", "delete_file"}


def behaviour(traj: Trajectory) -> dict[str, float]:
    calls = [c for t in traj.turns for c in t.tool_calls]
    first_edit = next((i for i, c in enumerate(calls) if c.name in EDITS), len(calls))
    commands = [str((c.arguments or {}).get("command", "")) for c in calls if c.name == "run_terminal_cmd" and isinstance(c.arguments, dict)]  # fmt: skip
    return {
        "turns": len(traj.turns),
        "tool_calls": len(calls),
        "tool_calls_per_turn": len(calls) / max(len(traj.turns), 1),
        "reads_before_first_edit": sum(1 for c in calls[:first_edit] if c.name in READS),
        "edits": sum(1 for c in calls if c.name in EDITS),
        "test_runs": sum(1 for cmd in commands if "test" in cmd),
        "lint_calls": sum(1 for c in calls if c.name == "read_lints"),
        "format_errors": sum(1 for c in calls if c.format_error),
        "repeated_rejected_calls": repeated_rejected_calls(calls),
    }


def repeated_rejected_calls(calls) -> int:
    """Calls that repeat, name and arguments alike, an earlier call the tools rejected: the loop a
    small policy falls into when it copies its own failed edit instead of the text the error shows."""
    rejected: set[str] = set()
    repeats = 0
    for c in calls:
        key = json.dumps([c.name, c.arguments], sort_keys=True, default=str)
        repeats += key in rejected
        if c.is_error:
            rejected.add(key)
    return repeats


def milestones(traj: Trajectory) -> dict[str, bool]:
    """Verifiable steps towards a fix that an unsolved episode can reach too: `read`, a non-test
    file read (read_file succeeded, so the path was copied right); `edit`, an edit of a non-test
    file that applied (edit_file found its old_string, so the text was copied right)."""

    def done(name: str) -> bool:
        return any(
            c.name == name and not c.is_error and isinstance(c.arguments, dict)
            and not is_test_path(str(c.arguments.get("path", "")))
            for t in traj.turns for c in t.tool_calls
        )  # fmt: skip

    return {"read": done("read_file"), "edit": done("edit_file")}


def mean(xs: Sequence[float]) -> float:
    return statistics.fmean(xs) if xs else 0.0


def percentile(xs: Sequence[float], q: float) -> float:
    if not xs:
        return 0.0
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]
