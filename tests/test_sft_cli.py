"""`vivace sft` driven as a user would: bad options and inputs are refused with exit 2 and one line
before any work, nothing the user made is overwritten, partial output never carries the final name,
and Ctrl-C / SIGTERM stop with 130 / 143 and say what was kept and what to do next."""

from __future__ import annotations

import asyncio
import errno
import io
import json
import math
import signal
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from transformers import AutoModelForCausalLM
from typer.testing import CliRunner

import vivace.rl.sft as sft
from vivace.cli import app
from vivace.model.checkpoint import load_model, load_tokenizer, save_checkpoint, tiny_config

SMALL = dict(hidden_size=64, moe_intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
             num_key_value_heads=1, head_dim=32, num_experts=4)  # fmt: skip


def _run(*args: str):
    return CliRunner().invoke(app, ["sft", *args])


def _said(result) -> str:
    return " ".join(result.output.split())


def _data(path, n: int = 2):
    path.write_text("".join(json.dumps({"ids": list(range(10, 60)), "loss_mask": [0] * 25 + [1] * 25}) + "\n"
                            for _ in range(n)))  # fmt: skip
    return path


@pytest.fixture
def no_expert_run(monkeypatch):
    """`sft data` whose episodes must never start (its options are refused first)."""

    async def refuse(*args, **kwargs):
        raise AssertionError("expert_data ran")

    monkeypatch.setattr(sft, "expert_data", refuse)


@pytest.mark.parametrize(
    "args, says",
    [
        (["--n", "0"], "--n"),
        (["--n", "-1"], "--n"),  # was every task but the last
        (["--concurrency", "0"], "--concurrency"),  # was a run that never started an episode, forever
        (["--styles-per-task", "0"], "--styles-per-task"),
        (["--max-tokens", "0"], "--max-tokens"),
        (["--styles", ","], "names no style"),
        (["--model", "/nonexistent/ckpt"], "/nonexistent/ckpt"),  # was a transformers traceback
    ],
)
def test_sft_data_refuses_bad_options_before_any_episode(tmp_path, no_expert_run, args, says):
    result = _run("data", "--backend", "plain", "--state-dir", str(tmp_path / "s"), "--out", str(tmp_path / "d.jsonl"),
                  *args)  # fmt: skip
    assert result.exit_code == 2 and says in _said(result), result.output
    assert "Traceback" not in result.output and not (tmp_path / "d.jsonl").exists()


def test_data_commands_refuse_an_out_that_holds_data(tmp_path, no_expert_run):
    made = tmp_path / "made.jsonl"
    _data(made)
    before = made.read_text()
    for command in (["data", "--backend", "plain", "--state-dir", str(tmp_path / "s")], ["copies", "--n", "3"],
                    ["augment", "--data", str(made)], ["drills", "--data", str(made)]):  # fmt: skip
        result = _run(*command, "--out", str(made))
        assert result.exit_code == 2 and "already exists" in _said(result), (command, result.output)
        assert made.read_text() == before, command
    result = _run("copies", "--n", "3", "--out", str(tmp_path))
    assert result.exit_code == 2 and "is a directory" in _said(result), result.output


