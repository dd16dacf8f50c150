"""`vivace sandbox bench`: the command works end to end; the full-size run is a slow benchmark."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import needs_isolation


def _bench(state_dir, *args: str, timeout: int) -> dict:
    env = {**os.environ, "VIVACE_STATE_DIR": str(state_dir)}
    r = subprocess.run([sys.executable, "-m", "vivace.cli", "sandbox", "bench", "--json", *args],
                       capture_output=True, text=True, env=env, timeout=timeout)  # fmt: skip
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@needs_isolation
def test_bench_small_run_reports_both_backends(tmp_path):
    res = _bench(tmp_path, "--n", "6", "--concurrency", "3", "--files", "60", "--baseline-n", "3", timeout=300)
    iso, plain = res["isolated"], res["plain"]
    assert iso["n"] == 6 and plain["n"] == 3
    assert iso["failures"] == 0 and plain["failures"] == 0
    assert iso["live_at_peak"] == 6  # all alive at once before teardown
    assert iso["metrics"]["live"] == 0 and plain["metrics"]["live"] == 0
    assert iso["first_command_ms"]["p99"] >= iso["first_command_ms"]["p50"] > 0
    assert res["ratio_plain_over_isolated"]["throughput"] > 0


@needs_isolation
def test_bench_scaling_reports_each_step(tmp_path):
    res = _bench(tmp_path, "--scaling", "0,4", "--files", "30", timeout=300)
    assert set(res) == {"0", "4"}
    assert all(0 < r["exec_p50_ms"] <= r["exec_p90_ms"] for r in res.values())


@pytest.mark.slow
@needs_isolation
def test_bench_acceptance_500_workspaces(tmp_path):
    """The issue's goal: 500 live at once over a 2,000-file repo, >= 10x faster than full copy."""
    res = _bench(tmp_path, "--n", "500", "--concurrency", "32", "--files", "2000", timeout=1800)
    iso = res["isolated"]
    assert iso["failures"] == 0 and iso["live_at_peak"] == 500
    assert res["ratio_plain_over_isolated"]["first_command_p50"] >= 10


def test_a_run_directory_in_use_by_another_bench_is_refused(tmp_path):
    """Two `vivace bench` runs into one --out both appended to its results.jsonl (one report, two models'
    rows), and a second start rewrote the file under the first run. The first to start holds OUT/.lock."""
    from vivace.bench.runner import start_run

    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from pathlib import Path; from vivace.locks import lock_exclusively; "
         "f = lock_exclusively(Path(sys.argv[1]) / '.lock'); print('held', flush=True); time.sleep(60)", str(tmp_path)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline() == "held\n"
        (tmp_path / "results.jsonl").write_text('{"model": "m", "task_id": "t", "sample": 0}\n')
        settings = {"models": ["m"], "tasks": ["t"], "samples": 1}
        with pytest.raises(ValueError, match=f"in use by another `vivace bench` \\(pid {holder.pid}\\)"):
            start_run(tmp_path, settings, resume=True)
        assert (tmp_path / "results.jsonl").read_text().count("\n") == 1  # untouched
    finally:
        holder.kill()
        holder.wait()
    assert start_run(tmp_path / "other", {"models": ["m"], "tasks": ["t"], "samples": 1}) == []
    assert start_run(tmp_path / "other", {"models": ["m"], "tasks": ["t"], "samples": 1}) == []  # its own: again
