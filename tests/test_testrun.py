"""Reading per-test outcomes from pytest's `-rA` summary, including awkward parametrized ids."""

from __future__ import annotations

import subprocess
import sys

from vivace.tasks.testrun import parse_outcomes

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