async def test_expert_data_stopped_leaves_only_a_partial_file(tmp_path, monkeypatch):
    """The episodes kept before a stop are in OUT.partial; OUT itself appears only when every episode ran."""
    calls = []

    async def run_task(policy, task, cfg, backend):
        calls.append(task.id)
        if len(calls) == 2:
            raise asyncio.CancelledError  # what Ctrl-C or SIGTERM does to the episodes in flight
        tokens = SimpleNamespace(ids=[1, 2, 3], loss_mask=[0, 1, 1])
        traj = SimpleNamespace(tokens=tokens, turns=[1], tool_calls=1, to_messages=lambda: [])
        return traj, SimpleNamespace(resolved=True, total=1.0)

    class Backend:
        async def aclose(self):
            calls.append("closed")

    monkeypatch.setattr(sft, "run_task", run_task)
    monkeypatch.setattr(sft, "_Oracle", lambda *a: None)
    monkeypatch.setattr(sft, "TeacherTokens", lambda *a: None)
    monkeypatch.setattr("vivace.sandbox.open_backend", lambda cfg: Backend())
    tasks = [SimpleNamespace(id=f"t{i}", split="train") for i in range(3)]
    out = tmp_path / "expert.jsonl"
    cfg = SimpleNamespace(sandbox=None)
    with pytest.raises(asyncio.CancelledError):
        await sft.expert_data(cfg, tasks, out, styles=("efficient",), concurrency=1)
    assert not out.exists() and calls[-1] == "closed"
    assert [json.loads(line)["task_id"] for line in sft.partial_path(out).read_text().splitlines()][0] == "t0"
    calls.clear()
    # Run again, it kept the stopped run's partial set (the stop message points at it): a second run with the
    # same --out truncated it, and two at once wrote over each other.
    kept = sft.partial_path(out).read_bytes()
    with pytest.raises(ValueError, match="expert.jsonl.partial exists: another run is writing it, or one was stopped"):
        await sft.expert_data(cfg, tasks[:1], out, styles=("efficient",), concurrency=1)
    assert sft.partial_path(out).read_bytes() == kept
    sft.partial_path(out).rename(tmp_path / "aside.jsonl")
    calls.clear()
    await sft.expert_data(cfg, tasks[:1], out, styles=("efficient",), concurrency=1)
    assert out.is_file() and not sft.partial_path(out).exists()


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_sft_data_stopped_by_a_signal_exits_128_plus_it_and_names_the_partial_file(tmp_path, monkeypatch, signum):
    out = tmp_path / "expert.jsonl"

    async def stopped(cfg, tasks, out_file, progress, **kwargs):
        sft.partial_path(out_file).write_text('{"ids": [1]}\n')
        progress(1, 8)
        if signum == signal.SIGINT:
            raise KeyboardInterrupt  # asyncio.run's answer to Ctrl-C
        signal.raise_signal(signal.SIGTERM)
        await asyncio.sleep(3)  # cancelled here by the CLI's handler
        return {}

    monkeypatch.setattr(sft, "expert_data", stopped)
    before = signal.signal(signal.SIGTERM, lambda s, f: None)  # without the CLI's handler: nothing stops
    try:
        result = _run("data", "--backend", "plain", "--state-dir", str(tmp_path / "s"), "--out", str(out), "--n", "2")
    finally:
        signal.signal(signal.SIGTERM, before)
    assert result.exit_code == 128 + signum, result.output
    said = _said(result)
    assert "1 of 8 episodes ran" in said and f"{out}.partial" in said and "run it again" in said, said
    assert not out.exists()


def test_sft_train_refuses_an_out_holding_a_run_and_bad_numbers(tmp_path):
    data = _data(tmp_path / "a.jsonl")
    run = tmp_path / "run"
    run.mkdir()
    (run / "train_log.jsonl").write_text('{"step": 1}\n')
    (run / "config.json").write_text("{}")  # a saved model: what --init can train on from
    base = ["train", "--data", str(data), "--init", "tiny-init", "--seq-len", "128", "--threads", "1"]
    result = _run(*base, "--out", str(run), "--steps", "1")
    assert result.exit_code == 2 and "already holds a run" in _said(result) and f"--init {run}" in _said(result)
    assert (run / "train_log.jsonl").read_text() == '{"step": 1}\n' and sorted(run.iterdir()) == [
        run / "config.json",
        run / "train_log.jsonl",
    ]
    result = _run(*base, "--out", str(data), "--steps", "1")
    assert result.exit_code == 2 and "is a file" in _said(result), result.output
    for bad, says in ((["--steps", "0"], "--steps"), (["--steps", "-1"], "--steps"), (["--epochs", "0"], "--epochs"),
                      (["--minutes", "0"], "--minutes"), (["--lr", "0"], "--lr"), (["--min-lr-ratio", "2"], "--min-lr-ratio"),
                      (["--warmup-steps", "-1"], "--warmup-steps"), (["--device", "bogus"], "--device bogus"),
                      (["--data", str(tmp_path)], "a directory, not a JSONL file")):  # fmt: skip
        result = _run(*base, "--out", str(tmp_path / "new"), *bad)
        assert result.exit_code == 2 and says in _said(result), (bad, result.output)
        assert not (tmp_path / "new").exists(), bad  # trained nothing, saved nothing


