"""Checkpoint directories given as --model / --init: a damaged one is refused with a message that
names it and says what is wrong, never loaded as a silently different model."""

from __future__ import annotations

import json
import re
import shutil

import pytest

from vivace.model.checkpoint import TINY_DIR, load_model, load_tokenizer, require_weights


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


def in_memory_form(path):
    """The weights rewritten as transformers holds them in memory (each MoE layer's experts fused into
    one tensor), not as it saves them: its loader takes both."""
    from safetensors.torch import save_file

    state = load_model(str(path)).model.state_dict()
    save_file({k: v.contiguous() for k, v in state.items() if k != "lm_head.weight"}, path / "model.safetensors")


@pytest.mark.parametrize(
    "damage",
    [lambda p: None,
     in_memory_form,
     lambda p: (in_memory_form(p), edit_config(p, moe_intermediate_size=128)),
     lambda p: (p / "model.safetensors").write_bytes((p / "model.safetensors").read_bytes()[:-1]),
     lambda p: edit_config(p, hidden_size=384),
     lambda p: edit_config(p, num_hidden_layers=6),
     lambda p: edit_config(p, num_hidden_layers=2),
     lambda p: edit_config(p, tie_word_embeddings=False),  # no lm_head.weight in the file to untie
     lambda p: edit_config(p, head_dim=64)],
    ids=["intact", "fused-experts", "fused-experts-narrower", "one-byte-short", "wrong-width", "more-layers",
         "fewer-layers", "untied", "wider-heads"],
)  # fmt: skip
def test_the_header_check_refuses_what_load_model_refuses(ckpt, damage):
    """require_weights (headers and a meta-device model, for `vivace train`'s start) against the reference,
    the trainer's own load: the same verdict, and the check names the file."""
    damage(ckpt)
    try:
        load_model(str(ckpt))
        loads = True
    except ValueError:
        loads = False
    if loads:
        require_weights(str(ckpt))
    else:
        with pytest.raises(ValueError, match=f"^{re.escape(str(ckpt / 'model.safetensors'))}"):
            require_weights(str(ckpt))


def test_a_checkpoint_that_does_not_load_to_resume_from_is_named(tmp_path):
    """Trainer.load: a damaged trainer.pt (optimizer and step) is a ValueError naming the checkpoint."""
    from vivace.config import TrainConfig
    from vivace.rl.trainer import Trainer

    trainer = Trainer("tiny-init", TrainConfig(model="tiny-init"))
    trainer.save(tmp_path / "step_1")
    trainer.load(tmp_path / "step_1")
    state = tmp_path / "step_1" / "trainer.pt"
    state.write_bytes(state.read_bytes()[:1000])
    with pytest.raises(ValueError, match=f"^{re.escape(str(tmp_path / 'step_1'))}: cannot resume from this checkpoint"):
        trainer.load(tmp_path / "step_1")


def trained_and_saved(path):
    """A tiny-init trainer after one step, saved to `path`; with its config and the step's sample."""
    from vivace.config import TrainConfig
    from vivace.rl.trainer import Sample, Trainer

    cfg = TrainConfig(model="tiny-init", lr=1e-3)
    ids = list(range(50, 90))
    sample = Sample(ids, [0] * 10 + [1] * 30, [0.0] * 10 + [-7.0] * 30, [-1] * 10 + [0] * 30, 1.0)
    trainer = Trainer("tiny-init", cfg)
    trainer.train_step([sample])
    trainer.save(path)
    return trainer, cfg, sample


