"""Error lines say what they were given: `error: MESSAGE` with the message exactly as written. rich read
square brackets in a message as markup, so a path like dir[abc], a glob or a repr lost its bracketed part
(`[bold]` turned the rest bold, a stray `[/x]` raised MarkupError and a traceback), and the user read a
path that is not theirs."""

from __future__ import annotations

import io
import json

import pytest
import typer
from rich.console import Console
from typer.testing import CliRunner

from vivace.cli import app, fail

VERBATIM = "cannot read /data/run[3]/src/[abc].py: [/x] [red] ['a', 'b'] [bold]still plain :100: C:\\dir\\"


def test_fail_prints_the_message_verbatim_and_exits_with_the_code(capsys):
    with pytest.raises(typer.Exit) as stopped:
        fail(VERBATIM, 3)
    assert stopped.value.exit_code == 3
    captured = capsys.readouterr()
    assert captured.err == f"error: {VERBATIM}\n" and captured.out == ""
    with pytest.raises(typer.Exit) as stopped:
        fail("plain")
    assert stopped.value.exit_code == 2


def test_fail_colours_the_label_only(monkeypatch):
    """On a terminal "error:" is red; no part of the message is styled (rich's highlighter coloured
    numbers and paths in it, each differently)."""
    screen = io.StringIO()
    monkeypatch.setattr("vivace.cli.err", Console(file=screen, force_terminal=True, color_system="standard"))
    with pytest.raises(typer.Exit):
        fail("step 12 of runs/x[1]/ckpt at 0x7f: 3.5 s")
    label, message = screen.getvalue().split(" ", 1)
    assert "\x1b[31m" in label and "error:" in label
    assert message == "step 12 of runs/x[1]/ckpt at 0x7f: 3.5 s\n"


