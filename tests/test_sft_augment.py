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
from vivace.rl.sft_augment import (
    augment_episodes,
    cut_after,
    held_out_words,
    name_pool,
    package_of,
    rename,
    rename_words,
    theme_of,
    theme_renames,
)

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


def _garden_episode() -> list[dict]:
    """A garden-theme task (package garden, records plant/plants, fields height/water) whose fix
    writes the field `height` back over its typo."""
    msgs = [
        Message("system", SYSTEM),
        Message("user", "garden/core.py:2: in tallest_plant\nE   KeyError: 'hieght'\nUsage message: Plant heights"),
        Message("assistant", "", (ToolCall("c1", "read_file", {"path": "garden/core.py"}),)),
        Message("tool", "def tallest_plant(plants):\n    return max(p['hieght'] for p in plants)  # water", tool_call_id="c1",
                name="read_file"),
        Message("assistant", "", (ToolCall("c2", "edit_file", {"path": "garden/core.py", "old_string": "'hieght'",
                                                               "new_string": "'height'"}),)),
        Message("tool", "Edited garden/core.py", tool_call_id="c2", name="edit_file"),
        Message("assistant", "Fixed the key in garden/core.py."),
    ]  # fmt: skip
    return [m.to_openai() for m in msgs]


def test_theme_of_reads_generated_and_named_themes():
    assert theme_of("gen-97669-misspelled-name-28843502a5") == "gen-97669"
    assert theme_of("garden-self-comparison-0a1b") == "garden"
    assert theme_of("nosuchtheme-x-y") is None and theme_of(None) is None


def test_theme_renames_keep_the_word_a_fix_writes():
    import random

    messages = [Message.from_openai(m) for m in _garden_episode()]
    mapping = theme_renames("garden", messages, random.Random(0))
    assert "height" not in mapping  # its typo 'hieght' stays in the code, so the fix must still write it
    assert set(mapping) == {"garden", "plant", "plants", "water"}
    assert mapping["plants"] == mapping["plant"] + "s"
    assert not set(mapping.values()) & held_out_words()


def test_rename_words_reaches_identifier_parts_but_not_longer_words():
    messages = [
        Message("system", "plant"),
        Message("user", "tallest_plant(plants) Plant plantation age message 2plant"),
    ]
    out = rename_words(messages, {"plant": "vor", "plants": "vors", "age": "tik"})
    assert out[0].content == "plant"  # the system turn is the harness's
    assert out[1].content == "tallest_vor(vors) Vor plantation tik message 2vor"


def test_whole_episodes_with_theme_names_and_the_context_trained():
    chat = ChatFormat(load_tokenizer("tiny"))
    tools = [tool_schema(t) for t in default_tools()]
    rows = [{"task_id": "garden-misspelled-name-abc", "messages": _garden_episode()}]
    out = list(augment_episodes(iter(rows), chat, tools, variants=3, seed=1, cuts=("whole",), theme_names=True,
                                train_context=True))  # fmt: skip
    assert len(out) == 3
    for r in out:
        text = chat.decode(r["ids"])
        after_system = text[text.index(SYSTEM) + len(SYSTEM) :]
        assert "garden" not in after_system and "plant" not in after_system and "water" not in after_system
        assert "'height'" in after_system and f"Fixed the key in {r['package']}/core.py." in after_system
        first = r["loss_mask"].index(1)
        assert set(r["loss_mask"][first:]) == {1}  # request, tool results and answers all trained
        assert SYSTEM in chat.decode(r["ids"][:first]) and "garden" not in chat.decode(r["ids"][first:])


def test_retry_cut_inserts_an_untrained_near_miss_read_and_its_real_error():
    chat = ChatFormat(load_tokenizer("tiny"))
    tools = [tool_schema(t) for t in default_tools()]
    rows = [{"task_id": "garden-misspelled-name-abc", "messages": _garden_episode()}]
    out = list(augment_episodes(iter(rows), chat, tools, variants=4, seed=2, cuts=("retry",), theme_names=True))
    assert len(out) == 4
    for r in out:
        pkg = r["package"]
        text = chat.decode(r["ids"])
        wrong = text.split('"path": "')[1].split("/")[0]  # the first read names the near miss
        # The error is the tool's, hint included: the file the episode shows with that name.
        assert wrong != pkg and f'Error: {wrong}/core.py does not exist. Did you mean "{pkg}/core.py"?' in text
        said = chat.decode([i for i, m in zip(r["ids"], r["loss_mask"], strict=True) if m])
        assert said.count('"path"') == 1 and f'"path": "{pkg}/core.py"' in said  # only the right read is trained
        assert wrong + "/" not in said and "edit_file" not in said


def test_retry_edit_cut_inserts_an_untrained_near_miss_edit_and_the_tools_error():
    chat = ChatFormat(load_tokenizer("tiny"))
    tools = [tool_schema(t) for t in default_tools()]
    rows = [{"task_id": "t1", "messages": _episode()}]
    out = list(augment_episodes(iter(rows), chat, tools, variants=6, seed=4, cuts=("retry_edit",)))
    assert out
    for r in out:
        text = chat.decode(r["ids"])
        pkg = r["package"]
        # The near miss's error is the real tool's, with the closest line of the file as read.
        assert f"old_string was not found in {pkg}/core.py" in text
        assert (f"The closest text in {pkg}/core.py is at line 2:\n     2\t    tota = 0" in text
                or f"The closest text in {pkg}/core.py is at line 3:\n     3\t    return total" in text)  # fmt: skip
        said = chat.decode([i for i, m in zip(r["ids"], r["loss_mask"], strict=True) if m])
        assert said.count("edit_file") == 1 and '"old_string": "tota "' in said  # only the right edit trained
        assert text.count("edit_file") >= 2 + 1  # the schema, the near miss and the right call