def test_a_resumed_trainer_takes_the_step_the_uninterrupted_one_takes(tmp_path):
    """Trainer.save/load carry Adam's moments (a sharded distributed checkpoint, path/optimizer) and the step:
    the step after a resume equals the uninterrupted run's, from this format and from the one before it
    (trainer.pt holding the whole optimizer); an optimizer shard missing is a ValueError naming the checkpoint."""
    import copy

    import torch
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    from vivace.rl.trainer import Trainer

    trainer, cfg, sample = trained_and_saved(tmp_path / "step_1")
    assert (tmp_path / "step_1" / "optimizer" / ".metadata").is_file()
    whole = get_optimizer_state_dict(trainer.model, trainer.optimizer, options=StateDictOptions(full_state_dict=True))
    whole = copy.deepcopy(whole)  # on one rank it shares the live moments, which the next step changes
    trainer.train_step([sample])
    expected = trainer.full_state_dict()

    old = tmp_path / "old_format"  # as vivace wrote checkpoints before the optimizer was sharded
    shutil.copytree(tmp_path / "step_1" / "model", old / "model")
    torch.save({"optimizer": whole, "step": 1}, old / "trainer.pt")
    for checkpoint in (tmp_path / "step_1", old):
        resumed = Trainer("tiny-init", cfg)
        resumed.load(checkpoint)
        assert resumed.step == 1
        resumed.train_step([sample])
        got = resumed.full_state_dict()
        assert all(torch.equal(got[k], expected[k]) for k in expected), checkpoint
    shard = next((tmp_path / "step_1" / "optimizer").glob("*.distcp"))
    shard.unlink()
    with pytest.raises(ValueError, match=f"^{re.escape(str(tmp_path / 'step_1'))}: cannot resume from this checkpoint"):
        Trainer("tiny-init", cfg).load(tmp_path / "step_1")


def test_resume_reads_the_rows_and_refuses_another_models_weights_by_name(tmp_path, monkeypatch):
    """Trainer.load reads the saved weights' rows on each rank (model/rows.py), never the checkpoint whole
    (load_model); a checkpoint whose weights are another model's (here: two layers fewer, self-consistent,
    so rows cannot plan it) takes rank 0's read, which names what differs, before any weight is set."""
    import torch
    from transformers import AutoModelForCausalLM

    import vivace.rl.trainer as trainer_module
    from vivace.model.checkpoint import save_checkpoint
    from vivace.rl.trainer import Trainer

    trainer, cfg, _ = trained_and_saved(tmp_path / "step_1")
    expected = trainer.full_state_dict()

    def whole(spec, *args, **kwargs):
        raise AssertionError(f"load_model({spec}) on resume")

    resumed = Trainer("tiny-init", cfg)  # tiny-init has no checkpoint: load_model initialises it
    monkeypatch.setattr(trainer_module, "load_model", whole)
    resumed.load(tmp_path / "step_1")
    got = resumed.full_state_dict()
    assert resumed.step == 1 and all(torch.equal(got[k], expected[k]) for k in expected)
    monkeypatch.undo()

    other = tmp_path / "other"
    shutil.copytree(tmp_path / "step_1", other)
    shutil.rmtree(other / "model")
    config = trainer.config.__class__.from_dict({**trainer.config.to_dict(), "num_hidden_layers": 2})
    save_checkpoint(AutoModelForCausalLM.from_config(config), trainer.tokenizer, other / "model")
    with pytest.raises(ValueError, match=f"^{re.escape(str(other))}: cannot resume .*missing: model.layers.2"):
        Trainer("tiny-init", cfg).load(other)


def rewrite_weights(path, change=None, header=None):
    """The checkpoint's model.safetensors with `change(state)` applied to its tensors, or `header(h)` to its
    header's JSON (the data bytes kept as they are)."""
    from safetensors.torch import load_file, save_file

    file = path / "model.safetensors"
    if change is not None:
        state = load_file(file)
        change(state)
        save_file(state, file, metadata={"format": "pt"})
    if header is not None:
        data = file.read_bytes()
        n = int.from_bytes(data[:8], "little")
        h = json.loads(data[8 : 8 + n])
        header(h)
        text = json.dumps(h).encode()
        file.write_bytes(len(text).to_bytes(8, "little") + text + data[8 + n :])


def poison(value):
    def change(state):
        name = next(k for k in sorted(state) if "q_proj" in k)
        state[name].view(-1)[7] = value

    return change


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("form", ["safetensors", "bin"])
def test_weights_holding_nan_or_inf_are_refused_naming_the_tensor(ckpt, value, form):
    """Damaged bytes can decode as NaN, and a run that diverged saves them: such weights load without any
    error and then sample garbage. load_model refuses them, naming the tensor, in either weight format."""
    import torch
    from safetensors.torch import load_file

    rewrite_weights(ckpt, poison(value))
    if form == "bin":
        torch.save(load_file(ckpt / "model.safetensors"), ckpt / "pytorch_model.bin")
        (ckpt / "model.safetensors").unlink()
    with pytest.raises(ValueError, match=r"NaN or infinite values \(model\.layers\.0\.self_attn\.q_proj\.weight\)"):
        load_model(str(ckpt))


