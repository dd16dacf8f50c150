"""`vivace bench` end to end on a task file: several models, results, report files, errors."""

from __future__ import annotations

import json
import signal

import pytest
from typer.testing import CliRunner

from conftest import ISOLATION_PROBLEM
from vivace.cli import app
from vivace.tasks.format import RepoSpec, Task, TestSpec, save_jsonl
from vivace.tasks.generate import unified_diff

BACKEND = "plain" if ISOLATION_PROBLEM else "isolated"
CALC = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n"


def _tasks(repo) -> list[Task]:
    bugs = {"add": ("return a + b", "return a * b", "test_add"), "sub": ("return a - b", "return b - a", None)}
    out = []
    for name, (good, bad, test) in bugs.items():
        buggy = CALC.replace(good, bad)
        files = {}
        if test is None:  # sub has no visible test: a hidden one judges it
            test = "test_sub"
            files = {"tests/test_sub.py": "from pkg.calc import sub\n\n\ndef test_sub():\n    assert sub(5, 3) == 2\n"}
        path = "tests/test_calc.py" if name == "add" else "tests/test_sub.py"
        out.append(Task(
            id=f"calc-{name}", repo=RepoSpec(path=str(repo), patch=unified_diff("pkg/calc.py", CALC, buggy)),
            request=f"{name}() is wrong.", tests=TestSpec(fail_to_pass=[f"{path}::{test}"], files=files),
            reference_patch=unified_diff("pkg/calc.py", buggy, CALC), metadata={"split": "test"},
        ))  # fmt: skip
    return out


