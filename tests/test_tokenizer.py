"""The reference tokenizer: the shipped files load with plain transformers, control tokens are
single ids, text round-trips byte for byte, the chat format works token-in/token-out over it, its
own chat template renders what ChatFormat renders, training is deterministic, and the CLI."""

from __future__ import annotations

import errno
import json
import random
import signal
from pathlib import Path

import pytest
from transformers import AutoTokenizer
from typer.testing import CliRunner

from test_chat import SCRIPTED, assert_prefix_property, call, random_conversation, result
from vivace.cli import app
from vivace.harness.chat import END_OF_TEXT, END_OF_TURN, QWEN_TEMPLATE, SPECIAL_TOKENS, ChatFormat
from vivace.harness.messages import Message
from vivace.harness.prompts import SYSTEM_PROMPT
from vivace.harness.tools import default_tools
from vivace.harness.tools.base import tool_schema
from vivace.model.corpus import conversation_texts
from vivace.model.tokenizer import (
    REFERENCE_DIR,
    chars_per_token,
    count_assistant_tokens,
    reference_chat_format,
    reference_tokenizer,
    train_tokenizer,
)

TOOLS = [tool_schema(t) for t in default_tools()]


@pytest.fixture(scope="module")
def tok():
    return reference_tokenizer()


@pytest.fixture(scope="module")
def chat(tok) -> ChatFormat:
    return ChatFormat(tok)


def test_shipped_files_load_with_plain_transformers():
    tok = AutoTokenizer.from_pretrained(str(REFERENCE_DIR))
    assert len(tok) == 4096
    assert (tok.eos_token, tok.pad_token, tok.bos_token) == (END_OF_TURN, END_OF_TEXT, None)
    assert tok.chat_template == QWEN_TEMPLATE
    assert tok.model_max_length >= 32768
    assert sum(p.stat().st_size for p in REFERENCE_DIR.iterdir()) < 1_000_000
    assert tok.encode("hi", add_special_tokens=True) == tok.encode("hi", add_special_tokens=False)  # no BOS/EOS


def test_control_tokens_are_single_special_ids(tok):
    added = tok.get_added_vocab()
    for t in SPECIAL_TOKENS:
        (i,) = tok.encode(t, add_special_tokens=False)
        assert added[t] == i and tok.added_tokens_decoder[i].special
        # never split, whatever is glued to it
        for left, right in [("x", "y"), ("\n", "\n"), ("<", ">"), ("|", "|"), ("", "")]:
            ids = tok.encode(left + t + right, add_special_tokens=False)
            assert ids.count(i) == 1
            assert tok.decode(ids) == left + t + right
    assert len(set(added.values())) == len(SPECIAL_TOKENS)


ROUND_TRIP = [
    "def f(x):\n\treturn x ** 2  # square\r\n",
    "    \n\n\n  trailing   \t",
    "naïve café — 结果 ✓ 🙂👍🏽 e\u0301 \u00e9 Ω≈ç√ \u200b\ufeff",
    "\x00\x01\x7f binary-ish \\x00",
    '{"name": "grep", "arguments": {"pattern": "\\\\bfoo\\\\b"}}',
    "",
]


@pytest.mark.parametrize("text", ROUND_TRIP)
def test_round_trips_exactly(tok, text):
    ids = tok.encode(text, add_special_tokens=False)
    assert tok.decode(ids) == text
    assert tok.decode(ids, skip_special_tokens=True) == text


def test_round_trips_random_text_and_code(tok):
    rng = random.Random(3)
    alphabet = [chr(c) for c in range(0x20, 0x7F)] + list("\n\t\r éü结果✓🙂\u0301\u00a0€ß")
    for _ in range(200):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 300)))
        assert tok.decode(tok.encode(text, add_special_tokens=False)) == text
    source = Path(__file__).read_text()
    assert tok.decode(tok.encode(source, add_special_tokens=False)) == source


def test_code_compresses(tok):
    held_out = (Path(__file__).parent / "test_chat.py").read_text()  # tests are not in the corpus
    assert chars_per_token(tok, [held_out]) > 2.5


