"""How well a policy copies a package name, piece by piece (docs/benchmarks.md, attempt 12).

For each episode of a probe file (`vivace sft augment --cut retry …`), the trained read_file call's
path is scored token by token up to its first `/` (the package name's pieces), teacher-forced: the
greedy choice right or not. `vivace sft eval` gives the first token and the whole path; this shows
the per-piece copy rate those two hide.

    .venv/bin/python scripts/probe_name_pieces.py tiny runs/ws3/probe_retry.jsonl,runs/ws3/probe_retry_letters.jsonl
"""

import sys
from pathlib import Path

import torch

from vivace.model.checkpoint import load_model
from vivace.rl.sft_train import argument_spans, read_episodes


def main(model_name: str, files: str, threads: int = 1) -> None:
    torch.set_num_threads(threads)
    loaded = load_model(model_name)
    model, tok = loaded.model, loaded.tokenizer
    for f in files.split(","):
        episodes = read_episodes(Path(f), len(tok))
        right = n = 0
        for e, spans in zip(episodes, argument_spans(episodes, tok.decode), strict=True):
            with torch.no_grad():
                logits = model(torch.tensor([e.ids])).logits[0]
            for arg, first, last in spans:
                if arg != "path":
                    continue
                for j in range(first, last + 1):
                    if tok.decode([e.ids[j]]).startswith("/"):
                        break
                    n += 1
                    right += int(logits[j - 1].argmax().item() == e.ids[j])
        print(f"{model_name} {Path(f).name}: name pieces right {right}/{n} = {right / max(n, 1):.3f}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], *(int(a) for a in sys.argv[3:4]))
