"""`vivace bench` end to end on a task file: several models, results, report files, errors."""

from __future__ import annotations

import asyncio
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


def test_bench_lists_every_unsound_task_with_why_and_what_to_do(repo, tmp_path, state_dir):
    """A task whose hidden tests cannot even be collected here (a module this environment lacks), or run
    out of time, is unsolvable by any fix: with the reference fix among the models, bench says which and
    why instead of a bare 0%. The warning named only the first, and nothing else did: now report.md,
    unsound.json and --json list each with its reason; tests that ran out of time say so, with the task's
    limit; and the advice fits where the task came from (`tasks swebench --check` only checks SWE-bench's)."""
    sound, sub = _tasks(repo)
    slow_test = "import time\n\n\ndef test_sub():\n    time.sleep(60)\n"
    slow = sub.model_copy(update={"id": "calc-sub-slow", "tests": sub.tests.model_copy(update={
        "files": {"tests/test_sub.py": slow_test}, "timeout_s": 2.0})})  # fmt: skip
    broken = sub.model_copy(update={"id": "calc-sub-broken", "metadata": {"split": "test", "kind": "swebench"},
        "tests": sub.tests.model_copy(update={"files": {"tests/test_sub.py": "import not_installed_anywhere\n"}})})  # fmt: skip
    tasks_file = tmp_path / "tasks.jsonl"
    save_jsonl([sound, slow, broken], tasks_file)
    out = tmp_path / "run"
    args = ["bench", "--model", "scripted:oracle", "--model", "scripted:null", "--tasks", str(tasks_file), "--json"]
    args += ["--out", str(out), "--backend", BACKEND, "--state-dir", str(state_dir), "--concurrency", "2"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    reasons = {(r["model"], r["task_id"]): r["details"].get("tests_not_run") for r in rows}
    assert reasons[("scripted:oracle", "calc-add")] is None and reasons[("scripted:null", "calc-add")] is None
    for m in ("scripted:oracle", "scripted:null"):
        assert "ModuleNotFoundError" in reasons[(m, "calc-sub-broken")]
    unsound = json.loads(result.stdout)["unsound_tasks"]
    assert json.loads((out / "unsound.json").read_text()) == unsound
    assert set(json.loads((out / "summary.json").read_text())) == {"scripted:oracle", "scripted:null"}
    assert list(unsound) == ["calc-sub-slow", "calc-sub-broken"]
    assert unsound["calc-sub-slow"] == (
        "the reference fix does not pass the tests (they timed out after 2 s, the task's tests.timeout_s)"
    )
    assert "not_installed_anywhere" in unsound["calc-sub-broken"]
    report = (out / "report.md").read_text()
    assert "## Unsound tasks" in report and "- calc-sub-slow: the reference fix" in report
    assert "- calc-sub-broken: the reference fix" in report
    page = (out / "report.html").read_text()  # the page said nothing of them
    assert "<h2>Unsound tasks</h2>" in page and "<li><b>calc-sub-slow</b>: the reference fix" in page
    assert "<li><b>calc-sub-broken</b>: the reference fix" in page
    said = " ".join(result.stderr.split())
    assert "2 task(s) are unsound in this environment (e.g. calc-sub-slow:" in said
    assert f"{out / 'report.md'} and unsound.json" in said
    # One hand-written task, one from SWE-bench: each gets its own way to fix and check it.
    assert "`vivace bench --model scripted:oracle --model scripted:null --tasks FILE`" in said
    assert "`vivace tasks swebench` again" in said and "--check" in said
    # Without the reference fix among the models nothing is judged: an unsolved task is not a broken one.
    save_jsonl([sound, broken], tasks_file)
    null_only = ["bench", "--model", "scripted:null", "--tasks", str(tasks_file), "--out", str(tmp_path / "run2")]
    result = CliRunner().invoke(app, [*null_only, "--backend", BACKEND, "--state-dir", str(state_dir)])
    assert result.exit_code == 0 and "2/2" in result.output, result.output
    assert "unsound in this environment" not in result.output and "Unsound tasks" not in result.output


def test_a_run_where_no_task_could_start_blames_the_tasks_not_the_model(repo, tmp_path, state_dir):
    """Every task with a repository that is gone: the run ended "nothing was measured … --resume", which would
    fail the same way; the fix is in the tasks' file."""
    sound, _ = _tasks(repo)
    gone = sound.model_copy(update={"id": "calc-gone", "repo": RepoSpec(path=str(tmp_path / "no-such-repo"))})
    tasks_file = tmp_path / "tasks.jsonl"
    save_jsonl([gone], tasks_file)
    args = ["bench", "--model", "scripted:random-edit", "--tasks", str(tasks_file), "--out", str(tmp_path / "run")]
    result = CliRunner().invoke(app, [*args, "--backend", BACKEND, "--state-dir", str(state_dir)])
    said = " ".join(result.stderr.split())
    assert result.exit_code == 1 and "no task could start (e.g. calc-gone:" in said, said
    assert "fix the tasks' repo, patch or setup in their file" in said


def test_tasks_that_cannot_start_are_named_as_the_tasks_problem(repo, tmp_path, state_dir):
    """A missing repository or a failing setup command was reported as episodes that "could not run", with
    --resume as the next step, which failed the same way; the setup's error was cut mid-word. Now each such
    task is named, with the fix in its file as the next step and the setup's last lines whole."""
    sound, sub = _tasks(repo)
    gone = sub.model_copy(update={"id": "calc-gone", "repo": RepoSpec(path=str(tmp_path / "no-such-repo"))})
    setup = (
        "echo collecting; echo 'ERROR: Could not find a version that satisfies the requirement setuptools' >&2; exit 3"
    )
    no_net = sound.model_copy(update={"id": "calc-setup", "setup": [setup]})
    tasks_file = tmp_path / "tasks.jsonl"
    save_jsonl([sound, gone, no_net], tasks_file)
    # Not a baseline that judges tasks (with scripted:oracle or scripted:null both are listed as unsound).
    args = ["bench", "--model", "scripted:random-edit", "--tasks", str(tasks_file), "--out", str(tmp_path / "run")]
    result = CliRunner().invoke(app, [*args, "--backend", BACKEND, "--state-dir", str(state_dir)])
    assert result.exit_code == 0, result.output
    said = " ".join(result.stderr.split())
    assert "2 task(s) could not start here and are not counted in success (calc-gone, calc-setup;" in said, said
    assert "fix the task's repo, patch or setup in its file" in said and "could not run" not in said
    rows = {r["task_id"]: r for r in map(json.loads, (tmp_path / "run" / "results.jsonl").read_text().splitlines())}
    assert "the task's repository cannot be had" in rows["calc-gone"]["error"]
    assert rows["calc-setup"]["error"].endswith(
        "failed (exit code 3; the sandbox has no network, so what it installs must be in the environment already): "
        "collecting\nERROR: Could not find a version that satisfies the requirement setuptools"
    )
    assert "error" not in rows["calc-add"]


def test_unsound_advice_names_swebench_check_only_for_swebench_tasks():
    """`vivace tasks swebench --check` cannot check a hand-written task file."""
    from vivace.bench.report import unsound_advice

    rows = [{"task_id": "mine", "kind": None}, {"task_id": "swe", "kind": "swebench"}]
    mine, swe = unsound_advice(rows, {"mine": "x"}), unsound_advice(rows, {"swe": "x"})
    assert "swebench" not in mine and "--model scripted:oracle" in mine and "reference_patch" in mine
    assert "`vivace tasks swebench`" in swe and "--check" in swe and "scripted:oracle" not in swe


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


def test_bench_on_a_tasks_generate_directory_says_to_give_one_of_its_files(repo, tmp_path):
    """`tasks generate --out DIR` writes tasks.jsonl and a copy per split: `--tasks DIR` read each task
    twice and said only "duplicate task id", not what to give instead."""
    tasks = _tasks(repo)
    save_jsonl(tasks, tmp_path / "tasks.jsonl")
    for split in ("train", "validation", "test"):
        save_jsonl([t for t in tasks if t.split == split], tmp_path / f"{split}.jsonl")
    result = CliRunner().invoke(app, ["bench", "--model", "scripted:null", "--tasks", str(tmp_path)])
    said = " ".join(result.output.split())
    assert result.exit_code == 2 and "duplicate task id 'calc-add'" in said, result.output
    assert "holds tasks.jsonl and its per-split copies (train.jsonl, validation.jsonl, test.jsonl)" in said
    assert f"give one of those files, e.g. {tmp_path / 'test.jsonl'}" in said


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
    args = ["bench", "--model", "scripted:oracle", "--tasks", str(tasks_file), "--out", str(out), "--json"]
    before = signal.signal(signal.SIGTERM, lambda s, f: None)  # without the CLI's handler: exit 130, not death
    try:
        result = CliRunner().invoke(app, [*args, "--backend", BACKEND, "--state-dir", str(state_dir)])
    finally:
        signal.signal(signal.SIGTERM, before)
    assert result.exit_code == (143 if stop == "sigterm" else 130), result.output
    said = " ".join(result.stderr.split())
    assert "stopped after 1 of 2 episodes" in said and f"--out {out} --resume" in said, said
    report = (out / "report.md").read_text()
    assert "stopped after 1 of 2 episodes" in report and "| scripted:oracle | 1 | 0 | 100.0% |" in report
    # --json still answers with what finished, marked as interrupted, for the script that waits on it.
    interrupted = json.loads(result.stdout)
    assert interrupted["interrupted"] and interrupted["summary"]["scripted:oracle"]["episodes"] == 1


def test_bench_reruns_into_a_run_only_with_resume_and_then_runs_just_what_is_left(repo, tmp_path, state_dir):
    """A second run into the same --out used to append: episodes twice, two runs' rows in one file
    while the report showed only the last. Now it refuses; --resume runs only the episodes missing
    (an interrupted run's, a last line cut short by a kill), and only with the same settings."""
    tasks_file = tmp_path / "tasks.jsonl"
    save_jsonl(_tasks(repo), tasks_file)
    out, results = tmp_path / "run", tmp_path / "run" / "results.jsonl"
    args = ["bench", "--model", "scripted:oracle", "--tasks", str(tasks_file), "--out", str(out), "--concurrency", "1"]
    args += ["--backend", BACKEND, "--state-dir", str(state_dir)]
    assert CliRunner().invoke(app, args).exit_code == 0
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2 and "already holds 2 episodes" in result.output and "--resume" in result.output
    assert len(results.read_text().splitlines()) == 2
    first, second = results.read_text().splitlines()
    results.write_text(first + "\n" + second[: len(second) // 2])  # killed while writing the second row
    result = CliRunner().invoke(app, [*args, "--resume"])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in results.read_text().splitlines()]
    assert sorted(r["task_id"] for r in rows) == ["calc-add", "calc-sub"] and rows[0] == json.loads(first)
    assert "resuming" in result.output and "1 episodes already finished" in result.output
    # The table stays Markdown on a stdout that is not a terminal: no line is wrapped.
    table = [line for line in result.stdout.splitlines() if line.startswith("|")]
    assert len(table) == 3 and all(line.endswith("|") for line in table), result.stdout
    assert "| scripted:oracle | 2 | 0 | 100.0% |" in result.stdout
    # Other settings would mix two runs in one report.
    result = CliRunner().invoke(app, [*args, "--resume", "--samples", "2"])
    assert result.exit_code == 2 and "other samples" in result.output, result.output


def test_bench_counts_episodes_the_endpoint_fails_as_errors_and_resume_runs_them_again(
    repo, tmp_path, state_dir, monkeypatch
):
    """An endpoint that is down (its client's retries spent) measures nothing about the model: those
    episodes are errors, apart from success, and --resume runs them again once it is back."""
    import vivace.bench.runner as runner
    from vivace.harness.policy import PolicyError, PolicyUnavailable

    class Fails:
        name = "scripted:null"

        def __init__(self, error: PolicyError):
            self.error = error

        async def act(self, conversation):
            raise self.error

    real = runner.load_policy
    refused = PolicyError("http://127.0.0.1:1/v1#m: the endpoint failed: HTTP 400: the conversation no longer fits")
    monkeypatch.setattr(runner, "load_policy", lambda spec, engine=None: Fails(refused))
    tasks_file = tmp_path / "tasks.jsonl"
    save_jsonl(_tasks(repo), tasks_file)
    base = ["bench", "--model", "scripted:null", "--tasks", str(tasks_file), "--json"]
    base += ["--backend", BACKEND, "--state-dir", str(state_dir)]
    # A request the server refuses (a context overflow) is the model's episode: a failure, not an error.
    result = CliRunner().invoke(app, [*base, "--out", str(tmp_path / "refused")])
    assert result.exit_code == 0, result.output
    s = json.loads(result.stdout)["summary"]["scripted:null"]
    assert s["episodes"] == 2 and s["errors"] == 0 and s["success"] == 0.0

    down = PolicyUnavailable("http://127.0.0.1:1/v1#m: the endpoint failed: APIConnectionError after 3 attempts")
    monkeypatch.setattr(runner, "load_policy", lambda spec, engine=None: Fails(down))
    out = tmp_path / "run"
    args = [*base, "--out", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 1, result.output  # nothing measured for the model: a script must see it
    s = json.loads(result.stdout)["summary"]["scripted:null"]
    assert s["episodes"] == 2 and s["errors"] == 2 and s["success"] is None
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert all("the endpoint failed" in r["error"] for r in rows)
    said = " ".join(result.stderr.split())
    assert "2 episode(s) could not run and are not counted in success" in said and "--resume" in said, said
    assert "no episode of scripted:null could run: nothing was measured" in said, said
    monkeypatch.setattr(runner, "load_policy", real)  # the endpoint is back
    result = CliRunner().invoke(app, [*args, "--resume"])
    assert result.exit_code == 0, result.output
    s = json.loads(result.stdout)["summary"]["scripted:null"]
    assert s["episodes"] == 2 and s["errors"] == 0 and s["success"] == 0.0
    assert len((out / "results.jsonl").read_text().splitlines()) == 2


def test_bench_counts_episodes_the_wall_clock_ended_waiting_for_the_model_apart(repo, tmp_path, state_dir, monkeypatch):
    """A timeout is the model's failure (speed is part of the task), but the report says how many
    ran out waiting for the model (a slow endpoint) and how many running tools."""
    import vivace.bench.runner as runner
    from vivace.harness.messages import AssistantTurn, Message, ToolCall

    class Slow:
        name = "scripted:null"

        async def act(self, conversation):
            if any(m.role == "assistant" for m in conversation.messages):  # after the command: think on
                await asyncio.sleep(30)
            command = "sleep 30" if "run 1" in conversation.messages[1].content else "echo x"
            call = ToolCall("c1", "run_terminal_cmd", {"command": command})
            return AssistantTurn(message=Message("assistant", "", (call,)), finish_reason="tool_calls")

    monkeypatch.setattr(runner, "load_policy", lambda spec, engine=None: Slow())
    tasks = _tasks(repo)
    tasks[1] = tasks[1].model_copy(update={"request": tasks[1].request + " run 1"})
    tasks_file, config = tmp_path / "tasks.jsonl", tmp_path / "limits.toml"
    save_jsonl(tasks, tasks_file)
    config.write_text("[agent]\nmax_wall_s = 3.0\n")
    args = ["bench", "--model", "scripted:null", "--tasks", str(tasks_file), "--json", "--config", str(config)]
    args += ["--backend", BACKEND, "--state-dir", str(state_dir), "--out", str(tmp_path / "run")]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    s = json.loads(result.stdout)["summary"]["scripted:null"]
    assert s["episodes"] == 2 and s["errors"] == 0 and s["success"] == 0.0
    assert s["timeouts"] == 2 and s["timeouts_waiting"] == 1
    report = (tmp_path / "run" / "report.md").read_text()
    assert "timeouts (waiting for the model)" in report and "| 2 (1) |" in report


def test_bench_closes_the_policies_it_loaded(repo, tmp_path, state_dir, monkeypatch):
    """An endpoint's client (its pooled connections) or a local engine's thread is let go when the
    run ends, on the loop that used it: it used to be left to the garbage collector."""
    import vivace.bench.runner as runner
    from vivace.harness.policies import NullPolicy

    closed = []

    class Holds(NullPolicy):
        async def aclose(self):
            closed.append(self.name)

    monkeypatch.setattr(runner, "load_policy", lambda spec, engine=None: Holds())
    tasks_file = tmp_path / "tasks.jsonl"
    save_jsonl(_tasks(repo), tasks_file)
    args = ["bench", "--model", "scripted:null", "--tasks", str(tasks_file), "--json", "--backend", BACKEND]
    result = CliRunner().invoke(app, [*args, "--state-dir", str(state_dir), "--out", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    assert closed == ["scripted:null"]


def test_bench_success_is_over_the_episodes_that_ran():
    from vivace.bench.report import markdown, summarize

    details = {"turns": 1, "tool_calls": 0, "tool_calls_per_turn": 0.0, "reference_tokens": 1, "wall_s": 1.0,
               "unsupported_claims": [], "format_errors": 0, "model_s": 0.0}  # fmt: skip
    ok = {
        "model": "m",
        "task_id": "a",
        "family": "f",
        "resolved": True,
        "total": 1.0,
        "adherence": 1.0,
        "details": details,
    }
    down = {"model": "m", "task_id": "b", "family": "f", "resolved": False, "total": 0.0, "error": "endpoint down"}
    s = summarize([ok, down])["m"]
    assert (
        s["success"] == 1.0 and s["errors"] == 1 and s["mean_total"] == 1.0 and s["success_by_family"] == {"f": [1, 1]}
    )
    assert "| m | 2 | 1 | 100.0% |" in markdown({"m": s}, "t")
    assert summarize([down])["m"]["success"] is None


def test_bench_refuses_options_at_extremes_that_would_run_something_else(repo, tmp_path):
    """--concurrency 0 used to wait forever, a negative one crashed; --n 0 ran every task; a model
    given twice ran each of its episodes twice under one name."""
    tasks_file = tmp_path / "tasks.jsonl"
    save_jsonl(_tasks(repo), tasks_file)
    base = ["bench", "--tasks", str(tasks_file), "--out", str(tmp_path / "run"), "--backend", "plain"]
    for extra, said in [(["--concurrency", "-1"], "--concurrency"), (["--concurrency", "0"], "--concurrency"),
                        (["--n", "0"], "--n"), (["--model", "scripted:null"], "given more than once")]:  # fmt: skip
        result = CliRunner().invoke(app, [*base, "--model", "scripted:null", *extra])
        assert result.exit_code == 2 and said in result.output, (extra, result.output)
    assert not (tmp_path / "run" / "results.jsonl").exists()


@pytest.mark.parametrize(
    "args",
    [
        ["generate", "--n", "0"],
        ["generate", "--n", "-3"],
        ["generate", "--concurrency", "0"],
        ["families", "--train", "0", "--validation", "0", "--test", "0"],
        ["families", "--train", "-1"],
        ["families", "--workers", "0"],
    ],
)
def test_task_generators_refuse_counts_that_would_write_nothing_or_crash(args, tmp_path):
    """Zero or negative counts used to write an empty task file with exit 0, and zero workers a traceback."""
    out = tmp_path / ("g" if args[0] == "generate" else "f.jsonl")
    result = CliRunner().invoke(app, ["tasks", *args, "--out", str(out)])
    assert result.exit_code == 2 and not out.exists(), result.output


@pytest.mark.parametrize("module", ["vivace", "vivace.cli"])
def test_python_dash_m_runs_every_command(module):
    """`python -m vivace.cli train` said "No such command": the commands registered on the imported module's
    app, not on the one `-m` runs as __main__; and `python -m vivace` did not exist."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", module, "train", "--help"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and "--resume" in done.stdout, done.stdout + done.stderr


def _row(**over) -> dict:
    """A scored results.jsonl row as the runner writes it (the fields the report reads)."""
    details = {"turns": 1, "tool_calls": 0, "tool_calls_per_turn": 0.0, "wall_s": 0.01, "format_errors": 0,
               "unsupported_claims": [], "model_s": 0.0, "reference_tokens": 6}  # fmt: skip
    row = {"model": "scripted:null", "task_id": "calc-add", "sample": 0, "total": 0.0, "correctness": 0.0,
           "adherence": 0.6, "efficiency": 0.5, "claims": 1.0, "format": 1.0, "resolved": False, "details": details,
           "trajectory": "trajectories/scripted_null/calc-add.json"}  # fmt: skip
    for key, value in over.items():
        if value is ...:
            row.pop(key)
        elif key.startswith("details."):
            details[key.removeprefix("details.")] = value
        else:
            row[key] = value
    return row


def _settings() -> dict:
    from vivace.bench.runner import run_settings
    from vivace.config import VivaceConfig

    return run_settings(["scripted:null"], [Task(id="calc-add", repo=RepoSpec(path="."), request="r",
                                                 tests=TestSpec(fail_to_pass=["a"]))], VivaceConfig(), 1)  # fmt: skip


@pytest.mark.parametrize(
    ("row", "said"),
    [(_row(total=...), "total is missing, not a number"),
     (_row(total="abc"), 'total is "abc", not a number'),
     (_row(resolved="yes"), 'resolved is "yes", not true or false'),
     (_row(details=...), "details is missing, not an object"),
     (_row(details=[1]), "details is [1], not an object"),
     (_row(**{"details.turns": "one"}), 'details.turns is "one", not a number'),
     (_row(**{"details.model_s": None}), "details.model_s is missing"),
     (_row(sample=-1), "sample is -1"),
     (_row(sample=True), "sample is true"),
     (_row(trajectory=5), "trajectory is 5, not a path"),
     ({"model": "scripted:null", "task_id": "calc-add", "error": 7}, "error is 7, not a message")],
    ids=["no-total", "total-string", "resolved-string", "no-details", "details-list", "turns-string", "no-model-s",
         "negative-sample", "bool-sample", "trajectory-number", "error-number"],
)  # fmt: skip
def test_resume_refuses_results_rows_the_runner_did_not_write_naming_line_and_field(tmp_path, row, said):
    """A row the report cannot add up (a field missing or of another type) was a KeyError or TypeError
    traceback from the report after the resumed run; now read_results names the file, line and field."""
    from vivace.bench.runner import start_run

    results = tmp_path / "results.jsonl"
    results.write_text(json.dumps(_row(task_id="calc-sub")) + "\n" + json.dumps(row) + "\n")
    (tmp_path / "run.json").write_text(json.dumps(_settings()))
    with pytest.raises(ValueError, match=f"^{results}:2: not a benchmark result row") as e:
        start_run(tmp_path, _settings(), resume=True)
    assert said in str(e.value)
    results.write_text(json.dumps(_row()) + "\n" + json.dumps({"model": "m", "task_id": "t", "error": "E: x"}) + "\n")
    assert len(start_run(tmp_path, _settings(), resume=True)) == 1  # the intact rows, the error row dropped


@pytest.mark.parametrize(
    ("name", "content", "said"),
    [("run.json", b"[1, 2]", "run.json: a JSON list, not a run's settings"),
     ("run.json", b"{oops", "run.json: not JSON (Expecting property name"),
     ("run.json", b"\xff\xfe{}", "run.json: not UTF-8 text (byte 0)"),
     ("results.jsonl", b"\xff\xfe garbage\n", "results.jsonl: not UTF-8 text (byte 0)")],
    ids=["run-json-list", "run-json-garbage", "run-json-binary", "results-binary"],
)  # fmt: skip
def test_bench_resume_names_a_damaged_run_file(repo, tmp_path, state_dir, name, content, said):
    """--resume reads RUN/run.json and RUN/results.jsonl: damage in either is named with the file, as a one-line
    error (an AttributeError traceback, or a JSON or codec message naming no file, before)."""
    tasks_file = tmp_path / "tasks.jsonl"
    save_jsonl(_tasks(repo)[:1], tasks_file)
    out = tmp_path / "run"
    out.mkdir()
    (out / "results.jsonl").write_text(json.dumps(_row()) + "\n")
    (out / "run.json").write_text(json.dumps(_settings()))
    (out / name).write_bytes(content)
    args = ["bench", "--model", "scripted:null", "--tasks", str(tasks_file), "--out", str(out), "--resume"]
    result = CliRunner().invoke(app, [*args, "--backend", BACKEND, "--state-dir", str(state_dir)])
    assert result.exit_code == 2 and isinstance(result.exception, SystemExit), result.output
    assert f"error: {out / name}" in result.output.replace("\n", ""), result.output
    assert said in result.output.replace("\n", ""), result.output


def test_bench_names_a_policy_the_run_cannot_set_up(repo, tmp_path, state_dir, monkeypatch):
    """A policy refused only once the run loads it with the engine's settings (a CUDA device this machine does
    not have) is the one-line error, not a traceback."""
    import vivace.bench.runner as runner

    def refuse(spec, engine=None):
        raise ValueError("device 'cuda': no CUDA device is visible to torch here; use cpu or auto")

    monkeypatch.setattr(runner, "load_policy", refuse)
    tasks_file = tmp_path / "tasks.jsonl"
    save_jsonl(_tasks(repo)[:1], tasks_file)
    args = ["bench", "--model", "scripted:null", "--tasks", str(tasks_file), "--out", str(tmp_path / "run")]
    result = CliRunner().invoke(app, [*args, "--backend", BACKEND, "--state-dir", str(state_dir)])
    assert result.exit_code == 2 and isinstance(result.exception, SystemExit), result.output
    assert "error: device 'cuda': no CUDA device" in result.output


def test_bench_resume_without_out_is_refused(repo, tmp_path, monkeypatch):
    """--resume with no --out used to start a fresh run in a new runs/bench-TIME, silently."""
    monkeypatch.chdir(tmp_path)
    tasks_file = tmp_path / "tasks.jsonl"
    save_jsonl(_tasks(repo)[:1], tasks_file)
    args = ["bench", "--model", "scripted:null", "--tasks", str(tasks_file), "--resume", "--backend", "plain"]
    result = CliRunner().invoke(app, [*args, "--state-dir", str(tmp_path / "state")])
    assert result.exit_code == 2 and "--resume needs --out RUN (the run to continue)" in result.output, result.output
    assert not (tmp_path / "runs").exists()


def test_select_on_results_of_another_suite_says_so(tmp_path):
    """Results none of whose tasks are in the suite were "no task meets the bounds ... lower --min-solved"."""
    task = Task(id="t1", repo=RepoSpec(bundled="_blank"), request="fix it", tests=TestSpec(fail_to_pass=["t.py"]),
                metadata={"split": "train", "family": "f"})  # fmt: skip
    suite, results = tmp_path / "suite.jsonl", tmp_path / "results.jsonl"
    save_jsonl([task], suite)
    results.write_text("".join(json.dumps({"model": "m", "task_id": t, "resolved": True}) + "\n" for t in ("x", "y")))
    out = tmp_path / "s.jsonl"
    result = CliRunner().invoke(app, ["tasks", "select", "--results", str(results), "--suite", str(suite),
                                      "--out", str(out)])  # fmt: skip
    said = " ".join(result.output.split())
    assert result.exit_code == 2 and f"none of the 2 tasks in the results is in suite {suite}, split train" in said
    assert "give the --suite (and --split) the results were measured on" in said and "--min-solved" not in said
    assert not out.exists()


def test_tasks_generate_stopped_by_sigterm_closes_the_backend_and_exits_143(tmp_path, monkeypatch):
    """SIGTERM killed the command outright, leaving the sandbox's cgroups and owner record until the next
    start; now it stops as Ctrl-C does: the backend is closed, one line, exit 128 + 15."""
    closed = []

    class Backend:
        async def aclose(self):
            closed.append(True)

    async def stopped(*args, **kwargs):
        signal.raise_signal(signal.SIGTERM)
        await asyncio.sleep(3)  # stopped here by the CLI's handler
        return []

    monkeypatch.setattr("vivace.sandbox.open_backend", lambda cfg: Backend())
    monkeypatch.setattr("vivace.tasks.generate.generate", stopped)
    out = tmp_path / "gen"
    args = ["tasks", "generate", "--n", "1", "--backend", "plain", "--state-dir", str(tmp_path / "s")]
    args += ["--out", str(out)]
    before = signal.signal(signal.SIGTERM, lambda s, f: None)  # without the CLI's handler: nothing stops
    try:
        result = CliRunner().invoke(app, args)
    finally:
        signal.signal(signal.SIGTERM, before)
    assert result.exit_code == 143, result.output
    said = " ".join(result.stderr.split())
    assert f"stopped by SIGTERM: nothing was written to {out}" in said and closed == [True], said
    assert not out.exists()


def test_tasks_families_stopped_by_sigterm_leaves_no_temporary_directories(tmp_path):
    """Each SIGTERM left the workers' vivace-family-* directories in the temporary directory (the process
    died in the middle of their test runs); now the runs in flight end and clean up, then exit 143."""
    import os
    import subprocess
    import sys
    import time

    tmp = tmp_path / "tmp"
    tmp.mkdir()
    out = tmp_path / "f.jsonl"
    argv = [sys.executable, "-c", "from vivace.cli import main; main()", "tasks", "families", "--train", "200",
            "--validation", "0", "--test", "0", "--out", str(out)]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "TMPDIR": str(tmp), "COLUMNS": "300"})  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not list(tmp.glob("vivace-family-*")) and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        assert list(tmp.glob("vivace-family-*")), "no test run started"
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 143, stderr
    assert f"stopped by SIGTERM: nothing was written to {out}" in " ".join(stderr.split()), stderr
    assert "Traceback" not in stderr and not out.exists()
    assert not list(tmp.glob("vivace-family-*"))


def test_episodes_the_policy_ended_in_an_error_are_counted_apart_from_weak_ones():
    """A policy that crashed on every episode (a model whose vocabulary its tokenizer outgrew) showed
    `errors 0 | success 0.0%`, as a weak model does."""
    from vivace.bench.report import markdown, summarize

    def row(task_id: str, stop_reason: str) -> dict:
        details = {"turns": 1, "tool_calls": 0, "tool_calls_per_turn": 0.0, "wall_s": 0.1, "format_errors": 0,
                   "unsupported_claims": [], "model_s": 0.0, "stop_reason": stop_reason}  # fmt: skip
        return {"model": "m", "task_id": task_id, "resolved": False, "total": 0.0, "adherence": 0.0,
                "details": details}  # fmt: skip

    summary = summarize([row("a", "error"), row("b", "error"), row("c", "answered")])
    assert summary["m"]["policy_errors"] == 2 and summary["m"]["errors"] == 0 and summary["m"]["success"] == 0
    table = markdown(summary, "t")
    assert "| format errors | policy errors |" in table and "| 0 | 2 |" in table  # format errors 0, policy errors 2


def test_an_episode_whose_trajectory_cannot_be_saved_keeps_its_row_and_the_run_goes_on(
    repo, tmp_path, state_dir, monkeypatch
):
    """Saving was outside the per-episode guard: one record that could not be written (a lone surrogate
    the model sampled, a full disk) cancelled every other episode of the run."""
    from vivace.harness.trajectory import Trajectory

    real = Trajectory.save

    def save(self, path):
        if "calc-add" in str(path):
            raise OSError(28, "No space left on device")
        real(self, path)

    monkeypatch.setattr(Trajectory, "save", save)
    tasks_file = tmp_path / "tasks.jsonl"
    save_jsonl(_tasks(repo), tasks_file)
    out = tmp_path / "run"
    args = ["bench", "--model", "scripted:oracle", "--tasks", str(tasks_file), "--out", str(out), "--json"]
    result = CliRunner().invoke(app, [*args, "--backend", BACKEND, "--state-dir", str(state_dir)])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["summary"]["scripted:oracle"]["success"] == 1.0  # both episodes measured
    rows = {r["task_id"]: r for r in map(json.loads, (out / "results.jsonl").read_text().splitlines())}
    assert rows["calc-add"]["resolved"] and "No space left" in rows["calc-add"]["trajectory_error"]
    assert "trajectory" not in rows["calc-add"] and (out / rows["calc-sub"]["trajectory"]).is_file()
