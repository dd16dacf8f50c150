"""Which tokens a policy can copy into a path (docs/benchmarks.md, "Why the held-out count barely moves").

For each expert episode of `--data` (rows of `vivace sft data`: ids and loss_mask), the package name of
the path in the assistant's first turn (the path's tokens up to its first `/`) has its
token at `--position` replaced by a candidate X wherever the name occurs in the context; the score of
X is the probability the model gives it, teacher-forced, when it writes that token of the path. By
default the candidates are every lower-case token of 2-4 letters. The probe shows whether the copy
depends on the token: on the shipped `tiny` it does, sharply (a fifth of those tokens below 0.1, half
above 0.9), and the same held-out names (`kitchen`: `ch`; `observatory`: `ob`, `ser`) stay out of reach
before and after RL. The summary's `by_norm` bins the tokens by their embedding row's norm (relative to
the median row): on tiny the uncopyable ones are the short rows ("Where the uncopyable tokens come from";
`probe_copy_classes.py` is the quick check of the cause).

    .venv/bin/python scripts/probe_copy_map.py --model tiny --model runs/new --data runs/ws4/train_a.jsonl \
        --episodes 2 --out runs/copy_map.json
"""

import argparse
import json
import time

import torch

from vivace.model.checkpoint import load_model, load_tokenizer
from vivace.rl.copying import argument_values

QUANTILES = (0.05, 0.1, 0.2, 0.3, 0.5, 0.75)
# embedding row norm as a share of the vocabulary's median row norm: the bins of the summary's `by_norm`
NORM_BINS = ((0.0, 0.5), (0.5, 0.65), (0.65, float("inf")))


def by_norm(model, per_token: dict[int, list[float]]) -> dict[str, dict[str, float]]:
    """The candidates binned by their (tied) embedding row's norm relative to the median row: how many,
    and the share copied with probability below 0.1. On the shipped tiny, every token under half the
    median norm is uncopyable and almost none above 0.65 of it (they are the narrow copy stage's ids
    that the text uses often, not untrained ones)."""
    norms = model.get_input_embeddings().weight.detach().float().norm(dim=1)
    rel = norms / norms.median()
    out = {}
    for lo, hi in NORM_BINS:
        ps = [sum(v) / len(v) for x, v in per_token.items() if lo <= rel[x] < hi]
        out[f"{lo}-{hi}"] = {
            "tokens": len(ps),
            "below_0.1": round(sum(p < 0.1 for p in ps) / len(ps), 3) if ps else None,
        }
    return out


def name_sites(data: str, tok, position: int, n: int) -> list[tuple[str, list[int], list[int]]]:
    """(task id, context up to the path's first token, the package name's ids) for the first `n`
    tasks whose first assistant turn writes a path with a package of more than `position` tokens."""
    seen, sites = set(), []
    with open(data) as rows:
        for line in rows:
            row = json.loads(line)
            if row["task_id"] in seen:
                continue
            ids, mask = row["ids"], row["loss_mask"]
            first, last = next(((s, e) for _, s, e in argument_values(ids, mask, tok.decode)), (0, -1))
            cut = next((j for j in range(first, last + 1) if tok.decode([ids[j]]).startswith("/")), None)
            # the first turn's path: no context token between the turn's start and the value
            if cut is not None and cut - first > position and 0 not in mask[mask.index(1) : first]:
                seen.add(row["task_id"])
                sites.append((row["task_id"], ids[:first], ids[first:cut]))
            if len(sites) == n:
                break
    return sites


@torch.no_grad()
def copy_probabilities(model, ctx: list[int], name: list[int], position: int, candidates: list[int], batch: int):
    """P(X) at the name's `position` with X put in its place wherever the name occurs in `ctx`."""
    where = [a for a in range(len(ctx) - len(name) + 1) if ctx[a : a + len(name)] == name]
    out = []
    for i in range(0, len(candidates), batch):
        rows = []
        for x in candidates[i : i + batch]:
            c = list(ctx)
            for a in where:
                c[a + position] = x
            rows.append(c + name[:position])
        probs = torch.softmax(model(torch.tensor(rows)).logits[:, -1].float(), -1)
        out += [probs[j, x].item() for j, x in enumerate(candidates[i : i + batch])]
    return out, len(where)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", action="append", required=True, help="tiny or a checkpoint directory (repeat)")
    ap.add_argument("--data", required=True, help="expert episodes (JSONL with ids and loss_mask)")
    ap.add_argument("--episodes", type=int, default=1, help="distinct tasks to probe in")
    ap.add_argument("--position", type=int, default=1, help="which token of the package name to replace (0: the first)")
    ap.add_argument("--tokens", help="JSON list of candidate token ids (default: lower-case tokens of 2-4 letters)")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", help="write {model: {token: [P per episode]}} here")
    ap.add_argument("--json", action="store_true", help="print the summary as JSON")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    tok = load_tokenizer(args.model[0])
    if args.tokens:
        candidates = json.load(open(args.tokens))
    else:
        candidates = [
            i for i in range(len(tok)) if (s := tok.decode([i])).isalpha() and s.islower() and 2 <= len(s) <= 4
        ]
    sites = name_sites(args.data, tok, args.position, args.episodes)
    if not sites:
        raise SystemExit(f"no episode in {args.data} names a path with more than {args.position} name tokens")
    maps, summary = {}, {}
    for spec in args.model:
        model = load_model(spec).model
        per_token: dict[int, list[float]] = {x: [] for x in candidates}
        for task_id, ctx, name in sites:
            t0 = time.monotonic()
            probs, n = copy_probabilities(model, ctx, name, args.position, candidates, args.batch)
            for x, p in zip(candidates, probs, strict=True):
                per_token[x].append(p)
            pieces = [tok.decode([t]) for t in name]
            print(f"{spec}: {task_id} {pieces} ({n} in context), {time.monotonic() - t0:.0f} s", flush=True)
        means = sorted(sum(v) / len(v) for v in per_token.values())
        summary[spec] = {
            "tokens": len(means),
            "quantiles": {q: round(means[int(q * (len(means) - 1))], 3) for q in QUANTILES},
            "below_0.01": round(sum(p < 0.01 for p in means) / len(means), 3),
            "below_0.1": round(sum(p < 0.1 for p in means) / len(means), 3),
            "lowest": [tok.decode([x]) for x in sorted(per_token, key=lambda x: sum(per_token[x]))[:30]],
            "by_norm": by_norm(model, per_token),
        }
        maps[spec] = {f"{tok.decode([x])}#{x}": v for x, v in per_token.items()}
    if args.out:
        json.dump(maps, open(args.out, "w"))
    print(json.dumps(summary, indent=None if args.json else 2))


if __name__ == "__main__":
    main()
