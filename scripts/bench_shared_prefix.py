"""Engine: 16 requests opened together as an RL step opens them (one 2,700-token system turn, then
one of four 200-token requests, four rollouts each; 40 tokens each), with and without sharing the
prefix among running sequences; three runs each, alternating. Prints each run and, as JSON, the
medians (docs/benchmarks.md, "Requests that arrive together share their common prefix")."""

from __future__ import annotations

import json
import time

import torch

from vivace.harness.policy import SamplingParams
from vivace.inference.engine import Engine
from vivace.model.checkpoint import load_model


def main() -> None:
    torch.set_num_threads(2)
    model = load_model("tiny").model.eval()
    g = torch.Generator().manual_seed(0)
    system = torch.randint(10, 2000, (2700,), generator=g).tolist()
    requests = [torch.randint(10, 2000, (200,), generator=g).tolist() for _ in range(4)]
    prompts = [system + requests[i // 4] for i in range(16)]
    params = [SamplingParams(max_tokens=40, seed=i) for i in range(16)]
    walls: dict[str, list[float]] = {}
    for run in range(3):
        for name, min_shared in (("shared", 64), ("separate", 10**9)):
            engine = Engine(model, max_batch=16, min_shared_prefix=min_shared)
            t0 = time.perf_counter()
            engine.run(prompts, params)
            walls.setdefault(name, []).append(time.perf_counter() - t0)
            stats = engine.stats
            print(
                f"run {run} {name}: {walls[name][-1]:.2f} s, prefill {stats.prefill_tokens}, reused {stats.reused_tokens}"
            )
    print(json.dumps({name: sorted(w)[len(w) // 2] for name, w in walls.items()}))


if __name__ == "__main__":
    main()
