"""`vivace serve bench`: the engine against transformers' `generate`, same model, same workload.

The workload is mixed-length, as agent traffic is: prompt lengths and output lengths drawn
log-uniformly (seeded), so some requests want 16 tokens and others 256. Both sides generate
exactly the requested number of tokens per request (no stop tokens), at temperature 1:

- engine: every request submitted at once; continuous batching (at most `max_batch` running);
- transformers: the same requests in arrival order, in static batches of `max_batch`, left-padded,
  each batch running to its longest request (`generate` has one `max_new_tokens` per call),
  which is how a batch-at-a-time server uses it.

Throughput counts only requested tokens. Per-token latency is a request's generation time divided
by its tokens (engine: from its first to its last token; transformers: its batch's time divided
by the batch's longest output, as every step yields one token per row).
"""

from __future__ import annotations

import math
import random
import statistics
import time
from collections.abc import Callable

import torch

from vivace.harness.policy import SamplingParams
from vivace.inference.engine import Engine


def workload(
    n: int, vocab: int, seed: int, prompt_range=(16, 512), output_range=(16, 256)
) -> list[tuple[list[int], int]]:
    rng = random.Random(seed)

    def log_uniform(lo: int, hi: int) -> int:
        return int(round(math.exp(rng.uniform(math.log(lo), math.log(hi)))))

    return [
        ([rng.randrange(vocab) for _ in range(log_uniform(*prompt_range))], log_uniform(*output_range))
        for _ in range(n)
    ]


def bench_engine(model, requests, max_batch: int, max_step_tokens: int = 2048) -> dict:
    engine = Engine(model, max_batch=max_batch, max_step_tokens=max_step_tokens, prefix_cache_tokens=0)
    stamps: dict[int, list[float]] = {}
    reqs = []
    t0 = time.perf_counter()
    for i, (prompt, n_out) in enumerate(requests):
        stamp = stamps.setdefault(i, [])
        reqs.append(
            engine.add(
                prompt, SamplingParams(max_tokens=n_out, seed=i), lambda t, lp, s=stamp: s.append(time.perf_counter())
            )
        )
    while engine.has_work:
        engine.step()
    wall = time.perf_counter() - t0
    tokens = sum(len(r.output) for r in reqs)
    per_token = [(s[-1] - s[0]) / (len(s) - 1) for s in stamps.values() if len(s) > 1]
    return _summary(tokens, wall, per_token, engine.stats.batch_sum / engine.stats.steps / max_batch)


@torch.inference_mode()
def bench_generate(model, requests, max_batch: int, pad_id: int) -> dict:
    tokens, per_token, occupancy = 0, [], []
    t0 = time.perf_counter()
    for b in range(0, len(requests), max_batch):
        batch = requests[b : b + max_batch]
        width = max(len(p) for p, _ in batch)
        ids = torch.tensor([[pad_id] * (width - len(p)) + p for p, _ in batch])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p, _ in batch])
        longest = max(n for _, n in batch)
        tb = time.perf_counter()
        out = model.generate(
            input_ids=ids, attention_mask=mask, max_new_tokens=longest, min_new_tokens=longest, do_sample=True,
            temperature=1.0, top_p=1.0, top_k=0, pad_token_id=pad_id, eos_token_id=None,
        )  # fmt: skip
        dt = time.perf_counter() - tb
        assert out.shape[1] == width + longest
        tokens += sum(n for _, n in batch)
        per_token += [dt / longest] * len(batch)
        occupancy.append(sum(n for _, n in batch) / (longest * max_batch))
    return _summary(tokens, time.perf_counter() - t0, per_token, statistics.mean(occupancy))


def _summary(tokens: int, wall: float, per_token: list[float], occupancy: float) -> dict:
    per_token = sorted(per_token)
    return {
        "tokens": tokens,
        "wall_s": round(wall, 3),
        "tokens_per_s": round(tokens / wall, 1),
        "ms_per_token_p50": round(1000 * statistics.median(per_token), 2),
        "ms_per_token_p90": round(1000 * per_token[int(0.9 * (len(per_token) - 1))], 2),
        "batch_occupancy": round(occupancy, 3),
    }


def run(model, n: int = 64, max_batch: int = 16, seed: int = 0, pad_id: int = 0,
        progress: Callable[[str], None] = lambda _: None) -> dict:  # fmt: skip
    """Both sides on one workload, engine first; returns their numbers and the ratio."""
    requests = workload(n, model.config.vocab_size, seed)
    torch.manual_seed(seed)
    progress("engine")
    engine = bench_engine(model, requests, max_batch)
    progress("transformers generate")
    hf = bench_generate(model, requests, max_batch, pad_id)
    return {
        "requests": n,
        "max_batch": max_batch,
        "prompt_tokens": sum(len(p) for p, _ in requests),
        "threads": torch.get_num_threads(),
        "engine": engine,
        "transformers_generate": hf,
        "throughput_ratio": round(engine["tokens_per_s"] / hf["tokens_per_s"], 2),
    }
