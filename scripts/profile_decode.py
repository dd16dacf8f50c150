"""Where the engine's decode step spends its time: step time at 1, 16 and 64 sequences (each with a
2,700-token shared system turn and its own 200 tokens, all prefilled first), then a profile of 20
steps at 16 sequences (the top operators by self CPU time, kernel launches per step and device time
per step on a GPU).

    .venv/bin/python scripts/profile_decode.py [--device cuda] [--dtype bfloat16] [--greedy-out FILE]

`--greedy-out` also writes the greedy tokens of 16 requests (100 each), to compare two versions of the
engine's code token for token (docs/benchmarks.md, "The engine's decode step on a GPU").
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from torch.profiler import ProfilerActivity, profile

from vivace.harness.policy import SamplingParams
from vivace.inference.engine import Engine
from vivace.model.checkpoint import load_model

LAUNCHES = ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernelEx")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu", help="Where the model runs (cpu, cuda).")
    parser.add_argument("--dtype", default="float32", help="The model's dtype (float32 as shipped, bfloat16).")
    parser.add_argument("--greedy-out", help="Write 16 requests' greedy tokens here (JSON).")
    args = parser.parse_args()
    torch.set_num_threads(2)
    device = torch.device(args.device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    model = load_model("tiny").model.eval().to(device, getattr(torch, args.dtype))
    g = torch.Generator().manual_seed(0)
    system = torch.randint(10, 2000, (2700,), generator=g).tolist()

    def decoding(batch: int) -> Engine:
        """An engine whose `batch` sequences have all finished their prompts and decode from here on."""
        engine = Engine(model, max_batch=batch)
        for i in range(batch):
            prompt = system + torch.randint(10, 2000, (200,), generator=g).tolist()
            engine.add(prompt, SamplingParams(max_tokens=400, seed=i))
        while engine.waiting or any(r.cache is None or r.cache.length < len(r.prompt) for r in engine.running):
            engine.step()
        for _ in range(5):
            engine.step()
        return engine

    report = {}
    for batch in (1, 16, 64):
        engine = decoding(batch)
        sync()
        t0 = time.perf_counter()
        for _ in range(50):
            engine.step()
        sync()
        report[f"decode_step_ms_batch_{batch}"] = round((time.perf_counter() - t0) / 50 * 1e3, 2)
        print(f"batch {batch}: decode step {report[f'decode_step_ms_batch_{batch}']} ms", flush=True)

    engine = decoding(16)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        for _ in range(20):
            engine.step()
        sync()
    ops = prof.key_averages()
    print(ops.table(sort_by="self_cpu_time_total", row_limit=20, max_name_column_width=60))
    if device.type == "cuda":
        report["kernel_launches_per_step_batch_16"] = sum(k.count for k in ops if k.key in LAUNCHES) / 20
        report["device_ms_per_step_batch_16"] = round(sum(k.self_device_time_total for k in ops) / 20 / 1e3, 2)

    if args.greedy_out:
        prompts = [system + torch.randint(10, 2000, (200,), generator=g).tolist() for _ in range(16)]
        done = Engine(model, max_batch=16).run(prompts, SamplingParams(max_tokens=100, temperature=0.0))
        with open(args.greedy_out, "w") as f:
            json.dump([r.token_ids for r in done], f)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
