"""The control for a run with a supervised term: the same updates with the policy gradient left out.

Replays a finished run's supervised term alone: as many updates as the run trained, each on the same
expert episodes (the cycle follows the trainer's step), at the run's learning rate, from the run's
starting policy; saves the result for `vivace bench` beside the run's own checkpoint. Whatever the
run gained beyond this, the policy gradient gave.

    .venv/bin/python scripts/supervised_only.py runs/train-20261128-192141 --out runs/supervised_only
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from vivace.config import VivaceConfig
from vivace.rl.trainer import Trainer


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path, help="a finished `vivace train` run directory")
    ap.add_argument("--out", type=Path, required=True, help="where to save (a checkpoint directory: OUT/model)")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    cfg = VivaceConfig.model_validate_json((args.run / "config.json").read_text())
    tc = cfg.train
    if tc.sft_data is None:
        tc.sft_data = args.run / "expert.jsonl"  # recorded by train.sft_expert
    updates = sum("sft_loss" in json.loads(line) for line in (args.run / "metrics.jsonl").read_text().splitlines())
    trainer = Trainer(tc.model, tc, temperature=cfg.engine.temperature)
    for i in range(updates):
        stats = trainer.train_step([])
        print(json.dumps({"update": i + 1, "sft_loss": round(stats["sft_loss"], 4)}), flush=True)
    trainer.save(args.out)
    print(json.dumps({"updates": updates, "out": str(args.out / "model")}))


if __name__ == "__main__":
    main()
