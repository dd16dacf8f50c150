"""`vivace sft` against what users do by mistake: a --dest that holds their own files, two commands writing
one --out at once, a device torch cannot train on, a bad line in the last of several eval files. Each is
refused before anything is lost, or said (found by probing the sft commands)."""

from __future__ import annotations

import fcntl
import json
import os

import pytest
from typer.testing import CliRunner

from test_sft_train import _episodes, _small_model, _write
from vivace.cli import app
from vivace.model.checkpoint import load_tokenizer, save_checkpoint, ship_checkpoint
from vivace.rl.sft_train import pick_device


def _said(result) -> str:
    return " ".join(result.output.split())


@pytest.fixture
def trained(tmp_path):
    path = tmp_path / "trained"
    save_checkpoint(_small_model(), load_tokenizer("tiny"), path)
    return path


def test_ship_refuses_a_dest_that_holds_anything_but_a_checkpoint(tmp_path, trained):
    """`sft ship --dest models` removed models/ whole, a user's own files with it; `--dest runs` removed
    the very checkpoint being shipped, which lay inside it."""
    mine = tmp_path / "models"
    (mine / "precious").mkdir(parents=True)
    (mine / "precious" / "notes.txt").write_text("keep")
    with pytest.raises(ValueError, match="models holds files and is not a checkpoint .*give --dest a new directory"):
        ship_checkpoint(trained, mine)
    with pytest.raises(ValueError, match="trained is inside --dest"):
        ship_checkpoint(trained, tmp_path)
    (tmp_path / "afile").write_text("mine")
    with pytest.raises(ValueError, match="afile is not a directory"):
        ship_checkpoint(trained, tmp_path / "afile")
    (tmp_path / "tiny.old").mkdir()
    (tmp_path / "tiny.old" / "results.csv").write_text("mine")  # the aside name a ship uses: not removed either
    with pytest.raises(ValueError, match=r"tiny.old holds files and is not a checkpoint"):
        ship_checkpoint(trained, tmp_path / "tiny")
    assert (mine / "precious" / "notes.txt").read_text() == "keep" and (trained / "config.json").is_file()
    assert (tmp_path / "afile").read_text() == "mine" and (tmp_path / "tiny.old" / "results.csv").exists()
    assert not (tmp_path / "tiny").exists() and not (tmp_path / "tiny.new").exists()
    ship_checkpoint(trained, tmp_path / "fresh")  # a new directory, then the checkpoint there, are replaceable
    record = ship_checkpoint(trained, tmp_path / "fresh")
    assert record["previous"] is not None


def test_a_second_writer_of_one_out_file_is_refused(tmp_path):
    """Two `sft copies --out same.jsonl` at once interleaved their lines into one file (a corrupt line
    among them) and the first said it had written its 30,000; the second blamed a full disk."""
    out = tmp_path / "same.jsonl"
    partial = tmp_path / "same.jsonl.partial"
    with partial.open("a") as held:  # the first command, mid-write
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        held.write("the first command's line\n")
        held.flush()
        result = CliRunner().invoke(app, ["sft", "copies", "--n", "3", "--out", str(out)])
        assert result.exit_code == 2 and f"another command is writing {out} now" in _said(result), _said(result)
        assert partial.read_text() == "the first command's line\n" and not out.exists()
    partial.write_text("a killed run's half line")  # unlocked: started over
    result = CliRunner().invoke(app, ["sft", "copies", "--n", "3", "--out", str(out)])
    assert result.exit_code == 0 and len(out.read_text().splitlines()) == 3 and not partial.exists()