@pytest.fixture
def here(tmp_path, monkeypatch):
    """The working directory is tmp_path, with `full[abc]/` (a directory holding a file)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "full[abc]").mkdir()
    (tmp_path / "full[abc]" / "x").touch()
    return tmp_path


# (command, the text the error line must show as given); none of them loads a model or starts work.
CASES = [
    (["agent", "x", "--repo", "/nonexistent/dir[abc]", "--model", "scripted:null"], "--repo /nonexistent/dir[abc] is"),
    (["sandbox", "run", "--repo", "/nonexistent/r[/x]", "--", "true"], "--repo /nonexistent/r[/x] does not exist"),
    (["sandbox", "run", "--repo", "/nonexistent/r[bold]b", "--", "true"], "--repo /nonexistent/r[bold]b does not"),
    (
        ["serve", "--model", "/nonexistent/ckpt[abc]", "--port", "0", "--device", "cpu"],
        "/nonexistent/ckpt[abc]: no such",
    ),
    (["bench", "--model", "scripted:null", "--tasks", "/nonexistent/[t].jsonl"], "/nonexistent/[t].jsonl: no such"),
    (["tasks", "select", "--results", "/nonexistent/[r].jsonl", "--out", "o.jsonl"], "/nonexistent/[r].jsonl: cannot"),
    (["train", "--local", "--config", "/nonexistent/[c].json"], "/nonexistent/[c].json: cannot read it"),
    (["sft", "ship", "/nonexistent/ck[abc]"], "/nonexistent/ck[abc] is not a checkpoint"),
    (["tokenizer", "train", "--out", "full[abc]"], "--out full[abc] already holds files"),
]


@pytest.mark.parametrize("args, says", CASES, ids=[" ".join(c[0][:2]) for c in CASES])
def test_bracketed_user_text_survives_in_the_error_line(here, args, says):
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert result.stdout == "" and "Traceback" not in result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and says in lines[0], result.stderr


def _selectable(tmp_path):
    """A one-task suite file and a results file measuring it, for `tasks select`."""
    import json

    from vivace.tasks.format import RepoSpec, Task, TestSpec, save_jsonl

    suite, results = tmp_path / "suite.jsonl", tmp_path / "results.jsonl"
    save_jsonl([Task(id="t1", repo=RepoSpec(bundled="_blank"), request="fix it", tests=TestSpec(fail_to_pass=["t.py"]),
                     metadata={"split": "train", "family": "f"})], suite)  # fmt: skip
    results.write_text(json.dumps({"model": "m", "task_id": "t1", "resolved": True}) + "\n")
    return suite, results


# Each used to end with a traceback, most after all their work (generating, training); {ro} cannot be written.
UNWRITABLE = {
    "sft data": ["sft", "data", "--backend", "plain", "--state-dir", "{state}", "--n", "1", "--out", "{ro}/x.jsonl"],
    "sft copies": ["sft", "copies", "--n", "3", "--out", "{ro}/c.jsonl"],
    "sft train": ["sft", "train", "--data", "{episodes}", "--init", "tiny-init", "--steps", "1", "--out", "{ro}/m"],
    "tasks generate": ["tasks", "generate", "--backend", "plain", "--state-dir", "{state}", "--n", "1", "--repos",
                       "textkit", "--out", "{ro}/gen"],
    "tasks families": ["tasks", "families", "--train", "1", "--validation", "0", "--test", "0", "--out",
                       "{ro}/f.jsonl"],
    "tasks select": ["tasks", "select", "--results", "{results}", "--suite", "{suite}", "--out", "{ro}/s.jsonl"],
    "tokenizer train": ["tokenizer", "train", "--vocab-size", "300", "--out", "{ro}/tok"],
}  # fmt: skip


@pytest.mark.parametrize("args", UNWRITABLE.values(), ids=UNWRITABLE.keys())
def test_an_out_that_cannot_be_written_is_refused_before_the_work(tmp_path, args):
    """A directory the user cannot write (permissions; a read-only mount and a full disk are refused the same
    way, by a file made and removed there): exit 2 and one line naming the path and why, before any work and
    before importing torch (seconds on a small machine)."""
    import os
    import subprocess
    import sys

    from conftest import unprivileged

    ro = tmp_path / "ro"
    ro.mkdir()
    suite, results = _selectable(tmp_path)
    episodes = tmp_path / "episodes.jsonl"
    episodes.write_text('{"ids": [10, 11, 12, 13], "loss_mask": [0, 1, 1, 1]}\n')
    argv = [a.format(ro=ro, state=tmp_path / "state", suite=suite, results=results, episodes=episodes) for a in args]
    prefix = unprivileged()  # root writes anywhere unless its override is dropped
    ro.chmod(0o555)
    try:
        mark = tmp_path / "torch-imported"
        probe = (f"import atexit, sys\natexit.register(lambda: open({str(mark)!r}, 'w').write(str('torch' in sys.modules)))"
                 "\nfrom vivace.cli import main\nmain()")  # fmt: skip
        done = subprocess.run([*prefix, sys.executable, "-c", probe, *argv],
                              capture_output=True, text=True, timeout=600,
                              env={**os.environ, "COLUMNS": "300"})  # fmt: skip
    finally:
        ro.chmod(0o755)
    lines = done.stderr.splitlines()
    assert done.returncode == 2 and len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert lines[0].startswith(f"error: --out {ro}/") and "(Permission denied)" in lines[0], lines[0]
    assert not list(ro.iterdir()) and done.stdout == ""
    assert mark.read_text() == "False"


def _disk_full(*args, **kwargs):
    raise OSError(28, "No space left on device")  # ENOSPC, no file name: as a write() that fills the disk says it


async def _no_tasks(*args, **kwargs):
    return []


class _Backend:
    async def aclose(self):
        pass


@pytest.mark.parametrize("command", ["generate", "families", "select", "swebench"])
def test_a_task_file_write_that_fails_after_the_work_is_one_line_and_exit_1(here, monkeypatch, command):
    """The disk fills (or the mount turns read-only) between the up-front check and the final write: the
    OSError was a traceback after all the generating; now one line naming the file and what was lost."""
    suite, results = _selectable(here)
    monkeypatch.setattr("vivace.tasks.format.save_jsonl", _disk_full)
    monkeypatch.setattr("vivace.tasks.families.generate_families", lambda *a, **k: [])
    monkeypatch.setattr("vivace.tasks.generate.generate", _no_tasks)
    monkeypatch.setattr("vivace.sandbox.open_backend", lambda cfg: _Backend())
    monkeypatch.setattr("vivace.tasks.swebench.load_swebench_jsonl", lambda *a, **k: ["a task"])
    args = {"generate": ["generate", "--backend", "plain", "--state-dir", "state", "--n", "1", "--out", "gen"],
            "families": ["families", "--train", "1", "--validation", "0", "--test", "0", "--out", "f.jsonl"],
            "select": ["select", "--results", str(results), "--suite", str(suite),
                       "--out", "s.jsonl"],
            "swebench": ["swebench", str(results), "--repos", str(here), "--out", "t.jsonl"]}[command]  # fmt: skip
    result = CliRunner().invoke(app, ["tasks", *args])
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: cannot write {args[-1]}: No space left on device; "), lines


@pytest.fixture
def sigterm_survivable():
    """SIGTERM with a no-op handler for the test: were a command's own handler missing, pytest lives on
    (and the test fails on the exit code) instead of being killed."""
    import signal

    before = signal.signal(signal.SIGTERM, lambda s, f: None)
    yield
    signal.signal(signal.SIGTERM, before)


def test_sft_eval_stopped_by_sigterm_keeps_the_numbers_it_has(tmp_path, monkeypatch, sigterm_survivable):
    """The second of two evaluations is stopped: exit 143, a line saying how many finished, and the
    first's row printed (it died silently and printed nothing)."""
    import signal

    import vivace.rl.sft_train as sft_train

    data = tmp_path / "held.jsonl"
    data.write_text('{"ids": [1, 2, 3], "loss_mask": [0, 1, 1]}\n')
    calls = []

    def evaluate(model, path, seq_len, threads):
        calls.append(model)
        if len(calls) == 2:
            signal.raise_signal(signal.SIGTERM)
        return {"episodes": 1, "read": 1, "too_long": 0, "untrained": 0, "eval_loss": 1.25, "eval_token_acc": 0.5}

    monkeypatch.setattr(sft_train, "evaluate_checkpoint", evaluate)
    args = ["sft", "eval", "--data", str(data), "--model", "tiny", "--model", "tiny"]
    result = CliRunner().invoke(app, [*args, "--json"])
    assert result.exit_code == 143, result.output
    assert "stopped by SIGTERM: 1 of 2 evaluations finished (printed above)" in result.stderr
    assert [json.loads(line)["eval_loss"] for line in result.stdout.splitlines()] == [1.25]
    calls.clear()
    result = CliRunner().invoke(app, args)  # the table, with the one row it has
    assert result.exit_code == 143 and "│ tiny" in result.stdout and result.stdout.count("│ tiny") == 1, result.output


def test_serve_bench_and_bench_pipeline_stopped_by_sigterm_say_so(tmp_path, monkeypatch, sigterm_survivable):
    import asyncio
    import signal

    import vivace.inference.bench as engine_bench
    import vivace.rl.bench as rl_bench

    def bench_run(*args, **kwargs):
        signal.raise_signal(signal.SIGTERM)
        raise AssertionError("not stopped")

    monkeypatch.setattr(engine_bench, "run", bench_run)
    result = CliRunner().invoke(app, ["serve", "bench", "--n", "2", "--device", "cpu"])
    assert result.exit_code == 143, result.output
    assert "stopped by SIGTERM: no numbers: the benchmark was cut short" in " ".join(result.stderr.split())

    async def pipeline(*args, **kwargs):
        signal.raise_signal(signal.SIGTERM)
        await asyncio.sleep(30)  # cancelled here

    monkeypatch.setattr(rl_bench, "bench_pipeline", pipeline)
    work = tmp_path / "bench"
    result = CliRunner().invoke(app, ["train", "bench-pipeline", "--local", "--work-dir", str(work), "--steps", "1"])
    assert result.exit_code == 143, result.output
    assert f"no numbers: the benchmark was cut short (its runs are under {work})" in " ".join(result.stderr.split())
