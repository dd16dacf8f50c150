"""The tokens a policy cannot copy, and package names built around them: the inputs of the copy repair
(scripts/repair_copy.sh; docs/benchmarks.md, "A copy repair on 2 cores").

The uncopyable tokens are short embedding rows ("Where the uncopyable tokens come from"): lower-case
pieces of 2-5 letters whose row norm is under `--below` (absolute; the shipped tiny's median row is
~1.4). Each gets up to `--per-token` names that a tokenizer splits back into exactly a copyable piece
(row norm at least `--copyable`), the short one, and often one more piece, with the short one first,
second or last (`--positions any`; `kit` + `ch` + `en` is the shape of `kitchen`, `ob` + `ser` + … of
`observatory`). No name is a word of a validation or test theme, so nothing held out is trained.

    .venv/bin/python scripts/copy_repair_names.py --model tiny --rows runs/repair/rows.json \
        --names runs/repair/names.txt --seed 0
"""

import argparse
import json
import keyword
import random
import re

from vivace.model.checkpoint import load_model
from vivace.rl.sft_augment import held_out_words

PIECE = re.compile(r"[a-z]{2,5}")


def piece_norms(model, tokenizer) -> dict[int, float]:
    """The embedding row norm of every lower-case piece of 2-5 letters."""
    norms = model.get_input_embeddings().weight.detach().float().norm(dim=1).tolist()
    return {i: n for i, n in enumerate(norms) if PIECE.fullmatch(tokenizer.convert_ids_to_tokens(i) or "")}


def names_around(
    tokenizer, rows: list[int], copyable: list[int], per_token: int, rng: random.Random, positions: str = "any"
) -> list[str]:
    held_out = held_out_words()
    piece = tokenizer.convert_ids_to_tokens
    names: list[str] = []
    for i in rows:
        made = 0
        for _ in range(200):
            # The short piece first ("ob" + "ject"), second ("kit" + "ch" + "en") or last: a path's
            # first token follows a quote, the others follow a piece, and each is a different copy.
            other = [piece(rng.choice(copyable)), piece(rng.choice(copyable + rows)) if rng.random() < 0.7 else ""]
            position = rng.randrange(3) if positions == "any" else 1
            name = "".join([*other[:position], piece(i), *other[position:]])
            ids = tokenizer.encode(name, add_special_tokens=False)
            if (i in ids and name.isidentifier() and not keyword.iskeyword(name) and name not in names
                    and name not in held_out):  # fmt: skip
                names.append(name)
                made += 1
                if made == per_token:
                    break
    return names


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--rows", required=True, help="write the short rows' token ids here (JSON list)")
    ap.add_argument("--names", required=True, help="write the names here, one per line")
    ap.add_argument("--below", type=float, default=1.0, help="a row shorter than this is a short row")
    ap.add_argument("--copyable", type=float, default=1.2, help="a row at least this long is copyable")
    ap.add_argument("--per-token", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--positions",
        choices=("any", "second"),
        default="any",
        help="where the short piece goes in a name (the first repair put it second)",
    )
    args = ap.parse_args()
    loaded = load_model(args.model)
    tok = loaded.tokenizer
    norms = piece_norms(loaded.model, tok)
    rows = [i for i, n in norms.items() if n < args.below]
    copyable = [i for i, n in norms.items() if n >= args.copyable]
    if not rows:
        raise SystemExit(f"{args.model}: no lower-case row under {args.below}; nothing to repair")
    names = names_around(tok, rows, copyable, args.per_token, random.Random(args.seed), args.positions)
    with open(args.rows, "w") as f:
        json.dump(rows, f)
    with open(args.names, "w") as f:
        f.write("\n".join(names) + "\n")
    covered = {i for n in names for i in tok.encode(n, add_special_tokens=False)} & set(rows)
    print(json.dumps({"rows": len(rows), "copyable": len(copyable), "names": len(names), "rows_covered": len(covered)}))


if __name__ == "__main__":
    main()
