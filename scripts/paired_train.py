"""Compare two `vivace train` runs of one seed rollout by rollout: same task-stream position, same member.

    .venv/bin/python scripts/paired_train.py CONTROL_RUN RUN [--json]

Runs with one seed draw the same tasks in the same order (rl.controller.TaskOrder), so the rollouts at
one (position, member) are two episodes of one task: one by each run's policy at that point. With a
control whose policy never moves (`train.lr` 1e-12), the difference is RL's effect on fresh tasks of
the training distribution, step by step (docs/benchmarks.md, "What RL does to the training
distribution"). Only positions whose task is the same in both runs are paired.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from vivace.rl.evaluate import paired


def rollouts(run: Path) -> dict[tuple[int, int], tuple[int, str, bool]]:
    files = sorted((run / "trajectories").glob("step_*.jsonl"))
    if not files:
        raise SystemExit(f"{run}/trajectories has no step_*.jsonl: pass a `vivace train` run directory")
    out = {}
    for f in files:
        step = int(f.stem.split("_")[1])
        for line in f.read_text().splitlines():
            r = json.loads(line)
            out[(r["position"], r["member"])] = (step, r["task_id"], bool(r["resolved"]))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("control", type=Path)
    parser.add_argument("run", type=Path)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    a, b = rollouts(args.control), rollouts(args.run)
    keys = sorted(k for k in set(a) & set(b) if a[k][1] == b[k][1])
    if not keys:
        raise SystemExit("no rollouts pair up: are both runs of the same seed and task set?")
    windows = []
    for lo, hi in [(1, 5), (6, 10), (11, 15), (16, 20), (21, 10**9)]:
        ks = [k for k in keys if lo <= b[k][0] <= hi]
        if ks:
            windows.append({"steps": f"{lo}-{hi if hi < 10**9 else 'end'}", "rollouts": len(ks),
                            "control": sum(a[k][2] for k in ks), "run": sum(b[k][2] for k in ks),
                            "agree": sum(a[k][2] == b[k][2] for k in ks)})  # fmt: skip
    # One task draw (a position) is the unit of the sign test: its members share a group.
    rows = [{"model": name, "task_id": str(k[0]), "sample": k[1], "resolved": side[k][2]}
            for name, side in (("control", a), ("run", b)) for k in keys]  # fmt: skip
    by_task = paired(rows, "control", "run")
    report = {"rollouts": len(keys), "control": sum(a[k][2] for k in keys), "run": sum(b[k][2] for k in keys),
              "paired": by_task, "windows": windows}  # fmt: skip
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print(f"{len(keys)} paired rollouts: solved {report['control']} by the control, {report['run']} by the run")
    for w in windows:
        print(f"  steps {w['steps']}: {w['control']} -> {w['run']} of {w['rollouts']} (agree {w['agree']})")
    print(f"  {json.dumps(by_task)}")


if __name__ == "__main__":
    main()
