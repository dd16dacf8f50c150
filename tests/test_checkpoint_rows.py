"""Each trainer rank reads its own shard's rows of the checkpoint (model/rows.py): the rows equal what
transformers' loader makes of the files (experts fused), the shards equal the broadcast's on 1 and 3 ranks
(uneven blocks), and a checkpoint it cannot plan, or a rank without the files, takes rank 0's broadcast."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from vivace.model.checkpoint import TINY_DIR, load_model, model_config
from vivace.model.rows import CheckpointRows


def meta_model(spec: str):
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(model_config(spec))


def test_rows_are_what_the_loader_makes_of_the_files():
    """Every tensor whole, and blocks of rows of the fused experts (an expert's gate rows, then its up
    rows) and of a plain weight, equal load_model's (the shipped checkpoint is bf16; rows are as stored)."""
    rows = CheckpointRows.open("tiny", meta_model("tiny"))
    loaded = load_model("tiny").model.state_dict()
    assert rows is not None and rows.plans["model.layers.1.mlp.experts.gate_up_proj"][0] == "experts"
    assert rows.plans.keys() == loaded.keys() - {"lm_head.weight"}  # tied to the embedding, not in the file
    for name in rows.plans:
        assert torch.equal(rows.rows(name, 0, loaded[name].shape[0]).float(), loaded[name]), name
    for name, (start, stop) in {"model.layers.1.mlp.experts.gate_up_proj": (3, 6),
                                "model.layers.2.mlp.experts.down_proj": (7, 8),
                                "model.embed_tokens.weight": (683, 1366)}.items():  # fmt: skip
        assert torch.equal(rows.rows(name, start, stop).float(), loaded[name][start:stop]), name


def copy_tiny(tmp_path, edit=None):
    """The shipped checkpoint copied, its tensors edited by `edit(dict) -> dict`."""
    path = tmp_path / "ckpt"
    shutil.copytree(TINY_DIR, path)
    if edit:
        tensors = load_file(path / "model.safetensors")
        save_file(edit(tensors), path / "model.safetensors", metadata={"format": "pt"})
    return str(path)


