"""Expert data (`vivace sft data`): the oracle's styles through the real harness become token
sequences whose loss mask covers exactly what the assistant said, rendered as the policy sees it."""

from __future__ import annotations

import json

import pytest

from test_scoring import task  # noqa: F401  (the injected-bug fixture on conftest's sample repo)
from vivace.config import load_preset
from vivace.harness.chat import ChatFormat
from vivace.harness.messages import Message, ToolCall
from vivace.harness.policy import render_conversation
from vivace.harness.tools import default_tools
from vivace.harness.tools.base import tool_schema
from vivace.model.checkpoint import load_tokenizer
from vivace.rl.sft import expert_data


def _message(d: dict) -> Message:
    calls = tuple(ToolCall(c["id"], c["function"]["name"], json.loads(c["function"]["arguments"]))
                  for c in d.get("tool_calls") or [])  # fmt: skip
    return Message(d["role"], d.get("content") or "", calls, tool_call_id=d.get("tool_call_id"), name=d.get("name"))


async def test_expert_data_masks_exactly_the_assistant_turns(task, state_dir, tmp_path):  # noqa: F811
    cfg = load_preset("default", sandbox={"backend": "plain", "state_dir": str(state_dir)})
    out = tmp_path / "expert.jsonl"
    result = await expert_data(cfg, [task], out, concurrency=2)
    assert result["kept"] == 4 and result["episodes"] == 4  # every style solves it
    rows = {r["style"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert rows["serial"]["turns"] > rows["efficient"]["turns"]
    assert rows["redundant"]["tool_calls"] > rows["efficient"]["tool_calls"]
    called = [c["function"]["name"] for m in rows["no-tests"]["messages"] for c in m.get("tool_calls") or []]
    # no-tests never checks its change (a run to find the failure first is looking, not checking)
    assert "edit_file" in called and "run_terminal_cmd" not in called[called.index("edit_file") :]
    chat = ChatFormat(load_tokenizer("tiny"))
    tools = [tool_schema(t) for t in default_tools()]
    for style, row in rows.items():
        ids, mask = row["ids"], row["loss_mask"]
        messages = [_message(m) for m in row["messages"]]
        assert ids == chat.prompt_ids(messages, tools)[: len(ids)], style  # the rendering the policy reads
        said = "".join(chat.assistant_text(m) for m in messages if m.role == "assistant")
        assert chat.decode([i for i, m in zip(ids, mask, strict=True) if m]) == said, style
        assert render_conversation(chat, messages, tools) == (ids, mask), style  # offline rendering = recorded
    # Minimal fragments: the bug's one line, made unique with as little context as needed.
    edit = next(c for m in rows["efficient"]["messages"] for c in m.get("tool_calls") or []
                if c["function"]["name"] == "edit_file")  # fmt: skip
    old = json.loads(edit["function"]["arguments"])["old_string"]
    assert "return a - b" in old and "def sub" not in old and old.count("\n") <= 2


async def test_anchor_data_records_the_expert_and_a_renamed_copy_of_each(state_dir, tmp_path):
    from vivace.rl.sft import anchor_data
    from vivace.tasks.suites import load_suite

    cfg = load_preset("tiny", sandbox={"backend": "plain", "state_dir": str(state_dir)})
    tasks = load_suite("families", split="train")
    out = tmp_path / "expert.jsonl"
    counts = await anchor_data(cfg, tasks, out, n=2, seed=5)
    assert counts == {"tasks": 2, "episodes": 2, "renamed": 2}
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [sorted(r) for r in rows] == [["ids", "loss_mask"]] * 4
    assert list(tmp_path.iterdir()) == [out]  # the recording and the partial file are gone
    chat = ChatFormat(load_tokenizer("tiny"))
    for original, copy in zip(rows[:2], rows[2:], strict=True):
        said, copied = (
            chat.decode([i for i, m in zip(r["ids"], r["loss_mask"], strict=True) if m]) for r in (original, copy)
        )
        assert said != copied and len(said.splitlines()) == len(copied.splitlines())  # the same turns, renamed


async def test_a_run_whose_expert_solves_nothing_stops_with_the_reason(state_dir, tmp_path):
    from vivace.rl.controller import _expert_file
    from vivace.tasks.format import RepoSpec, Task, TestSpec

    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "main.py").write_text("x = 1\n")
    tasks = [Task(id="no-fix", repo=RepoSpec(path=str(repo)), request="fix it",  # no reference fix to replay
                  tests=TestSpec(command="false", fail_to_pass=["t::a"], pass_to_pass=[]))]  # fmt: skip
    cfg = load_preset("tiny", sandbox={"backend": "plain", "state_dir": str(state_dir)})
    notes: list[str] = []
    with pytest.raises(ValueError, match="solved none of the 1 training tasks"):
        await _expert_file(cfg, tmp_path, tasks, notes.append)
    assert notes[0].startswith("recording the expert on 1 training tasks") and not (tmp_path / "expert.jsonl").exists()


def test_sft_data_takes_a_users_tasks_file_without_splits_and_names_what_it_dropped(task, state_dir, tmp_path):  # noqa: F811
    """`sft data --tasks FILE` refused a file whose tasks name no split ("no tasks in split 'train'"), which
    `train.suite` and `tasks select` take as train; and a task whose expert episode failed was only counted
    ("unresolved:efficient": 1), never named."""
    from typer.testing import CliRunner

    from vivace.cli import app

    broken = task.model_copy(update={"id": "calc-add-broken", "reference_patch": task.reference_patch.replace(
        "-    return a - b", "-    return a -  b")})  # fmt: skip
    tasks_file = tmp_path / "tasks.jsonl"
    tasks_file.write_text("".join(t.model_dump_json(exclude={"base_dir"}) + "\n" for t in (task, broken)))
    assert all("split" not in t.metadata for t in (task, broken))
    out = tmp_path / "expert.jsonl"
    args = ["sft", "data", "--tasks", str(tasks_file), "--out", str(out), "--styles", "efficient", "--json",
            "--backend", "plain", "--state-dir", str(state_dir)]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    counts = json.loads(result.stdout)
    assert counts["episodes"] == 2 and counts["kept"] == 1 and counts["unresolved:efficient"] == 1
    assert list(counts["not_kept"]) == ["calc-add-broken (efficient)"]
    assert counts["not_kept"]["calc-add-broken (efficient)"].startswith("edit_file pkg/calc.py: old_string was not")
    args[args.index("--out") + 1] = str(tmp_path / "test.jsonl")
    result = CliRunner().invoke(app, [*args, "--split", "test"])
    assert result.exit_code == 2 and "metadata.split (train when it names none)" in " ".join(result.output.split())
