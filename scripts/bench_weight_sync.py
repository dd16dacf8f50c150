"""The broadcast weight sync's memory and time: two FSDP2 trainer ranks (gloo, CPU) send their weights to
one receiver, the whole state gathered on rank 0 first (`gathered`: how the sync worked before) and one
tensor at a time as the ranks gather it (`streamed`: Trainer.full_tensors), alternating in one run. With
`--store`, the object-store sync: the whole state put as one object (`whole`: before) against pieces put as
the ranks gather them (`pieces`: _TrainerActor.weights); a replica fetches the whole model either way.

    .venv/bin/python scripts/bench_weight_sync.py [--layers 12] [--hidden 768] [--rounds 3] [--repeats 2] [--store [--piece-mb 256]]

Each mode runs in fresh processes (freed memory stays resident, so one mode would hide the other's peak),
the modes alternating. Prints each process's peak anonymous resident memory above what it held before its
first sync (sampled every 5 ms) and a sync's seconds, medians over the repeats, and the results as JSON
(docs/benchmarks.md, "The weight sync's memory").
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from bench_trainer_memory import MEMORY_WATCH, make_checkpoint  # noqa: E402

COMMON = r"""
import torch, torch.distributed as dist
rank, model, trainer_port, sync_port = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
mode, rounds = sys.argv[5], int(sys.argv[6])
torch.set_num_threads(1)
from vivace.rl.weight_sync import WeightBroadcast
def measure(sync):  # the process's peak above what it held before its first sync, and each sync's seconds
    time.sleep(0.05)
    base, seconds = restart_peak(), []  # the watch's mark so far is the start-up's (rank 0 read the checkpoint whole)
    for _ in range(rounds):
        t0 = time.perf_counter()
        sync()
        seconds.append(time.perf_counter() - t0)
    time.sleep(0.05)
    print(json.dumps({"above_mb": max(high[0], anon_mb()) - base, "seconds": seconds}), flush=True)
"""

TRAINER = r"""
os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", trainer_port
from vivace.config import TrainConfig
from vivace.rl.trainer import Trainer
trainer = Trainer(model, TrainConfig(model=model), rank=rank, world_size=2)
group = WeightBroadcast(f"127.0.0.1:{sync_port}", 0, 2) if rank == 0 else None
def gathered():
    state = trainer.full_state_dict()  # the whole model on rank 0's host
    return group.send(state) if rank == 0 else 0
def streamed():
    tensors = trainer.full_tensors()
    if rank == 0:
        return group.send(tensors)
    return sum(0 for _ in tensors)
dist.barrier()
measure(gathered if mode == "gathered" else streamed)
dist.barrier()
dist.destroy_process_group()
"""

RECEIVER = r"""
from vivace.model.checkpoint import load_model
engine_model = load_model(model).model
params = {**dict(engine_model.named_parameters(remove_duplicate=False)), **dict(engine_model.named_buffers())}
group = WeightBroadcast(f"127.0.0.1:{sync_port}", 1, 2)
names = sorted(engine_model.state_dict())
with torch.no_grad():
    measure(lambda: group.receive(names, params))
"""

# --store: the object-store sync instead. Rank 0 starts a local Ray and puts the weights; what a replica then
# fetches is the whole model either way, so only the trainer ranks are measured.
STORE = r"""
os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", trainer_port
import ray
from vivace.config import TrainConfig
from vivace.rl.trainer import Trainer
from vivace.rl.workers import _TrainerActor
trainer = Trainer(model, TrainConfig(model=model), rank=rank, world_size=2)
if rank == 0:
    ray.init(num_cpus=1, include_dashboard=False, object_store_memory=4 << 30, log_to_driver=False)
actor = _TrainerActor.__new__(_TrainerActor)  # the actor's code, in this process
actor.trainer = trainer
def whole():  # before: the whole state on rank 0's host, put as one object
    state = trainer.full_state_dict()
    return ray.put(state) if rank == 0 else None
def pieces():  # now: put a piece at a time as the ranks gather the tensors
    return actor.weights(int(os.environ["PIECE_MB"]) << 20)
dist.barrier()
measure(whole if mode == "whole" else pieces)
dist.barrier()
dist.destroy_process_group()
"""

PROCESSES = ("trainer rank 0", "trainer rank 1", "receiver")
STORE_MODES = ("whole", "pieces")


def run(model: Path, mode: str, rounds: int) -> dict[str, dict]:
    """One fresh set of processes syncing `rounds` times in `mode`: each process's measurement."""
    ports = [free_port(), free_port()]
    scripts = [STORE, STORE] if mode in STORE_MODES else [TRAINER, TRAINER, RECEIVER]
    procs = [subprocess.Popen([sys.executable, "-c", MEMORY_WATCH + COMMON + script, str(rank), str(model), *ports,
                               mode, str(rounds)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for rank, script in zip((0, 1, 1), scripts, strict=False)]  # fmt: skip
    outs = [p.communicate(timeout=1800) for p in procs]
    for p, (_, err) in zip(procs, outs, strict=True):
        if p.returncode != 0:
            sys.exit(f"a process failed:\n{err[-3000:]}")
    return {name: json.loads(out.strip().splitlines()[-1]) for name, (out, _) in zip(PROCESSES, outs, strict=False)}


def free_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--rounds", type=int, default=3, help="Syncs per process.")
    parser.add_argument("--repeats", type=int, default=2, help="Fresh processes per mode.")
    parser.add_argument("--piece-mb", type=int, default=256, help="--store: the pieces' size (the sync's is 256).")
    parser.add_argument("--store", action="store_true", help="The object-store sync: the whole state put at once "
                        "against pieces put as the ranks gather them (rl/workers.py, _TrainerActor.weights).")  # fmt: skip
    args = parser.parse_args()
    os.environ["PIECE_MB"] = str(args.piece_mb)  # read by the ranks' processes
    modes = STORE_MODES if args.store else ("gathered", "streamed")
    tmp = Path(tempfile.mkdtemp(prefix="weight-sync-"))
    params = make_checkpoint(tmp / "model", args.layers, args.hidden)
    weights_mb = params * 4 / 2**20
    who = "the object store" if args.store else "1 receiver"
    print(f"model: {params / 1e6:.0f}M parameters, {weights_mb:.0f} MB in fp32; 2 trainer ranks, {who}", flush=True)
    results: dict[str, dict[str, list]] = {name: {mode: [] for mode in modes} for name in PROCESSES}
    for i in range(args.repeats):  # the modes alternate, each in fresh processes
        for mode in modes[:: 1 if i % 2 == 0 else -1]:
            for name, got in run(tmp / "model", mode, args.rounds).items():
                results[name][mode].append(got)
    summary = {}
    for name, row in results.items():
        if not row[modes[0]]:
            continue  # the receiver, with --store
        summary[name] = {mode: {"peak_above_mb": round(statistics.median(r["above_mb"] for r in runs)),
                                "median_s": round(statistics.median(s for r in runs for s in r["seconds"]), 3)}
                         for mode, runs in row.items()}  # fmt: skip
        (a, b), (g, s) = modes, (summary[name][m] for m in modes)
        print(f"{name:>15}: peak above its start (MB) {a} {g['peak_above_mb']}, {b} "
              f"{s['peak_above_mb']}; seconds a sync {a} {g['median_s']}, {b} {s['median_s']}")  # fmt: skip
    print(json.dumps({"parameters": params, "weights_mb": round(weights_mb), "rounds": args.rounds,
                      "repeats": args.repeats, **summary}))  # fmt: skip


if __name__ == "__main__":
    main()