def test_near_miss_is_a_one_letter_typo_and_files_are_read_back():
    import random

    from vivace.bench.baselines import files_read
    from vivace.rl.sft_augment import near_miss

    rng = random.Random(0)
    for _ in range(50):
        bad = near_miss("count_over", rng)
        assert bad != "count_over" and abs(len(bad) - len("count_over")) <= 1
    messages = [Message.from_openai(m) for m in _episode()]
    assert files_read(messages) == {"acme/core.py": "def total(xs):\n    tota = 0\n    return total\n"}


def test_cli_augments_every_data_file_and_refuses_a_missing_one(tmp_path):
    from typer.testing import CliRunner

    from vivace.cli import app

    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text(json.dumps({"task_id": "t1", "messages": _episode()}) + "\n")
    b.write_text(json.dumps({"task_id": "t2", "messages": _episode()}) + "\n\n")
    out = tmp_path / "out.jsonl"
    args = ["sft", "augment", "--data", str(a), "--data", str(b), "--out", str(out), "--variants", "2", "--json"]
    result = CliRunner().invoke(app, [*args, "--cut", "first_edit"])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["task_id"] for r in rows] == ["t1", "t1", "t2", "t2"]  # both files, not only the last
    missing = CliRunner().invoke(app, ["sft", "augment", "--data", str(a), "--data", str(tmp_path / "no.jsonl")])
    assert missing.exit_code == 2 and "no.jsonl: no such file" in missing.output
    bad = CliRunner().invoke(app, ["sft", "augment", "--data", str(a), "--cut", "sideways"])
    assert bad.exit_code == 2 and "unknown --cut sideways" in bad.output


def test_cli_refuses_malformed_episodes_by_line_and_writes_nothing(tmp_path):
    from typer.testing import CliRunner

    from vivace.cli import app

    good = json.dumps({"task_id": "t1", "messages": _episode()})
    cases = {
        "not JSON": good + "\n" + good[:40] + "\n",
        "expected a JSON object, got list": good + "\n[1, 2]\n",
        "messages must be a list": good + '\n{"messages": "hello"}\n',
        "messages[0].role": good + '\n{"messages": [{"role": "wizard", "content": "x"}]}\n',
        "tool_calls[0]": good + '\n{"messages": [{"role": "assistant", "tool_calls": ["read_file"]}]}\n',
        'no "messages" (keys: ids, loss_mask)': good + '\n{"ids": [1, 2], "loss_mask": [0, 1]}\n',
    }
    out = tmp_path / "out.jsonl"
    for n, (expect, text) in enumerate(cases.items()):
        path = tmp_path / f"bad{n}.jsonl"
        path.write_text(text)
        result = CliRunner().invoke(app, ["sft", "augment", "--data", str(path), "--out", str(out)])
        assert result.exit_code == 2, result.output
        message = " ".join(result.output.split())
        assert f"{path.name}:2:" in message and expect in message, result.output
        assert not out.exists() and not list(tmp_path.glob("out.jsonl*"))  # nothing half-written
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(good.encode() + b"\n" + '{"x": "caf\xe9"}\n'.encode("latin-1"))
    result = CliRunner().invoke(app, ["sft", "augment", "--data", str(path), "--out", str(out)])
    assert result.exit_code == 2 and "latin1.jsonl:2: not UTF-8" in " ".join(result.output.split())


def test_package_of_tolerates_calls_without_arguments():
    episode = _episode()
    episode[2]["tool_calls"][0]["function"].pop("arguments")
    assert package_of(episode) == "acme"  # the edit's path still names it
    episode[4]["tool_calls"][0]["function"]["arguments"] = "{not json"
    assert package_of(episode) is None


def test_random_letter_names_and_fixed_packages():
    import random
    import re

    from vivace.rl.sft_augment import fresh_word, random_letters

    rng = random.Random(0)
    names = [random_letters(rng) for _ in range(300)]
    assert all(4 <= len(n) <= 10 and n.isalpha() and n.islower() for n in names)
    assert len(set(names)) > 290  # no small set a model could memorise
    # Letters follow English frequencies: `e` far more often than `z` or `q`.
    text = "".join(names)
    assert text.count("e") > 10 * (text.count("z") + text.count("q"))
    syllables = re.compile(r"^(?:(?:b|d|f|g|k|l|m|n|p|r|s|t|v|z|br|dr|gr|kl|pl|st|tr)[aeiou][nrl]?){2,3}$")
    assert all(syllables.match(fresh_word(rng, 0.0)) for _ in range(50))  # _invent's pattern

    chat = ChatFormat(load_tokenizer("tiny"))
    tools = [tool_schema(t) for t in default_tools()]
    rows = [{"task_id": "t1", "messages": _episode()}]
    out = list(augment_episodes(iter(rows), chat, tools, variants=8, seed=5, cuts=("whole",),
                                packages=["lighthouse", "tavern"]))  # fmt: skip
    assert {r["package"] for r in out} == {"lighthouse", "tavern"}
    for r in out:
        assert f"{r['package']}/core.py:4: in total" in chat.decode(r["ids"])
    lettered = list(augment_episodes(iter(rows), chat, tools, variants=20, seed=6, cuts=("whole",), invented_share=1.0,
                                     letters_share=1.0))  # fmt: skip
    # Every package is random letters now: (nearly) none fits _invent's consonant-vowel syllables.
    assert sum(bool(syllables.match(r["package"])) for r in lettered) <= 1
