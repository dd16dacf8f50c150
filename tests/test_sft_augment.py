"""Name-swapped, cut-short expert episodes (rl/sft_augment.py): the package is renamed everywhere
the model reads or writes it, never to a held-out theme's word, the dialogue ends at the decision
being practised, and the tokens are exactly the harness's rendering of the edited conversation."""

from __future__ import annotations

import json

from vivace.harness.chat import ChatFormat
from vivace.harness.messages import Message, ToolCall
from vivace.harness.tools import default_tools
from vivace.harness.tools.base import tool_schema
from vivace.model.checkpoint import load_tokenizer
from vivace.rl.sft_augment import augment_episodes, cut_after, held_out_words, name_pool, package_of, rename

SYSTEM = "You are a coding agent. Paths are relative; acme is not special here."


def _episode() -> list[dict]:
    msgs = [
        Message("system", SYSTEM),
        Message("user", "```\ntests/test_core.py:3: in test_total\nacme/core.py:4: in total\nE   NameError: name 'tota' is not defined\n```"),
        Message("assistant", "Reading the code involved.", (ToolCall("c1", "read_file", {"path": "acme/core.py"}),)),
        Message("tool", "     1\tdef total(xs):\n     2\t    tota = 0\n     3\t    return total\n", tool_call_id="c1", name="read_file"),
        Message("assistant", "", (ToolCall("c2", "edit_file", {"path": "acme/core.py", "old_string": "tota ", "new_string": "total "}),)),
        Message("tool", "Edited acme/core.py: replaced 1 occurrence(s)", tool_call_id="c2", name="edit_file"),
        Message("assistant", "Changed acme/core.py."),
    ]  # fmt: skip
    return [m.to_openai() for m in msgs]


def test_package_rename_and_cuts():
    rows = _episode()
    assert package_of(rows) == "acme"
    messages = rename([Message.from_openai(m) for m in rows], "acme", "zorblat")
    assert messages[0].content == SYSTEM  # the system prompt is the harness's, never edited
    text = json.dumps([m.to_openai() for m in messages[1:]])
    assert "acme" not in text and text.count("zorblat") == 5
    first = cut_after(messages, "first_file", "zorblat")
    assert first[-1].tool_calls[0].name == "read_file" and len(first) == 3
    edit = cut_after(messages, "first_edit", "zorblat")
    assert edit[-1].tool_calls[0].arguments["path"] == "zorblat/core.py" and len(edit) == 5
    assert cut_after(messages[:2], "first_edit", "zorblat") is None


def test_augmented_rows_are_the_harness_rendering_with_fresh_names():
    chat = ChatFormat(load_tokenizer("tiny"))
    tools = [tool_schema(t) for t in default_tools()]
    rows = [{"task_id": "t1", "messages": _episode()}, {"task_id": "no-package", "messages": _episode()[:2]}]
    out = list(augment_episodes(iter(rows), chat, tools, variants=6, seed=3))
    assert len(out) == 6 and {r["task_id"] for r in out} == {"t1"}  # the call-less episode is skipped
    held_out = held_out_words()
    for r in out:
        new = r["package"]
        assert new != "acme" and new not in held_out
        text = chat.decode(r["ids"])
        assert "acme/" not in text and f"{new}/core.py:4: in total" in text
        said = chat.decode([i for i, m in zip(r["ids"], r["loss_mask"], strict=True) if m])
        assert f'"path": "{new}/core.py"' in said
        assert ("edit_file" in said) == (r["cut"] == "first_edit")
        assert "Changed" not in said  # cut before the answer


def test_name_pool_is_offline_words_without_held_out_themes():
    pool = name_pool()
    assert len(pool) > 1000 and pool == sorted(pool)
    assert not set(pool) & held_out_words()
    assert "def" not in pool and "core" not in pool
