"""The command line's contract, as a user meets it: a bad value or path is refused before any work with
exit 2 and one line naming it and what to do (never a traceback, never after minutes of work); `--json`
puts exactly one JSON document on stdout; a relative --state-dir works. The work itself is stubbed out:
a case that reaches it fails."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conftest import needs_isolation
from vivace.cli import app, with_sandbox_options
from vivace.config import load_preset
from vivace.tasks.format import RepoSpec, Task, TestSpec

# The work each command would start once its options were accepted; "records" and "suite" instead give
# the command something to write, so that it reaches its --out.
WORK = {
    "sandbox": ["vivace.sandbox.bench.run_bench", "vivace.sandbox.bench.bench_scaling"],
    "tasks": ["vivace.tasks.generate.generate", "vivace.tasks.families.generate_families"],
    "index": ["vivace.search.bench.run_bench", "vivace.search.finetune.train_embedder"],
    "tokenizer": ["vivace.model.corpus.code_files"],
    "sft": ["vivace.rl.sft_train.train_sft"],
    "pipeline": ["vivace.rl.bench.bench_pipeline"],
    "serve": ["vivace.inference.samplers.load_for_engine", "vivace.cli_serve._engine"],
    "records": ["vivace.tasks.swebench.load_swebench_jsonl"],
    "suite": ["vivace.tasks.suites.load_suite"],
}


def _ran(*args, **kwargs):
    raise AssertionError("the work started: the bad value was not refused first")


def _task(i: int, split: str) -> Task:
    return Task(id=f"t{i}", repo=RepoSpec(path="."), request="fix it", tests=TestSpec(fail_to_pass=["t::t"]),
                metadata={"split": split, "family": "fam", "repo": "o/r"})  # fmt: skip


def _one_task(*args, **kwargs) -> list[Task]:
    return [_task(0, "train")]


@pytest.fixture
def paths(tmp_path, monkeypatch):
    """FILE (an empty file), DIR (an empty directory), NEW (nothing there), RESULTS (task t0 solved); the
    working directory is tmp_path."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "file").touch()
    (tmp_path / "dir").mkdir()
    (tmp_path / "results.jsonl").write_text('{"task_id": "t0", "resolved": true, "model": "m"}\n')
    return {"FILE": "file", "DIR": "dir", "NEW": "new", "UNDER_FILE": "file/x.jsonl", "RESULTS": "results.jsonl"}


def _args(args: list[str], paths: dict[str, str]) -> list[str]:
    return [paths.get(a, a) for a in args]


AGENT = ["agent", "hi", "--model", "scripted:null", "--repo", "DIR", "--json"]
BENCH = ["bench", "--model", "scripted:null", "--suite", "bundled", "--n", "1", "--json", "--backend", "plain"]
PIPELINE = ["train", "bench-pipeline", "--local", "--json"]
STATE = ["--state-dir", "NEW"]