def test_bench_two_models(repo, tmp_path, state_dir):
    tasks_file = tmp_path / "tasks.jsonl"
    save_jsonl(_tasks(repo), tasks_file)
    out = tmp_path / "run"
    args = ["bench", "--model", "scripted:oracle", "--model", "scripted:null", "--tasks", str(tasks_file)]
    args += ["--out", str(out), "--json", "--backend", BACKEND, "--state-dir", str(state_dir), "--concurrency", "2"]
    result = CliRunner().invoke(app, [*args, "--samples", "2"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)["summary"]
    assert summary["scripted:oracle"]["success"] == 1.0 and summary["scripted:null"]["success"] == 0.0
    assert summary["scripted:oracle"]["adherence_solved"] >= 0.95
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert len(rows) == 8 and all("error" not in r for r in rows)  # 2 models x 2 tasks x 2 samples
    assert sorted(r["sample"] for r in rows) == [0] * 4 + [1] * 4
    assert len({r["trajectory"] for r in rows}) == 8 and all((out / r["trajectory"]).is_file() for r in rows)
    page = (out / "report.html").read_text()
    assert page.startswith("<!doctype html>") and "<svg" in page and "scripted:oracle" in page
    assert "| scripted:null |" in (out / "report.md").read_text()


def test_bench_warns_about_tasks_whose_tests_never_run(repo, tmp_path, state_dir):
    """A task whose hidden tests cannot even be collected here (a module this environment lacks)
    is unsolvable by any fix: with the reference fix among the models, bench says which and why
    instead of a bare 0%."""
    sound, broken = _tasks(repo)
    broken = broken.model_copy(update={"id": "calc-sub-broken", "tests": broken.tests.model_copy(update={
        "files": {"tests/test_sub.py": "import not_installed_anywhere\n\n\ndef test_sub():\n    pass\n"}})})  # fmt: skip
    tasks_file = tmp_path / "tasks.jsonl"
    save_jsonl([sound, broken], tasks_file)
    out = tmp_path / "run"
    args = ["bench", "--model", "scripted:oracle", "--model", "scripted:null", "--tasks", str(tasks_file)]
    args += ["--out", str(out), "--backend", BACKEND, "--state-dir", str(state_dir), "--concurrency", "2"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    reasons = {(r["model"], r["task_id"]): r["details"].get("tests_not_run") for r in rows}
    assert reasons[("scripted:oracle", "calc-add")] is None and reasons[("scripted:null", "calc-add")] is None
    for m in ("scripted:oracle", "scripted:null"):
        assert "ModuleNotFoundError" in reasons[(m, "calc-sub-broken")]
    said = " ".join(result.output.split())
    assert "1 task(s) are unsound in this environment (e.g. calc-sub-broken: the reference fix does not pass" in said
    assert "not_installed_anywhere" in said, said
    # Without the reference fix among the models nothing is judged: an unsolved task is not a broken one.
    null_only = ["bench", "--model", "scripted:null", "--tasks", str(tasks_file), "--out", str(tmp_path / "run2")]
    result = CliRunner().invoke(app, [*null_only, "--backend", BACKEND, "--state-dir", str(state_dir)])
    assert result.exit_code == 0 and "2/2" in result.output and "unsound" not in result.output, result.output


def test_bench_config_file_overrides_the_preset(repo, tmp_path, state_dir):
    tasks_file = tmp_path / "tasks.jsonl"
    save_jsonl(_tasks(repo)[:1], tasks_file)
    config = tmp_path / "one_turn.json"
    config.write_text(json.dumps({"agent": {"max_turns": 1}}))
    out = tmp_path / "run"
    args = ["bench", "--model", "scripted:oracle", "--tasks", str(tasks_file), "--out", str(out), "--json"]
    args += ["--backend", BACKEND, "--state-dir", str(state_dir), "--config", str(config)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    (row,) = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert row["details"]["stop_reason"] == "max_turns" and row["details"]["turns"] == 1 and not row["resolved"]
    # Bad files: a field no section has, a file that is not a table of sections, a file that is not there.
    for name, text, said in [("typo.json", '{"agent": {"max_turnz": 1}}', "max_turnz"),
                             ("list.json", "[1, 2]", "table of sections"), ("missing.json", None, "missing.json")]:  # fmt: skip
        path = tmp_path / name
        if text is not None:
            path.write_text(text)
        result = CliRunner().invoke(
            app, ["bench", "--model", "scripted:null", "--suite", "bundled", "--config", str(path)]
        )
        assert result.exit_code == 2 and said in result.output, result.output


def test_bench_bad_inputs(tmp_path):
    runner = CliRunner()
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "x", "repo": {"bundled": "nope"}, "request": "r", "tests": {"fail_to_pass": ["a"]}}\n')
    result = runner.invoke(app, ["bench", "--model", "scripted:null", "--tasks", str(bad)])
    assert result.exit_code == 2 and f"{bad}:1" in result.output and "repo" in result.output
    result = runner.invoke(app, ["bench", "--model", "nonsense", "--suite", "bundled"])
    assert result.exit_code == 2 and "valid forms" in result.output
    result = runner.invoke(app, ["bench", "--model", "scripted:null"])
    assert result.exit_code == 2 and "--suite" in result.output
    result = runner.invoke(app, ["bench", "--model", "scripted:null", "--suite", "everything"])
    assert result.exit_code == 2 and "unknown suite" in result.output
    result = runner.invoke(app, ["bench", "--model", "scripted:null", "--suite", "bundled", "--samples", "0"])
    assert result.exit_code == 2 and "--samples" in result.output


def test_bench_names_an_empty_tasks_file_and_refuses_an_unknown_split(tmp_path):
    runner = CliRunner()
    for text in ("", "\n  \n"):
        empty = tmp_path / "empty.jsonl"
        empty.write_text(text)
        result = runner.invoke(app, ["bench", "--model", "scripted:null", "--tasks", str(empty)])
        assert result.exit_code == 2 and f"{empty}: no tasks" in result.output, result.output
    for where in (["--suite", "bundled"], ["--tasks", str(tmp_path / "empty.jsonl")]):
        result = runner.invoke(app, ["bench", "--model", "scripted:null", *where, "--split", "nosplit"])
        assert result.exit_code == 2 and "unknown split 'nosplit'; use train, validation, test" in result.output


def test_progress_shows_as_plain_lines_when_stderr_is_not_a_terminal(capsys):
    """Where rich would draw nothing until the end (a log, a pipe, CI), the bar becomes a line per tenth."""
    from vivace.cli import LoggedProgress

    with LoggedProgress() as progress:
        job = progress.add_task("episodes", total=20)
        for _ in range(20):
            progress.advance(job)
        other = progress.add_task("files", total=None)  # no total: nothing to count tenths of
        progress.update(other, completed=5)
    assert capsys.readouterr().err.splitlines() == [f"episodes: {k}/20" for k in range(2, 21, 2)]
    with LoggedProgress(quiet=True) as progress:
        progress.update(progress.add_task("episodes", total=2), completed=2)
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("stop", ["ctrl-c", "sigterm"])
def test_bench_ctrl_c_reports_the_episodes_that_finished(stop, repo, tmp_path, state_dir, monkeypatch):
    """Ctrl-C, or SIGTERM (a scheduler's limit, `timeout`): a report of the episodes that finished."""
    import vivace.bench.runner as runner

    real = runner.run_benchmark

    async def first_then_stop(models, tasks, *args, **kwargs):
        await real(models, tasks[:1], *args, **kwargs)
        if stop == "sigterm":
            signal.raise_signal(signal.SIGTERM)
        raise KeyboardInterrupt

    monkeypatch.setattr(runner, "run_benchmark", first_then_stop)
    tasks_file = tmp_path / "tasks.jsonl"
    save_jsonl(_tasks(repo), tasks_file)
    out = tmp_path / "run"
    args = ["bench", "--model", "scripted:oracle", "--tasks", str(tasks_file), "--out", str(out)]
    before = signal.signal(signal.SIGTERM, lambda s, f: None)  # without the CLI's handler: exit 130, not death
    try:
        result = CliRunner().invoke(app, [*args, "--backend", BACKEND, "--state-dir", str(state_dir)])
    finally:
        signal.signal(signal.SIGTERM, before)
    assert result.exit_code == (143 if stop == "sigterm" else 130), result.output
    assert "stopped after 1 of 2 episodes" in result.output
    report = (out / "report.md").read_text()
    assert "stopped after 1 of 2 episodes" in report and "| scripted:oracle | 1 | 100.0% |" in report
