"""Supervised warm start (`vivace sft train`): packed rows see one episode at a time, the loss
counts only masked targets, a few steps overfit a handful of episodes, the checkpoint loads, and
bad data fails with the file and line."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import time
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config, Qwen3Config
from typer.testing import CliRunner

from test_own_checkpoint import SMALL as OWN
from test_own_checkpoint import llama3_tokenizer, save
from vivace.cli import app
from vivace.harness.chat import ChatFormat
from vivace.model.checkpoint import deepen, load_model, load_tokenizer, save_checkpoint, tiny_config
from vivace.model.tokenizer import reference_tokenizer
from vivace.rl.sft_train import (
    IGNORE,
    PACKED,
    SftDataError,
    _init_model,
    forward_row,
    lr_at,
    make_episode,
    pack,
    read_episodes,
    train_sft,
    turn_start_token,
)

torch.set_num_threads(2)
SMALL = dict(hidden_size=64, moe_intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
             num_key_value_heads=1, head_dim=32, num_experts=4)  # fmt: skip
VOCAB = 4096  # the reference tokenizer's


def _small_model():
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(tiny_config(VOCAB, **SMALL), dtype=torch.float32).eval()


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _episodes(n: int, seed: int = 0, lo: int = 20, hi: int = 60) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        k = rng.randint(lo, hi)
        rows.append({"ids": [rng.randrange(VOCAB) for _ in range(k)], "loss_mask": [0] * (k // 2) + [1] * (k - k // 2)})
    return rows


@pytest.mark.parametrize("attn", [PACKED, "sdpa", "eager"])
def test_packed_row_equals_each_episode_alone(attn):
    model = _small_model()
    eps = [make_episode(r["ids"], r["loss_mask"]) for r in _episodes(3, lo=5, hi=40)] + [make_episode([7])]
    with torch.no_grad():
        alone = [model(input_ids=torch.tensor([e.ids]), use_cache=False).logits[0] for e in eps]  # plain inference
        flat = torch.tensor([[i for e in eps for i in e.ids]])
        leaky = model(input_ids=flat, use_cache=False).logits[0]  # one long sequence: later episodes see earlier ones
        model.set_attn_implementation(attn)
        packed = forward_row(model, eps)[0].logits[0]
    start = 0
    for e, ref in zip(eps, alone, strict=True):
        torch.testing.assert_close(packed[start : start + len(e.ids)], ref, atol=1e-4, rtol=0)
        start += len(e.ids)
    assert (leaky[len(eps[0].ids) :] - packed[len(eps[0].ids) :]).abs().max() > 1e-2  # the check has teeth


def test_labels_and_loss_count_only_masked_targets():
    # Targets are the next token where the *target's* mask is 1; nothing crosses an episode's end.
    a, b = make_episode([5, 6, 7], [0, 1, 1]), make_episode([8, 9], [1, 0])
    assert a.labels + b.labels == [6, 7, IGNORE, IGNORE, IGNORE]
    assert make_episode([1, 2, 3]).labels == [2, 3, IGNORE]  # ids only: every token
    model = _small_model()
    rng = random.Random(1)
    ids = [rng.randrange(VOCAB) for _ in range(12)]
    mask = [0, 0, 0, 1, 1, 0, 1, 1, 0, 0, 0, 0]  # trailing tool output is not trained

    def loss(ids_):
        with torch.no_grad():
            out, labels = forward_row(model, [make_episode(ids_, mask)])
        return torch.nn.functional.cross_entropy(out.logits[0], labels, ignore_index=IGNORE), out.logits[0]

    base, logits = loss(ids)
    logp = torch.log_softmax(logits, -1)
    by_hand = -sum(logp[t - 1, ids[t]] for t in (3, 4, 6, 7)) / 4  # targets at masked positions 3, 4, 6, 7
    torch.testing.assert_close(base, by_hand)
    with torch.no_grad():  # what training computes: logits at the trained positions only, same numbers
        out, labels = forward_row(model, [make_episode(ids, mask)], trained_only=True)
    torch.testing.assert_close(out.logits[0], logits[[2, 3, 5, 6]], atol=1e-5, rtol=0)
    assert labels.tolist() == [ids[t] for t in (3, 4, 6, 7)]
    assert torch.equal(loss(ids[:8] + [1, 2, 3, 4])[0], base)  # unmasked targets change nothing
    assert not torch.equal(loss(ids[:6] + [ids[6] + 1] + ids[7:])[0], base)  # a masked one does


def test_pack_fits_rows_and_is_seeded():
    lengths = [50, 30, 30, 20, 70, 10, 100]
    rows = pack(lengths, 100, random.Random(0))
    assert sorted(i for r in rows for i in r) == list(range(7))
    assert all(sum(lengths[i] for i in r) <= 100 for r in rows) and len(rows) == 4  # 310 tokens: best possible
    assert rows == pack(lengths, 100, random.Random(0))


def test_overfits_and_saves_a_loadable_checkpoint(tmp_path):
    data = _write(tmp_path / "train.jsonl", _episodes(6))
    kw = dict(seq_len=128, batch_tokens=256, lr=1e-2, warmup_steps=2, max_steps=30, eval_every=15, seed=3,
              init="tiny-init", config_overrides=SMALL, threads=2)  # fmt: skip
    summary = train_sft([data], tmp_path / "m", eval_data=data, **kw)
    log = [json.loads(x) for x in (tmp_path / "m" / "train_log.jsonl").read_text().splitlines()]
    steps = [x for x in log if "loss" in x]
    evals = [x for x in log if "eval_loss" in x]
    assert len(steps) == 30 and [x["step"] for x in evals] == [15, 30]
    assert steps[0]["loss"] > 7 and steps[-1]["loss"] < 0.5 * steps[0]["loss"] and steps[-1]["loss"] < 1.0
    assert evals[-1]["eval_token_acc"] > 0.9 and summary["stopped_by"] == "max_steps"
    assert summary["counts"]["kept"] == 6 and len(summary["data"][0]["sha256"]) == 64
    assert json.loads((tmp_path / "m" / "sft_summary.json").read_text())["finished"] is True
    assert PACKED not in (tmp_path / "m" / "config.json").read_text()  # loads with the default attention
    for model in (load_model(str(tmp_path / "m")).model, AutoModelForCausalLM.from_pretrained(tmp_path / "m")):
        assert model.dtype == torch.float32
        ev = read_episodes(data, VOCAB)
        with torch.no_grad():
            out, labels = forward_row(model.eval(), ev[:1])
        assert torch.nn.functional.cross_entropy(out.logits[0], labels, ignore_index=IGNORE) < 1.0
    # The same seed gives the same run.
    logs = []
    for name in ("a", "b"):
        train_sft([data], tmp_path / name, **{**kw, "max_steps": 4})
        logs.append([json.loads(x)["loss"] for x in (tmp_path / name / "train_log.jsonl").read_text().splitlines()])
    assert logs[0] == logs[1] and len(logs[0]) == 4


def test_budgets_and_schedule(tmp_path):
    data = _write(tmp_path / "train.jsonl", _episodes(4) + [{"ids": list(range(200))}, {"ids": [1], "loss_mask": [1]}])
    kw = dict(seq_len=128, batch_tokens=128, warmup_steps=1, init="tiny-init", config_overrides=SMALL, save_every=1)
    by_epochs = train_sft([data], tmp_path / "e", epochs=2, **kw)
    counts = by_epochs["counts"]  # 200 ids are too long for 128; a lone id has no target
    assert counts["too_long"] == 1 and counts["untrained"] == 1 and counts["kept"] == 4
    assert by_epochs["stopped_by"] == "epochs" and by_epochs["step"] == 2 * counts["steps_per_epoch"]
    by_time = train_sft([data], tmp_path / "t", time_budget_s=1e-3, epochs=5, **kw)
    assert by_time["stopped_by"] == "time_budget" and by_time["step"] == 1  # at least one step, then out of time

    def interrupt(line):
        if line["step"] == 2:
            raise KeyboardInterrupt

    stopped = train_sft([data], tmp_path / "i", epochs=5, progress=interrupt, **kw)
    assert stopped["stopped_by"] == "interrupted" and stopped["step"] == 2
    assert load_model(str(tmp_path / "i")).model is not None  # what it learned is saved
    lrs = [lr_at(s, s / 10, 1.0, 2, 0.1) for s in range(12)]
    assert lrs[:2] == [0.5, 1.0] and lrs[2] > lrs[6] > lrs[10] == pytest.approx(0.1) == lrs[11]


def test_dialogue_objective_keeps_the_system_turn_as_context_and_trains_the_rest(tmp_path):
    start = 7  # stands for the chat format's message-start token
    ids = [start, 11, 12, 13, start, 21, 22, start, 31, 32]  # system turn, user turn, assistant turn
    path = _write(tmp_path / "d.jsonl", [{"ids": ids, "loss_mask": [0] * 8 + [1, 1]}])
    (assistant,) = read_episodes(path, VOCAB)
    (dialogue,) = read_episodes(path, VOCAB, turn_start=start)
    assert assistant.ids == ids and [t for t in assistant.labels if t != IGNORE] == [31, 32]
    assert dialogue.ids == ids and dialogue.labels == [IGNORE] * 3 + [start, 21, 22, start, 31, 32, IGNORE]
    no_turns = _write(tmp_path / "plain.jsonl", [{"ids": [1, 2, 3]}])
    with pytest.raises(SftDataError, match="plain.jsonl:1: .*chat episode"):
        read_episodes(no_turns, VOCAB, turn_start=start)


def test_bad_data_names_the_file_and_line(tmp_path):
    good = _episodes(1)[0]
    cases = {
        "not JSON": ["{oops"],
        '"ids", a list': [{"text": "hi"}],
        "loss_mask": [{"ids": [1, 2, 3], "loss_mask": [0, 1]}],
        "outside the vocabulary": [{"ids": [1, VOCAB + 5]}],
    }
    for n, (expect, rows) in enumerate(cases.items()):
        path = tmp_path / f"bad{n}.jsonl"
        path.write_text(json.dumps(good) + "\n" + "".join((r if isinstance(r, str) else json.dumps(r)) + "\n"
                                                          for r in rows))  # fmt: skip
        with pytest.raises(SftDataError, match=re.escape(f"{path}:2: ") + ".*" + re.escape(expect)):
            read_episodes(path, VOCAB)
        result = CliRunner().invoke(app, ["sft", "train", "--data", str(path), "--out", str(tmp_path / "x")])
        assert result.exit_code == 2 and f"{path.name}:2" in result.output.replace("\n", ""), result.output
    missing = CliRunner().invoke(
        app, ["sft", "train", "--data", str(tmp_path / "nope.jsonl"), "--out", str(tmp_path / "m")]
    )
    assert missing.exit_code == 2 and "no such file" in missing.output


def test_unreadable_lines_and_untrainable_data_say_why(tmp_path):
    good = json.dumps(_episodes(1)[0])
    latin = tmp_path / "latin1.jsonl"
    latin.write_bytes(good.encode() + b"\n" + b'{"ids": [1], "x": "caf\xe9"}\n')
    with pytest.raises(SftDataError, match=re.escape(f"{latin}:2: not UTF-8")):
        read_episodes(latin, VOCAB)
    listed = _write(tmp_path / "list.jsonl", [[1, 2, 3]])
    with pytest.raises(SftDataError, match=re.escape(f"{listed}:1: expected a JSON object")):
        read_episodes(listed, VOCAB)
    untrained = _write(tmp_path / "zero.jsonl", [{"ids": [1, 2, 3], "loss_mask": [0, 0, 0]}])
    result = CliRunner().invoke(app, ["sft", "eval", "--data", str(untrained), "--model", "tiny"])
    assert result.exit_code == 2 and "no episode has a trained token" in " ".join(result.output.split())
    drills = CliRunner().invoke(app, ["sft", "drills", "--data", str(latin), "--out", str(tmp_path / "d.jsonl")])
    assert drills.exit_code == 2 and "latin1.jsonl:2: not UTF-8" in " ".join(drills.output.split())


def test_cli_trains_the_tiny_model(tmp_path):
    rows = _episodes(3, lo=40, hi=80)
    a, b = _write(tmp_path / "a.jsonl", rows[:2]), _write(tmp_path / "b.jsonl", rows[2:])
    args = ["sft", "train", "--data", f"{a},{b}", "--out", str(tmp_path / "m"), "--seq-len", "256",
            "--batch-tokens", "256", "--steps", "2", "--threads", "2", "--json"]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["step"] == 2 and summary["counts"]["episodes"] == 3 and len(summary["data"]) == 2
    assert load_tokenizer(str(tmp_path / "m")) is not None


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_cli_stop_saves_what_was_learned_and_says_how_to_go_on(signum, tmp_path, monkeypatch):
    """Ctrl-C, or a scheduler's SIGTERM: the step in flight is dropped, the rest saved, the exit is 128 + the
    signal and the message says how to train on (there is no resume)."""
    import vivace.rl.sft_train as sft_train

    real = sft_train.train_sft

    def signalled(*args, progress, **kwargs):
        def hook(line):
            progress(line)
            if line.get("step") == 2 and "loss" in line:
                signal.raise_signal(signum)

        return real(*args, progress=hook, **kwargs)

    monkeypatch.setattr(sft_train, "train_sft", signalled)
    data = _write(tmp_path / "a.jsonl", _episodes(3, lo=40, hi=80))
    out = tmp_path / "m"
    args = ["sft", "train", "--data", str(data), "--out", str(out), "--seq-len", "256",
            "--batch-tokens", "256", "--steps", "6", "--threads", "2", "--json"]  # fmt: skip
    # As a terminal has them: Ctrl-C raises KeyboardInterrupt; SIGTERM without the CLI's handler trains on.
    before = signal.signal(signum, signal.default_int_handler if signum == signal.SIGINT else lambda s, f: None)
    try:
        result = CliRunner().invoke(app, args)
    finally:
        signal.signal(signum, before)
    assert result.exit_code == 128 + signum, result.output
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["stopped_by"] == "interrupted" and summary["step"] == 2
    said = " ".join(result.stderr.split())
    assert f"stopped by {signal.Signals(signum).name}" in said and f"--init {out}" in said, said
    assert load_model(str(out)).model is not None


def test_cli_arch_trains_a_fresh_model_of_that_size_and_refuses_bad_fields(tmp_path):
    data = _write(tmp_path / "a.jsonl", _episodes(2, lo=40, hi=80))
    base = ["sft", "train", "--data", str(data), "--out", str(tmp_path / "m"), "--seq-len", "256", "--steps", "1",
            "--threads", "2", "--json"]  # fmt: skip
    arch = "hidden_size=96,num_hidden_layers=3,num_attention_heads=6,head_dim=16,num_experts=4"
    result = CliRunner().invoke(app, [*base, "--init", "tiny-init", "--arch", arch])
    assert result.exit_code == 0, result.output
    cfg = load_model(str(tmp_path / "m")).model.config
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads, cfg.head_dim, cfg.num_experts) == (
        96, 3, 6, 16, 4)  # fmt: skip
    base[base.index("--out") + 1] = str(tmp_path / "refused")  # m holds the run above, and --out must be new
    for bad, says in (("hidden_size=big", "expected int"), ("colour=3", "not a numeric field"),
                      ("hidden_size", "not key=value"), ("vocab_size=9", "not a numeric field"),
                      ("num_attention_heads=3", "multiple of num_key_value_heads")):  # fmt: skip
        result = CliRunner().invoke(app, [*base, "--init", "tiny-init", "--arch", bad])
        assert result.exit_code == 2 and says in result.output, result.output
    # --arch makes a fresh model, so with the shipped weights as --init it would silently drop them.
    result = CliRunner().invoke(app, [*base, "--init", "tiny", "--arch", arch])
    assert result.exit_code == 2 and "tiny-init" in result.output, result.output


def test_deepen_adds_identity_layers_that_then_train():
    model = _small_model()
    deeper = deepen(model, 5)  # 2 -> 5: new layers after old layer 0 (two) and after old layer 1
    assert deeper.config.num_hidden_layers == 5 and model.config.num_hidden_layers == 2
    ids = torch.randint(0, VOCAB, (1, 50))
    with torch.no_grad():
        assert torch.equal(model(ids).logits, deeper(ids).logits)  # exactly the same function
    old = dict(model.named_parameters())
    new = dict(deeper.named_parameters())
    for name, p in new.items():  # old layers at positions 0 and 3; 1, 2 and 4 are new
        if name.startswith("model.layers.0.") or name.startswith("model.layers.3."):
            src = name.replace("layers.3.", "layers.1.")
            assert torch.equal(p, old[src]), name
        elif "o_proj" in name or "down_proj" in name:
            assert not p.any(), name
    # The zeroed projections get gradients, so the new layers leave the identity at the first step.
    deeper.train()
    deeper(ids, labels=ids).loss.backward()
    assert new["model.layers.1.self_attn.o_proj.weight"].grad.abs().sum() > 0
    assert new["model.layers.4.mlp.experts.down_proj"].grad.abs().sum() > 0
    with pytest.raises(ValueError, match="only be deepened"):
        deepen(model, 2)


def test_cli_arch_deepens_a_checkpoint_and_refuses_other_fields(tmp_path):
    data = _write(tmp_path / "a.jsonl", _episodes(2, lo=40, hi=80))
    save_checkpoint(_small_model(), load_tokenizer("tiny-init"), tmp_path / "start")
    base = ["sft", "train", "--data", str(data), "--out", str(tmp_path / "m"), "--seq-len", "256", "--steps", "1",
            "--threads", "2", "--init", str(tmp_path / "start"), "--json"]  # fmt: skip
    result = CliRunner().invoke(app, [*base, "--arch", "num_hidden_layers=3"])
    assert result.exit_code == 0, result.output
    assert load_model(str(tmp_path / "m")).model.config.num_hidden_layers == 3
    base[base.index("--out") + 1] = str(tmp_path / "refused")  # m holds the run above, and --out must be new
    for arch, says in (("num_hidden_layers=3,hidden_size=96", "tiny-init"), ("num_hidden_layers=1", "deepened")):
        result = CliRunner().invoke(app, [*base, "--arch", arch])
        assert result.exit_code != 0 and says in result.output, result.output


class _Predicts(torch.nn.Module):
    """Greedy-predicts the true next token inside each packed segment, except the tokens in `miss`."""

    def __init__(self, miss: set[int]):
        super().__init__()
        self.miss = miss
        self.device = torch.device("cpu")

    def forward(self, input_ids, cu_seq_lens_q, logits_to_keep, **kwargs):
        ids, bounds = input_ids[0].tolist(), cu_seq_lens_q.tolist()
        logits = torch.zeros(len(ids), VOCAB)
        for a, b in zip(bounds, bounds[1:], strict=False):
            for k in range(a, b - 1):
                nxt = ids[k + 1]
                logits[k, (nxt + 1) % VOCAB if nxt in self.miss else nxt] = 1.0
        return type("Out", (), {"logits": logits[logits_to_keep][None]})()


def test_eval_probes_the_first_token_and_the_whole_value_of_each_argument():
    from vivace.rl.sft_train import argument_spans, evaluate

    tok = load_tokenizer("tiny")
    episodes = []
    for k in range(3):  # three episodes sharing a system turn, packed in one row
        turns = [("system", "You are a coding agent."), ("user", f"fix bug {k} in zoo/core.py"),
                 ("assistant", '<tool_call>\n{"name": "edit_file", "arguments": {"path": "zoo/core.py", '
                               f'"old_string": "x = {k}", "new_string": "y = {k}"}}}}\n</tool_call>')]  # fmt: skip
        ids, mask = [], []
        for role, text in turns:
            piece = tok(f"<|im_start|>{role}\n{text}<|im_end|>\n")["input_ids"]
            ids, mask = ids + piece, mask + [int(role == "assistant")] * len(piece)
        episodes.append(make_episode(ids, mask))
    spans = argument_spans(episodes, tok.decode)
    assert [[a for a, _, _ in s] for s in spans] == [["path", "old_string", "new_string"]] * 3
    first_path = episodes[0].ids[spans[0][0][1]]
    assert tok.decode(episodes[0].ids[spans[0][0][1] : spans[0][0][2] + 1]).startswith('zoo/core.py"')
    perfect = evaluate(_Predicts(set()), episodes, 8192, spans)
    assert perfect["eval_token_acc"] == 1.0 and perfect["eval_exact_path"] == perfect["eval_exact_new_string"] == 1.0
    wrong = evaluate(_Predicts({first_path}), episodes, 8192, spans)  # the path's first token missed, nothing else
    assert wrong["eval_first_path"] == wrong["eval_exact_path"] == 0.0
    assert wrong["eval_first_old_string"] == wrong["eval_exact_new_string"] == 1.0
    assert wrong["eval_token_acc"] < 1.0


def test_ship_rounds_to_bf16_and_loads_as_a_checkpoint(tmp_path):
    from vivace.model.checkpoint import save_checkpoint, ship_checkpoint

    model = _small_model()
    save_checkpoint(model, load_tokenizer("tiny"), tmp_path / "trained")
    (tmp_path / "trained" / "sft_summary.json").write_text(json.dumps({"step": 7, "finished": True}))
    (tmp_path / "tiny").mkdir()
    (tmp_path / "tiny" / "config.json").write_text("{}")  # an earlier checkpoint: replaced, with its every file
    (tmp_path / "tiny" / "stale.bin").write_text("old")
    record = ship_checkpoint(tmp_path / "trained", tmp_path / "tiny")
    assert record["dtype"] == "bfloat16" and record["sft_summary"] == {"step": 7, "finished": True}
    assert not (tmp_path / "tiny" / "stale.bin").exists()
    # safetensors writes its file 0600: a package's files must be readable by every user of the install
    assert {f.name: f.stat().st_mode & 0o777 for f in (tmp_path / "tiny").iterdir()}["model.safetensors"] == 0o644
    assert json.loads((tmp_path / "tiny" / "warm_start.json").read_text())["sha256"] == record["sha256"]
    shipped = load_model(str(tmp_path / "tiny")).model  # computes in fp32 again
    assert next(shipped.parameters()).dtype == torch.float32
    ids = torch.tensor([[5, 17, 300, 42]])
    with torch.no_grad():
        a, b = model(ids).logits, shipped(ids).logits
    assert torch.allclose(a, b, atol=0.05) and not torch.equal(a, b)  # rounded, not retrained


def test_ship_refuses_a_stopped_run_and_a_damaged_summary_and_keeps_the_lineage(tmp_path):
    """A run stopped by Ctrl-C was recorded as finished and shipped without a word; a damaged summary
    failed after the new checkpoint was written beside the assets (left there); a re-ship dropped how
    the one it replaced was made."""
    from vivace.model.checkpoint import save_checkpoint, ship_checkpoint

    trained, dest = tmp_path / "trained", tmp_path / "tiny"
    save_checkpoint(_small_model(), load_tokenizer("tiny"), trained)
    summary = {"finished": False, "stopped_by": "interrupted", "step": 4, "planned_steps": 30}
    (trained / "sft_summary.json").write_text(json.dumps(summary))
    ship_checkpoint(trained, dest, allow_unfinished=True, recipe="first")
    first = (dest / "warm_start.json").read_text()
    with pytest.raises(ValueError, match=r"did not finish \(stopped by interrupted, at step 4 of 30\).*--allow-unf"):
        ship_checkpoint(trained, dest)
    (trained / "sft_summary.json").write_text('{"step": 4,\n')
    with pytest.raises(ValueError, match=r"trained/sft_summary.json: cannot read it"):
        ship_checkpoint(trained, dest)
    assert (dest / "warm_start.json").read_text() == first and sorted(p.name for p in tmp_path.iterdir()) == [
        "tiny", "trained"]  # fmt: skip
    (trained / "sft_summary.json").write_text(json.dumps({**summary, "finished": True, "stopped_by": "max_steps"}))
    record = ship_checkpoint(trained, dest, recipe="second")
    assert record["recipe"] == "second" and record["sft_summary"]["stopped_by"] == "max_steps"
    assert record["previous"]["recipe"] == "first" and "sft_summary" not in record["previous"]
    assert json.loads((dest / "warm_start.json").read_text())["previous"]["sha256"] == json.loads(first)["sha256"]


def test_tiny_init_is_the_seeded_untrained_model_whatever_is_shipped():
    from vivace.model.checkpoint import TINY_DIR, load_model

    a, b = load_model("tiny-init").model, load_model("tiny-init").model
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True))
    if (TINY_DIR / "config.json").is_file():  # the shipped warm start differs from where it began
        shipped = load_model("tiny").model.state_dict()
        assert any(not torch.equal(v, shipped[k]) for k, v in a.state_dict().items())


def test_device_choice_falls_back_to_the_cpu_and_names_a_missing_gpu(monkeypatch):
    from vivace.rl.sft_train import pick_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert pick_device("auto") == torch.device("cpu") and pick_device("cpu") == torch.device("cpu")
    with pytest.raises(ValueError, match="no CUDA GPU"):
        pick_device("cuda:0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert pick_device("auto") == torch.device("cuda")


def test_cli_eval_compares_checkpoints_on_held_out_episodes(tmp_path):
    data = _write(tmp_path / "a.jsonl", _episodes(4, lo=40, hi=80))
    save_checkpoint(_small_model(), load_tokenizer("tiny-init"), tmp_path / "start")
    train = ["sft", "train", "--data", str(data), "--out", str(tmp_path / "m"), "--seq-len", "256", "--steps", "8",
             "--batch-tokens", "256", "--threads", "2", "--init", str(tmp_path / "start"), "--json"]  # fmt: skip
    assert CliRunner().invoke(app, train).exit_code == 0
    args = ["sft", "eval", "--data", str(data), "--model", str(tmp_path / "start"), "--model", str(tmp_path / "m"),
            "--seq-len", "256", "--json"]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    before, after = (json.loads(line) for line in result.stdout.strip().splitlines())
    assert before["episodes"] == after["episodes"] == 4 and before["model"].endswith("start")
    assert after["eval_loss"] < before["eval_loss"]  # the trained checkpoint fits its data better
    missing = CliRunner().invoke(app, ["sft", "eval", "--data", str(tmp_path / "no.jsonl"), "--model", "tiny"])
    assert missing.exit_code == 2 and "no such file" in missing.output
    not_a_model = CliRunner().invoke(app, ["sft", "eval", "--data", str(data), "--model", str(tmp_path)])
    assert not_a_model.exit_code == 2 and "is not a model" in not_a_model.output


def _tool_call_episode(tok, path: str) -> dict:
    ids, mask = [], []
    for role, text in [("system", "You are a coding agent."), ("user", f"fix {path}"),
                       ("assistant", f'<tool_call>\n{{"name": "read_file", "arguments": {{"path": "{path}"}}}}\n</tool_call>')]:  # fmt: skip
        piece = tok(f"<|im_start|>{role}\n{text}<|im_end|>\n")["input_ids"]
        ids, mask = ids + piece, mask + [int(role == "assistant")] * len(piece)
    return {"ids": ids, "loss_mask": mask}


def test_paths_objective_trains_the_path_value_only(tmp_path):
    from vivace.rl.sft_train import only_paths

    tok = load_tokenizer("tiny")
    row = _tool_call_episode(tok, "kitchen/core.py")
    (e,) = read_episodes(_write(tmp_path / "e.jsonl", [row]), VOCAB)
    trained = [t for t in only_paths(e, tok.decode).labels if t != IGNORE]
    assert tok.decode(trained) == "kitchen/core.py"  # not the call around it, not the closing quote
    no_call = make_episode(row["ids"][:10], [1] * 10)
    assert all(t == IGNORE for t in only_paths(no_call, tok.decode).labels)  # nothing to train: dropped as untrained


def test_embedding_rows_train_alone_and_a_frozen_embedding_stays(tmp_path):
    tok = load_tokenizer("tiny")
    data = _write(tmp_path / "p.jsonl", [_tool_call_episode(tok, p) for p in ("kitchen/core.py", "zoo/util.py")])
    kw = dict(seq_len=512, batch_tokens=512, lr=1e-2, warmup_steps=1, max_steps=3, init="tiny-init",
              config_overrides=SMALL, eval_every=0, save_every=0, weight_decay=0.1)  # fmt: skip
    rows = [5, 77, 301]
    summary = train_sft([data], tmp_path / "rows", embedding_rows=rows, objective="paths", seed=0, **kw)
    assert summary["counts"]["kept"] == 2 and summary["trained_tokens"] > 0
    before = _init_weights(tmp_path, kw)
    after = load_model(str(tmp_path / "rows")).model.state_dict()
    emb = "model.embed_tokens.weight"  # tied: lm_head.weight is the same tensor
    assert torch.equal(after["lm_head.weight"], after[emb])
    moved = (after[emb] - before[emb]).abs().sum(1) > 0
    assert moved[rows].all() and moved.sum() == len(rows)  # weight decay included: no other row moved
    others = [k for k in before if k not in (emb, "lm_head.weight")]
    assert others and all(torch.equal(after[k], before[k]) for k in others)  # nothing else moved

    train_sft([data], tmp_path / "frozen", freeze_embedding=True, seed=0, **kw)
    frozen = load_model(str(tmp_path / "frozen")).model.state_dict()
    assert torch.equal(frozen[emb], before[emb])
    assert any(not torch.equal(frozen[k], before[k]) for k in others)
    with pytest.raises(ValueError, match="exclude each other"):
        train_sft([data], tmp_path / "x", embedding_rows=rows, freeze_embedding=True, **kw)
    with pytest.raises(ValueError, match="token ids 0..4095"):
        train_sft([data], tmp_path / "x", embedding_rows=[VOCAB + 3], **kw)


def _init_weights(tmp_path, kw) -> dict:
    """The starting weights of a `tiny-init` run with SMALL (train_sft seeds the fresh model alike)."""
    train_sft([_write(tmp_path / "none.jsonl", [{"ids": [1, 2], "loss_mask": [0, 1]}])], tmp_path / "start",
              **{**kw, "max_steps": 0})  # fmt: skip
    return load_model(str(tmp_path / "start")).model.state_dict()


def test_cli_embedding_rows_must_be_a_list_of_token_ids(tmp_path):
    data = _write(tmp_path / "a.jsonl", _episodes(1))
    base = ["sft", "train", "--data", str(data), "--out", str(tmp_path / "m"), "--steps", "1", "--init", "tiny-init"]
    for content, says in [("{not json", "Expecting"), ('{"rows": [1]}', "a JSON list of token ids")]:
        (tmp_path / "rows.json").write_text(content)
        result = CliRunner().invoke(app, [*base, "--embedding-rows", str(tmp_path / "rows.json")])
        assert result.exit_code == 2 and says in result.output, result.output
    missing = CliRunner().invoke(app, [*base, "--embedding-rows", str(tmp_path / "none.json")])
    assert missing.exit_code == 2 and "none.json" in missing.output
    (tmp_path / "ok.json").write_text("[1, 2]")
    both = CliRunner().invoke(app, [*base, "--embedding-rows", str(tmp_path / "ok.json"), "--freeze-embedding"])
    assert both.exit_code == 2 and "exclude each other" in both.output, both.output


def _own_checkpoint(path, config, tokenizer) -> str:
    """A checkpoint directory of another architecture, saved as such checkpoints ship."""
    return str(save(path, config, tokenizer))


@pytest.mark.parametrize(
    "config, types",
    [
        (lambda v: Qwen3Config(vocab_size=v, head_dim=8, **OWN), ["full_attention"] * 5),
        # full attention in layer 0, a sliding window from layer 1 on (max_window_layers=1)
        (lambda v: Qwen2Config(vocab_size=v, use_sliding_window=True, sliding_window=16, max_window_layers=1, **OWN),
         ["full_attention"] * 3 + ["sliding_attention"] * 2),
    ],
    ids=["qwen3", "qwen2-sliding"],
)  # fmt: skip
def test_deepen_gives_new_layers_the_layer_types_of_their_sources(tmp_path, config, types):
    tok = reference_tokenizer()
    start = _own_checkpoint(tmp_path / "start", config(len(tok)), tok)
    model = load_model(start).model
    deeper, _ = _init_model(start, {"num_hidden_layers": 5}, 0)  # what `sft train --arch` builds
    # 2 -> 5: positions 0, 1, 2 are old layer 0 and two new layers after it; 3, 4 old layer 1 and one after
    assert deeper.config.layer_types == types and len(model.config.layer_types) == 2
    if hasattr(deeper.config, "max_window_layers") and "sliding_attention" in types:
        assert deeper.config.max_window_layers == types.index("sliding_attention")
    save_checkpoint(deeper, tok, tmp_path / "deeper")
    loaded = load_model(str(tmp_path / "deeper")).model
    assert loaded.config.layer_types == types
    ids = torch.randint(0, len(tok), (1, 40))
    with torch.no_grad():
        assert torch.allclose(model(ids).logits, loaded(ids).logits)  # identity layers: the same function


def test_deepen_keeps_each_moe_layer_sparse_or_dense_as_its_source():
    # decoder_sparse_step=2: old layer 0 dense, layer 1 sparse; the stride would shift over the new layers
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_config(VOCAB, **{**SMALL, "decoder_sparse_step": 2})).eval()
    deeper = deepen(model, 5)
    assert deeper.config.mlp_only_layers == [0, 1, 2] and deeper.config.decoder_sparse_step == 1
    ids = torch.randint(0, VOCAB, (1, 30))
    with torch.no_grad():
        assert torch.equal(model(ids).logits, deeper(ids).logits)


def test_cli_arch_deepens_a_qwen3_checkpoint(tmp_path):
    tok = reference_tokenizer()
    start = _own_checkpoint(tmp_path / "start", Qwen3Config(vocab_size=len(tok), head_dim=8, **OWN), tok)
    data = _write(tmp_path / "a.jsonl", _episodes(2, lo=40, hi=80))
    result = CliRunner().invoke(app, ["sft", "train", "--data", str(data), "--out", str(tmp_path / "m"), "--init",
                                      start, "--arch", "num_hidden_layers=3", "--seq-len", "256", "--steps", "1",
                                      "--threads", "2", "--json"])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert load_model(str(tmp_path / "m")).model.config.layer_types == ["full_attention"] * 3


def test_dialogue_objective_needs_a_turn_start_token(tmp_path):
    tok = reference_tokenizer()
    assert turn_start_token(ChatFormat(tok)) == tok.convert_tokens_to_ids("<|im_start|>")
    # Llama 3's vocabulary has no <|im_start|>: vivace's template spells it as text, so nothing marks
    # where the system turn ends, and the objective would quietly be the assistant one.
    llama = llama3_tokenizer()
    start = _own_checkpoint(tmp_path / "llama", LlamaConfig(vocab_size=len(llama), **OWN), llama)
    data = _write(tmp_path / "a.jsonl", [{"ids": [1, 2, 3, 4], "loss_mask": [0, 0, 1, 1]}])
    train = ["sft", "train", "--data", str(data), "--out", str(tmp_path / "m"), "--steps", "1", "--init", start]
    result = CliRunner().invoke(app, [*train, "--objective", "dialogue"])
    said = " ".join(result.output.split())
    assert result.exit_code == 2 and "opens every chat turn" in said and "--objective assistant" in said, said
    assert not (tmp_path / "m").exists()  # refused before anything trained
    drills = ["sft", "drills", "--data", str(data), "--out", str(tmp_path / "drills.jsonl"), "--model", start]
    result = CliRunner().invoke(app, drills)  # a drill keeps the system turn too
    said = " ".join(result.output.split())
    assert result.exit_code == 2 and "opens every chat turn" in said, said


def test_data_rendered_with_another_tokenizer_is_refused_though_its_ids_fit(tmp_path):
    """`vivace sft data --model` one checkpoint, then `sft train --init` another whose vocabulary the ids
    fit: it trained on ids that spell other text."""
    from vivace.harness.messages import Message

    def rendered(tok) -> dict:
        ids = ChatFormat(tok).prompt_ids([Message("system", "Fix it."), Message("user", "The test fails.")], None)
        return {"task_id": "t", "ids": ids, "loss_mask": [0] * (len(ids) - 3) + [1] * 3}

    drill = {"ids": [5, 6, 7], "loss_mask": [1, 1, 1]}  # synthetic: no text to check
    llama = _write(tmp_path / "llama.jsonl", [rendered(llama3_tokenizer()), drill])  # its ids all fit tiny's vocabulary
    own = _write(tmp_path / "own.jsonl", [rendered(reference_tokenizer()), drill])
    train = ["sft", "train", "--steps", "1", "--init", "tiny-init"]
    result = CliRunner().invoke(app, [*train, "--data", str(llama), "--out", str(tmp_path / "m")])
    said = " ".join(result.output.split())
    assert result.exit_code == 2 and "rendered with another tokenizer" in said and "llama.jsonl:1" in said, said
    assert not (tmp_path / "m").exists()
    result = CliRunner().invoke(app, [*train, "--data", str(own), "--out", str(tmp_path / "ok")])
    assert result.exit_code == 0, result.output


def _turns(n: int, seed: int = 0) -> list[dict]:
    """Chat-like episodes for the dialogue objective: three turns, each opened by <|im_start|>."""
    start = load_tokenizer("tiny").convert_tokens_to_ids("<|im_start|>")
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        turns = [[start, *(rng.randrange(20, 200) for _ in range(k))] for k in (6, 8, 10)]
        ids = [t for turn in turns for t in turn]
        rows.append({"ids": ids, "loss_mask": [0] * (len(ids) - 10) + [1] * 10})
    return rows


def test_dialogue_runs_eval_the_assistant_tokens_as_sft_eval_does(tmp_path):
    """A dialogue run's eval lines scored its eval episodes on the dialogue mask (821 tokens where `sft eval`,
    which the help says gives the same numbers, scored 199): runs of the two objectives could not be compared."""
    from vivace.rl.sft_train import evaluate_checkpoint

    data, evals = _write(tmp_path / "d.jsonl", _turns(4)), _write(tmp_path / "e.jsonl", _turns(2, seed=1))
    kw = dict(seq_len=128, batch_tokens=256, warmup_steps=1, max_steps=1, init="tiny-init", config_overrides=SMALL)
    summary = train_sft([data], tmp_path / "m", eval_data=evals, objective="dialogue", **kw)
    probe = evaluate_checkpoint(str(tmp_path / "m"), evals, seq_len=128)
    assert summary["eval_tokens"] == probe["eval_tokens"] == 2 * 10
    assert summary["eval_loss"] == pytest.approx(probe["eval_loss"], rel=1e-4)


def test_an_eval_file_with_no_usable_episode_is_refused_not_skipped(tmp_path):
    data = _write(tmp_path / "d.jsonl", _episodes(2))
    long = _write(tmp_path / "long.jsonl", _episodes(2, lo=300, hi=400))
    kw = dict(seq_len=128, batch_tokens=256, max_steps=1, init="tiny-init", config_overrides=SMALL)
    with pytest.raises(SftDataError, match=r"--eval .*long.jsonl: none of its 2 episode\(s\) .* fits 128 tokens"):
        train_sft([data], tmp_path / "m", eval_data=long, **kw)


def test_a_time_budget_alone_warms_up_over_a_quarter_of_its_steps_at_most(tmp_path):
    """With --minutes and no step budget the warmup stayed --warmup-steps (20): a 4-step run never got past
    a fifth of the peak rate, and never decayed."""
    data = _write(tmp_path / "d.jsonl", _episodes(8))
    kw = dict(seq_len=128, batch_tokens=128, lr=1e-3, warmup_steps=1000, init="tiny-init", config_overrides=SMALL)
    summary = train_sft([data], tmp_path / "m", time_budget_s=4.0, **kw)
    lrs = [json.loads(x)["lr"] for x in (tmp_path / "m" / "train_log.jsonl").read_text().splitlines()]
    assert summary["stopped_by"] == "time_budget" and len(lrs) >= 4, lrs
    # Near the peak once warm (the cosine runs on elapsed time, which a slow first step has used some of).
    assert summary["warmup_steps"] <= len(lrs) // 2 and max(lrs) > 0.5e-3 and lrs[-1] < max(lrs)


def test_ctrl_c_during_the_optimizer_step_saves_the_step_whole_and_counted(tmp_path, monkeypatch):
    """Ctrl-C inside optimizer.step() stopped the run with that step applied (or half applied) to the weights
    but not counted, logged or checked for NaN: the saved checkpoint was a step its summary did not name."""
    data = _write(tmp_path / "d.jsonl", _episodes(4))
    real_step, calls = torch.optim.AdamW.step, []

    def step_then_ctrl_c(self, *args, **kwargs):
        result = real_step(self, *args, **kwargs)
        calls.append(1)
        if len(calls) == 2:
            os.kill(os.getpid(), signal.SIGINT)  # arrives before step() has returned
            time.sleep(0.05)
        return result

    monkeypatch.setattr(torch.optim.AdamW, "step", step_then_ctrl_c)
    kw = dict(seq_len=128, batch_tokens=128, warmup_steps=1, max_steps=6, init="tiny-init", config_overrides=SMALL)
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        summary = train_sft([data], tmp_path / "m", **kw)
    finally:
        signal.signal(signal.SIGINT, before)
    log = [json.loads(x) for x in (tmp_path / "m" / "train_log.jsonl").read_text().splitlines()]
    assert summary["stopped_by"] == "interrupted" and summary["finished"] is False
    assert summary["step"] == 2 == log[-1]["step"] and len(calls) == 2


def test_a_save_moves_config_json_in_last(tmp_path, monkeypatch):
    """A directory with config.json is taken for a checkpoint: a kill between the moves must not leave one
    beside no weights (`--init` then failed with "no weights", the weights stranded in OUT/.saving)."""
    from vivace.rl import sft_train

    moved, real_replace = [], os.replace
    monkeypatch.setattr(sft_train.os, "replace", lambda a, b: (moved.append(Path(b).name), real_replace(a, b)))
    sft_train._save(_small_model(), load_tokenizer("tiny"), tmp_path)
    assert moved[-1] == "config.json" and "model.safetensors" in moved
