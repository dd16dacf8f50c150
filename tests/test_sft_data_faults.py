"""The sft data commands against rows they were not written for (found by probing `sft augment` and
`sft drills`): a lone surrogate or a non-string task_id is refused by file, line and field instead of a
traceback; a tool-call value longer than 64 tokens is drilled and scored whole, not cut; a --package
that cannot name a Python package is refused instead of writing "/core.py"."""

from __future__ import annotations

import json
import re

import pytest
from typer.testing import CliRunner

from test_sft_augment import _episode
from vivace.cli import app
from vivace.harness.chat import ChatFormat
from vivace.harness.tools import default_tools
from vivace.harness.tools.base import tool_schema
from vivace.model.checkpoint import load_tokenizer
from vivace.rl.copying import argument_values, path_drills
from vivace.rl.packing import make_episode
from vivace.rl.sft_augment import augment_episodes, read_expert_rows
from vivace.rl.sft_train import SftDataError

LONE = "\ud800"  # what JSON's "\ud800" decodes to: valid JSON, no character


def _said(result) -> str:
    return " ".join(result.output.split())


def _with_row(tmp_path, row: dict, name: str = "bad.jsonl"):
    """A file of a good episode, then `row` on line 2."""
    path = tmp_path / name
    path.write_text(json.dumps({"task_id": "t1", "messages": _episode()}) + "\n" + json.dumps(row) + "\n")
    return path


def test_augment_refuses_a_lone_surrogate_naming_the_line_and_field(tmp_path):
    """It reached the tokenizer, which raised a TypeError from inside ChatFormat.encode."""
    episode = _episode()
    episode[1]["content"] += LONE
    path, out = _with_row(tmp_path, {"task_id": "t2", "messages": episode}), tmp_path / "out.jsonl"
    result = CliRunner().invoke(app, ["sft", "augment", "--data", str(path), "--out", str(out), "--cut", "whole"])
    assert result.exit_code == 2, result.output
    assert "bad.jsonl:2: messages[1].content holds a lone surrogate" in _said(result)
    assert not list(tmp_path.glob("out.jsonl*"))


@pytest.mark.parametrize(
    ("field", "edit"),
    [
        ("messages[3].content", lambda m: m[3].update(content="tota" + LONE)),  # a tool result
        ("messages[2].tool_calls[0].function.arguments",  # the arguments text holding the escape itself
         lambda m: m[2]["tool_calls"][0]["function"].update(arguments='{"path": "acme/core.py\\ud800"}')),
        ("messages[4].tool_calls[0].function.arguments",  # an arguments object, the value decoded
         lambda m: m[4]["tool_calls"][0]["function"].update(arguments={"path": "acme/core.py", "old_string": LONE})),
        ("messages[1].content", lambda m: m[1].update(content=[{"type": "text", "text": LONE}])),  # a text part
    ],
)  # fmt: skip
def test_read_expert_rows_names_the_field_holding_a_lone_surrogate(tmp_path, field, edit):
    episode = _episode()
    edit(episode)
    with pytest.raises(SftDataError, match=re.escape(f"bad.jsonl:2: {field} holds a lone surrogate")):
        read_expert_rows(_with_row(tmp_path, {"messages": episode}))
    episode = _episode()
    episode[1]["content"] += "\ud83d\ude00"  # a surrogate pair is a character (an emoji): kept
    assert len(read_expert_rows(_with_row(tmp_path, {"messages": episode}))) == 2


