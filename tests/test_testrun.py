"""Reading per-test outcomes from pytest's `-rA` summary, including awkward parametrized ids, and
only from pytest's own summary."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from conftest import make_backend
from vivace.tasks.format import DEFAULT_TEST_COMMAND
from vivace.tasks.testrun import TestRun, failure_section, no_outcome_reason, parse_outcomes, read_summary, run_tests

SUITE = """
import pytest

@pytest.mark.parametrize("src", ["{% if x %}", "a - b", "x] - [y", "tab\\there", "plain"])
def test_params(src):
    assert "plain" not in src

def test_ok():
    pass

class TestGroup:
    def test_fails(self):
        assert 1 == 2, "one is not two - really"
"""


def test_outcomes_of_real_pytest_output(tmp_path):
    (tmp_path / "test_sample.py").write_text(SUITE)

    def run(*args: str) -> str:
        cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args]
        return subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, check=False).stdout

    collected = [line for line in run("--collect-only", "-q").splitlines() if "::" in line]
    assert len(collected) == 7 and any(" - " in c for c in collected)
    outcomes = parse_outcomes(run("-q", "-rA", "--tb=short"))
    assert set(outcomes) == set(collected)  # every id, spaces and " - " included, read whole
    failed = {t for t, o in outcomes.items() if o == "FAILED"}
    assert failed == {"test_sample.py::test_params[plain]", "test_sample.py::TestGroup::test_fails"}


def test_no_outcome_reason_from_real_runs(tmp_path):
    """A run that reports none of the ids says why (a conftest that cannot import, a syntax
    error in the code under test); a run that reports any of them, or timed out, says nothing."""
    (tmp_path / "test_sample.py").write_text("from calc import add\n\ndef test_add():\n    assert add(1, 2) == 3\n")
    (tmp_path / "calc.py").write_text("def add(a, b):\n    return a + b\n")

    def run() -> TestRun:
        cmd = [sys.executable, "-m", "pytest", "-q", "-rA", "--tb=short", "-p", "no:cacheprovider"]
        done = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, check=False)
        return TestRun(parse_outcomes(done.stdout), done.stdout + done.stderr, done.returncode)

    ids = ["test_sample.py::test_add"]
    assert no_outcome_reason(run(), ids) is None
    (tmp_path / "calc.py").write_text("def add(a, b):\n    return a +\n")
    reason = no_outcome_reason(run(), ids)
    assert reason is not None and reason.startswith("exit code 2:") and "SyntaxError" in reason
    (tmp_path / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    (tmp_path / "conftest.py").write_text("import not_installed_anywhere\n")
    reason = no_outcome_reason(run(), ids)
    assert reason is not None and "ModuleNotFoundError" in reason and "not_installed_anywhere" in reason
    assert no_outcome_reason(TestRun({}, "", 0, timed_out=True), ids) is None  # tests_timed_out says it
    assert no_outcome_reason(TestRun({}, "", 127), ids) == "exit code 127: no output"
    # Another runner (python -m unittest) passed and printed no pytest summary: "exit code 0: OK" said nothing.
    unittest_said = no_outcome_reason(TestRun({}, "...\n------\nRan 3 tests in 0.001s\n\nOK\n", 0), ids)
    assert unittest_said == (
        "exit code 0, but no pytest -rA summary to read outcomes from: the test command must be pytest with -rA "
        "(its last line: OK)"
    )
    assert len(no_outcome_reason(TestRun({}, "E   " + "x" * 1000, 1), ids)) == 300


def test_failure_section_of_a_failing_test_and_of_a_module_that_did_not_import(tmp_path):
    """A failing test's section is its traceback; a test in a module that failed to import gets that
    module's collection error, without the interpreter's own frames; a test pytest never reached, none."""
    (tmp_path / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    (tmp_path / "test_a.py").write_text("from calc import add\n\ndef test_add():\n    assert add(1, 2) == 3\n")
    cmd = [sys.executable, "-m", "pytest", "-q", "-rA", "--tb=short", "-p", "no:cacheprovider"]
    out = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, check=False).stdout
    section = failure_section(out, "test_a.py::test_add")
    assert "assert add(1, 2) == 3" in section and "ERROR collecting" not in section
    (tmp_path / "test_b.py").write_text("from calc import sub\n\ndef test_sub():\n    assert sub(3, 2) == 1\n")
    out = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, check=False).stdout
    assert "Interrupted" in out and not parse_outcomes(out)  # one broken module: no test ran at all
    section = failure_section(out, "test_b.py::test_sub")
    assert section.startswith("ERROR collecting test_b.py")
    assert "cannot import name 'sub' from 'calc'" in section and "test_b.py:1: in <module>" in section
    assert not [line for line in section.splitlines() if line.startswith("/")]  # importlib's frame is gone
    assert failure_section(out, "test_a.py::test_add") == ""  # its module imported; the run stopped first


FORGER = """
import atexit, pytest

def test_prints():  # its captured output is shown above the summary
    print("PASSED test_forge.py::test_fails\\n1 passed in 0.01s")

def test_fails():
    atexit.register(print, "PASSED test_forge.py::test_fails")  # after pytest's final line
    assert 0

def test_xfails():
    pytest.xfail("not yet")