def conversation() -> list[Message]:
    return [
        Message("system", SYSTEM_PROMPT),
        Message("user", "`parse_rule` fails on empty input; fix it."),
        Message(
            "assistant",
            "Reading the module and its tests together.",
            (call(0, "read_file", path="routes/planner.py"), call(1, "grep", pattern=r"parse_rule\(", path=".")),
        ),
        result(0, "read_file", "     1\tdef parse_rule(text):\n     2\t    return text.split(':')\n"),
        result(1, "grep", "routes/planner.py:1:def parse_rule(text):\ntests/test_planner.py:9:    parse_rule('')"),
        Message(
            "assistant",
            "",
            (
                call(
                    0, "edit_file", path="routes/planner.py", old_string="    return", new_string="    if not text: ..."
                ),
                call(1, "run_terminal_cmd", command="python -m pytest -q tests/test_planner.py"),
                call(2, "read_lints", paths=["routes/planner.py"]),
            ),
        ),
        result(0, "edit_file", "Edited routes/planner.py: replaced 1 occurrence(s)"),
        result(1, "run_terminal_cmd", "Exit code: 0\n--- stdout ---\n....  [100%]\n4 passed in 0.03s"),
        result(2, "read_lints", "No lint errors in routes/planner.py."),
        Message("assistant", "Fixed: empty input now returns []. The tests pass (4 passed)."),
        Message("user", "Thanks — and 结果?"),
    ]


def test_chat_format_is_prefix_stable(chat):
    assert_prefix_property(chat, conversation(), TOOLS)
    for name, messages in SCRIPTED.items():
        assert_prefix_property(chat, messages, [] if name == "no tools" else TOOLS)
    rng = random.Random(5)
    for _ in range(20):
        assert_prefix_property(chat, random_conversation(rng), TOOLS)


def test_own_template_renders_what_chat_format_renders(tok, chat):
    messages = conversation()
    for upto, gen in [(len(messages), True), (len(messages) - 1, False), (5, True)]:
        part = messages[:upto]
        text = tok.apply_chat_template(
            [m.to_openai() for m in part], tools=TOOLS, tokenize=False, add_generation_prompt=gen
        )
        assert text == chat.render(part, TOOLS, add_generation_prompt=gen)
        if gen:
            assert tok.encode(text, add_special_tokens=False) == chat.prompt_ids(part, TOOLS)


def test_count_assistant_tokens(chat):
    messages = [m for m in conversation() if m.role == "assistant"]
    assert reference_chat_format().tokenizer is reference_tokenizer()
    assert count_assistant_tokens(messages) == sum(len(chat.assistant_ids(m)) for m in messages)
    assert count_assistant_tokens([Message("assistant", "")]) == 1  # just the end-of-turn token


def test_training_is_deterministic():
    corpus = [(Path(__file__).parent / "test_chat.py").read_text()[:6000], *conversation_texts(per_repo=1)][:3]
    first, second = train_tokenizer(corpus, 600), train_tokenizer(corpus, 600)
    assert first.backend_tokenizer.to_str() == second.backend_tokenizer.to_str()
    assert len(first) == 600
    assert [first.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS] == list(range(len(SPECIAL_TOKENS)))
    with pytest.raises(ValueError, match="vocab_size must be at least"):
        train_tokenizer(corpus, 100)


def test_corpus_conversations_are_seeded_and_use_the_real_tools():
    a, b = list(conversation_texts(per_repo=1)), list(conversation_texts(per_repo=1))
    assert a == b
    assert list(conversation_texts(seed=1, per_repo=1)) != a
    text = "".join(a)
    assert SYSTEM_PROMPT in text and json.dumps(TOOLS[0], ensure_ascii=False) in text
    assert text.count("<tool_call>") > 2 * len(a)
    assert "\t" in text and "Exit code: " in text  # read_file's numbered lines, run_terminal_cmd's header