def test_copies_augment_drills_refuse_counts_that_make_nothing(tmp_path):
    data = _data(tmp_path / "a.jsonl")
    for args, says in ((["copies", "--n", "0"], "--n"), (["copies", "--n", "-3"], "--n"),
                       (["copies", "--repeats", "0"], "--repeats"),
                       (["copies", "--n", "2", "--vocab", "300:999999"], "ids 0..4095 only"),
                       (["copies", "--n", "2", "--vocab", "abc"], "give LO:HI"),
                       # random ids that include <|im_end|> and <tool_call> teach the model to write them anywhere
                       (["copies", "--n", "2", "--vocab", "0:300"], "control tokens (0 <|im_start|>, 1 <|im_end|>, "
                        "2 <tool_call>, 3 </tool_call> and 3 more); give a LO:HI without them, e.g. 7:300"),
                       (["copies", "--n", "2", "--vocab", "6:7"], "(6 <|endoftext|>); give a LO:HI without them"),
                       (["augment", "--data", str(data), "--variants", "0"], "--variants"),
                       (["drills", "--data", str(data), "--window", "-5"], "--window")):  # fmt: skip
        out = tmp_path / "out.jsonl"
        result = _run(*args, "--out", str(out))
        assert result.exit_code == 2 and says in _said(result) and "Traceback" not in result.output, (
            args,
            result.output,
        )
        assert not out.exists() and not (tmp_path / "out.jsonl.partial").exists(), args
    result = _run("copies", "--n", "3", "--out", str(tmp_path / "c.jsonl"), "--json")
    assert result.exit_code == 0 and json.loads(result.stdout) == {"out": str(tmp_path / "c.jsonl"), "written": 3}


def _other_tokenizer_checkpoint(path):
    """A checkpoint whose tokenizer reads two ids the other way round: the same ids, other text."""
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_config(4096, **SMALL), dtype=torch.float32)
    save_checkpoint(model, load_tokenizer("tiny-init"), path)
    spec = json.loads((path / "tokenizer.json").read_text())
    vocab = spec["model"]["vocab"]
    a, b = (k for k, i in vocab.items() if i in (500, 501))
    vocab[a], vocab[b] = vocab[b], vocab[a]
    (path / "tokenizer.json").write_text(json.dumps(spec))
    return path


def test_sft_eval_refuses_models_with_different_tokenizers_and_missing_inputs_up_front(tmp_path):
    data = _data(tmp_path / "a.jsonl")
    other = _other_tokenizer_checkpoint(tmp_path / "other")
    result = _run("eval", "--data", str(data), "--model", "tiny-init", "--model", str(other), "--json")
    assert result.exit_code == 2 and "different tokenizers" in _said(result), result.output
    assert result.stdout.strip() == ""  # refused before any model was evaluated
    for args in (["--data", str(data), "--data", str(tmp_path / "nope.jsonl"), "--model", "tiny-init"],
                 ["--data", str(data), "--model", "tiny-init", "--model", str(tmp_path / "typo")]):  # fmt: skip
        result = _run("eval", *args, "--json")
        assert result.exit_code == 2 and result.stdout.strip() == "", result.output


def test_sft_eval_says_which_evaluation_runs_on_stderr_and_prints_json_lines(tmp_path):
    data = _data(tmp_path / "a.jsonl")
    result = _run("eval", "--data", str(data), "--data", str(data), "--model", "tiny-init", "--json")
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in result.stdout.splitlines()]  # only JSON on stdout
    assert [r["episodes"] for r in rows] == [2, 2]
    assert "[1/2] evaluating tiny-init on" in result.stderr and "[2/2] done in" in result.stderr


class _FillsUp(io.FileIO):
    """A file on a disk with `room` bytes left: a write takes what fits, the next fails with ENOSPC."""

    def __init__(self, path, room: int):
        super().__init__(path, "wb")
        self.room = room

    def write(self, data) -> int:
        if not self.room:
            raise OSError(errno.ENOSPC, "No space left on device")
        n = super().write(bytes(data)[: self.room])
        self.room -= n
        return n


