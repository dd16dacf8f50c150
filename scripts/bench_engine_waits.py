"""Engine: how long a caller on the event loop waits to submit a request, to read `load()` and to update
the weights while the engine decodes (8 sequences at a long prompt), for this checkout's AsyncEngine and
for the one of an earlier revision, in one process, alternating, two runs each.

    .venv/bin/python scripts/bench_engine_waits.py [--old 5d2c1e4^]

Before 5d2c1e4 all three took the lock the engine thread holds through every step and retakes at once,
so a caller could wait out several steps; since, requests go through an inbox and `load()` does not wait.
Before 35323c3 a weight update still did (`--old 35323c3^`); since, the loop yields to it at the next
step boundary. Prints each run and the results as JSON (docs/benchmarks.md, "The engine's submissions do
not wait for its steps").
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from vivace.config import EngineConfig
from vivace.harness.policy import SamplingParams
from vivace.inference import engine as current
from vivace.inference.samplers import load_for_engine


def engine_module_at(rev: str):
    """inference/engine.py as it was at `rev`, imported beside the current one."""
    source = subprocess.run(["git", "show", f"{rev}:src/vivace/inference/engine.py"], check=True,
                            capture_output=True, text=True).stdout  # fmt: skip
    path = Path(tempfile.mkdtemp()) / "engine_at_rev.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("engine_at_rev", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["engine_at_rev"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


async def measure(module, model, prompt: list[int], calls: int = 40) -> dict:
    engine = module.AsyncEngine(module.Engine(model, max_batch=16, max_step_tokens=2048, seed=0))
    busy = [asyncio.ensure_future(engine.generate(prompt, SamplingParams(temperature=1.0, max_tokens=400, seed=i)))
            for i in range(8)]  # fmt: skip
    await asyncio.sleep(1.0)  # all decoding
    state = {k: v.clone() for k, v in model.state_dict().items()}  # the same values: the samples do not change
    submit, load, extra, update, update_steps = [], [], [], [], []
    for i in range(calls):
        t = time.perf_counter()
        engine.load()
        load.append(time.perf_counter() - t)
        t = time.perf_counter()
        params = SamplingParams(temperature=1.0, max_tokens=1, seed=100 + i)
        extra.append(asyncio.ensure_future(engine.generate(prompt[:50], params)))
        await asyncio.sleep(0)  # generate's first step submits, on this loop
        submit.append(time.perf_counter() - t)
        await asyncio.sleep(0.025)
        steps, t = engine.engine.stats.steps, time.perf_counter()
        engine.update_weights(state)  # on the event loop, as an in-process trainer's sync calls it
        update.append(time.perf_counter() - t)
        update_steps.append(engine.engine.stats.steps - steps)
        await asyncio.sleep(0.025)
    await asyncio.gather(*busy, *extra)
    engine.close()

    def summary(xs: list[float]) -> dict:
        return {"median_ms": round(1e3 * statistics.median(xs), 2), "max_ms": round(1e3 * max(xs), 1),
                "over_10ms": sum(x > 0.01 for x in xs)}  # fmt: skip

    return {
        "calls": calls,
        "submit": summary(submit),
        "load": summary(load),
        "update": summary(update),
        "update_steps_waited": {"median": statistics.median(update_steps), "max": max(update_steps)},
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--old", default="5d2c1e4^", help="The revision to compare with.")
    args = parser.parse_args()
    old = engine_module_at(args.old)
    loaded = load_for_engine("tiny", EngineConfig(device="cpu"))
    prompt = loaded.tokenizer.encode("def add(a, b):\n    return a + b\n" * 60)
    results: dict[str, list[dict]] = {f"at {args.old}": [], "this checkout": []}
    for _ in range(2):
        for name, module in ((f"at {args.old}", old), ("this checkout", current)):
            result = await measure(module, loaded.model, prompt)
            print(name, result, file=sys.stderr)
            results[name].append(result)
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    asyncio.run(main())