def test_cli_train_json(tmp_path):
    res = CliRunner().invoke(app, ["tokenizer", "train", "--out", str(tmp_path), "--vocab-size", "300", "--json"])
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout)
    assert report["vocab_size"] == 300
    assert report["corpus_bytes"] == report["code_bytes"] + report["conversation_bytes"] > 1_000_000
    assert report["chars_per_token_code"] > 1 and report["chars_per_token_conversations"] > 1
    assert set(report["files"]) >= {"tokenizer.json", "tokenizer_config.json"}
    tok = AutoTokenizer.from_pretrained(str(tmp_path))
    assert len(tok) == 300 and tok.chat_template == QWEN_TEMPLATE
    bad = CliRunner().invoke(app, ["tokenizer", "train", "--out", str(tmp_path / "x"), "--vocab-size", "10"])
    assert bad.exit_code == 2 and "--vocab-size 10: give 263 or more" in bad.output
    files = {p: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()}
    again = CliRunner().invoke(app, ["tokenizer", "train", "--out", str(tmp_path), "--vocab-size", "300"])
    assert again.exit_code == 2 and "already holds files" in again.output  # refused before any training
    assert {p: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()} == files
    a_file = tmp_path / "tokenizer.json"
    onto_file = CliRunner().invoke(app, ["tokenizer", "train", "--out", str(a_file), "--vocab-size", "300"])
    assert onto_file.exit_code == 2 and f"{a_file} is a file; give a directory" in onto_file.output, onto_file.output


def test_cli_train_never_replaces_the_shipped_tokenizer_by_default(tmp_path, monkeypatch):
    """Retraining on today's source gives another vocabulary; the default --out used to be the shipped one."""
    from vivace.model.tokenizer import REFERENCE_DIR

    monkeypatch.chdir(tmp_path)
    shipped = {p.name: p.read_bytes() for p in REFERENCE_DIR.iterdir() if p.is_file()}
    res = CliRunner().invoke(app, ["tokenizer", "train", "--vocab-size", "300", "--json"])
    assert res.exit_code == 0, res.output
    assert (
        json.loads(res.stdout)["out_dir"] == "runs/tokenizer" and (tmp_path / "runs/tokenizer/tokenizer.json").is_file()
    )
    assert {p.name: p.read_bytes() for p in REFERENCE_DIR.iterdir() if p.is_file()} == shipped


def test_bench_counts_reference_tokens():
    from vivace.bench.report import markdown, summarize
    from vivace.bench.runner import reference_tokens
    from vivace.harness.trajectory import ToolRecord, Trajectory, Turn

    messages = [m for m in conversation() if m.role == "assistant"]
    turns = [
        Turn(
            content=m.content,
            tool_calls=[ToolRecord(id=c.id, name=c.name, arguments=c.arguments, result="") for c in m.tool_calls],
        )
        for m in messages
    ]
    traj = Trajectory(
        request="r", policy="p", system_prompt="s", system_prompt_version="v1", turns=turns, stop_reason="done"
    )
    n = reference_tokens(traj)
    assert n == count_assistant_tokens(messages)
    broken = Turn(content="", tool_calls=[ToolRecord(id="call_0", name="", arguments='{"na', result="")])
    assert reference_tokens(traj.model_copy(update={"turns": [broken]})) > 1

    def row(details):
        base = {"turns": 3, "tool_calls": 5, "tool_calls_per_turn": 1.7, "completion_tokens": 9, "wall_s": 2.0}
        extra = {"unsupported_claims": [], "format_errors": 0}
        return {"model": "m", "resolved": True, "total": 1.0, "adherence": 1.0, "details": base | extra | details}

    rows = [
        row({"model_s": 2.0, "reference_tokens": n}),
        row({"model_s": 1.0, "reference_tokens": 3 * n}),
        row({"model_s": 5.0}),  # a row written before reference counts: left out of the token columns
    ]
    s = summarize(rows)["m"]
    assert s["median_ref_tokens"] == 2 * n and s["ref_tokens_per_s"] == pytest.approx(4 * n / 3)
    assert "tokens/s (ref.)" in markdown({"m": s}, "t")
    scripted = [{**r, "details": r["details"] | {"completion_tokens": 0}} for r in rows]
    assert summarize(scripted)["m"]["ref_tokens_per_s"] is None  # generates nothing: no speed


