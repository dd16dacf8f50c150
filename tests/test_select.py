"""Pass-rate filtering (`vivace tasks select`): rates from benchmark rows, the bounds, bad input."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from vivace.cli import app
from vivace.tasks.format import RepoSpec, Task, TaskFormatError, TestSpec, load_jsonl, save_jsonl
from vivace.tasks.select import read_pass_rates, select_tasks


def _task(task_id: str, family: str = "f", split: str = "train") -> Task:
    return Task(id=task_id, repo=RepoSpec(bundled="_blank"), request="fix it", tests=TestSpec(fail_to_pass=["t.py"]),
                metadata={"split": split, "family": family})  # fmt: skip


def _rows(path, outcomes: dict[str, list[bool]], model: str = "tiny") -> None:
    lines = [
        json.dumps({"model": model, "task_id": task_id, "sample": k, "resolved": ok})
        for task_id, oks in outcomes.items()
        for k, ok in enumerate(oks)
    ]
    path.write_text("\n".join(lines) + "\n")


def test_rates_pool_files_and_select_keeps_suite_order(tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    _rows(a, {"t1": [True, False], "t2": [False, False], "t3": [True, True]})
    _rows(b, {"t1": [False, False], "t4": [False, True]})
    rates = read_pass_rates([a, b])
    assert (rates["t1"].solved, rates["t1"].episodes) == (1, 4)
    assert rates["t3"].rate == 1.0
    tasks = [_task(f"t{i}") for i in (4, 3, 2, 1, 5)]  # t5 was never measured
    assert [t.id for t in select_tasks(tasks, rates)] == ["t4", "t3", "t1"]
    assert [t.id for t in select_tasks(tasks, rates, max_rate=0.9)] == ["t4", "t1"]
    assert [t.id for t in select_tasks(tasks, rates, min_solved=2)] == ["t3"]
    assert [t.id for t in select_tasks(tasks, rates, min_solved=0, max_rate=0.0)] == ["t2"]
    # An episode that could not run (the endpoint down) is not a failure of the model.
    with b.open("a") as f:
        f.write(json.dumps({"model": "tiny", "task_id": "t3", "resolved": False, "error": "endpoint down"}) + "\n")
    assert read_pass_rates([a, b])["t3"].rate == 1.0


def test_mixed_models_need_a_choice(tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    _rows(a, {"t1": [True]}, model="tiny")
    _rows(b, {"t1": [False, False]}, model="scripted:null")
    with pytest.raises(TaskFormatError, match="several models"):
        read_pass_rates([a, b])
    assert read_pass_rates([a, b], model="scripted:null")["t1"].episodes == 2


@pytest.mark.parametrize("line", ["not json", '{"task_id": "t1"}', "[1, 2]", '"text"'])
def test_malformed_rows_name_file_and_line(tmp_path, line):
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps({"model": "m", "task_id": "t0", "resolved": True}) + "\n\n" + line + "\n")
    with pytest.raises(TaskFormatError, match=r"r\.jsonl:3: not a benchmark result row"):
        read_pass_rates([path])


MISTYPED = [
    ({"resolved": "false"}, 'resolved must be a JSON boolean (true or false), got "false"'),
    ({"resolved": 1}, "resolved must be a JSON boolean"),
    ({"task_id": ["t1"]}, 'task_id must be a string, got ["t1"]'),
    ({"model": None}, "model must be a string"),
]


@pytest.mark.parametrize("fields,said", MISTYPED, ids=["resolved-string", "resolved-int", "task-id-list", "model-null"])
def test_mistyped_rows_are_refused_not_guessed(tmp_path, fields, said):
    """bool("false") is True: a quoted outcome would have counted as solved."""
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps({"model": "m", "task_id": "t1", "resolved": True}) + "\n"
                    + json.dumps({"model": "m", "task_id": "t1", "resolved": False, **fields}) + "\n")  # fmt: skip
    with pytest.raises(TaskFormatError) as info:
        read_pass_rates([path])
    assert str(info.value).startswith(f"{path}:2: {said}"), str(info.value)


def test_unreadable_results_file_is_an_error(tmp_path):
    with pytest.raises(TaskFormatError, match="cannot read"):
        read_pass_rates([tmp_path / "nope.jsonl"])
    with pytest.raises(TaskFormatError, match="cannot read"):
        read_pass_rates([tmp_path])  # a directory
    (tmp_path / "bin.jsonl").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(TaskFormatError, match="cannot read"):
        read_pass_rates([tmp_path / "bin.jsonl"])


def test_cli_writes_a_train_suite(tmp_path):
    suite = tmp_path / "suite.jsonl"
    save_jsonl([_task("t1", "a"), _task("t2", "a"), _task("t3", "b")], suite)
    results = tmp_path / "results.jsonl"
    _rows(results, {"t1": [True, False], "t2": [False, False], "t3": [True, True], "zz": [True]})
    out = tmp_path / "pool.jsonl"
    args = ["tasks", "select", "--results", str(results), "--suite", str(suite), "--out", str(out)]
    r = CliRunner().invoke(app, [*args, "--max-rate", "0.75", "--json"])
    assert r.exit_code == 0, r.output
    report = json.loads(r.stdout)
    assert report["kept"] == 1 and report["results_not_in_suite"] == 1
    assert report["families"]["a"] == {"tasks": 2, "measured": 2, "solved_sometimes": 1, "kept": 1}
    assert [t.id for t in load_jsonl(out)] == ["t1"]
    # Nothing meets the bounds: an error, and no file written.
    out.unlink()
    r = CliRunner().invoke(app, [*args, "--min-solved", "3"])
    assert r.exit_code == 1 and "no task meets the bounds" in r.output and not out.exists()


def test_cli_split_all_selects_over_every_split(tmp_path):
    """`--split all` was refused as an unknown split although the command's own messages name it."""
    suite = tmp_path / "suite.jsonl"
    save_jsonl([_task("t1"), _task("t2", split="test"), _task("t3", split="validation")], suite)
    results = tmp_path / "results.jsonl"
    _rows(results, {"t1": [True, False], "t2": [True, False], "t3": [False, False]})
    out = tmp_path / "pool.jsonl"
    args = ["tasks", "select", "--results", str(results), "--suite", str(suite), "--out", str(out)]
    r = CliRunner().invoke(app, [*args, "--split", "all", "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["tasks"] == 3 and [t.id for t in load_jsonl(out)] == ["t1", "t2"]
    r = CliRunner().invoke(app, args)  # train only, by default: the other measured tasks are named
    assert r.exit_code == 0 and [t.id for t in load_jsonl(out)] == ["t1"], r.output
    assert "2 measured tasks are not in" in r.output and "(train)" in r.output, r.output
    r = CliRunner().invoke(app, [*args, "--split", "dev"])
    assert r.exit_code == 2 and "unknown split 'dev'" in r.output, r.output
