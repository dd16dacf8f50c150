"""How much of RL's gradient is shared across tasks, and does it point where held-out success lies?

    .venv/bin/python scripts/gradient_signal.py --train RUN [RUN ...] --test RUN [RUN ...] [--json]

`--train`: `vivace train` run directories (their `trajectories/step_*.jsonl`); `--test`: run directories
with a before/after report (`eval/results.jsonl` and the starting policy's episodes in
`eval/trajectories/<model>/`). Every group split on success (the tiny preset's filter) gives one
policy-gradient vector at the starting checkpoint: the trainer's own loss (rl/loss.py, on-policy, token
aggregation within the group) through `Trainer._forward`, with the preset's advantages
(`rl.rollout.to_samples`); one group per training task (runs with one seed share their task stream).
Samples from runs whose policy had already moved a little are taken as if drawn from the checkpoint:
their importance weights are capped at 2 as in training.

Prints, for K groups per half (disjoint random halves, 200 draws each):
- `train-train`: cosine between the mean gradients of two disjoint sets of K training groups. If every
  group's gradient is a shared direction plus task-specific noise, this is K*rho / (K*rho + 1) where
  rho = |shared|^2 / E|noise|^2; the fitted rho says how many groups make the shared part dominate;
- `train-test`: cosine between the mean of K training groups and the mean over all held-out groups
  (the direction that would raise success on the held-out tasks, itself noisy);
- `test-test` for the held-out groups' own split halves, and the same with each group's advantages
  negated at random (`train-test, null`): what no shared direction looks like.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
from pathlib import Path

import torch

from vivace.config import load_preset
from vivace.harness.trajectory import Trajectory
from vivace.rl.loss import policy_loss
from vivace.rl.rollout import Rollout, to_samples
from vivace.rl.trainer import Trainer


def train_groups(run: Path) -> list[list[Rollout]]:
    groups: dict[tuple[str, int], list[Rollout]] = {}
    files = sorted((run / "trajectories").glob("step_*.jsonl"))
    if not files:
        raise SystemExit(f"{run}/trajectories has no step_*.jsonl: pass a `vivace train` run directory")
    for f in files:
        for line in f.read_text().splitlines():
            r = json.loads(line)
            if r.get("error") or not r.get("trajectory"):
                continue
            traj = Trajectory.model_validate(r["trajectory"])
            groups.setdefault((f.name, r["position"]), []).append(
                Rollout(r["task_id"], traj, r["reward"], resolved=bool(r["resolved"]))
            )
    return list(groups.values())


def test_groups(run: Path, model: str) -> list[list[Rollout]]:
    results = run / "eval" / "results.jsonl"
    if not results.is_file():
        raise SystemExit(f"{results} not found: pass a `vivace train` run that ended with its report")
    groups: dict[str, list[Rollout]] = {}
    for line in results.read_text().splitlines():
        r = json.loads(line)
        if r["model"] != model:
            continue
        name = r["task_id"] + (f".s{r['sample']}" if r.get("sample") else "")
        path = run / "eval" / "trajectories" / model / f"{name}.json"
        if not path.is_file():
            continue
        traj = Trajectory.model_validate_json(path.read_text())
        groups.setdefault(r["task_id"], []).append(Rollout(r["task_id"], traj, r["total"], resolved=r["resolved"]))
    return list(groups.values())


def gradients(trainer: Trainer, groups: list[list[Rollout]], cfg, label: str) -> list[torch.Tensor]:
    params = [p for p in trainer.model.parameters() if p.requires_grad]
    out = []
    for i, group in enumerate(groups):
        samples, _ = to_samples([group], cfg, version=0)
        if not samples:
            continue
        trainer.model.zero_grad(set_to_none=True)
        n_tokens = sum(s.n_generated for s in samples)
        for micro in trainer._micro_batches(samples):
            logp, _, mask, behav, adv = trainer._forward(micro)
            loss, _ = policy_loss(logp, logp.detach(), behav, adv, mask, trainer.loss_cfg, n_tokens)
            loss.backward()
        # The descent direction of the loss is the ascent direction of the objective.
        out.append(-torch.cat([p.grad.reshape(-1) for p in params]).detach().clone())
        print(f"{label}: group {i + 1}/{len(groups)} ({len(samples)} samples, {n_tokens} tokens)", flush=True)
    return out


def cos(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.dot(a, b) / (a.norm() * b.norm() + 1e-30))


def mean(vs: list[torch.Tensor]) -> torch.Tensor:
    return torch.stack(vs).mean(0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--train", nargs="+", type=Path, required=True)
    parser.add_argument("--test", nargs="+", type=Path, required=True)
    parser.add_argument("--model", default="tiny", help="Checkpoint at which gradients are taken.")
    parser.add_argument("--draws", type=int, default=200)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(2)
    cfg = load_preset("tiny")
    trainer = Trainer(args.model, cfg.train, temperature=cfg.engine.temperature)
    # One group per task: runs with one seed share their task stream, and two groups of one task would
    # agree for reasons that do not carry to other tasks.
    seen: set[str] = set()
    groups = []
    for group in (g for run in args.train for g in train_groups(run)):
        if group[0].task_id not in seen:
            seen.add(group[0].task_id)
            groups.append(group)
    g_train = gradients(trainer, groups, cfg, "train")
    g_test = gradients(trainer, [g for run in args.test for g in test_groups(run, args.model)], cfg, "test")
    if len(g_train) < 4 or len(g_test) < 2:
        raise SystemExit(f"too few groups split on success: {len(g_train)} training, {len(g_test)} held-out")
    rng = random.Random(0)
    test_mean = mean(g_test)
    rows = []
    k = 1
    while 2 * k <= len(g_train):
        tt, tx, null = [], [], []
        for _ in range(args.draws):
            pick = rng.sample(range(len(g_train)), 2 * k)
            a, b = mean([g_train[i] for i in pick[:k]]), mean([g_train[i] for i in pick[k:]])
            tt.append(cos(a, b))
            tx.append(cos(a, test_mean))
            null.append(cos(mean([g_train[i] * rng.choice((-1, 1)) for i in pick[:k]]), test_mean))
        rows.append({"k": k, "train_train": statistics.mean(tt), "train_test": statistics.mean(tx),
                     "train_test_null_sd": statistics.pstdev(null), "train_test_sd": statistics.pstdev(tx)})  # fmt: skip
        k *= 2
    half = len(g_test) // 2
    test_test = statistics.mean(
        cos(mean([g_test[i] for i in p[:half]]), mean([g_test[i] for i in p[half : 2 * half]]))
        for p in (rng.sample(range(len(g_test)), 2 * half) for _ in range(args.draws))
    )
    # rho from the largest K: c = K rho / (K rho + 1)
    last = rows[-1]
    c = max(min(last["train_train"], 0.999), 1e-6)
    rho = c / (last["k"] * (1 - c))
    report = {"train_groups": len(g_train), "test_groups": len(g_test), "curve": rows,
              "test_test_half": test_test, "rho": rho, "groups_for_half_agreement": 1 / rho,
              "full_train_vs_test": cos(mean(g_train), test_mean)}  # fmt: skip
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print(f"{len(g_train)} training groups, {len(g_test)} held-out groups (split on success)")
    print(f"{'K':>4} {'train-train':>12} {'train-test':>11} {'sd':>6} {'null sd':>8}")
    for r in rows:
        print(f"{r['k']:>4} {r['train_train']:>12.4f} {r['train_test']:>11.4f} {r['train_test_sd']:>6.3f} "
              f"{r['train_test_null_sd']:>8.3f}")  # fmt: skip
    print(
        f"held-out halves agree: cos {test_test:.4f}; all training vs held-out: cos {report['full_train_vs_test']:.4f}"
    )
    print(f"rho {rho:.4f}: about {1 / rho:.0f} split groups before the shared direction outweighs the rest")


if __name__ == "__main__":
    main()
