"""What the engine's prefix cache holds after short replies to requests that ask for most of the context.

Each of N requests is a 3-token prompt with max_tokens 8000 that ends after one token (every id stops
it), as an agent's turn does. Prints one JSON line: the entries kept, the positions the cache counts,
and the memory the entries hold. `--whole` restores the old behaviour (each entry kept its whole
allocation) for a side-by-side run: `python scripts/prefix_cache_memory.py` and `... --whole`.
"""

from __future__ import annotations

import argparse
import json
import time

from vivace.harness.policy import SamplingParams
from vivace.inference import forward
from vivace.inference.engine import Engine
from vivace.model.checkpoint import load_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=100)
    parser.add_argument("--max-tokens", type=int, default=8000)
    parser.add_argument("--whole", action="store_true", help="keep whole allocations (the old behaviour)")
    args = parser.parse_args()
    if args.whole:
        forward.KVCache.compact = lambda self: self
    model = load_model("tiny").model
    engine = Engine(model)
    every_id = tuple(range(model.config.vocab_size))
    t0 = time.perf_counter()
    for i in range(args.requests):
        engine.run([[100 + i, 7, 9]], [SamplingParams(max_tokens=args.max_tokens, stop_token_ids=every_id, seed=i)])
    entries = [cache for _, cache in engine.prefix._entries.values()]
    print(json.dumps({
        "kept": "whole allocations" if args.whole else "compact copies",
        "entries": len(entries),
        "positions_counted": engine.prefix.size,
        "held_mb": round(sum(c.nbytes() for c in entries) / 2**20, 1),
        "seconds": round(time.perf_counter() - t0, 2),
    }))  # fmt: skip


if __name__ == "__main__":
    main()