async def test_expert_data_on_a_disk_that_fills_keeps_whole_lines_in_the_partial_file(tmp_path, monkeypatch):
    """A full disk left OUT.partial ending in a cut-off JSON line (buffered writes stop anywhere); now the
    episode that does not fit is cut off again, so the file holds the episodes kept before it, whole."""
    calls = []

    async def run_task(policy, task, cfg, backend):
        tokens = SimpleNamespace(ids=list(range(10)), loss_mask=[1] * 10)
        traj = SimpleNamespace(tokens=tokens, turns=[1], tool_calls=1, to_messages=lambda: [])
        return traj, SimpleNamespace(resolved=True, total=1.0)

    class Backend:
        async def aclose(self):
            calls.append("closed")

    class FullDisk(type(Path())):
        def open(self, *args, **kwargs):
            return _FillsUp(self, room=300)  # one episode's line (about 200 bytes) and half the next

    monkeypatch.setattr(sft, "run_task", run_task)
    monkeypatch.setattr(sft, "_Oracle", lambda *a: None)
    monkeypatch.setattr(sft, "TeacherTokens", lambda *a: None)
    monkeypatch.setattr(sft, "partial_path", lambda out: FullDisk(f"{out}.partial"))
    monkeypatch.setattr("vivace.sandbox.open_backend", lambda cfg: Backend())
    out = tmp_path / "expert.jsonl"
    tasks = [SimpleNamespace(id=f"t{i}", split="train") for i in range(3)]
    with pytest.raises(OSError) as e:
        await sft.expert_data(SimpleNamespace(sandbox=None), tasks, out, styles=("efficient",), concurrency=1)
    assert e.value.errno == errno.ENOSPC and str(e.value.filename) == f"{out}.partial"
    text = Path(f"{out}.partial").read_text()
    assert text.endswith("\n") and [json.loads(line)["task_id"] for line in text.splitlines()] == ["t0"]
    assert not out.exists() and calls == ["closed"]


def test_sft_data_on_a_full_disk_says_what_the_partial_file_holds(tmp_path, monkeypatch):
    out = tmp_path / "expert.jsonl"

    async def fills_up(cfg, tasks, out_file, progress, **kwargs):
        sft.partial_path(out_file).write_text('{"ids": [1]}\n')
        progress(1, 8)
        raise OSError(errno.ENOSPC, "No space left on device", str(sft.partial_path(out_file)))

    monkeypatch.setattr(sft, "expert_data", fills_up)
    result = _run("data", "--backend", "plain", "--state-dir", str(tmp_path / "s"), "--out", str(out), "--n", "2")
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), result.output
    said = _said(result)
    assert f"error: cannot write {out}.partial: No space left on device; the 1 episodes kept before it are in" in said
    assert "Traceback" not in result.output and not out.exists()


@pytest.mark.parametrize("bad", [["--lr", "inf"], ["--lr", "nan"], ["--epochs", "inf"], ["--minutes", "inf"]])
def test_sft_train_refuses_numbers_that_are_not_finite(tmp_path, bad):
    """--lr inf was trained with, saving NaN weights and writing NaN into train_log.jsonl and --json."""
    data = _data(tmp_path / "a.jsonl")
    result = _run("train", "--data", str(data), "--init", "tiny-init", "--seq-len", "128", "--threads", "1",
                  "--steps", "1", "--out", str(tmp_path / "m"), *bad)  # fmt: skip
    assert result.exit_code == 2 and f"error: {bad[0]} " in _said(result), result.output
    assert not (tmp_path / "m").exists()


def test_sft_train_that_diverges_stops_with_one_line_and_keeps_the_last_good_save(tmp_path, monkeypatch):
    """A step that makes the weights NaN (here: an infinite learning rate from step 2) used to train on, log
    NaN and save the NaN weights over the last good save; now the run stops there, exit 1."""
    import vivace.rl.sft_train as sft_train

    real = sft_train.lr_at
    monkeypatch.setattr(sft_train, "lr_at", lambda step, *a: real(step, *a) if step == 0 else math.inf)
    data = _data(tmp_path / "a.jsonl", n=4)
    out = tmp_path / "m"
    result = _run("train", "--data", str(data), "--init", "tiny-init", "--seq-len", "128", "--batch-tokens", "64",
                  "--threads", "1", "--steps", "3", "--save-every", "1", "--warmup-steps", "0", "--json",
                  "--out", str(out))  # fmt: skip
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), result.output
    assert result.stdout == ""
    said = _said(result)
    assert "error: training diverged: the weights became NaN or infinite at step 2" in said, said
    assert f"{out} keeps the save of step 1" in said
    log = (out / "train_log.jsonl").read_text()
    assert [json.loads(line)["step"] for line in log.splitlines()] == [1] and "NaN" not in log and "Infinity" not in log
    load_model(str(out))  # the step-1 save, whole and finite (load_model refuses NaN weights)


