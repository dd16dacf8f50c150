"""Checkpoint directories given as --model / --init: a damaged one is refused with a message that
names it and says what is wrong, never loaded as a silently different model."""

from __future__ import annotations

import json
import shutil

import pytest

from vivace.model.checkpoint import TINY_DIR, load_model, load_tokenizer


@pytest.fixture
def ckpt(tmp_path):
    path = tmp_path / "ckpt"
    shutil.copytree(TINY_DIR, path)
    return path


def edit_config(path, **changes):
    cfg = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**cfg, **changes}))


def test_a_copy_of_tiny_loads(ckpt):
    loaded = load_model(str(ckpt))
    assert len(loaded.tokenizer) > 1000 and loaded.model.config.num_hidden_layers >= 1


@pytest.mark.parametrize(
    ("damage", "words"),
    [
        (lambda p: (p / "model.safetensors").unlink(), "cannot load the checkpoint's weights"),
        (lambda p: (p / "model.safetensors").write_bytes((p / "model.safetensors").read_bytes()[:100_000]),
         "cannot load the checkpoint's weights"),
        (lambda p: (p / "model.safetensors").write_bytes(b""), "cannot load the checkpoint's weights"),
        (lambda p: edit_config(p, hidden_size=384), "cannot load the checkpoint's weights"),
        (lambda p: edit_config(p, num_hidden_layers=6), "missing keys: model.layers.4"),
        (lambda p: edit_config(p, num_hidden_layers=2), "unexpected keys: model.layers.2"),
        (lambda p: [(p / f).unlink() for f in ("tokenizer.json", "tokenizer_config.json")], "has no tokenizer"),
        (lambda p: (p / "tokenizer.json").unlink(), "cannot load its tokenizer"),
    ],
    ids=["no-weights", "truncated-weights", "empty-weights", "wrong-width", "more-layers", "fewer-layers",
         "no-tokenizer", "no-vocabulary"],
)  # fmt: skip
def test_a_damaged_checkpoint_is_refused_by_name(ckpt, damage, words):
    damage(ckpt)
    with pytest.raises(ValueError, match="ckpt") as e:
        load_model(str(ckpt))
    assert words in str(e.value)


def test_model_and_tokenizer_loaders_agree_on_what_is_a_tokenizer(ckpt):
    (ckpt / "tokenizer_config.json").unlink()
    for load in (load_model, load_tokenizer):
        with pytest.raises(ValueError, match="has no tokenizer"):
            load(str(ckpt))
