"""Running a task's tests in a workspace and reading per-test outcomes.

The command is run with the test *files* appended (not the individual ids), so a test id
that no longer exists cannot abort the whole run; each id's outcome is then looked up in
pytest's `-rA` summary (`PASSED path::name`, `FAILED path::name - msg`, ...). An id that
does not appear there (not collected, a collection error) counts as not passed.

Used by the generator (which tests catch a mutant) and the scorer (did the fix work).
Not covered: test runners other than pytest-style summaries.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field

from vivace.sandbox.base import Workspace

# pytest imports every plugin its environment has installed. The sandbox's default toolchain is
# vivace's own environment, whose anyio plugin (anyio comes with httpx) took ~0.3 s of a ~0.7 s test
# run; the tasks vivace generates need no plugin, so their commands run with autoload off (Task.env).
NO_PLUGIN_AUTOLOAD = {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}

# A summary line is `OUTCOME path::name[params]`, then ` - message` for failures and xfails.
# Parameters may hold spaces and " - ": a PASSED line's id is the whole rest of the line; for
# the others the id ends at the first `]` before " - ". Misreading such a failing id is harmless:
# an id with no outcome counts as not passed, which it did not.
_SUMMARY = re.compile(r"^(FAILED|ERROR|XFAIL|XPASS|SKIPPED)\s+(\S+?::[^\s\[]+(?:\[.*?\])?)(?= - |\s*$)", re.M)
_PASSED = re.compile(r"^PASSED\s+(\S+?::.*?)\s*$", re.M)


@dataclass(frozen=True)
class TestRun:
    __test__ = False  # not a pytest test class
    outcomes: dict[str, str] = field(default_factory=dict)  # test id -> PASSED / FAILED / ERROR / ...
    output: str = ""  # stdout + stderr of the run (capped by the sandbox)
    exit_code: int = 0
    timed_out: bool = False
    duration_s: float = 0.0

    def passed(self, test_id: str) -> bool:
        return self.outcomes.get(test_id) in ("PASSED", "XFAIL")

    @property
    def failing(self) -> list[str]:
        return sorted(t for t, o in self.outcomes.items() if o in ("FAILED", "ERROR"))


def test_files(test_ids: list[str]) -> list[str]:
    """The files a list of pytest ids live in, in first-seen order."""
    files: list[str] = []
    for t in test_ids:
        f = t.split("::", 1)[0]
        if f not in files:
            files.append(f)
    return files


async def run_tests(workspace: Workspace, command: str, test_ids: list[str] | None, timeout_s: float) -> TestRun:
    """Runs `command` (+ the files of `test_ids`, when given) and parses the outcomes."""
    argv = command + ("".join(" " + shlex.quote(f) for f in test_files(test_ids)) if test_ids else "")
    res = await workspace.exec(argv, timeout=timeout_s)
    output = res.stdout + ("\n" + res.stderr if res.stderr else "")
    return TestRun(parse_outcomes(res.stdout), output, res.exit_code, res.timed_out, res.duration_s)


def parse_outcomes(stdout: str) -> dict[str, str]:
    """Test id -> outcome from pytest's `-rA` short summary. An id reported twice (passed, then
    an error in teardown) keeps the bad outcome."""
    outcomes = {test_id: "PASSED" for test_id in _PASSED.findall(stdout)}
    seen: set[str] = set()
    for outcome, test_id in _SUMMARY.findall(stdout):
        if test_id not in seen:
            outcomes[test_id] = outcome
            seen.add(test_id)
    return outcomes


def no_outcome_reason(run: TestRun, test_ids: list[str], max_chars: int = 300) -> str | None:
    """Why none of `test_ids` got an outcome (a collection error, a missing module, a wrong
    command), or None when at least one did: the run's exit code and its last error line."""
    if run.timed_out or any(t in run.outcomes for t in test_ids):
        return None
    lines = [line.strip() for line in run.output.splitlines() if line.strip()]
    errors = [line for line in lines if re.search(r"\b\w*(Error|Exception)\b|^E\s", line)]
    last = (errors or lines or ["no output"])[-1]
    return f"exit code {run.exit_code}: {last}"[:max_chars]


def failure_section(output: str, test_id: str, max_lines: int = 30) -> str:
    """The traceback pytest printed for one failing test (its `___ name ___` section), capped."""
    name = test_id.split("::")[-1]
    lines = output.splitlines()
    start = next((i for i, line in enumerate(lines) if re.match(rf"^_+ {re.escape(name)}(\[.*\])? _+$", line)), None)
    if start is None:
        return ""
    end = next(
        (j for j in range(start + 1, len(lines)) if re.match(r"^(_{3,} .* _{3,}|={3,}.*={3,})$", lines[j])),
        len(lines),
    )
    section = lines[start + 1 : end]
    if len(section) > max_lines:
        section = section[: max_lines // 2] + ["..."] + section[-(max_lines // 2) :]
    return "\n".join(section).strip("\n")