def test_sft_train_into_an_out_a_kill_left_during_its_first_save(tmp_path):
    """A kill during the first save left OUT/.saving; --out OUT was then refused with "give --init OUT", which
    answered "not a model". The leftover is removed and the run trains; other files without a model are
    refused without pointing at --init."""
    data = _data(tmp_path / "a.jsonl")
    out = tmp_path / "m"
    (out / ".saving").mkdir(parents=True)
    (out / ".saving" / "model.safetensors").write_bytes(b"cut short")
    base = ["train", "--data", str(data), "--init", "tiny-init", "--seq-len", "128", "--threads", "1", "--steps", "1"]
    result = _run(*base, "--json", "--out", str(out))
    assert result.exit_code == 0, result.output
    assert (out / "config.json").is_file() and not (out / ".saving").exists()
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine\n")
    result = _run(*base, "--out", str(other))
    assert result.exit_code == 2 and "holds files but no model" in _said(result) and "--init" not in _said(result)
    assert sorted(other.iterdir()) == [other / "notes.txt"]


def test_sft_train_again_after_a_run_that_failed_before_its_first_save(tmp_path):
    """A first step that diverged said "nothing was saved; train again with a lower --lr", and the same command
    with a lower --lr was refused: its log (train_log.jsonl) made --out "hold files but no model"."""
    data = _data(tmp_path / "a.jsonl")
    out = tmp_path / "m"
    base = ["train", "--data", str(data), "--init", "tiny-init", "--seq-len", "128", "--threads", "1",
            "--warmup-steps", "0", "--out", str(out)]  # fmt: skip
    result = _run(*base, "--lr", "1e30", "--steps", "3")
    assert result.exit_code == 1 and "nothing was saved" in _said(result), result.output
    assert [p.name for p in out.iterdir()] == ["train_log.jsonl"]
    result = _run(*base, "--lr", "1e-4", "--steps", "1", "--json")
    assert result.exit_code == 0, result.output
    assert "removed what a run stopped before its first save left" in _said(result) and (out / "config.json").is_file()


def test_an_rl_run_or_checkpoint_as_init_names_the_policy_inside(tmp_path):
    data = _data(tmp_path / "a.jsonl")
    run = tmp_path / "run"
    save_checkpoint(load_model("tiny-init").model, load_tokenizer("tiny"), run / "checkpoints" / "step_3" / "model")
    (run / "config.json").write_text(json.dumps({"train": {}, "sandbox": {}}))  # the run's, not a model's
    for init, says in ((run, "is a `vivace train` run: its latest policy is"),
                       (run / "checkpoints" / "step_3", "is a `vivace train` checkpoint: its policy is")):  # fmt: skip
        result = _run("train", "--data", str(data), "--init", str(init), "--out", str(tmp_path / "m"))
        assert result.exit_code == 2 and says in _said(result), result.output
        assert str(run / "checkpoints" / "step_3" / "model") in _said(result)


