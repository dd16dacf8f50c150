"""Running a task's tests in a workspace and reading per-test outcomes.

The command is run with the test *files* appended (not the individual ids), so a test id
that no longer exists cannot abort the whole run; each id's outcome is then looked up in
pytest's `-rA` summary (`PASSED path::name`, `FAILED path::name - msg`, ...). An id that
does not appear there (not collected, a collection error) counts as not passed.

Only pytest's own final summary is read: the last `short test summary info` section, up to the
final `N failed, M passed in Xs` line. The code under test prints into the same stdout (the
captured output of passed tests, which `-rA` shows above the summary; `atexit` handlers after
it; skip and xfail reasons, which pytest writes verbatim, newlines and all, inside it), so a
`PASSED id` line anywhere else proves nothing, and a summary holding more PASSED lines than the
final line counts passed tests holds forged ones: none of its PASSED lines is trusted then.

Used by the generator (which tests catch a mutant) and the scorer (did the fix work).
Not covered: test runners other than pytest-style summaries.
"""

from __future__ import annotations

import difflib
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
# A path may hold spaces too ("tests/sub dir/test_a.py"): it runs to the first "::".
_SUMMARY = re.compile(r"^(FAILED|ERROR|XFAIL|XPASS|SKIPPED)\s+(\S.*?::[^\s\[]+(?:\[.*?\])?)(?= - |\s*$)", re.M)
_PASSED = re.compile(r"^PASSED\s+(\S.*?::.*?)\s*$", re.M)
_HEADER = re.compile(r"^=+ short test summary info =+$")
# `1 failed, 2 passed, 1 warning in 0.12s` (`=`-framed without -q; "in 0.12 seconds" before pytest 5.3),
# with one of pytest's own counts in it, so that a program's "3 files written in 2s" is not taken for it.
_FINAL = re.compile(
    r"^=*\s*(?=.*\b(?:passed|failed|skipped|deselected|xfailed|xpassed|errors?|warnings?|no tests ran)\b)"
    r"(?:no tests ran|\d+ [\w ]+(?:, \d+ [\w ]+)*) in \d+(?:\.\d+)?(?:s| seconds)(?: \(.*\))?\s*=*$"
)
_N_PASSED = re.compile(r"\b(\d+) passed\b")
# The sandbox keeps the head and the tail of a long output and puts this line between them.
_OUTSIDE_FRAME = re.compile(r"^/\S+:\d+: in ")  # a traceback frame at an absolute path: not the project's
_DROPPED = re.compile(r"^\[\.\.\. \d+ bytes of output dropped \.\.\.\]$")
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")  # terminal colours (a repository's addopts may force them)


@dataclass(frozen=True)
class TestRun:
    __test__ = False  # not a pytest test class
    outcomes: dict[str, str] = field(default_factory=dict)  # test id -> PASSED / FAILED / ERROR / ...
    output: str = ""  # stdout + stderr of the run (capped by the sandbox)
    exit_code: int = 0
    timed_out: bool = False
    duration_s: float = 0.0
    untrusted: str | None = None  # why the summary's PASSED lines were not believed (see read_summary)

    def passed(self, test_id: str, xfail: bool = True) -> bool:
        """Passed, or (with `xfail`) failed as expected: a test marked xfail before and after a change
        keeps passing. The code under test can call pytest.xfail() itself, so a test that must start
        passing is asked with xfail=False."""
        return self.outcome(test_id) in (("PASSED", "XFAIL") if xfail else ("PASSED",))

    def outcome(self, test_id: str) -> str | None:
        """What pytest reported for `test_id`, also when a parameter in it is written as in the source
        (`test_x[café]`, which pytest reports as `test_x[caf\\xe9]`); None when it reported nothing."""
        if test_id in self.outcomes:
            return self.outcomes[test_id]
        head, bracket, params = test_id.partition("[")
        escaped = params.encode("unicode_escape").decode("ascii")  # pytest's ascii_escaped of a parameter id
        return self.outcomes.get(head + bracket + escaped) if bracket else None

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
    stdout, stderr = _ANSI.sub("", res.stdout), _ANSI.sub("", res.stderr)
    output = stdout + ("\n" + stderr if stderr else "")
    outcomes, untrusted = read_summary(stdout, truncated=res.stdout_dropped > 0)
    return TestRun(outcomes, output, res.exit_code, res.timed_out, res.duration_s, untrusted)


def parse_outcomes(stdout: str, truncated: bool = False) -> dict[str, str]:
    """Test id -> outcome from pytest's `-rA` short summary (read_summary)."""
    return read_summary(stdout, truncated)[0]


def read_summary(stdout: str, truncated: bool = False) -> tuple[dict[str, str], str | None]:
    """(test id -> outcome, why its PASSED lines were dropped or None) from pytest's final short
    summary section. An id reported twice (passed, then an error in teardown) keeps the bad outcome.
    `truncated`: the middle of stdout was dropped; a summary longer than the kept tail lost its
    header, so the section starts where the tail does."""
    section = _summary_section(stdout.split("\n"), truncated) or []
    text = "\n".join(section)
    passes = _PASSED.findall(text)
    counted = min((int(m.group(1)) if (m := _N_PASSED.search(line)) else 0 for line in section if _FINAL.match(line)),
                  default=0)  # fmt: skip
    untrusted = None
    if len(passes) > counted:  # pytest writes one PASSED line per passed test: the others are forged
        untrusted, passes = f"{len(passes)} PASSED lines for {counted} passed tests", []
    outcomes = dict.fromkeys(passes, "PASSED")
    seen: set[str] = set()
    for outcome, test_id in _SUMMARY.findall(text):
        if test_id not in seen:
            outcomes[test_id] = outcome
            seen.add(test_id)
    # A failure reported anywhere stands: a summary forged after pytest's cannot hide a real one.
    for outcome, test_id in _SUMMARY.findall(stdout):
        if outcome in ("FAILED", "ERROR") and test_id not in seen:
            outcomes[test_id] = outcome
            seen.add(test_id)
    return outcomes, untrusted


