"""Acceptance (slow, `make bench`): the bundled suite judged with the scripted baselines.

The oracle solves every task with adherence >= 0.95, doing nothing solves none, random
edits solve about none; and every bundled bug task is a real bug (the oracle's 100% proves
each reference fixes its task; null's 0% proves each starts broken).
"""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from conftest import ISOLATION_PROBLEM
from vivace.cli import app

pytestmark = pytest.mark.slow


def test_bundled_suite_with_baselines(tmp_path, state_dir):
    backend = "plain" if ISOLATION_PROBLEM else "isolated"
    args = ["bench", "--suite", "bundled", "--n", "100", "--concurrency", "8", "--json", "--out", str(tmp_path)]
    args += ["--model", "scripted:oracle", "--model", "scripted:null", "--model", "scripted:random"]
    result = CliRunner().invoke(app, [*args, "--backend", backend, "--state-dir", str(state_dir)])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    s = report["summary"]
    print(json.dumps(report, indent=1))
    assert s["scripted:oracle"]["episodes"] == 100 and s["scripted:oracle"]["errors"] == 0
    assert s["scripted:oracle"]["success"] == 1.0 and s["scripted:oracle"]["adherence_solved"] >= 0.95
    assert s["scripted:null"]["success"] == 0.0
    assert s["scripted:random"]["success"] <= 0.05