def test_sft_ship_into_a_place_it_cannot_write_is_one_line_and_leaves_nothing(tmp_path):
    ckpt = tmp_path / "trained"
    save_checkpoint(load_model("tiny-init").model, load_tokenizer("tiny"), ckpt)
    (tmp_path / "file").write_text("not a directory")
    result = _run("ship", str(ckpt), "--dest", str(tmp_path / "file" / "tiny"))
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    assert "cannot write" in _said(result) and "is left as it was" in _said(result)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "trained"]
    result = _run("ship", str(ckpt), "--dest", str(tmp_path / "tiny"), "--recipe", "a test", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["recipe"] == "a test" and (tmp_path / "tiny" / "model.safetensors").is_file()


def test_a_save_cut_short_removes_its_half_written_files(tmp_path, monkeypatch):
    """Ctrl-C (or SIGTERM) during a save: its files in OUT/.saving are removed, the last whole save stays."""
    from vivace.rl.sft_train import _save

    def cut_short(model, tokenizer, path):
        path.mkdir(parents=True)
        (path / "model.safetensors").write_bytes(b"half")
        raise KeyboardInterrupt

    monkeypatch.setattr("vivace.model.checkpoint.save_checkpoint", cut_short)
    (tmp_path / "model.safetensors").write_bytes(b"the last save")
    with pytest.raises(KeyboardInterrupt):
        _save(None, None, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.safetensors"]
    assert (tmp_path / "model.safetensors").read_bytes() == b"the last save"


def test_sft_train_on_a_disk_that_fills_is_one_line_naming_the_file(tmp_path, monkeypatch):
    def disk_full(model, tokenizer, out):
        raise OSError(errno.ENOSPC, "No space left on device", str(out / ".saving" / "model.safetensors"))

    monkeypatch.setattr("vivace.rl.sft_train._save", disk_full)
    data = _data(tmp_path / "a.jsonl")
    out = tmp_path / "m"
    result = _run("train", "--data", str(data), "--init", "tiny-init", "--seq-len", "128", "--threads", "1",
                  "--steps", "1", "--out", str(out))  # fmt: skip
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), result.output
    said = _said(result)
    assert f"error: {out}/.saving/model.safetensors: No space left on device; nothing was saved" in said, said


def test_a_save_on_a_full_disk_is_an_os_error_naming_the_file(tmp_path, monkeypatch):
    """safetensors reports a full disk as its own SafetensorError, which the CLI's OSError handling missed
    (a traceback); the save raises it as the OSError it is, its files removed."""
    from safetensors import SafetensorError

    from vivace.rl.sft_train import _save

    def disk_full(model, tokenizer, path):
        path.mkdir(parents=True)
        (path / "config.json").write_text("{}")
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr("vivace.model.checkpoint.save_checkpoint", disk_full)
    with pytest.raises(OSError) as e:
        _save(None, None, tmp_path)
    assert (e.value.errno, e.value.strerror) == (errno.ENOSPC, "No space left on device")
    assert e.value.filename == str(tmp_path / ".saving" / "model.safetensors") and not list(tmp_path.iterdir())


def test_an_output_that_fills_the_disk_is_one_line_and_nothing_left(full_disk):
    """copies, drills and augment write through OUT.partial (_written): on a disk that fills meanwhile (a real
    64 KiB tmpfs here, past the up-front check) the OSError was a traceback; it is one line, exit 1, and
    neither OUT nor OUT.partial is left."""
    out = full_disk / "out.jsonl"
    result = _run("copies", "--n", "2000", "--out", str(out))
    lines = result.stderr.splitlines()
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    assert lines[-1].startswith(f"error: cannot write {out}: No space left on device; nothing was written"), lines
    assert not out.exists() and not out.with_name("out.jsonl.partial").exists()


@pytest.mark.parametrize(
    ("init", "given", "used"), [("tiny", None, 1e-4), ("tiny-init", None, 2e-3), ("tiny", "5e-4", 5e-4)]
)
def test_sft_train_default_rate_follows_the_starting_weights(tmp_path, monkeypatch, init, given, used):
    """The default rate was the from-scratch recipe's 2e-3 whatever --init: continuing the shipped warm start
    with it sent the loss from 1.43 to 8.28 in two steps. Trained weights now continue at 1e-4."""
    import vivace.rl.sft_train as sft_train

    seen = {}

    def fake_train(*args, **kwargs):
        seen.update(kwargs)
        raise KeyboardInterrupt  # stop before any work; the rate chosen is what is checked

    monkeypatch.setattr(sft_train, "train_sft", fake_train)
    args = ["train", "--data", str(_data(tmp_path / "d.jsonl")), "--init", init, "--out", str(tmp_path / "o")]
    _run(*args, *(["--lr", given] if given else []))
    assert seen["lr"] == used


def test_sft_data_that_keeps_no_episode_fails_and_says_why(tmp_path):
    """Every episode dropped (here: longer than --max-tokens) is no training set: exit 1 naming the
    cause, where it exited 0 and `sft train` then tripped on an empty file."""
    out = tmp_path / "expert.jsonl"
    result = _run("data", "--backend", "plain", "--state-dir", str(tmp_path / "s"), "--out", str(out), "--n", "1",
                  "--styles", "efficient", "--max-tokens", "10")  # fmt: skip
    assert result.exit_code == 1, result.output
    said = _said(result)
    assert "none of the 1 episodes was kept" in said and "longer than --max-tokens 10: raise it" in said, said
    assert out.exists() and out.read_text() == ""


def test_sft_data_again_refuses_to_start_over_the_partial_set_a_stop_left(tmp_path):
    """The stop message says "the 7 kept are in OUT.partial"; the next run with the same --out truncated it."""
    out = tmp_path / "expert.jsonl"
    sft.partial_path(out).write_text('{"ids": [1]}\n{"ids": [2]}\n')
    result = _run("data", "--out", str(out), "--n", "1")
    assert result.exit_code == 2 and "expert.jsonl.partial holds 2 episodes" in _said(result), result.output
    assert "move it aside" in _said(result) and sft.partial_path(out).read_text().count("\n") == 2
