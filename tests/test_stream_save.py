"""A checkpoint written from the trainer's stream of gathered tensors (model/stream_save.py): the files
save_pretrained writes, byte for byte, while holding one weights file at a time."""

from __future__ import annotations

import filecmp
import json

import pytest
import torch
from transformers import AutoModelForCausalLM

import vivace.rl.trainer as trainer_module
from vivace.config import TrainConfig
from vivace.model.checkpoint import load_model, save_checkpoint
from vivace.model.rows import CheckpointRows
from vivace.model.stream_save import save_streamed, streamable
from vivace.rl.trainer import Sample, Trainer


@pytest.fixture(scope="module")
def trained():
    """The shipped tiny policy after one step (so its weights are not the files it was read from)."""
    trainer = Trainer("tiny", TrainConfig(model="tiny", lr=1e-3, micro_batch_tokens=256))
    ids = list(range(7, 107))
    trainer.train_step([Sample(ids, [0] * 50 + [1] * 50, [0.0] * 50 + [-5.0] * 50, [-1] * 50 + [0] * 50, 1.0)])
    return trainer


def meta_twin(trainer):
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(trainer.config, dtype=torch.float32)


def save_pretrained_way(trainer, path):
    plain = meta_twin(trainer)
    plain.load_state_dict(trainer.full_state_dict(), strict=False, assign=True)
    plain.tie_weights()
    save_checkpoint(plain, trainer.tokenizer, path)


def same_files(a, b) -> list[str]:
    names = sorted(p.name for p in a.iterdir())
    assert names == sorted(p.name for p in b.iterdir())
    return [n for n in names if not filecmp.cmp(a / n, b / n, shallow=False)]


def test_a_trainer_checkpoint_is_the_directory_save_pretrained_writes(trained, tmp_path):
    """Trainer.save streams the weights; the directory is byte for byte what save_pretrained wrote from the
    whole state: the experts back in one tensor per expert, the tied head left out, config and tokenizer."""
    trained.save(tmp_path / "step")
    save_pretrained_way(trained, tmp_path / "whole")
    assert same_files(tmp_path / "step" / "model", tmp_path / "whole") == []


def test_files_of_bounded_size_load_as_the_same_weights_and_rows(trained, tmp_path):
    """Cut into files of 8 MB: an index of shards that transformers loads and rows reads, equal to the
    trainer's weights, every file under the bound but for a single tensor larger than it."""
    path = save_streamed(meta_twin(trained), trained.tokenizer, trained.full_tensors(), tmp_path / "m", 8 * 2**20)
    index = json.loads((path / "model.safetensors.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    assert len(files) > 2 and files[0] == f"model-00001-of-{len(files):05d}.safetensors"
    assert all((path / f).stat().st_size < 8 * 2**20 + 2**20 for f in files)
    weights, loaded = trained.full_state_dict(), load_model(str(path)).model
    assert all(torch.equal(weights[k], v) for k, v in loaded.state_dict().items())
    rows = CheckpointRows.open(str(path), loaded)
    assert rows is not None
    experts = next(n for n in weights if n.endswith("mlp.experts.gate_up_proj"))
    assert torch.equal(rows.rows(experts, 2, 5), weights[experts][2:5])


def test_a_stream_out_of_order_or_cut_short_is_an_error(trained, tmp_path):
    twin = meta_twin(trained)
    tensors = list(trained.full_tensors())
    with pytest.raises(ValueError, match="out of sorted name order"):
        save_streamed(twin, trained.tokenizer, reversed(tensors), tmp_path / "a", 8 * 2**20)
    with pytest.raises(ValueError, match="stopped after"):
        save_streamed(twin, trained.tokenizer, tensors[:-3], tmp_path / "b")


def test_a_model_that_cannot_be_written_file_by_file_is_gathered_and_saved_whole(trained, tmp_path, monkeypatch):
    """Where a file's conversion would need another file's tensors (`streamable` false), Trainer.save takes
    the whole state on rank 0 and save_pretrained, with the same result."""
    assert streamable(meta_twin(trained))
    monkeypatch.setattr(trainer_module, "streamable", lambda *a: False)
    monkeypatch.setattr(trainer_module, "save_streamed", None)  # not called
    trained.save(tmp_path / "step")
    save_pretrained_way(trained, tmp_path / "whole")
    assert same_files(tmp_path / "step" / "model", tmp_path / "whole") == []


def test_a_write_error_still_takes_every_gathered_tensor(trained, tmp_path, monkeypatch):
    """Each tensor of the stream is an all-gather the other ranks take part in: rank 0 failing to write
    (a full disk) must still take the rest, or the other ranks would wait in the next one; then it raises."""
    import vivace.model.stream_save as stream_save

    taken, total = [], len(trained.model.state_dict())
    real = trained.full_tensors
    monkeypatch.setattr(trained, "full_tensors", lambda: (taken.append(n) or (n, t) for n, t in real()))

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(stream_save, "save_file", full_disk)
    monkeypatch.setattr(trained.cfg, "checkpoint_file_mb", 4)  # the first of several files fails
    with pytest.raises(OSError, match="No space left"):
        trained.save(tmp_path / "step")
    assert len(taken) == total
