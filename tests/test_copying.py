"""Copy practice for the warm start: synthetic repeated spans, and path drills cut from episodes."""

from __future__ import annotations

from vivace.model.checkpoint import load_tokenizer
from vivace.rl.copying import copy_sequences, lookback_sequences, name_pieces, path_drills


def test_copy_sequences_repeat_the_span_and_train_only_on_the_repeats():
    for row in copy_sequences(50, (300, 800), seed=3, repeats=2):
        ids, mask = row["ids"], row["loss_mask"]
        assert len(ids) == len(mask) and all(300 <= t < 800 for t in ids)
        trained = [t for t, m in zip(ids, mask, strict=True) if m]
        span = len(trained) // 2 + 1  # each repeat trains all but its first token
        assert trained[: span - 1] == trained[span - 1 :]  # the two repeats are the same tokens


def _episode(tok, request: str, reply: str):
    turns = [("system", "You are a coding agent."), ("user", request), ("assistant", reply)]
    ids, mask = [], []
    for role, text in turns:
        piece = tok(f"<|im_start|>{role}\n{text}<|im_end|>\n")["input_ids"]
        ids += piece
        mask += [int(role == "assistant")] * len(piece)
    return {"ids": ids, "loss_mask": mask}


def test_path_drills_keep_the_system_turn_and_train_on_the_path_only():
    tok = load_tokenizer("tiny")
    turn_start = tok.convert_tokens_to_ids("<|im_start|>")
    filler = "tests/test_core.py:4: in test_spread\n" * 40
    row = _episode(tok, filler + "museum/core.py:12: in spread\nE   NameError", '{"path": "museum/core.py"}')
    system_len = row["ids"].index(turn_start, 1)
    drills = list(path_drills([row], tok.decode, turn_start, window=64))
    assert len(drills) == 1
    ids, mask = drills[0]["ids"], drills[0]["loss_mask"]
    assert ids[:system_len] == row["ids"][:system_len] and len(ids) == len(mask)
    assert tok.decode([t for t, m in zip(ids, mask, strict=True) if m]) == 'museum/core.py"}'
    context = tok.decode(ids[system_len:])
    assert "museum/core.py:12" in context and len(ids) - system_len <= 64 + 8  # cut to the window
    # no path argument, or a path the assistant did not write: no drill
    plain = _episode(tok, "museum/core.py:12", "Done.")
    assert list(path_drills([plain], tok.decode, turn_start)) == []
    user_only = {"ids": row["ids"], "loss_mask": [0] * len(row["ids"])}
    assert list(path_drills([user_only], tok.decode, turn_start)) == []


def test_old_string_drills_end_at_the_closing_quote_not_an_escaped_one():
    tok = load_tokenizer("tiny")
    turn_start = tok.convert_tokens_to_ids("<|im_start|>")
    reply = '{"path": "m/core.py", "old_string": "x = \\"a\\" + y", "new_string": "x = 1"}'
    row = _episode(tok, 'def f():\n    x = "a" + y\n', reply)
    drills = list(path_drills([row], tok.decode, turn_start, arguments=("old_string",)))
    assert len(drills) == 1
    trained = tok.decode([t for t, m in zip(drills[0]["ids"], drills[0]["loss_mask"], strict=True) if m])
    assert trained.startswith('x = \\"a\\" + y"') and "new_string" not in trained
    both = list(path_drills([row], tok.decode, turn_start, arguments=("path", "old_string")))
    assert len(both) == 2


def test_copy_sequences_filler_sets_how_far_back_the_copy_is():
    for row in copy_sequences(30, (300, 4000), seed=1, repeats=1, span=(8, 8), filler=(500, 600)):
        ids, mask = row["ids"], row["loss_mask"]
        assert mask == [0] * (len(ids) - 7) + [1] * 7  # the repeat, less its first token
        # ids = filler, span, filler, span: the first span starts after 500-600 tokens, the copy 500-600 after it
        starts = [p for p in range(500, 601) if ids[p : p + 8] == ids[-8:]]
        assert starts and 500 <= len(ids) - 16 - starts[0] <= 600


def test_lookback_sequences_copy_spans_from_far_back_and_train_on_half_the_row():
    for row in lookback_sequences(20, (300, 4000), seed=2, context=256, span=(8, 24)):
        ids, mask = row["ids"], row["loss_mask"]
        assert len(ids) == len(mask) and 512 <= len(ids) < 512 + 24
        assert not any(mask[:256]) and sum(mask) > 0.4 * len(ids)
        source = ids[:256]
        i = 256
        while i < len(ids):  # every copied span (a 0 then 1s in the mask) occurs in the random context
            j = i + 1
            while j < len(ids) and mask[j]:
                j += 1
            assert any(source[a : a + j - i] == ids[i:j] for a in range(256 - (j - i) + 1))
            i = j


def test_copies_behind_the_system_turn_open_like_an_agent_episode(tmp_path):
    import json

    from typer.testing import CliRunner

    from vivace.cli import app
    from vivace.harness.chat import ChatFormat
    from vivace.harness.messages import Message
    from vivace.harness.prompts import SYSTEM_PROMPT
    from vivace.harness.tools import default_tools
    from vivace.harness.tools.base import tool_schema

    chat = ChatFormat(load_tokenizer("tiny"))
    tools = [tool_schema(t) for t in default_tools()]
    episode = chat.prompt_ids([Message("system", SYSTEM_PROMPT), Message("user", "Fix the failing test.")], tools)
    out = tmp_path / "c.jsonl"
    args = ["sft", "copies", "--out", str(out), "--n", "3", "--lookback", "64", "--behind-system"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 3
    for row in rows:
        n = next(i for i, (a, b) in enumerate(zip(row["ids"], episode, strict=False)) if a != b)
        # The whole system turn, then the user turn opens: where the random row begins.
        assert chat.decode(row["ids"][:n]).endswith("<|im_start|>user\n")
        assert not any(row["loss_mask"][:n]) and sum(row["loss_mask"]) > 0
        assert len(row["ids"]) - n >= 128  # the lookback row follows in full


def test_name_pieces_are_the_short_common_tokens_names_split_into_and_lookback_draws_from_them():
    tokenizer = load_tokenizer("tiny")
    pool = name_pieces(words=500)
    kinds = set(pool)
    assert 30 < len(kinds) < len(pool)  # a few hundred kinds at most, the frequent ones repeated
    assert max(len(tokenizer.decode([t])) for t in kinds) <= 6  # pieces, not words
    (row,) = lookback_sequences(1, (0, 1), seed=0, context=256, pool=pool)
    assert set(row["ids"]) <= kinds
    context = row["ids"][:256]
    assert len(set(context)) < 200  # pieces recur: one token alone does not say where a copy comes from