def test_large_finite_weights_are_not_mistaken_for_infinite(ckpt):
    """The check sums each tensor (fast), and a sum can overflow where no weight is infinite: such a tensor is
    checked element by element before it is refused."""
    rewrite_weights(ckpt, poison(3e38))
    rewrite_weights(ckpt, lambda s: s[next(k for k in sorted(s) if "q_proj" in k)].view(-1).__setitem__(8, 3e38))
    load_model(str(ckpt))


def test_weights_that_are_not_a_pytorch_file_are_refused_without_the_unsafe_advice(ckpt):
    """A damaged pytorch_model.bin: torch's unpickler fails and suggests weights_only=False (which runs code
    from the file); load_model says the weights cannot load, as for damaged safetensors."""
    (ckpt / "model.safetensors").unlink()
    (ckpt / "pytorch_model.bin").write_bytes(b"garbage, not a pickle" * 100)
    with pytest.raises(ValueError, match="cannot load the checkpoint's weights") as e:
        load_model(str(ckpt))
    assert "weights_only" not in str(e.value)


def test_a_git_lfs_pointer_is_named_as_one_when_loading(ckpt):
    (ckpt / "model.safetensors").write_text("version https://git-lfs.github.com/spec/v1\noid sha256:ab\nsize 9\n")
    with pytest.raises(ValueError, match=re.escape(f"{ckpt / 'model.safetensors'}: a Git LFS pointer")):
        load_model(str(ckpt))


def test_the_shipped_tiny_is_checked_against_its_recorded_sha256(ckpt, monkeypatch):
    """warm_start.json records the shipped weights' sha256 (ship_checkpoint): loading `tiny` checks it, so a
    damaged checkout is refused with what to do rather than loaded as another model."""
    import vivace.model.spec as spec

    monkeypatch.setattr(spec, "TINY_DIR", ckpt)
    assert json.loads((ckpt / "warm_start.json").read_text())["sha256"]
    load_model("tiny")
    rewrite_weights(ckpt, lambda s: s[sorted(s)[0]].view(-1).__setitem__(0, 0.5))
    with pytest.raises(ValueError, match="sha256 is not the one warm_start.json records.*git checkout"):
        load_model("tiny")
    monkeypatch.setattr(spec, "TINY_DIR", ckpt.parent / "not-shipped")  # a checkout without the trained tiny
    other = ckpt.parent / "other"
    shutil.copytree(TINY_DIR, other)
    load_model(str(other))  # another directory is not checked against the (absent) shipped record


def test_a_ship_cut_short_is_refused_not_taken_for_the_untrained_model(ckpt, monkeypatch):
    """`sft ship` removed the shipped checkpoint, then renamed the new one in: killed between the two,
    `--model tiny` silently became the seeded untrained model. Now the old one goes aside first, and a
    missing tiny with a whole one beside it is refused with what to do."""
    import vivace.model.spec as spec

    shipped = ckpt.parent / "tiny"
    monkeypatch.setattr(spec, "TINY_DIR", shipped)
    ckpt.rename(shipped.with_name("tiny.old"))  # killed after the old one went aside, before the new one came in
    with pytest.raises(ValueError, match=r"tiny checkpoint is missing and .*tiny.old holds one: `vivace sft ship` "):
        load_model("tiny")
    shipped.with_name("tiny.old").rename(shipped)
    load_model("tiny")


def test_weights_stored_in_another_dtype_than_config_json_says_warn(ckpt):
    def f16(h):
        for name, t in h.items():
            if name != "__metadata__":
                t["dtype"] = "F16"

    assert json.loads((ckpt / "config.json").read_text())["dtype"] == "bfloat16"
    rewrite_weights(ckpt, header=f16)
    with pytest.warns(RuntimeWarning, match="stored as F16 where config.json says bfloat16"):
        load_model(str(ckpt))