@pytest.fixture
def small_corpus(monkeypatch):
    """`tokenizer train` over a few lines instead of vivace's whole source."""
    import vivace.model.corpus as corpus

    monkeypatch.setattr(corpus, "code_files", lambda: [Path("calc.py")])
    monkeypatch.setattr(corpus, "code_texts", lambda: iter(["def add(a, b):\n    return a + b\n"]))
    monkeypatch.setattr(corpus, "conversation_texts", lambda: iter(["Let me read calc.py first.\n"]))


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_cli_train_stopped_by_a_signal_says_so_and_exits_128_plus_it(tmp_path, monkeypatch, small_corpus, signum):
    """Ctrl-C exited without a word, and SIGTERM killed the command outright; now both say what was saved."""
    import vivace.model.tokenizer as T

    real = T.train_tokenizer

    def stopped(texts, vocab_size):
        if signum == signal.SIGINT:
            raise KeyboardInterrupt  # what Ctrl-C raises
        signal.raise_signal(signal.SIGTERM)
        return real(texts, vocab_size)  # reached only where SIGTERM does not stop the command

    monkeypatch.setattr(T, "train_tokenizer", stopped)
    out = tmp_path / "tok"
    before = signal.signal(signal.SIGTERM, lambda s, f: None)  # without the CLI's handler: nothing stops
    try:
        res = CliRunner().invoke(app, ["tokenizer", "train", "--out", str(out), "--vocab-size", "300"])
    finally:
        signal.signal(signal.SIGTERM, before)
    assert res.exit_code == 128 + signum, res.output
    said = " ".join(res.stderr.split())
    assert f"stopped by {signal.Signals(signum).name}: nothing was written to {out}; run it again" in said, said
    assert not out.exists()


def test_cli_train_that_cannot_save_is_one_line(tmp_path, monkeypatch, small_corpus):
    """A disk that fills (or a mount gone read-only) after the check up front: the save's OSError was a
    traceback after all the training."""

    def disk_full(tokenizer, out_dir):
        raise OSError(errno.ENOSPC, "No space left on device", str(Path(out_dir) / "tokenizer.json"))

    monkeypatch.setattr("vivace.model.tokenizer.save_tokenizer", disk_full)
    out = tmp_path / "tok"
    res = CliRunner().invoke(app, ["tokenizer", "train", "--out", str(out), "--vocab-size", "300", "--json"])
    assert res.exit_code == 1 and isinstance(res.exception, SystemExit), res.output
    said = " ".join(res.stderr.split())
    assert f"error: cannot write {out}/tokenizer.json: No space left on device; the tokenizer trained was not" in said
    assert "Traceback" not in res.output and res.stdout == ""


def test_the_code_corpus_is_the_same_when_vivace_is_installed_under_a_hidden_directory(tmp_path, monkeypatch):
    """Hidden directories are left out below the package only: installed under `.venv/` or `~/.local/`,
    every file had been left out, and `vivace tokenizer train` trained on no code at all."""
    import shutil

    from vivace.model import corpus

    here = [p.relative_to(corpus.VIVACE_SRC) for p in corpus.code_files()]
    copy = tmp_path / ".venv" / "site-packages" / "vivace"
    shutil.copytree(corpus.VIVACE_SRC, copy, ignore=shutil.ignore_patterns("__pycache__", "*.safetensors", "*.json*"))
    (copy / ".hidden.py").write_text("x = 1\n")  # still left out
    monkeypatch.setattr(corpus, "VIVACE_SRC", copy)
    assert [p.relative_to(copy) for p in corpus.code_files()] == here and len(here) > 100


def test_cli_train_says_when_the_corpus_gave_fewer_tokens_than_asked(tmp_path, monkeypatch):
    """--vocab-size 5,000,000 gave 25,731 tokens without a word: a model sized for the request wastes rows."""
    from vivace.model import tokenizer as T

    real = T.train_tokenizer
    monkeypatch.setattr(T, "train_tokenizer", lambda texts, size: real(texts, 300))  # as a small corpus would
    res = CliRunner().invoke(app, ["tokenizer", "train", "--out", str(tmp_path), "--vocab-size", "400", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["vocab_size"] == 300
    assert "the corpus gave 300 tokens, fewer than --vocab-size 400" in " ".join(res.stderr.split())
