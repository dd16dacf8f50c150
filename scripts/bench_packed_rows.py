"""Training throughput of packed rows by row length: `packed` attention (segments of similar length
in one padded call) against one attention call per episode, on rows of short copy sequences.

    python scripts/bench_packed_rows.py [--rows 8192,32768,131072] [--json]

Runs on the GPU when torch sees one (bf16 autocast, as `vivace sft train` does), else on the CPU.
docs/benchmarks.md (attempt 10) has the H200 numbers."""

from __future__ import annotations

import argparse
import itertools
import json
import random
import time

import torch
import torch.nn.functional as F
from transformers import AttentionInterface

from vivace.model.checkpoint import load_model
from vivace.rl.copying import copy_sequences
from vivace.rl.packing import PACKED, forward_row, make_episode, pack_episodes


def per_episode(module, query, key, value, attention_mask, scaling=None, cu_seq_lens_q=None, **kwargs):
    """The reference: one causal attention call per packed segment (no shared prefix)."""
    groups = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(groups, 1), value.repeat_interleave(groups, 1)
    bounds = cu_seq_lens_q.tolist()
    parts = [F.scaled_dot_product_attention(query[:, :, a:b], key[:, :, a:b], value[:, :, a:b], is_causal=True,
                                            scale=scaling) for a, b in itertools.pairwise(bounds)]  # fmt: skip
    return torch.cat(parts, 2).transpose(1, 2).contiguous(), None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="8192,32768,131072", help="Row lengths in tokens, comma-separated.")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    AttentionInterface.register("per_episode", per_episode)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    model = load_model("tiny").model.to(dev).train()
    episodes = [make_episode(r["ids"], r["loss_mask"]) for r in copy_sequences(4000, (300, 800), 0)]
    results = []
    for seq in (int(x) for x in args.rows.split(",")):
        row = [episodes[i] for i in pack_episodes(episodes, seq, random.Random(0))[0][0]]
        tokens = sum(len(e.ids) for e in row)
        line = {"device": dev, "row_tokens": tokens, "episodes": len(row)}
        for impl in (PACKED, "per_episode"):
            model.set_attn_implementation(impl)
            times = []
            for _ in range(args.repeats + 1):  # the first is a warm-up
                if dev == "cuda":
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
                with torch.autocast("cuda", dtype=torch.bfloat16, enabled=dev == "cuda"):
                    out, labels = forward_row(model, row, trained_only=True)
                F.cross_entropy(out.logits[0].float(), labels).backward()
                if dev == "cuda":
                    torch.cuda.synchronize()
                times.append(time.perf_counter() - t0)
            line[f"{impl}_tok_s"] = round(tokens / min(times[1:]))
        line["ratio"] = round(line[f"{PACKED}_tok_s"] / line["per_episode_tok_s"], 2)
        results.append(line)
        print(json.dumps(line) if args.json else "  ".join(f"{k} {v}" for k, v in line.items()), flush=True)


if __name__ == "__main__":
    main()