@pytest.mark.parametrize(
    ("changes", "field"),
    [({"num_experts_per_tok": 0}, "num_experts_per_tok"), ({"num_experts_per_tok": 9}, "num_experts_per_tok"),
     ({"num_local_experts": 0}, "num_experts"), ({"max_position_embeddings": -5}, "max_position_embeddings"),
     ({"hidden_size": 0}, "hidden_size"), ({"decoder_sparse_step": 0}, "decoder_sparse_step"),
     ({"num_attention_heads": 3}, "num_attention_heads")],
    ids=["top-k-0", "top-k-past-experts", "no-experts", "negative-context", "zero-width", "sparse-step-0",
         "heads"],
)  # fmt: skip
def test_a_config_json_describing_no_usable_model_is_refused_naming_the_field(ckpt, changes, field):
    """What `--arch` refuses (parse_arch) a checkpoint's config.json may hold too: refused when it is read,
    by file and field, for training (model_config) as for sampling (load_model)."""
    from vivace.model.checkpoint import model_config, parse_arch

    edit_config(ckpt, **changes)
    for load in (load_model, model_config):
        with pytest.raises(ValueError, match=f"^{re.escape(str(ckpt / 'config.json'))}: .*{field}"):
            load(str(ckpt))
    with pytest.raises(ValueError, match=field):
        parse_arch(",".join(f"{k}={v}" for k, v in changes.items()))


@pytest.mark.parametrize(
    ("text", "words"),
    [("[1, 2]", "expected a JSON object, got list"), (None, "hidden_size"), ("eps", "rms_norm_eps")],
    ids=["list", "wrong-type", "wrong-type-float"],
)
def test_a_config_json_of_the_wrong_shape_is_refused_by_name(ckpt, text, words):
    """A list, or a field of the wrong type: transformers raises TypeError or huggingface_hub's validation
    error, not the ValueError the commands catch."""
    from vivace.model.checkpoint import model_config

    if text is None:
        edit_config(ckpt, hidden_size="abc")
    elif text == "eps":
        edit_config(ckpt, rms_norm_eps="x")
    else:
        (ckpt / "config.json").write_text(text)
    for load in (load_model, model_config, load_tokenizer):
        with pytest.raises(ValueError, match=f"^{re.escape(str(ckpt / 'config.json'))}: cannot read it.*{words}"):
            load(str(ckpt))


@pytest.mark.parametrize("name", ["tokenizer.json", "tokenizer_config.json"])
def test_a_damaged_tokenizer_file_is_named(ckpt, name):
    text = (ckpt / name).read_text()
    (ckpt / name).write_text(text[: len(text) // 2])
    for load in (load_model, load_tokenizer):
        with pytest.raises(ValueError, match=f"^{re.escape(str(ckpt / name))}: not JSON"):
            load(str(ckpt))


@pytest.mark.parametrize("damage", ["missing", "a-directory"])
def test_a_model_directory_without_config_json_says_so(ckpt, damage):
    """`--model DIR`: a directory is meant as a checkpoint; without config.json the error says that, not only
    that the spec is unknown."""
    from vivace.harness.policies import load_policy

    (ckpt / "config.json").unlink()
    if damage == "a-directory":
        (ckpt / "config.json").mkdir()
    with pytest.raises(ValueError, match=f"no config.json in {re.escape(str(ckpt))}"):
        load_policy(str(ckpt))


def test_a_checkpoint_write_on_a_full_disk_is_an_oserror_naming_the_file(full_disk):
    """dcp wraps a rank's failed write in a CheckpointException, a BaseException that no `except Exception`
    sees, and torch.save says a full disk as RuntimeError("unexpected pos"): `vivace train` ended with ~100
    lines of traceback instead of its one line with the last checkpoint and the resume command."""
    import errno

    import torch
    import torch.distributed.checkpoint as dcp

    from vivace.rl.trainer import failed_writes_as_oserror

    big = {"x": torch.zeros(100_000)}
    for path, write in [
        (full_disk / "optimizer", lambda p: dcp.save(big, checkpoint_id=p)),
        (full_disk / "trainer.pt", lambda p: torch.save(big, p)),
    ]:
        with pytest.raises(OSError) as e:
            with failed_writes_as_oserror(path):
                write(path)
        assert e.value.errno == errno.ENOSPC or e.value.filename == str(path), e.value
    with pytest.raises(RuntimeError, match="not a write"):  # other errors are left as they are
        with failed_writes_as_oserror(full_disk / "x"):
            raise RuntimeError("not a write")