@pytest.mark.parametrize(
    "work, args, says",
    [
        (None, [*AGENT, "--max-turns", "0"], "--max-turns"),
        (None, [*AGENT, "--backend", "nope"], "--backend 'nope': choose auto, isolated, plain"),
        (None, [*AGENT, "--state-dir", "FILE"], "--state-dir file is a file; give a directory"),
        (None, [*BENCH, "--temperature", "-1"], "--temperature -1: give 0 (greedy) or more"),
        (None, [*BENCH, "--out", "UNDER_FILE"], "file is a file, not a directory"),
        (None, [*BENCH, "--state-dir", "UNDER_FILE"], "--state-dir file/x.jsonl cannot be made"),
        (None, [*AGENT, "--repo", "NEW"], "--repo new is not a directory; give the repository to work on"),
        (None, ["sandbox", "run", "--repo", "DIR", *STATE, "--timeout", "-1", "--", "true"], "--timeout -1"),
        (None, ["sandbox", "run", "--repo", "NEW", *STATE, "--", "true"], "--repo new does not exist; give a"),
        (None, ["sandbox", "serve", "--port", "-1", *STATE], "--port: Input should be greater than or equal to 0"),
        ("sandbox", ["sandbox", "bench", *STATE, "--n", "0"], "--n"),
        ("sandbox", ["sandbox", "bench", *STATE, "--concurrency", "0"], "--concurrency"),  # hung
        ("sandbox", ["sandbox", "bench", *STATE, "--baseline-n", "0"], "--baseline-n"),
        ("sandbox", ["sandbox", "bench", *STATE, "--scaling", "-1"], "--scaling"),
        ("tasks", ["tasks", "generate", "--out", "FILE", *STATE], "--out: file is a file; give a directory"),
        ("tasks", ["tasks", "families", "--out", "DIR"], "--out: dir is a directory; give a file path"),
        ("tasks", ["tasks", "families", "--out", "UNDER_FILE"], "file is a file, not a directory"),
        ("records", ["tasks", "swebench", "FILE", "--repos", "DIR", "--out", "UNDER_FILE"], "file is a file"),
        ("suite", ["tasks", "select", "--results", "RESULTS", "--out", "DIR"], "--out: dir is a directory"),
        ("index", ["index", "bench", "--files", "0"], "--files"),
        ("index", ["index", "bench", "--workspaces", "0"], "--workspaces"),
        ("index", ["index", "train-embedder", "--traces", "DIR", "--out", "FILE"], "--out: file is a file"),
        ("index", ["index", "train-embedder", "--traces", "DIR", "--lr", "0"], "--lr 0: give a learning rate"),
        ("tokenizer", ["tokenizer", "train", "--out", "NEW", "--vocab-size", "10"], "--vocab-size 10: give 263"),
        ("tokenizer", ["tokenizer", "train", "--out", "UNDER_FILE"], "file is a file, not a directory"),
        (None, ["sft", "copies", "--n", "1", "--out", "UNDER_FILE"], "file is a file, not a directory"),
        (None, ["sft", "copies", "--n", "1", "--out", "NEW", "--vocab", "5:3"], "--vocab 5:3: give LO:HI with"),
        (None, ["sft", "copies", "--n", "1", "--out", "NEW", "--lookback", "0"], "--lookback 0: give 24 or more"),
        ("sft", ["sft", "train", "--data", "FILE", "--out", "UNDER_FILE"], "file is a file, not a directory"),
        (None, ["train", "--local", "--preset", "smoke", "--backend", "nope"], "--backend 'nope'"),
        (None, ["train", "--local", "--preset", "smoke", "--state-dir", "FILE"], "--state-dir file is a file"),
        ("pipeline", [*PIPELINE, "--modes", "nope"], "--modes 'nope': unknown 'nope'"),
        ("pipeline", [*PIPELINE, "--turns", "x"], "--turns 'x': give MIN-MAX"),
        ("pipeline", [*PIPELINE, "--median-s", "0"], "--median-s 0"),
        ("pipeline", [*PIPELINE, "--steps", "0"], "--steps"),
        ("pipeline", [*PIPELINE, "--concurrency", "0"], "--concurrency"),  # hung
        ("pipeline", [*PIPELINE, "--group-size", "0"], "--group-size"),  # hung
        ("pipeline", [*PIPELINE, "--tasks-per-step", "0"], "--tasks-per-step"),  # measured nothing, exit 0
        ("pipeline", [*PIPELINE, "--replicas", "0"], "--replicas"),
        ("serve", ["serve", "bench", "--n", "0"], "--n"),
        ("serve", ["serve", "--model", "tiny", "--port", "70000"], "--port"),
        ("serve", ["serve", "--model", "gone/ckpt"], "gone/ckpt: no such checkpoint directory; give a directory as"),
    ],
)
def test_bad_values_are_refused_with_one_line_before_any_work(paths, tmp_path, monkeypatch, work, args, says):
    for target in WORK.get(work, []):
        monkeypatch.setattr(target, _one_task if work in ("records", "suite") else _ran)
    result = CliRunner().invoke(app, _args(args, paths))
    said = " ".join(result.output.split())
    assert result.exit_code == 2 and says in said, result.output
    assert "Traceback" not in result.output and result.stdout == ""
    assert not (tmp_path / "new").exists() and not (tmp_path / "runs").exists()  # nothing made


@pytest.mark.parametrize(
    "command, option, says",
    [
        (["serve"], "--model", "tiny, or a local checkpoint directory (required)."),
        (["sft", "train"], "--data", "[default: runs/sft/expert.jsonl]"),
        (["sft", "augment"], "--data", "[default: runs/sft/expert.jsonl]"),
        (["sandbox", "serve"], "--port", "TCP port (default: the config's server.port, 8765)."),
        (["sandbox", "run"], "--timeout", "(default: the preset's sandbox.timeout_s, 120 s in the default preset)."),
    ],
)
def test_help_says_what_an_option_without_a_shown_default_does_when_left_out(command, option, says):
    """These showed neither a default nor that they are required, though each has one or is."""
    result = CliRunner().invoke(app, [*command, "--help"], env={"COLUMNS": "400"})
    assert result.exit_code == 0, result.output
    row = next(line for line in result.output.splitlines() if line.strip("│ ").startswith(f"{option} "))
    assert says in " ".join(row.split()), row


