"""Which tokens a policy copies in synthetic copy rows, by token class (docs/benchmarks.md, "Where the
uncopyable tokens come from").

Teacher-forced on rows of `vivace sft copies` (a random span repeated; loss on the repeats): the share of
repeated tokens the model's greedy choice gets right, split by whether the target token's id lies in one
of `--range` (e.g. the warm start's narrow copy stage, 300:800) and by whether it is frequent in the
agent's text (at least `--min-count` times in `--text`, episodes of `vivace sft data`). On the shipped
tiny it separates sharply: tokens of the narrow stage's range that the episodes use often are copied
about a tenth of the time, every other class almost always. Seconds per model, where
`probe_copy_map.py` takes minutes.

    .venv/bin/vivace sft copies --out runs/wide_val.jsonl --n 200 --vocab 300:4000 --seed 98
    .venv/bin/vivace sft data --out runs/train400.jsonl --n 400 --styles efficient
    .venv/bin/python scripts/probe_copy_classes.py --model tiny --copies runs/wide_val.jsonl \
        --text runs/train400.jsonl --range 300:800 --json
"""

import argparse
import json
from collections import Counter
from pathlib import Path

import torch

from vivace.model.checkpoint import load_model, load_tokenizer
from vivace.rl.packing import IGNORE, Episode
from vivace.rl.sft_train import SftDataError, read_episodes


def parse_range(text: str) -> tuple[int, int]:
    lo, _, hi = text.partition(":")
    if not (lo.isdigit() and hi.isdigit() and int(lo) < int(hi)):
        raise argparse.ArgumentTypeError(f"--range wants lo:hi token ids with lo < hi, got {text!r}")
    return int(lo), int(hi)


@torch.no_grad()
def copy_accuracy(model, rows: list[Episode], classify) -> dict[str, dict[str, float]]:
    """{class: {"accuracy", "tokens"}} over the trained (repeated) tokens of `rows`."""
    right: Counter = Counter()
    total: Counter = Counter()
    for row in rows:
        greedy = model(torch.tensor([row.ids])).logits[0].argmax(-1).tolist()
        for guess, target in zip(greedy, row.labels, strict=True):
            if target != IGNORE:
                cls = classify(target)
                total[cls] += 1
                right[cls] += guess == target
    return {c: {"accuracy": round(right[c] / total[c], 3), "tokens": total[c]} for c in sorted(total)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", action="append", required=True, help="tiny or a checkpoint directory (repeat)")
    ap.add_argument("--copies", required=True, help="rows of `vivace sft copies` (ids, loss_mask)")
    ap.add_argument("--text", required=True, help="agent episodes whose token counts say which tokens are frequent")
    ap.add_argument("--range", type=parse_range, action="append", default=[], help="lo:hi id range (repeat)")
    ap.add_argument("--min-count", type=int, default=10, help="a token is frequent from this many occurrences")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", action="store_true", help="one JSON object")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    vocab = len(load_tokenizer(args.model[0]))
    try:  # the training loader's checks: a bad line stops the probe with its file, line and fix
        counts = Counter(t for row in read_episodes(Path(args.text), vocab) for t in row.ids)
        rows = read_episodes(Path(args.copies), vocab)
    except SftDataError as e:
        raise SystemExit(f"error: {e}") from None

    def classify(token: int) -> str:
        where = next((f"{lo}:{hi}" for lo, hi in args.range if lo <= token < hi), "other")
        return f"{where} {'frequent' if counts[token] >= args.min_count else 'rare'}"

    result = {spec: copy_accuracy(load_model(spec).model, rows, classify) for spec in args.model}
    if args.json:
        print(json.dumps(result))
        return
    for spec, classes in result.items():
        print(spec)
        for cls, v in classes.items():
            print(f"  {cls:<24} {v['accuracy']:.3f} of {v['tokens']} tokens")


if __name__ == "__main__":
    main()
