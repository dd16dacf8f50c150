"""How well a policy copies a package name, piece by piece (docs/benchmarks.md, attempt 12).

For each episode of a probe file (`vivace sft augment --cut retry …`), the trained read_file call's
path is scored token by token up to its first `/` (the package name's pieces), teacher-forced: the
greedy choice right or not. `vivace sft eval` gives the first token and the whole path; this shows
the per-piece copy rate those two hide. With `--targets` (training JSONL files), the pieces are also
split by how often each occurs as a training target (loss_mask 1), and the pieces after the first by
how many different tokens follow the token before them in the context (1: a plain copy's easy case).

    .venv/bin/python scripts/probe_name_pieces.py tiny runs/ws3/probe_retry.jsonl,runs/ws3/probe_retry_letters.jsonl \
        --targets runs/ws3/train_a.jsonl
"""

import argparse
import json
from collections import Counter, defaultdict
from pathlib import Path

import torch

from vivace.model.checkpoint import load_model
from vivace.rl.sft_train import argument_spans, read_episodes


def target_counts(files: list[str]) -> Counter:
    counts: Counter = Counter()
    for f in files:
        with open(f) as rows:
            for line in rows:
                row = json.loads(line)
                mask = row.get("loss_mask") or [1] * len(row["ids"])
                counts.update(i for i, m in zip(row["ids"], mask, strict=True) if m)
    return counts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", help="tiny or a checkpoint directory")
    ap.add_argument("probes", help="probe JSONL files, comma-separated")
    ap.add_argument("--targets", default="", help="training JSONL files, comma-separated (optional)")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    loaded = load_model(args.model)
    model, tok = loaded.model, loaded.tokenizer
    counts = target_counts([f for f in args.targets.split(",") if f]) if args.targets else None
    by_count: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    by_followers: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for f in args.probes.split(","):
        episodes = read_episodes(Path(f), len(tok))
        right = n = 0
        for e, spans in zip(episodes, argument_spans(episodes, tok.decode), strict=True):
            with torch.no_grad():
                logits = model(torch.tensor([e.ids])).logits[0]
            for arg, first, last in spans:
                if arg != "path":
                    continue
                context = e.ids[:first]
                for j in range(first, last + 1):
                    if tok.decode([e.ids[j]]).startswith("/"):
                        break
                    ok = int(logits[j - 1].argmax().item() == e.ids[j])
                    n, right = n + 1, right + ok
                    if counts is not None:
                        c = counts[e.ids[j]]
                        key = "fewer than 100" if c < 100 else "100-999" if c < 1000 else "1000 or more"
                        by_count[key][0] += ok
                        by_count[key][1] += 1
                    if j > first:
                        prev = e.ids[j - 1]
                        followers = {context[i + 1] for i in range(len(context) - 1) if context[i] == prev}
                        key = "0-1" if len(followers) <= 1 else "2-4" if len(followers) <= 4 else "5+"
                        by_followers[key][0] += ok
                        by_followers[key][1] += 1
        print(f"{args.model} {Path(f).name}: name pieces right {right}/{n} = {right / max(n, 1):.3f}")
    for title, table in (("times the piece is a training target", by_count),
                         ("different followers of the token before it", by_followers)):  # fmt: skip
        for key in sorted(table):
            r, k = table[key]
            print(f"  {title}: {key}: {r}/{k} = {r / k:.2f}")


if __name__ == "__main__":
    main()