@pytest.mark.parametrize(
    "command, says",
    [
        (["serve", "--model", "tiny", "--port", "0", "--device", "gpu"], "error: --device: unknown device 'gpu'; use"),
        (["serve", "bench", "--device", "gpu"], "error: --device: unknown device 'gpu'; use"),
        (["config", "show", "--config", "gpu.json"], "gpu.json: engine.device: unknown device 'gpu'; use"),
    ],
)
def test_a_bad_device_is_named_without_pydantics_prefix(tmp_path, monkeypatch, command, says):
    """`--device gpu` said "--device: Value error, unknown device 'gpu'; …"."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "gpu.json").write_text('{"engine": {"device": "gpu"}}')
    monkeypatch.setattr("vivace.cli_serve._engine", _ran)
    monkeypatch.setattr("vivace.inference.samplers.load_for_engine", _ran)
    result = CliRunner().invoke(app, command)
    said = " ".join(result.output.split())
    assert result.exit_code == 2 and says in said and "Value error" not in said, said


@pytest.mark.parametrize("command", [["serve", "--model", "tiny"], ["sandbox", "serve", *STATE]])
def test_servers_refuse_an_address_they_cannot_listen_on_before_starting(paths, tmp_path, monkeypatch, command):
    """uvicorn only logged a port in use or a host that does not resolve, after the app started (for
    `serve`, after the model loaded), and exited 3."""
    monkeypatch.setattr("vivace.cli_serve._engine", _ran)
    monkeypatch.setattr("vivace.sandbox.server.serve", _ran)
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = str(held.getsockname()[1])
        cases = [(["--port", port], "Address already in use; give another --port"),
                 (["--host", "bad host!", "--port", "0"], "host 'bad host!' is no address or name")]  # fmt: skip
        for extra, says in cases:
            result = CliRunner().invoke(app, _args([*command, *extra], paths))
            assert result.exit_code == 2 and says in " ".join(result.output.split()), result.output
            assert "Traceback" not in result.output


def test_tasks_generate_and_families_print_one_json_document(paths, tmp_path, monkeypatch):
    """`tasks families` printed a line of text and then the counts, which no JSON parser reads; `tasks
    generate` printed its counts only as text."""

    async def generate(workspace, n, seed, names, concurrency, report):
        return [_task(0, "train"), _task(1, "test")]

    monkeypatch.setattr("vivace.tasks.generate.generate", generate)
    monkeypatch.setattr("vivace.tasks.families.generate_families", lambda *a, **k: [_task(2, "train")])
    result = CliRunner().invoke(app, ["tasks", "generate", "--out", "gen", "--n", "2", *_args(STATE, paths), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == {"tasks": 2, "splits": {"train": 1, "validation": 0, "test": 1},
                                         "out": "gen/tasks.jsonl"}  # fmt: skip
    result = CliRunner().invoke(app, ["tasks", "families", "--out", "f.jsonl", "--train", "1", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == {"tasks": 1, "counts": {"train/fam": 1}, "out": "f.jsonl"}
    assert (tmp_path / "f.jsonl").is_file() and (tmp_path / "gen" / "test.jsonl").is_file()


def test_tasks_generate_refuses_an_out_holding_tasks_unless_forced(paths, tmp_path, monkeypatch):
    """It replaced tasks.jsonl and the split files of an earlier run without a word (100 tasks became 2)."""
    (tmp_path / "gen").mkdir()
    (tmp_path / "gen" / "tasks.jsonl").write_text("earlier\n")
    monkeypatch.setattr("vivace.tasks.generate.generate", _ran)
    args = ["tasks", "generate", "--out", "gen", "--n", "2", *_args(STATE, paths)]
    result = CliRunner().invoke(app, args)
    said = " ".join(result.output.split())
    assert result.exit_code == 2 and "--out gen already holds tasks (tasks.jsonl and its split files)" in said, said
    assert "give another --out, remove them first, or add --force to replace them" in said
    assert (tmp_path / "gen" / "tasks.jsonl").read_text() == "earlier\n"

    async def generate(workspace, n, seed, names, concurrency, report):
        return [_task(0, "train"), _task(1, "test")]

    monkeypatch.setattr("vivace.tasks.generate.generate", generate)
    result = CliRunner().invoke(app, [*args, "--force"])
    assert result.exit_code == 0, result.output
    assert len((tmp_path / "gen" / "tasks.jsonl").read_text().splitlines()) == 2


def test_a_relative_state_dir_is_made_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = with_sandbox_options(load_preset("default"), None, Path("state"))
    assert cfg.sandbox.state_dir == tmp_path / "state"
    cfg = with_sandbox_options(load_preset("default", sandbox={"state_dir": "from-config"}), None, None)
    assert cfg.sandbox.state_dir == tmp_path / "from-config"


@needs_isolation
def test_sandbox_run_works_with_a_relative_state_dir(repo, tmp_path, monkeypatch):
    """bwrap was handed paths under a relative state directory, resolved them elsewhere, and every command
    failed (`bench` counted each episode an error: ProcessLookupError)."""
    monkeypatch.chdir(tmp_path)
    args = ["sandbox", "run", "--repo", str(repo), "--backend", "isolated", "--state-dir", "state", "--", "echo", "hi"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0 and result.stdout == "hi\n", result.output


def test_bench_pipeline_shows_its_steps_where_stderr_is_not_a_terminal(monkeypatch):
    """Its progress was a rich status, which draws nothing in a log file or a pipe: minutes of silence."""

    async def bench_pipeline(cfg, work_dir, modes, say, **kwargs):
        say("sync: step 1/2, 3.0 s, sampler busy 50%")
        return {"modes": {}, "workload": {}}

    monkeypatch.setattr("vivace.rl.bench.bench_pipeline", bench_pipeline)
    result = CliRunner().invoke(app, [*PIPELINE, "--steps", "2"])
    assert result.exit_code == 0 and json.loads(result.stdout) == {"modes": {}, "workload": {}}, result.output
    assert "sync: step 1/2, 3.0 s, sampler busy 50%" in result.stderr
