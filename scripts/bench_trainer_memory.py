"""The trainer's memory per rank: two FSDP2 ranks (gloo, CPU) start, take one step and save, for this
checkout's trainer and for an earlier revision's, on a ~200M-parameter Qwen3-MoE made for the run.

    .venv/bin/python scripts/bench_trainer_memory.py [--old 913b0d2^] [--layers 12] [--hidden 768]

Before load_sharded every rank loaded the whole model and then sharded it, so each rank's peak held the
full weights (a 30B model is 120 GB in fp32: more than a GPU has); since, every rank builds the model on
the meta device and shards it first, and rank 0 alone reads the checkpoint and broadcasts the shards.
Prints each rank's peak anonymous resident memory (sampled every 5 ms) above its baseline (after imports) at each stage, and the results
as JSON (docs/benchmarks.md, "The trainer's memory per rank"); `resume_growth` is what resuming from the saved
checkpoint (Trainer.load) adds to the trainer's memory at its peak.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tarfile
import tempfile
from io import BytesIO
from pathlib import Path

# The start of a rank's script: `high[0]` follows the process's peak anonymous memory, sampled every 5 ms.
MEMORY_WATCH = r"""
import json, os, sys, threading, time
def anon_mb():  # memory the process owns (not the checkpoint's pages mapped from the file, which the OS can drop)
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("RssAnon:")) / 1024
high = [0.0]
restart, restarted = threading.Event(), threading.Event()
def watch():
    while True:
        if restart.is_set():  # the watch itself restarts the peak: set from outside, a sample taken before could overwrite it
            high[0] = anon_mb()
            restart.clear()
            restarted.set()
        else:
            high[0] = max(high[0], anon_mb())
        time.sleep(0.005)
def restart_peak():
    restarted.clear()
    restart.set()
    restarted.wait()
    return high[0]
threading.Thread(target=watch, daemon=True).start()
"""

RANK = r"""def peak_mb():
    time.sleep(0.02)
    high[0] = max(high[0], anon_mb())
    return high[0]
import torch, torch.distributed as dist
from vivace.config import TrainConfig
from vivace.rl.trainer import Sample, Trainer
rank, world, port, model, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", port
torch.set_num_threads(1)
stages = {"imports": peak_mb()}
files = {"checkpoint_file_mb": int(sys.argv[6])} if "checkpoint_file_mb" in TrainConfig.model_fields else {}
trainer = Trainer(model, TrainConfig(model=model, lr=1e-4, micro_batch_tokens=256, **files), rank=rank, world_size=world)
stages["start"] = peak_mb()
ids = list(range(7, 207))
sample = Sample(ids, [0] * 100 + [1] * 100, [0.0] * 100 + [-5.0] * 100, [-1] * 100 + [0] * 100, 1.0)
trainer.train_step([sample] * world)
stages["step"] = peak_mb()
trainer.save(__import__("pathlib").Path(out))
stages["save"] = peak_mb()
dist.barrier()
settled = restart_peak()  # the resume's own peak: what loading the checkpoint adds to the trainer
trainer.load(__import__("pathlib").Path(out))
stages["resume_growth"] = peak_mb() - settled
print(json.dumps(stages))
dist.destroy_process_group()
"""


def make_checkpoint(path: Path, layers: int, hidden: int) -> int:
    """A randomly initialised Qwen3-MoE with the tiny preset's tokenizer; returns its parameter count."""
    import torch
    from transformers import AutoModelForCausalLM

    from vivace.model.checkpoint import load_tokenizer, save_checkpoint, tiny_config

    tokenizer = load_tokenizer("tiny")
    config = tiny_config(len(tokenizer), hidden_size=hidden, moe_intermediate_size=hidden, num_hidden_layers=layers,
                         num_attention_heads=hidden // 64, num_key_value_heads=4, head_dim=64)  # fmt: skip
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    save_checkpoint(model, tokenizer, path)
    return sum(p.numel() for p in model.parameters())


def source_at(rev: str, into: Path) -> Path:
    """src/ as it was at `rev`, extracted under `into` (git archive: no change to the checkout)."""
    data = subprocess.run(["git", "archive", rev, "src"], check=True, capture_output=True).stdout
    with tarfile.open(fileobj=BytesIO(data)) as tar:
        tar.extractall(into, filter="data")
    return into / "src"


def run(src: Path, model: Path, out: Path, world: int, file_mb: int) -> list[dict]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    env = {**os.environ, "PYTHONPATH": str(src)}
    procs = [subprocess.Popen([sys.executable, "-c", MEMORY_WATCH + RANK, str(r), str(world), port, str(model), str(out),
                               str(file_mb)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for r in range(world)]  # fmt: skip
    outs = [p.communicate(timeout=1800) for p in procs]
    for p, (_, err) in zip(procs, outs, strict=True):
        if p.returncode != 0:
            sys.exit(f"a rank failed:\n{err[-3000:]}")
    return [json.loads(o.strip().splitlines()[-1]) for o, _ in outs]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--old", default="913b0d2^", help="The revision to compare with.")
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument(
        "--file-mb",
        type=int,
        default=2048,
        help="train.checkpoint_file_mb where the revision has it: the largest weights file saved.",
    )
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="trainer-memory-"))
    params = make_checkpoint(tmp / "model", args.layers, args.hidden)
    weights_mb = params * 4 / 2**20
    print(f"model: {params / 1e6:.0f}M parameters, {weights_mb:.0f} MB in fp32; {args.world} ranks", flush=True)
    variants = {f"at {args.old}": source_at(args.old, tmp / "old"), "this checkout": Path(__file__).parents[1] / "src"}
    results = {}
    for name, src in variants.items():
        ranks = run(src, tmp / "model", tmp / f"saved-{len(results)}", args.world, args.file_mb)
        results[name] = [{k: round(v - (0 if k == "resume_growth" else r["imports"])) for k, v in r.items()
                          if k != "imports"} for r in ranks]  # fmt: skip
        for i, r in enumerate(results[name]):
            print(f"{name:>16}  rank {i}: peak above imports (MB) " + ", ".join(f"{k} {v}" for k, v in r.items()))
    print(json.dumps({"parameters": params, "weights_mb": round(weights_mb), "world": args.world, "ranks": results}))


if __name__ == "__main__":
    main()
