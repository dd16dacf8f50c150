"""The trainer as a torch.distributed group of two FSDP2 ranks (gloo) makes the same update as one
rank when the ranks hold equal token counts — and does not hang when they hold different
numbers of micro-batches; a checkpoint saved by one number of ranks resumes on another."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

SCRIPT = r"""
import json, os, sys, torch
import torch.distributed as dist
rank, world, port, out, uneven = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5] == "1"
os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", port
from vivace.config import TrainConfig
from vivace.rl.trainer import Sample, Trainer
cfg = TrainConfig(lr=1e-2, micro_batch_tokens=64, param_dtype=sys.argv[6] if len(sys.argv) > 6 else "float32")
trainer = Trainer("tiny", cfg, rank=rank, world_size=world)
g = torch.Generator().manual_seed(0)
def sample(n, adv):
    ids = torch.randint(7, 4096, (n,), generator=g).tolist()
    return Sample(ids, [0] * 10 + [1] * (n - 10), [0.0] * 10 + [-8.0] * (n - 10), [-1] * 10 + [0] * (n - 10), adv)
samples = [sample(40, 1.0), sample(40, -1.0)] + ([sample(30, 0.5)] * 3 if uneven else [])
stats = trainer.train_step(samples)
state = trainer.full_state_dict()
streamed = dict(trainer.full_tensors())  # what the broadcast weight sync sends: each all-gathered on every rank
shards = trainer.model.state_dict()  # DTensors: each names its whole shape
assert sorted(streamed) == list(streamed) and all(streamed[k].shape == shards[k].shape for k in shards)
if rank == 0:
    assert streamed.keys() == state.keys() and all(torch.equal(streamed[k], state[k]) for k in state)
    torch.save(state, out)
    print(json.dumps(stats), flush=True)
dist.barrier()  # neither rank leaves the group while the other still talks to it (gloo aborted at exit)
dist.destroy_process_group()
"""


def run(world: int, tmp_path, uneven: bool = False, script: str = SCRIPT, extra: tuple[str, ...] = ()) -> dict:
    """`script` on `world` ranks, each given (rank, world, port, out, uneven, *extra): what rank 0 saved to
    `out` and the JSON it printed last."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    out = tmp_path / f"w{world}{uneven}.pt"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script, str(r), str(world), port, str(out), "1" if uneven else "0", *extra],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        for r in range(world)
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs[0][1][-2000:]
    return {"state": torch.load(out), "stats": json.loads(outs[0][0].strip().splitlines()[-1])}


@pytest.mark.slow
def test_two_ranks_equal_one(tmp_path):
    one, two = run(1, tmp_path), run(2, tmp_path)
    start = __import__("vivace.model.checkpoint", fromlist=["load_model"]).load_model("tiny").model.state_dict()
    moved = max(float((one["state"][k] - start[k]).abs().max()) for k in one["state"])
    assert moved > 1e-3  # the step changed the weights
    for k, v in one["state"].items():
        assert torch.allclose(v, two["state"][k], atol=1e-5), k
    uneven = run(2, tmp_path, uneven=True)  # rank 0 gets 3 samples, rank 1 gets 2: padded, no hang
    assert uneven["stats"]["grad_norm"] > 0


@pytest.mark.slow
def test_two_bf16_ranks_equal_one(tmp_path):
    """With param_dtype bfloat16 the ranks gather bf16 parameters and reduce fp32 gradients (gloo): the same
    update as one rank."""
    one, two = (run(world, tmp_path, extra=("bfloat16",)) for world in (1, 2))
    for k, v in one["state"].items():
        assert v.dtype == torch.float32 and torch.allclose(v, two["state"][k], atol=1e-5), k