def test_a_second_sft_train_on_one_out_is_refused(tmp_path):
    data = _write(tmp_path / "d.jsonl", _episodes(2))
    out = tmp_path / "model"
    out.mkdir()
    (out / "train_log.jsonl").write_text('{"step": 1}\n')  # the first run's, before its first save
    fd = os.open(out, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # the first run, holding --out
    try:
        result = CliRunner().invoke(
            app, ["sft", "train", "--data", str(data), "--out", str(out), "--init", "tiny-init"]
        )
    finally:
        os.close(fd)
    assert result.exit_code == 2 and "is in use by another `vivace sft train`" in _said(result), _said(result)
    assert [p.name for p in out.iterdir()] == ["train_log.jsonl"]  # not cleared as a stopped run's leftover


def test_a_directory_named_like_a_leftover_is_refused_not_unlinked(tmp_path):
    data = _write(tmp_path / "d.jsonl", _episodes(2))
    out = tmp_path / "model"
    (out / "train_log.jsonl").mkdir(parents=True)  # a directory: IsADirectoryError from unlink()
    result = CliRunner().invoke(app, ["sft", "train", "--data", str(data), "--out", str(out)])
    assert result.exit_code == 2 and "holds files but no model" in _said(result), _said(result)
    assert (out / "train_log.jsonl").is_dir()


@pytest.mark.parametrize("device", ["meta", "mps", "xpu", "cuda:99", "nonsense"])
def test_only_devices_training_runs_on_are_taken(device):
    """meta, mps and xpu failed with tracebacks after the model had loaded."""
    with pytest.raises(ValueError, match=f"--device {device}: "):
        pick_device(device)
    assert pick_device("cpu").type == "cpu"


def test_eval_checks_every_file_first_and_says_what_it_left_out(tmp_path):
    """A bad line in the second file was found after the first file's evaluation, whose numbers were then
    not shown; an episode longer than the context was dropped from the count without a word."""
    good = _write(tmp_path / "good.jsonl", _episodes(3))
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(_episodes(1)[0]) + "\nnot json\n" + json.dumps(_episodes(1)[0]) + "\n")
    args = ["sft", "eval", "--model", "tiny-init", "--data", str(good), "--data", str(bad)]
    result = CliRunner().invoke(app, args)
    said = _said(result)
    assert result.exit_code == 2 and "bad.jsonl:2" in said and "evaluating" not in said, said
    long = dict(_episodes(1, seed=1, lo=200, hi=201)[0])
    _write(bad, [*_episodes(2), long])
    result = CliRunner().invoke(app, ["sft", "eval", "--model", "tiny-init", "--data", str(bad), "--seq-len", "100"])
    said = _said(result)
    assert result.exit_code == 0 and "1 of 3 episodes of" in said and "1 longer than the context" in said, said
    assert "2 of 3" in said


def test_a_null_loss_mask_is_refused_not_read_as_train_everything(tmp_path):
    """`"loss_mask": null` trained every token (425 of 430) without a word; only a missing key means that."""
    from vivace.rl.sft_train import SftDataError, read_episodes

    row = _episodes(1)[0]
    _write(tmp_path / "d.jsonl", [row, {**row, "loss_mask": None}])
    with pytest.raises(SftDataError, match=r'd.jsonl:2: "loss_mask" is null; give one 0/1 per id, or drop the key'):
        read_episodes(tmp_path / "d.jsonl", 4096)
    _write(tmp_path / "d.jsonl", [{"ids": row["ids"]}])
    assert len(read_episodes(tmp_path / "d.jsonl", 4096)) == 1


def test_a_stopped_run_says_which_rate_to_train_on_from_it_with(tmp_path, monkeypatch):
    """The stop message advised --init OUT, whose default rate for trained weights is 20x below the
    from-scratch one: a continued tiny-init run silently trained on at 1e-4, with a new warmup."""
    import vivace.rl.sft_train as sft_train

    monkeypatch.setattr(sft_train, "train_sft", lambda *a, **k: {"stopped_by": "interrupted", "step": 3,
                        "counts": {"too_long": 0, "untrained": 0}})  # fmt: skip
    data = _write(tmp_path / "d.jsonl", _episodes(2))
    result = CliRunner().invoke(app, ["sft", "train", "--data", str(data), "--out", str(tmp_path / "o"),
                                      "--init", "tiny-init", "--json"])  # fmt: skip
    said = _said(result)
    assert (
        result.exit_code == 130
        and f"give --init {tmp_path / 'o'}, --lr 0.002 (a checkpoint's default is 0.0001)" in (said)
    ), said
