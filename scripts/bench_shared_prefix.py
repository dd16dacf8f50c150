"""Engine: 16 requests opened together as an RL step opens them (one 2,700-token system turn, then
one of four 200-token requests, four rollouts each), three ways, three runs each, alternating:

- `shared, read once`: the common prefix is prefilled once and copied, and decoding sequences read
  it once per step (cascade attention, inference/forward.py) — the engine's default on CPU;
- `shared, read per sequence`: prefilled once and copied, but every sequence attends over its own
  copy — the engine's default on other devices;
- `separate`: every request prefills its whole prompt (no sharing among running sequences).

    .venv/bin/python scripts/bench_shared_prefix.py [--max-tokens 40] [--device cuda]

On a GPU it also checks that the two ways of reading the prefix pick the same greedy tokens.

Prints each run and, as JSON, the medians (docs/benchmarks.md, "Requests that arrive together share
their common prefix" and "Decoding reads a shared prefix once").
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from vivace.harness.policy import SamplingParams
from vivace.inference import forward
from vivace.inference.engine import Engine
from vivace.model.checkpoint import load_model

ARMS = {  # name: (Engine's min_shared_prefix, cascade attention on)
    "shared, read once": (64, True),
    "shared, read per sequence": (64, False),
    "separate": (10**9, False),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-tokens", type=int, default=40, help="Tokens generated per request.")
    parser.add_argument("--device", default="cpu", help="Where the model runs (cpu, cuda).")
    args = parser.parse_args()
    torch.set_num_threads(2)
    device = torch.device(args.device)
    model = load_model("tiny").model.eval().to(device)
    g = torch.Generator().manual_seed(0)
    system = torch.randint(10, 2000, (2700,), generator=g).tolist()
    requests = [torch.randint(10, 2000, (200,), generator=g).tolist() for _ in range(4)]
    prompts = [system + requests[i // 4] for i in range(16)]
    params = [SamplingParams(max_tokens=args.max_tokens, seed=i) for i in range(16)]
    walls: dict[str, list[float]] = {}
    for run in range(3):
        for name, (min_shared, cascade) in ARMS.items():
            forward.CASCADE_DEVICE_TYPES = {device.type} if cascade else set()
            engine = Engine(model, max_batch=16, min_shared_prefix=min_shared)
            t0 = time.perf_counter()
            engine.run(prompts, params)
            if device.type == "cuda":
                torch.cuda.synchronize()
            walls.setdefault(name, []).append(time.perf_counter() - t0)
            stats = engine.stats
            print(
                f"run {run} {name}: {walls[name][-1]:.2f} s, prefill {stats.prefill_tokens}, reused {stats.reused_tokens}"
            )
    medians = {name: round(sorted(w)[len(w) // 2], 3) for name, w in walls.items()}
    if device.type != "cpu":
        greedy = [SamplingParams(max_tokens=args.max_tokens, temperature=0.0) for _ in range(16)]
        tokens = {}
        for cascade in (True, False):
            forward.CASCADE_DEVICE_TYPES = {device.type} if cascade else set()
            tokens[cascade] = [r.token_ids for r in Engine(model, max_batch=16).run(prompts, greedy)]
        same = sum(a == b for a, b in zip(tokens[True], tokens[False], strict=True))
        medians["greedy sequences identical, read once vs per sequence"] = f"{same}/16"
    print(json.dumps(medians))


if __name__ == "__main__":
    main()