RESHARD = r"""
import json, os, sys, torch
import torch.distributed as dist
rank, world, port, out, mode, ckpt = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], *sys.argv[6:8]
os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", port
from pathlib import Path
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict
from vivace.config import TrainConfig
from vivace.rl.trainer import Sample, Trainer
cfg = TrainConfig(model="tiny-init", lr=1e-3)
trainer = Trainer("tiny-init", cfg, rank=rank, world_size=world)
if mode == "save":  # one real step, so Adam's moments are not zero, then the checkpoint
    ids = list(range(50, 90))
    sample = Sample(ids, [0] * 10 + [1] * 30, [0.0] * 10 + [-7.0] * 30, [-1] * 10 + [0] * 30, 1.0)
    trainer.train_step([sample, sample])
    trainer.save(Path(ckpt))
else:
    trainer.load(Path(ckpt))
full = StateDictOptions(full_state_dict=True, cpu_offload=True)  # gathered, unsharded, on rank 0
state = {"weights": trainer.full_state_dict(), "step": trainer.step,
         "optimizer": get_optimizer_state_dict(trainer.model, trainer.optimizer, options=full)}
# Adam's per-parameter step is a plain tensor, not a shard: the gathered state shows rank 0's alone.
state["ranks"] = [None] * world
mine = (trainer.step, sorted({float(s["step"]) for s in trainer.optimizer.state.values()}))
dist.all_gather_object(state["ranks"], mine)
if rank == 0:
    torch.save(state, out)
    print(json.dumps({"step": trainer.step}), flush=True)
dist.barrier()  # neither rank leaves the group while the other still talks to it
dist.destroy_process_group()
"""


@pytest.mark.slow
@pytest.mark.parametrize(("saved_on", "resumed_on"), [(2, 1), (1, 2)], ids=["2-to-1-rank", "1-to-2-ranks"])
def test_a_checkpoint_resumes_on_another_number_of_ranks(tmp_path, saved_on, resumed_on):
    """Trainer.save writes the optimizer as each rank's shard (a distributed checkpoint) and Trainer.load
    reads it into the current ranks' shards: saved by 2 ranks it resumes on 1 and saved by 1 on 2, with the
    weights, the step and every parameter's AdamW state (exp_avg, exp_avg_sq, step) the saver held,
    compared whole (gathered on rank 0)."""
    ckpt = tmp_path / "step_1"
    saved = run(saved_on, tmp_path, script=RESHARD, extra=("save", str(ckpt)))["state"]
    resumed = run(resumed_on, tmp_path, script=RESHARD, extra=("load", str(ckpt)))["state"]
    assert saved["step"] == resumed["step"] == 1
    assert saved["ranks"] == [(1, [1.0])] * saved_on and resumed["ranks"] == [(1, [1.0])] * resumed_on
    assert saved["weights"].keys() == resumed["weights"].keys()
    for k, v in saved["weights"].items():
        assert torch.equal(v, resumed["weights"][k]), k
    moments, got = saved["optimizer"]["state"], resumed["optimizer"]["state"]
    assert moments.keys() == got.keys() and len(moments) == len(saved["weights"]) - 1  # lm_head is tied
    assert sum(float(s["exp_avg_sq"].sum()) for s in moments.values()) > 0  # a real step moved them
    for name, state in moments.items():
        assert state.keys() == got[name].keys() == {"exp_avg", "exp_avg_sq", "step"}, name
        assert float(state["step"]) == 1, name
        for key, value in state.items():
            assert torch.equal(value, got[name][key]), (name, key)
    assert saved["optimizer"]["param_groups"] == resumed["optimizer"]["param_groups"]


