"""Compare two `vivace bench` runs of one policy each, episode by episode (same tasks, same seeds).

    .venv/bin/python scripts/paired_bench.py runs/before_bench runs/after_bench [--before-model tiny] [--json]

Prints success before and after, the paired split (solved only after / only before / both), the
sign test over tasks (rl.evaluate.paired) and success per family. Greedy runs (`--temperature 0`)
are the sharpest instrument: the same policy on the same task gives the same episode, so every
changed outcome is the weights' doing.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from vivace.rl.evaluate import paired


def load(run: Path, model: str | None) -> list[dict]:
    results = run / "results.jsonl"
    if not results.is_file():
        raise SystemExit(f"{results} not found: pass the --out directory of a `vivace bench` run")
    rows = [json.loads(line) for line in results.read_text().splitlines() if line.strip()]
    models = sorted({r["model"] for r in rows if not r["model"].startswith("scripted:")})
    if model is None:
        if len(models) != 1:
            raise SystemExit(
                f"{run} has {len(models)} model policies {models}: name one with --before-model/--after-model"
            )
        model = models[0]
    chosen = [r for r in rows if r["model"] == model and "error" not in r]  # errors: episodes that could not run
    if not chosen:
        raise SystemExit(f"{run} has no episodes of {model!r}; it has {models}")
    return chosen


def episode(row: dict) -> tuple[str, int]:
    """What pairs two runs' episodes, as in rl.evaluate.paired: the task and the sample's seed index."""
    return row["task_id"], row.get("sample", 0)


def by_family(before: list[dict], after: list[dict]) -> dict[str, dict[str, int]]:
    """Solved episodes per family, before and after, over the episodes both runs have."""
    solved_after = {episode(r): bool(r.get("resolved")) for r in after}
    families: dict[str, dict[str, int]] = {}
    for r in before:
        if episode(r) not in solved_after:
            continue
        counts = families.setdefault(r.get("family") or "-", {"before": 0, "after": 0, "episodes": 0})
        counts["before"] += bool(r.get("resolved"))
        counts["after"] += solved_after[episode(r)]
        counts["episodes"] += 1
    return dict(sorted(families.items()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("before", type=Path)
    ap.add_argument("after", type=Path)
    ap.add_argument("--before-model")
    ap.add_argument("--after-model")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    before = load(args.before, args.before_model)
    after = load(args.after, args.after_model)
    rows = [{**r, "model": "before"} for r in before] + [{**r, "model": "after"} for r in after]
    result = paired(rows, "before", "after")
    result["solved_before"] = result["both"] + result["before_only"]
    result["solved_after"] = result["both"] + result["after_only"]
    result["families"] = by_family(before, after)
    if args.json:
        print(json.dumps(result, indent=1))
        return
    print(f"solved {result['solved_before']} -> {result['solved_after']} of {result['episodes']} paired episodes; "
          f"only after {result['after_only']}, only before {result['before_only']}, both {result['both']}; "
          f"tasks up {result['tasks_up']}, down {result['tasks_down']}, sign test p = {result['p_value']:.2f}")  # fmt: skip
    for f, c in result["families"].items():
        print(f"  {f}: {c['before']} -> {c['after']} of {c['episodes']}")


if __name__ == "__main__":
    main()
