"""The scorer: one deterministic function of (task, trajectory, final workspace) that is both
the benchmark's judgement and the RL reward.

Components (each in [0, 1], 1 is best; the weights and the total are in config.ScoreConfig):
- correctness: the hidden tests, after the agent's edits to test files are undone and the
  task's hidden test files are written fresh, so changing tests never helps. 1 when every
  FAIL_TO_PASS test passes (an expected failure does not count: the code can call pytest.xfail)
  and every PASS_TO_PASS test passes or fails as expected, else 0 (fractions are reported too).
- adherence: mean of five parts — files touched vs the reference (Jaccard), change size vs
  the reference (ref/agent lines, capped at 1), new lint problems on the lines the agent
  added (1/(1+n), with the same ruff as the read_lints tool), no edits to tests, no stray new
  files (1/(1+n)).
- efficiency: mean of turns (target/turns), tool calls per turn (/target) and completion
  tokens (target/tokens; 1 when the policy does not report tokens).
- claims: share of the final answer's checkable claims the trajectory backs — "tests pass"
  needs a test command after the last edit that exited 0; "I ran/verified ..." needs a
  command run; every file name mentioned must appear in a tool call, result or the diff.
- format: 1/(1 + malformed tool calls).

Correctness is also the RL reward: bench/guard.py takes out of the test run what would raise it
without the fix (modules shadowing pytest, the agent's pytest configuration, bytecode), and says so
in the details; outcomes come only from pytest's own final summary (tasks.testrun).

Scoring changes the workspace (test files); score a workspace only once, after the episode.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, Field

from vivace.bench.guard import SAFE_GIT, guard_runner, unguard_runner
from vivace.bench.patch import FileChange, is_test_path, parse_patch
from vivace.config import ScoreConfig
from vivace.harness.agent import WAITING_FOR_POLICY
from vivace.harness.tools.base import ToolContext
from vivace.harness.tools.shell import ReadLints, ReadLintsArgs
from vivace.harness.trajectory import Trajectory
from vivace.sandbox.base import Workspace
from vivace.tasks.format import Task
from vivace.tasks.testrun import no_outcome_reason, run_tests

_REVERT_PATCH = ".vivace-revert-tests.patch"
_EDIT_TOOLS = ("edit_file", "write_file", "delete_file")
_TEST_CMD = re.compile(r"\b(pytest|unittest|tox|nox|make\s+test|npm\s+test|cargo\s+test|go\s+test)\b")
_TEST_CLAIM = re.compile(
    r"\b(all\s+)?(the\s+)?(tests?|test suite|specs?)\b[^.\n]{0,40}?\b(now\s+)?(pass(es|ed|ing)?|green|succeed(s|ed)?)\b",
    re.I,
)
_RUN_CLAIM = re.compile(r"\bI\s+(ran|have run|executed|tested|verified|confirmed)\b", re.I)
_FILE = re.compile(r"(?<![\w/.-])([\w./-]+\.(?:py|pyi|md|txt|toml|json|cfg|ini|yaml|yml|js|ts|rs|go|java|c|h))\b")


class Score(BaseModel):
    task_id: str
    total: float
    correctness: float
    adherence: float
    efficiency: float
    claims: float
    format: float
    resolved: bool
    details: dict[str, Any] = Field(default_factory=dict)  # every measured number behind the components


async def score(
    task: Task, traj: Trajectory, workspace: Workspace, weights: ScoreConfig | None = None, setup_diff: str = ""
) -> Score:
    """`setup_diff`: the workspace's diff after the task's setup commands ran, before the agent (they
    run in the workspace, so what they changed is in the episode's diff too, and is not the agent's)."""
    w = weights or ScoreConfig()
    if traj.diff_failed:  # what the agent changed is unknown: nothing could be undone or set aside for the tests
        reason = traj.error or "the workspace diff could not be computed"
        zero = dict(total=0.0, correctness=0.0, adherence=0.0, efficiency=0.0, claims=0.0, format=0.0)
        return Score(task_id=task.id, **zero, resolved=False, details={"not_scored": reason})
    agent, by_setup = agent_changes(traj.diff, setup_diff)
    reference = parse_patch(task.reference_patch)
    tests, test_details = await _correctness(task, agent, workspace, _test_files(task, reference))
    adherence, adherence_details = await _adherence(agent, reference, workspace)
    efficiency, efficiency_details = _efficiency(traj, w)
    unsupported, n_claims = unsupported_claims(traj)
    claims = 1.0 if n_claims == 0 else 1 - len(unsupported) / n_claims
    fmt = 1 / (1 + traj.format_errors)
    correct = 1.0 if tests else 0.0
    total = correct * (w.correctness + w.adherence * adherence + w.efficiency * efficiency)
    total -= w.claims * (1 - claims) + w.format * (1 - fmt)
    details = {
        **({"setup_changes_left_out": by_setup} if by_setup else {}),
        **test_details,
        **adherence_details,
        **efficiency_details,
        **_rejected_edits(traj),
        "claims_checked": n_claims,
        "unsupported_claims": unsupported,
        "format_errors": traj.format_errors,
        "stop_reason": traj.stop_reason,
        # A wall-clock stop while waiting for the policy: counted apart in the report (a slow endpoint).
        "timed_out_waiting": traj.stop_reason == "timeout" and (traj.error or "").endswith(WAITING_FOR_POLICY),
    }
    return Score(
        task_id=task.id,
        total=round(total, 6),
        correctness=correct,
        adherence=round(adherence, 6),
        efficiency=round(efficiency, 6),
        claims=round(claims, 6),
        format=round(fmt, 6),
        resolved=tests,
        details=details,
    )


def agent_changes(diff: str, setup_diff: str = "") -> tuple[list[FileChange], list[str]]:
    """(the agent's changes, the paths left out as the setup's): the episode's diff less each path
    whose section is exactly what the setup left (a build's egg-info, a generated config). A path
    the agent changed further counts as the agent's, setup's part with it."""
    setup = {c.path: c.text for c in parse_patch(setup_diff)}
    changes = parse_patch(diff)
    by_setup = [c.path for c in changes if setup.get(c.path) == c.text]
    return [c for c in changes if setup.get(c.path) != c.text], by_setup


async def _correctness(
    task: Task, agent: list[FileChange], ws: Workspace, own_tests: set[str]
) -> tuple[bool, dict[str, Any]]:
    """`own_tests`: the task's own test files (_test_files), undone like any test path the agent edited."""
    test_edits = [c for c in agent if is_test_path(c.path) or c.path in own_tests]
    if test_edits:  # undo them: the hidden tests judge the code, not tests the agent rewrote
        await ws.write_text(_REVERT_PATCH, "".join(c.text for c in test_edits))
        undo = await ws.exec(
            f"{SAFE_GIT} apply -R --unsafe-paths {_REVERT_PATCH}; rc=$?; rm -f {_REVERT_PATCH}; exit $rc"
        )
        if undo.exit_code in (126, 127):  # no git in the workspace: the environment's failure
            raise RuntimeError(f"could not undo the agent's test edits: {undo.stderr.strip()}")
        if undo.exit_code != 0:  # tests the agent made into what its diff cannot take back (a symlink)
            return False, {"test_files_edited": list(dict.fromkeys(c.path for c in test_edits)),
                           "tests_not_run": f"the agent's test edits could not be undone: {undo.stderr.strip()[:300]}"}  # fmt: skip
    for path, content in task.tests.files.items():
        await ws.write_text(path, content)
    guarded = await guard_runner(ws, agent, task.tests.command)
    ids = task.tests.fail_to_pass + task.tests.pass_to_pass
    try:
        run = await run_tests(ws, task.tests.command, ids, task.tests.timeout_s)
    finally:
        await unguard_runner(ws, guarded)
    # A test that must start passing must pass: the code under test can call pytest.xfail() itself.
    f2p = sum(run.passed(t, xfail=False) for t in task.tests.fail_to_pass)
    p2p = sum(run.passed(t) for t in task.tests.pass_to_pass)
    resolved = f2p == len(task.tests.fail_to_pass) and p2p == len(task.tests.pass_to_pass) and not run.timed_out
    details = {
        "fail_to_pass": [f2p, len(task.tests.fail_to_pass)],
        "pass_to_pass": [p2p, len(task.tests.pass_to_pass)],
        "tests_timed_out": run.timed_out,
        "test_files_edited": list(dict.fromkeys(c.path for c in test_edits)),
        **guarded,
    }
    if xfailed := [t for t in task.tests.fail_to_pass if run.outcome(t) == "XFAIL"]:
        details["fail_to_pass_xfailed"] = xfailed
    if run.untrusted:
        details["summary_untrusted"] = run.untrusted
    if (
        reason := no_outcome_reason(run, ids)
    ) is not None:  # no id got an outcome: the code does not import, or no tests ran
        details["tests_not_run"] = reason
    elif not run.timed_out and (missing := [t for t in ids if run.outcome(t) is None]):
        details["ids_without_outcome"] = missing[:10]  # a wrong id, or a module that did not import
    return resolved, details


def _test_files(task: Task, reference: list[FileChange]) -> set[str]:
    """The task's own test files, whatever their names: those of its test ids and its hidden tests, less
    any file its reference fix changes (a doctest's id names the module under test)."""
    ids = task.tests.fail_to_pass + task.tests.pass_to_pass
    files = {t.split("::")[0] for t in ids if t.split("::")[0].endswith(".py")} | set(task.tests.files)
    return files - {c.path for c in reference}


async def _adherence(agent: list[FileChange], reference: list[FileChange], ws: Workspace) -> tuple[float, dict]:
    mine = [c for c in agent if not is_test_path(c.path)]
    ref = [c for c in reference if not is_test_path(c.path)]
    a_paths, r_paths = {c.path for c in mine}, {c.path for c in ref}
    files = 1.0 if not (a_paths | r_paths) else len(a_paths & r_paths) / len(a_paths | r_paths)
    a_size, r_size = sum(c.size for c in mine), sum(c.size for c in ref)
    size = (min(1.0, r_size / a_size) if a_size else 0.0) if r_size else (1.0 if not a_size else 0.5)
    new_lint = await _new_lint_problems(mine, ws)
    stray = [c.path for c in mine if c.new_file and c.path not in r_paths]
    touched_tests = any(is_test_path(c.path) for c in agent)
    parts = [files, size, 1 / (1 + new_lint), 0.0 if touched_tests else 1.0, 1 / (1 + len(stray))]
    return sum(parts) / len(parts), {
        "files_touched": sorted(a_paths),
        "files_reference": sorted(r_paths),
        "lines_changed": a_size,
        "lines_reference": r_size,
        "new_lint_problems": new_lint,
        "stray_files": stray,
    }


async def _new_lint_problems(changes: list[FileChange], ws: Workspace) -> int:
    py = {c.path: set(c.added_lines) for c in changes if c.path.endswith(".py") and not c.deleted and c.added_lines}
    if not py:
        return 0
    result = await ReadLints().run(ReadLintsArgs(paths=sorted(py)), ToolContext(workspace=ws))
    if result.is_error:
        return 0  # no linter here: not the agent's fault
    return sum(1 for path, line, *_ in result.meta.get("diagnostics", []) if line in py.get(path, ()))


def _rejected_edits(traj: Trajectory) -> dict[str, Any]:
    """How many edits the tools refused (an old_string not found or not unique, a path that does not
    exist), and the first one's path and error: for the reference fix, the sign that its patch does not
    apply here."""
    rejected = [c for t in traj.turns for c in t.tool_calls if c.name in _EDIT_TOOLS and c.is_error]
    if not rejected:
        return {"edits_rejected": 0}
    first = rejected[0]
    path = first.arguments.get("path", "?") if isinstance(first.arguments, dict) else "?"
    said = " ".join(first.result.removeprefix("Error: ").split())[:200]
    return {"edits_rejected": len(rejected), "first_rejected_edit": f"{first.name} {path}: {said}"}


def _efficiency(traj: Trajectory, w: ScoreConfig) -> tuple[float, dict[str, Any]]:
    turns = max(1, len(traj.turns))
    tool_turns = sum(1 for t in traj.turns if t.tool_calls)
    per_turn = traj.tool_calls / tool_turns if tool_turns else 0.0
    tokens = traj.completion_tokens
    parts = [
        min(1.0, w.target_turns / turns),
        min(1.0, per_turn / w.target_calls_per_turn),
        min(1.0, w.target_tokens / tokens) if tokens else 1.0,
    ]
    return sum(parts) / len(parts), {
        "turns": len(traj.turns),
        "tool_calls": traj.tool_calls,
        "tool_calls_per_turn": round(per_turn, 3),
        "completion_tokens": tokens,
        "model_s": round(sum(t.model_s for t in traj.turns), 3),
        "tool_s": round(sum(t.tools_s for t in traj.turns), 3),
        "wall_s": round(traj.wall_s, 3),
    }


def unsupported_claims(traj: Trajectory) -> tuple[list[str], int]:
    """(claims in the final answer the trajectory does not back, number of claims checked)."""
    text = traj.final_message
    calls = [c for t in traj.turns for c in t.tool_calls]
    last_edit = max((i for i, c in enumerate(calls) if c.name in _EDIT_TOOLS and not c.is_error), default=-1)
    runs = [(i, c) for i, c in enumerate(calls) if c.name == "run_terminal_cmd" and not c.is_error]
    checked: list[str] = []
    unsupported: list[str] = []
    if m := _TEST_CLAIM.search(text):
        checked.append(m.group(0))
        test_runs = [(i, c) for i, c in runs if _TEST_CMD.search(str((c.arguments or {}).get("command", "")))]
        latest = test_runs[-1] if test_runs else None
        if latest is None or latest[0] < last_edit or latest[1].meta.get("exit_code") != 0:
            unsupported.append(m.group(0))
    if m := _RUN_CLAIM.search(text):
        checked.append(m.group(0))
        if not runs:
            unsupported.append(m.group(0))
    seen = traj.diff + "".join(str(c.arguments) + c.result for c in calls)
    for name in sorted(set(_FILE.findall(text))):
        checked.append(name)
        if name not in seen and name.rsplit("/", 1)[-1] not in seen:
            unsupported.append(name)
    return unsupported, len(checked)