def test_augment_with_theme_names_refuses_a_task_id_that_is_not_a_string(tmp_path):
    """`theme_of` called .split on it: an AttributeError."""
    path, out = _with_row(tmp_path, {"task_id": 12345, "messages": _episode()}), tmp_path / "out.jsonl"
    args = ["sft", "augment", "--data", str(path), "--out", str(out), "--theme-names"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert 'bad.jsonl:2: "task_id" must be a string' in _said(result) and "got int" in _said(result)
    assert not list(tmp_path.glob("out.jsonl*"))
    for kept in ({"task_id": None, "messages": _episode()}, {"messages": _episode()}):  # null or none: as before
        assert len(read_expert_rows(_with_row(tmp_path, kept))) == 2


def _turns(tok, request: str, reply: str) -> tuple[list[int], list[int]]:
    ids, mask = [], []
    for role, text in [("system", "You are a coding agent."), ("user", request), ("assistant", reply)]:
        piece = tok(f"<|im_start|>{role}\n{text}<|im_end|>\n")["input_ids"]
        ids, mask = ids + piece, mask + [int(role == "assistant")] * len(piece)
    return ids, mask


def _spelled(tok, ids: list[int], s: int, e: int, value: str) -> bool:
    """Whether tokens s..e are the value as a call spells it (JSON-escaped), then the closing quote,
    with that quote in token e."""
    written = json.dumps(value)[1:]
    return tok.decode(ids[s : e + 1]).startswith(written) and len(tok.decode(ids[s:e])) < len(written)


def test_a_long_value_is_drilled_and_scored_whole_to_its_closing_quote():
    """The scan stopped 64 tokens into a value: a drill trained on a cut old_string, and the eval scored
    its first 65 tokens as the "whole value" (eval_exact_old_string)."""
    from vivace.rl.sft_train import argument_spans

    tok = load_tokenizer("tiny")
    turn_start = tok.convert_tokens_to_ids("<|im_start|>")
    old = " ".join(f"value_{i} = compute_{i}(x)" for i in range(40))
    args = {"path": "m/core.py", "old_string": old, "new_string": old + "!"}
    ids, mask = _turns(tok, old, json.dumps(args))
    calls = []
    found = list(argument_values(ids, mask, lambda t: calls.append(len(t)) or tok.decode(t), tuple(args)))
    assert [a for a, _, _ in found] == ["path", "old_string", "new_string"]
    assert all(_spelled(tok, ids, s, e, v) for (_, s, e), v in zip(found, args.values(), strict=True))
    assert found[1][2] - found[1][1] > 200
    assert sum(calls) <= 8 * len(ids)  # linear: each position decoded a bounded number of times

    (drill,) = path_drills([{"ids": ids, "loss_mask": mask}], tok.decode, turn_start, arguments=("old_string",))
    trained = tok.decode([t for t, m in zip(drill["ids"], drill["loss_mask"], strict=True) if m])
    assert trained.startswith(json.dumps(old)[1:])

    (spans,) = argument_spans([make_episode(ids, mask)], tok.decode)
    assert spans == found


def test_a_value_not_closed_before_the_turn_ends_is_left_out_and_an_escaped_backslash_closes():
    tok = load_tokenizer("tiny")
    ids, mask = _turns(tok, "fix m/core.py", '{"path": "m/core.py", "old_string": "x = 1 + ')
    assert [a for a, _, _ in argument_values(ids, mask, tok.decode, ("path", "old_string"))] == ["path"]
    args = {"old_string": "a \\", "new_string": "b"}  # the value ends with a backslash: `"a \\"`
    ids, mask = _turns(tok, "fix it", json.dumps(args))
    (_, s, e), _ = argument_values(ids, mask, tok.decode, tuple(args))
    assert _spelled(tok, ids, s, e, args["old_string"])  # not on to the quote before "new_string"


def test_a_package_name_that_is_not_an_identifier_is_refused():
    """`--package ""` wrote paths like "/core.py"; "a-b", "1x", "a.b" code that cannot import."""
    from vivace.rl.sft_augment import check_package_names

    for bad in ("", "a-b", "1x", "a.b", "class", "a b"):
        with pytest.raises(ValueError, match="is not a Python package name"):
            check_package_names(["lighthouse", bad])
    check_package_names(["lighthouse", "_x1", "Tavern"])
    chat = ChatFormat(load_tokenizer("tiny"))
    tools = [tool_schema(t) for t in default_tools()]
    rows = [{"task_id": "t1", "messages": _episode()}]
    with pytest.raises(ValueError, match="--package '' is not"):
        list(augment_episodes(iter(rows), chat, tools, variants=1, cuts=("whole",), packages=[""]))


def test_the_cli_refuses_a_bad_package_name_before_writing(tmp_path):
    path, out = _with_row(tmp_path, {"task_id": "t2", "messages": _episode()}), tmp_path / "out.jsonl"
    result = CliRunner().invoke(app, ["sft", "augment", "--data", str(path), "--out", str(out), "--package", "a-b"])
    assert result.exit_code == 2 and "--package 'a-b' is not a Python package name" in _said(result), _said(result)
    assert not list(tmp_path.glob("out.jsonl*"))


def test_augment_renders_the_messages_it_checked_text_parts_joined():
    """read_expert_rows accepts content as a list of text parts; the rendering re-read the raw row and
    trained on the list's Python repr (`[{'type': 'text', ...}]`)."""
    chat = ChatFormat(load_tokenizer("tiny"))
    tools = [tool_schema(t) for t in default_tools()]
    episode = _episode()
    request = episode[1]["content"]
    episode[1]["content"] = [{"type": "text", "text": request[:20]}, {"type": "text", "text": request[20:]}]
    (row,) = augment_episodes(iter([{"messages": episode}]), chat, tools, variants=1, cuts=("whole",))
    (plain,) = augment_episodes(iter([{"messages": _episode()}]), chat, tools, variants=1, cuts=("whole",))
    assert "'type'" not in chat.decode(row["ids"]) and row["ids"] == plain["ids"]