def _summary_section(lines: list[str], truncated: bool) -> list[str] | None:
    """The lines after the last summary header up to the last final line (which they include),
    or None when pytest printed no final line (killed, crashed, os._exit) or no summary. Lines
    printed after pytest's final line (atexit) are left out; a forged final line after it joins
    the section, where the smallest count of passed tests is the one believed."""
    lines = [line.rstrip("\r") for line in lines]
    cut = max((i for i, line in enumerate(lines) if _DROPPED.match(line)), default=-1) if truncated else -1
    end = max((i for i in range(cut + 1, len(lines)) if _FINAL.match(lines[i])), default=None)
    if end is None:
        return None
    start = max((i for i in range(cut + 1, end) if _HEADER.match(lines[i])), default=None)
    if start is None and not truncated:
        return None
    return lines[(cut if start is None else start) + 1 : end + 1]


def no_outcome_reason(run: TestRun, test_ids: list[str], max_chars: int = 300) -> str | None:
    """Why none of `test_ids` got an outcome (a collection error, a missing module, a wrong
    command), or None when at least one did: the run's exit code and its last error line."""
    if run.timed_out or any(run.outcome(t) is not None for t in test_ids):
        return None
    if run.outcomes:  # pytest reported tests, none of them by these ids
        near = difflib.get_close_matches(test_ids[0], list(run.outcomes), n=1, cutoff=0.5)
        closest = f"; the closest it reported to {test_ids[0]}: {near[0]}" if near else ""
        return (f"pytest reported {len(run.outcomes)} tests but none by the task's {len(test_ids)} ids{closest}; an id "
                "is FILE::[CLASS::]NAME[PARAMS] as pytest -rA prints it")[:max_chars]  # fmt: skip
    raw = [line.rstrip("\r") for line in run.output.split("\n")]
    if any(map(_HEADER.match, raw)) and not any(map(_FINAL.match, raw)):
        return (f"exit code {run.exit_code}: pytest printed its summary without the final 'N passed in Xs' line "
                "that outcomes are read by; it leaves that line out at -qq, so give the command no -q when the "
                "repository's pytest addopts have one")[:max_chars]  # fmt: skip
    lines = [line.strip() for line in run.output.splitlines() if line.strip()]
    errors = [line for line in lines if re.search(r"\b\w*(Error|Exception)\b|^E\s", line)]
    last = (errors or lines or ["no output"])[-1]
    if run.exit_code == 0 and not errors:  # it ran and passed, but said nothing outcomes are read from
        return (f"exit code 0, but no pytest -rA summary to read outcomes from: the test command must be pytest "
                f"with -rA (its last line: {last})")[:max_chars]  # fmt: skip
    return f"exit code {run.exit_code}: {last}"[:max_chars]


def shown_failure(output: str, failing: list[str]) -> tuple[str, str]:
    """(test id, failure_section) of the first of `failing` whose failure pytest showed, else (failing[0], "").
    When a module fails to import, pytest runs no test at all: the first failing id may be one that passes
    once collection gets past the broken module, and has no section."""
    return next(((t, section) for t in failing if (section := failure_section(output, t))), (failing[0], ""))


def failure_section(output: str, test_id: str, max_lines: int = 30) -> str:
    """The traceback pytest printed for one failing test (its `___ name ___` section), capped; for a
    test whose module did not import, that module's `___ ERROR collecting file ___` section, headed by
    its title and without the frames outside the project (absolute paths: the interpreter's importlib)."""
    file, name = test_id.split("::")[0], test_id.split("::")[-1]
    lines = output.splitlines()
    start = next((i for i, line in enumerate(lines) if re.match(rf"^_+ {re.escape(name)}(\[.*\])? _+$", line)), None)
    if start is not None:
        return _capped(_until_next_section(lines, start), max_lines)
    title = f"ERROR collecting {file}"
    start = next((i for i, line in enumerate(lines) if re.match(rf"^_+ {re.escape(title)} _+$", line)), None)
    if start is None:
        return ""
    section = _until_next_section(lines, start)
    outside = {j for i, line in enumerate(section) if _OUTSIDE_FRAME.match(line) for j in (i, i + 1)}  # frame, code
    return _capped([title, *(line for i, line in enumerate(section) if i not in outside)], max_lines)


def _until_next_section(lines: list[str], start: int) -> list[str]:
    end = next(
        (j for j in range(start + 1, len(lines)) if re.match(r"^(_{3,} .* _{3,}|={3,}.*={3,})$", lines[j])),
        len(lines),
    )
    return lines[start + 1 : end]


def _capped(section: list[str], max_lines: int) -> str:
    if len(section) > max_lines:
        section = section[: max_lines // 2] + ["..."] + section[-(max_lines // 2) :]
    return "\n".join(section).strip("\n")