RESUME = r"""
import json, os, sys, torch
import torch.distributed as dist
rank, world, port, ckpt = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", port
from pathlib import Path
import vivace.rl.trainer as T
from vivace.config import TrainConfig
reads = []
real_load_model = T.load_model
T.load_model = lambda spec, *a, **k: (reads.append(spec), real_load_model(spec, *a, **k))[1]
cfg = TrainConfig(model="tiny", lr=1e-2, micro_batch_tokens=64)
trainer = T.Trainer("tiny", cfg, rank=rank, world_size=world)
g = torch.Generator().manual_seed(0)
ids = torch.randint(7, 2048, (40,), generator=g).tolist()
sample = T.Sample(ids, [0] * 10 + [1] * 30, [0.0] * 10 + [-8.0] * 30, [-1] * 10 + [0] * 30, 1.0)
trainer.train_step([sample, sample])
trainer.save(Path(ckpt))
fresh = T.Trainer("tiny", cfg, rank=rank, world_size=world)
fresh.load(Path(ckpt))
a, b = trainer.full_state_dict(), fresh.full_state_dict()
same = rank != 0 or all(torch.equal(a[k], b[k]) for k in a)
out = {"rank": rank, "reads": reads, "same": same, "step": fresh.step}
dist.barrier()
if rank == 0:  # a damaged optimizer state, which only rank 0 reads
    state = Path(ckpt) / "trainer.pt"
    state.write_bytes(state.read_bytes()[:1000])
dist.barrier()
try:
    fresh.load(Path(ckpt))
    out["damaged"] = "loaded"
except ValueError as e:
    out["damaged"] = str(e)
print(json.dumps(out), flush=True)
dist.barrier()  # neither rank leaves the group while the other still talks to it
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_two_ranks_resume_by_their_rows_and_fail_together(tmp_path):
    """On resume each rank reads its own rows of the saved weights, as at the start (test_checkpoint_rows.py),
    so no rank loads the checkpoint whole: a resumed trainer holds the saved weights and step; a damaged
    checkpoint, which only rank 0 reads, is the same ValueError on every rank instead of a rank waiting
    forever for the broadcast."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    ckpt = tmp_path / "step_1"
    procs = [subprocess.Popen([sys.executable, "-c", RESUME, str(r), "2", port, str(ckpt)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for r in range(2)]  # fmt: skip
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs[0][1][-2000:] + outs[1][1][-2000:]
    zero, one = (json.loads(o[0].strip().splitlines()[-1]) for o in outs)
    assert zero["reads"] == one["reads"] == []
    assert zero["same"] and zero["step"] == one["step"] == 1
    for out in (zero, one):
        assert out["damaged"].startswith(f"{ckpt}: cannot resume from this checkpoint"), out["damaged"]


ANCHORED = r"""
import json, os, sys, torch
import torch.distributed as dist
rank, world, port, data = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", port
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from vivace.config import TrainConfig
from vivace.model.checkpoint import load_model
from vivace.rl.trainer import Sample, Trainer
cfg = TrainConfig(model="tiny", lr=1e-2, micro_batch_tokens=64, kl_coef=0.1, sft_data=data, sft_episodes=3)
trainer = Trainer("tiny", cfg, rank=rank, world_size=world)
ids = list(range(100, 140))
sample = Sample(ids, [0] * 10 + [1] * 30, [0.0] * 10 + [-8.0] * 30, [-1] * 10 + [0] * 30, 1.0)
kl = [trainer.train_step([sample, sample])["kl_reference_k3"] for _ in range(2)]
full = StateDictOptions(full_state_dict=True, cpu_offload=True)
ref = get_model_state_dict(trainer.reference, options=full)
start = load_model("tiny").model.state_dict() if rank == 0 else {}
print(json.dumps({"kl": kl, "experts": len(trainer._expert_rows()),
                  "reference_kept": all(torch.equal(ref[k], start[k]) for k in ref)}), flush=True)
dist.barrier()
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_two_ranks_with_a_sharded_reference_and_uneven_expert_rows(tmp_path):
    """The frozen reference (kl_coef) is sharded like the policy, so its forward is a collective: with
    three expert episodes a step, rank 0 packs two expert rows and rank 1 one, yet every rank's all-gathers
    pair with the others' (the reference runs on expert rows too), and the reference stays the start."""
    import socket

    data = tmp_path / "expert.jsonl"
    with data.open("w") as f:
        for i in range(3):
            f.write(json.dumps({"ids": list(range(200 + i, 248 + i)), "loss_mask": [0] * 16 + [1] * 32}) + "\n")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    procs = [subprocess.Popen([sys.executable, "-c", ANCHORED, str(r), "2", port, str(data)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for r in range(2)]  # fmt: skip
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs[0][1][-2000:] + outs[1][1][-2000:]
    zero, one = (json.loads(o[0].strip().splitlines()[-1]) for o in outs)
    assert (zero["experts"], one["experts"]) == (2, 1)
    assert zero["kl"][0] == pytest.approx(0.0, abs=1e-9) and zero["kl"][1] > 1e-6
    assert zero["reference_kept"]


def test_an_error_rank_0_broadcasts_always_crosses():
    """What rank 0 sends the other ranks when it cannot read a checkpoint must unpickle there: an exception
    that does not (here: a class local to a function, which pickle cannot name) goes as a RuntimeError
    naming it."""
    import pickle

    from vivace.rl.trainer import _portable

    class Odd(Exception):
        def __init__(self, a, b):
            super().__init__(f"{a} and {b}")

    with pytest.raises(AttributeError):
        pickle.dumps(Odd(1, 2))
    sent = pickle.loads(pickle.dumps(_portable(Odd(1, 2))))
    assert isinstance(sent, RuntimeError) and str(sent) == "Odd: 1 and 2"
    error = FileNotFoundError(2, "No such file", "trainer.pt")
    assert _portable(error) is error