def test_an_index_of_shards_is_read_by_rows(tmp_path):
    """A checkpoint split into shards with an index (as large models are published) plans the same rows."""
    path = tmp_path / "ckpt"
    shutil.copytree(TINY_DIR, path)
    tensors = load_file(path / "model.safetensors")
    (path / "model.safetensors").unlink()
    names = sorted(tensors)
    halves = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for file, part in halves.items():
        save_file({n: tensors[n] for n in part}, path / file, metadata={"format": "pt"})
    weight_map = {n: file for file, part in halves.items() for n in part}
    (path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    rows = CheckpointRows.open(str(path), meta_model("tiny"))
    expected = CheckpointRows.open("tiny", meta_model("tiny"))
    assert rows is not None and rows.plans == expected.plans
    name = "model.layers.3.mlp.experts.down_proj"
    assert torch.equal(rows.rows(name, 2, 5), expected.rows(name, 2, 5))


@pytest.mark.parametrize(
    "edit",
    [
        # an expert stored under a name of another convention (Mixtral's w1/w3): the fusion cannot be planned
        lambda t: {k.replace("experts.0.gate_proj", "experts.0.w1"): v for k, v in t.items()},
        # a tensor the model has is missing
        lambda t: {k: v for k, v in t.items() if k != "model.norm.weight"},
        # a layer norm under the legacy name transformers' loader renames (gamma -> weight)
        lambda t: {**t, "model.extra.LayerNorm.gamma": torch.ones(2)},
    ],
    ids=["another-fusion", "missing", "renamed-by-the-loader"],
)
def test_what_it_cannot_plan_is_left_to_the_broadcast(tmp_path, edit):
    assert CheckpointRows.open(copy_tiny(tmp_path, edit), meta_model("tiny")) is None


def test_an_untrained_model_bin_weights_or_a_damaged_file_have_no_rows(tmp_path):
    """None, not an error: load_model then reads (or refuses, saying why) on rank 0, and every rank hears it."""
    assert CheckpointRows.open("tiny-init", meta_model("tiny")) is None
    damaged = tmp_path / "damaged"
    shutil.copytree(TINY_DIR, damaged)
    (damaged / "model.safetensors").write_bytes(b"\x10" + b"\x00" * 7 + b"{not json}" + b"\x00" * 6)
    assert CheckpointRows.open(str(damaged), meta_model("tiny")) is None
    path = tmp_path / "bin"
    shutil.copytree(TINY_DIR, path)
    (path / "model.safetensors").rename(path / "pytorch_model.bin")  # the name is all `open` looks at
    assert CheckpointRows.open(str(path), meta_model("tiny")) is None


def test_one_rank_reads_rows_and_never_the_whole_checkpoint(monkeypatch):
    """load_sharded on one rank: the shards equal load_model's weights and buffers (rotary frequencies,
    built from the config), the tied head stays tied, and load_model (the whole checkpoint) is never called."""
    import vivace.rl.trainer as trainer

    trainer.init_distributed()
    whole = []
    monkeypatch.setattr(trainer, "load_model", lambda *a, **k: whole.append(a))
    model, _ = trainer.load_sharded("tiny", "cpu")
    reference = load_model("tiny").model
    got = {k: v.full_tensor() if hasattr(v, "full_tensor") else v for k, v in model.state_dict().items()}
    want = reference.state_dict()
    assert whole == [] and got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
    assert all(torch.equal(model.get_buffer(n), b) for n, b in reference.named_buffers())
    assert model.lm_head.weight is model.model.embed_tokens.weight


RANK = r"""
import json, os, sys, torch
import torch.distributed as dist
rank, world, port, spec, without = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5])
os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", port
import vivace.rl.trainer as T
from vivace.model.rows import CheckpointRows
if rank == without:  # this rank's node cannot see the checkpoint's files
    T.CheckpointRows.open = classmethod(lambda cls, spec, model: None)
whole = []
real = T.load_model
T.load_model = lambda *a, **k: (whole.append(a[0]), real(*a, **k))[1]
T.init_distributed(rank, world)
model, _ = T.load_sharded(spec, "cpu")
local = {n: p.to_local().shape[0] for n, p in model.named_parameters()}
full = {k: v.full_tensor() if hasattr(v, "full_tensor") else v for k, v in model.state_dict().items()}
if rank == 0:
    want = real(spec).model.state_dict()
    same = full.keys() == want.keys() and all(torch.equal(full[k], want[k]) for k in want)
else:
    same = None
print(json.dumps({"same": same, "whole": whole, "experts": local["model.layers.0.mlp.experts.gate_up_proj"],
                  "vocab": local["model.embed_tokens.weight"]}), flush=True)
dist.barrier()
dist.destroy_process_group()
"""


def ranks(world: int, without: int = -1) -> list[dict]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    procs = [subprocess.Popen([sys.executable, "-c", RANK, str(r), str(world), port, "tiny", str(without)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(world)]  # fmt: skip
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), "\n".join(err[-2000:] for _, err in outs)
    return [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]


@pytest.mark.slow
def test_three_ranks_read_uneven_rows_or_all_take_the_broadcast():
    """Three ranks: 8 experts in blocks of 3, 3, 2 and 4,096 embedding rows in 1,366, 1,366, 1,364, each read by
    its rank, give the loader's weights, and no rank reads the checkpoint whole. When one rank cannot plan
    the rows (its node lacks the files), every rank takes rank 0's broadcast instead, with the same weights."""
    read = ranks(3)
    assert (
        read[0]["same"]
        and [r["experts"] for r in read] == [3, 3, 2]
        and [r["vocab"] for r in read] == [1366, 1366, 1364]
    )
    assert all(r["whole"] == [] for r in read)
    fallback = ranks(3, without=2)
    assert fallback[0]["same"] and fallback[0]["whole"] == ["tiny"] and all(r["whole"] == [] for r in fallback[1:])