"""


def test_only_pytests_own_summary_is_read(tmp_path):
    """PASSED lines the code prints (captured output, at exit) are not outcomes; PASSED lines in
    the summary beyond its count of passed tests (a skip reason is printed verbatim) are forged,
    and none is believed; a cut output's tail holds the summary."""
    (tmp_path / "test_forge.py").write_text(FORGER)
    cmd = [sys.executable, "-m", "pytest", "-q", "-rA", "--tb=short", "-p", "no:cacheprovider", "test_forge.py"]
    env = {**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    out = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, env=env, check=False).stdout
    assert out.count("PASSED test_forge.py::test_fails") == 2  # printed twice, once above and once below
    outcomes, untrusted = read_summary(out)
    assert untrusted is None and outcomes == {"test_forge.py::test_prints": "PASSED",
                                              "test_forge.py::test_fails": "FAILED",
                                              "test_forge.py::test_xfails": "XFAIL"}  # fmt: skip
    run = TestRun(outcomes)
    assert run.passed("test_forge.py::test_xfails") and not run.passed("test_forge.py::test_xfails", xfail=False)
    (tmp_path / "test_forge.py").write_text(
        FORGER.replace("assert 0", 'pytest.skip("x\\nPASSED test_forge.py::test_fails")')
    )
    out = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, env=env, check=False).stdout
    outcomes, untrusted = read_summary(out)
    assert untrusted == "2 PASSED lines for 1 passed tests" and "test_forge.py::test_fails" not in outcomes
    header, summary = "=" * 20 + " short test summary info " + "=" * 20, "PASSED a.py::t\nFAILED a.py::u - x\n"
    assert parse_outcomes(f"{header}\n{summary}1 failed, 1 passed in 0.01s\n3 files written in 2s\n") == {
        "a.py::t": "PASSED",
        "a.py::u": "FAILED",
    }
    cut = f"PASSED a.py::u\n...\n[... 9 bytes of output dropped ...]\n{summary}1 failed, 1 passed in 0.01s\n"
    assert parse_outcomes(cut, truncated=True) == {"a.py::t": "PASSED", "a.py::u": "FAILED"}
    assert parse_outcomes(cut) == {"a.py::u": "FAILED"}  # not cut: no header, no summary; a failure stands
    assert parse_outcomes(f"{header}\n{summary}") == {"a.py::u": "FAILED"}  # no final line: pytest did not finish


@pytest.mark.parametrize(
    ("addopts", "command"),
    [
        ("-ra -q", DEFAULT_TEST_COMMAND),  # pytest's documented example: with another -q, no final line
        ('"--color=yes"', DEFAULT_TEST_COMMAND),  # python-slugify's: every summary line coloured
        ("-q --color=yes", DEFAULT_TEST_COMMAND),
        ("", "python -m pytest -q -rA --color=yes -p no:cacheprovider"),  # a task's own command that colours
    ],
)
async def test_outcomes_whatever_the_repositorys_pytest_options(tmp_path, state_dir, addopts, command):
    """A repository's addopts could leave no outcome to read: a valid task was judged unsound and the
    oracle scored 0 ("exit code 0: PASSED ..." given as the reason the fix failed)."""
    (tmp_path / "test_sample.py").write_text("def test_ok():\n    pass\n\ndef test_bad():\n    assert 1 == 2\n")
    if addopts:
        (tmp_path / "pytest.ini").write_text(f"[pytest]\naddopts = {addopts}\n")
    backend = make_backend("plain", state_dir)
    try:
        ws = await backend.create(backend.snapshot(str(tmp_path)))
        run = await run_tests(ws, command, ["test_sample.py::test_ok"], 60)
        await ws.close()
    finally:
        await backend.aclose()
    assert run.outcomes == {"test_sample.py::test_ok": "PASSED", "test_sample.py::test_bad": "FAILED"}, run.output
    assert "\x1b[" not in run.output


def test_a_summary_without_its_final_line_is_named_as_the_reason(tmp_path):
    (tmp_path / "test_sample.py").write_text("def test_ok():\n    pass\n")
    cmd = [sys.executable, "-m", "pytest", "-qq", "-rA", "-p", "no:cacheprovider"]
    done = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, check=False)
    run = TestRun(parse_outcomes(done.stdout), done.stdout, done.returncode)
    assert run.outcomes == {}  # no final line: nothing is read (it is what proves the PASSED lines)
    reason = no_outcome_reason(run, ["test_sample.py::test_ok"])
    assert reason.startswith("exit code 0: pytest printed its summary without the final") and "-q" in reason


def test_ids_whose_path_holds_a_space_are_read():
    """`\\S+?::` stopped at the space: a test under "tests/sub dir/" had no outcome, and the oracle failed with
    "no pytest -rA summary" as the reason."""
    out = ("===== short test summary info =====\nPASSED tests/sub dir/test_a.py::test_ok\nFAILED tests/sub dir/test_a.py::test_bad[x y] - assert 1\n"
           "===== 1 failed, 1 passed in 0.01s =====\n")  # fmt: skip
    assert parse_outcomes(out) == {"tests/sub dir/test_a.py::test_ok": "PASSED",
                                   "tests/sub dir/test_a.py::test_bad[x y]": "FAILED"}  # fmt: skip
