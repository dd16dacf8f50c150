"""How much of RL's gradient is shared across tasks, and does it point where held-out success lies?

    .venv/bin/python scripts/gradient_signal.py --train RUN [RUN ...] --test RUN [RUN ...] [--json]

`--train`: `vivace train` run directories (their `trajectories/step_*.jsonl`); `--test`: run directories
with a before/after report (`eval/results.jsonl` and the starting policy's episodes in
`eval/trajectories/<model>/`). Every group split on success (the tiny preset's filter) gives one
policy-gradient vector at the starting checkpoint: the trainer's own loss (rl/loss.py, on-policy, token
aggregation within the group) through `Trainer._forward`, with the preset's advantages
(`rl.rollout.to_samples`); one group per training task (its first split one) and per held-out task
(all its episodes in the runs given).
Samples from runs whose policy had already moved a little are taken as if drawn from the checkpoint:
their importance weights are capped at 2 as in training.

Prints, for all parameters and for each part of the model (embeddings, attention, router, experts,
norms), with --json as JSON:
- rho, the mean cosine of two training groups' vectors (with its standard error over the pairs). If
  every vector is a shared direction plus its task's own part, rho = |shared|^2 / E|vector|^2, and the
  mean of K groups is K*rho / (K*rho + 1) shared: 1/rho groups make two disjoint halves agree at 0.5;
- the curve over K of the cosine between the means of two disjoint sets of K training groups (below
  K*rho / (K*rho + 1) as 2K nears the set's size: the halves are drawn without replacement), and between
  the mean of K training groups and the held-out groups' mean, with the spread of the latter when each
  training group's sign is flipped at random (what no shared direction looks like);
- the held-out groups' own two halves, and all training groups against the held-out mean.

Options: `--skip-copies N` leaves out of the loss every generated token that, with the N before it,
repeats an earlier span of its episode (copied paths, names, the calls' scaffolding); `--same-task` is
the positive control (the cosine of two groups of one task, from runs of one seed); `--gram FILE` saves
the vectors' inner products per part and `--from-gram FILE` analyses them again without the ~8 minutes
of backward passes (docs/benchmarks.md, "Do the training groups share a direction?"); `--by-theme` adds
the same measures for the training groups of real-word repositories and of generated (pseudo-word) ones
apart (with `--from-gram`, pass the `--train` runs too if the file predates it: the task order is rebuilt).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
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


def splits(group: list[Rollout]) -> bool:
    """Some episodes solved the task and some did not: the only groups the preset's filter trains."""
    return len({r.resolved for r in group}) == 2


def all_solved(group: list[Rollout]) -> bool:
    """Every episode solved the task, and their rewards differ (efficiency, adherence, claims, format):
    groups the preset's filter drops, whose only signal is how well a solve was done."""
    return all(r.resolved for r in group) and len({round(r.reward, 6) for r in group}) > 1


KINDS = {"split": splits, "all-solved": all_solved}


def split_by_task(groups, keep=splits) -> list[list[list[Rollout]]]:
    """The groups that split on success (or pass `keep`), gathered per task in the order found."""
    by_task: dict[str, list[list[Rollout]]] = {}
    for group in groups:
        if keep(group):
            by_task.setdefault(group[0].task_id, []).append(group)
    return list(by_task.values())


def first_split(groups, keep=splits) -> list[list[Rollout]]:
    """Per task, its first split group: runs with one seed share their task stream, and two groups of
    one task would agree for reasons that do not carry to other tasks."""
    return [gs[0] for gs in split_by_task(groups, keep)]


def training_groups(runs: list[Path], keep=splits) -> list[list[Rollout]]:
    """One split group per training task, over the runs in order (the order the Gram matrix keeps)."""
    return first_split((g for run in runs for g in train_groups(run)), keep)


def same_task_pairs(groups) -> list[tuple[list[Rollout], list[Rollout]]]:
    """Tasks with two split groups (two runs of one seed draw the same tasks)."""
    return [(gs[0], gs[1]) for gs in split_by_task(groups) if len(gs) >= 2]


def same_task_control(args) -> dict:
    """The positive control: two groups of one task share that task's expected gradient, so their
    cosine shows what a shared direction looks like next to the noise of four rollouts."""
    cfg = load_preset("tiny")
    trainer = Trainer(args.model, cfg.train, temperature=cfg.engine.temperature)
    pairs = same_task_pairs(g for run in args.train for g in train_groups(run))
    masks = {"skip_copies": args.skip_copies, "entropy_top": args.top_entropy}
    first = gradients(trainer, [a for a, _ in pairs], cfg, "first", **masks)
    second = gradients(trainer, [b for _, b in pairs], cfg, "second", **masks)
    same = [float(torch.nn.functional.cosine_similarity(a, b, dim=0)) for a, b in zip(first, second, strict=True)]
    other = [
        float(torch.nn.functional.cosine_similarity(first[i], second[j], dim=0))
        for i in range(len(first))
        for j in range(len(second))
        if i != j
    ]

    def summary(xs: list[float]) -> dict:
        return {"pairs": len(xs), "mean": statistics.mean(xs), "se": statistics.pstdev(xs) / math.sqrt(len(xs))}

    return {"tasks": len(pairs), "same_task": summary(same), "different_tasks": summary(other)}


def merged_split(groups, keep=splits) -> list[list[Rollout]]:
    """Per task, all its episodes in one group, if they split on success or pass `keep` (held-out
    groups have only two episodes per run)."""
    merged: dict[str, list[Rollout]] = {}
    for group in groups:
        merged.setdefault(group[0].task_id, []).extend(group)
    return [g for g in merged.values() if keep(g)]


BLOCKS = ("embeddings", "attention", "router", "experts", "norms")


def block(name: str) -> str:
    """Which part of the model a parameter belongs to (Qwen3-MoE names; the head is tied to the embeddings)."""
    if "norm" in name:
        return "norms"
    if "embed" in name or "lm_head" in name:
        return "embeddings"
    if "self_attn" in name:
        return "attention"
    if ".mlp.gate." in name:
        return "router"
    return "experts"


def without_copies(ids: list[int], mask: list[int], n: int) -> list[int]:
    """The mask less every generated token that, with the n tokens before it, repeats a span seen
    earlier in the episode (prompt, tool results or its own text): the copied part of a name, a path,
    an old_string."""
    seen: set[tuple[int, ...]] = set()
    out = list(mask)
    for j in range(n, len(ids)):
        span = tuple(ids[j - n : j + 1])
        if mask[j] and span in seen:
            out[j] = 0
        seen.add(span)
    return out


def top_entropy(entropy: torch.Tensor, fraction: float) -> torch.Tensor:
    """Mask of the `fraction` of positions with the highest policy entropy (the forks where a sample
    could have gone another way; ties at the threshold are kept)."""
    if fraction >= 1 or len(entropy) == 0:
        return torch.ones_like(entropy)
    threshold = torch.quantile(entropy.float(), 1 - fraction)
    return (entropy >= threshold).to(entropy.dtype)


def gradients(
    trainer: Trainer, groups: list[list[Rollout]], cfg, label: str, skip_copies: int = 0, entropy_top: float = 1.0
) -> list[torch.Tensor]:
    """One objective-ascent vector per group, parameters in BLOCKS order (see `block_ranges`)."""
    named = sorted(
        ((n, p) for n, p in trainer.model.named_parameters() if p.requires_grad),
        key=lambda np: BLOCKS.index(block(np[0])),
    )
    out = []
    for i, group in enumerate(groups):
        samples, _ = to_samples([group], cfg, version=0)
        if skip_copies:
            for sample in samples:
                sample.mask = without_copies(sample.ids, sample.mask, skip_copies)
            samples = [sample for sample in samples if sample.n_generated]
        if not samples:
            continue
        trainer.model.zero_grad(set_to_none=True)
        n_tokens = sum(s.n_generated for s in samples)
        for micro in trainer._micro_batches(samples):
            logp, entropy, mask, behav, adv = trainer._forward(micro)
            mask = mask * top_entropy(entropy, entropy_top)
            loss, _ = policy_loss(logp, logp.detach(), behav, adv, mask, trainer.loss_cfg, n_tokens)
            loss.backward()
        grads = [p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad for _, p in named]  # FSDP
        out.append(-torch.cat([g.reshape(-1) for g in grads]).detach().clone())
        print(f"{label}: group {i + 1}/{len(groups)} ({len(samples)} samples, {n_tokens} tokens)", file=sys.stderr)
    return out


def block_ranges(trainer: Trainer) -> dict[str, tuple[int, int]]:
    sizes = {b: 0 for b in BLOCKS}
    for n, p in trainer.model.named_parameters():
        if p.requires_grad:
            sizes[block(n)] += p.numel()
    ranges, start = {}, 0
    for b in BLOCKS:
        ranges[b] = (start, start + sizes[b])
        start += sizes[b]
    return ranges


def mean_cos(gram: torch.Tensor, a: list[int], b: list[int], sign: torch.Tensor | None = None) -> float:
    """Cosine between the mean of vectors `a` and the mean of vectors `b`, from their Gram matrix
    (optionally with each vector multiplied by `sign`)."""
    g = gram if sign is None else gram * sign[:, None] * sign[None, :]
    ab, aa, bb = g[a][:, b].sum(), g[a][:, a].sum(), g[b][:, b].sum()
    return float(ab / (aa.sqrt() * bb.sqrt() + 1e-30))


def pair_cos(gram: torch.Tensor, a: list[int], b: list[int] | None = None) -> tuple[float, float]:
    """Mean cosine (and its standard error) over the pairs within `a`, or between `a` and `b`."""
    norms = gram.diagonal().sqrt()
    cos = gram / (norms[:, None] * norms[None, :])
    off = [float(cos[i, j]) for x, i in enumerate(a) for j in (a[x + 1 :] if b is None else b)]
    return statistics.mean(off), statistics.pstdev(off) / math.sqrt(len(off))


def null_cos(gram: torch.Tensor, a: list[int], test: list[int], rng: random.Random) -> float:
    """`mean_cos(gram, a, test)` with every vector but the held-out ones given a random sign: what the
    cosine looks like when nothing is shared."""
    sign = torch.tensor([rng.choice((-1.0, 1.0)) for _ in range(len(gram))], dtype=gram.dtype)
    sign[test] = 1.0
    return mean_cos(gram, a, test, sign)


def analyse(gram: torch.Tensor, train: list[int], test: list[int], draws: int) -> dict:
    rng = random.Random(0)
    rows = []
    k = 1
    while 2 * k <= len(train):
        tt, tx, null = [], [], []
        for _ in range(draws):
            pick = rng.sample(train, 2 * k)
            tt.append(mean_cos(gram, pick[:k], pick[k:]))
            tx.append(mean_cos(gram, pick[:k], test))
            null.append(null_cos(gram, pick[:k], test, rng))
        rows.append({"k": k, "train_train": statistics.mean(tt), "train_test": statistics.mean(tx),
                     "train_test_sd": statistics.pstdev(tx), "train_test_null_sd": statistics.pstdev(null)})  # fmt: skip
        k *= 2
    half = len(test) // 2
    test_test = statistics.mean(
        mean_cos(gram, p[:half], p[half : 2 * half]) for p in (rng.sample(test, 2 * half) for _ in range(draws))
    )
    # rho = |shared|^2 / E|group vector|^2 is the expected cosine of two groups' vectors: estimated by
    # their mean over pairs (nearly uncorrelated when there is little shared: its standard error is theirs).
    rho, se = pair_cos(gram, train)
    return {"curve": rows, "rho": rho, "rho_se": se, "test_test_half": test_test,
            "groups_for_half_agreement_at_least": 1 / max(rho + 2 * se, 1e-9),
            "full_train_vs_test": mean_cos(gram, train, test)}  # fmt: skip


def by_theme(gram: torch.Tensor, task_ids: list[str], test: list[int], draws: int) -> dict:
    """Training groups of real-word repositories (the held-out ones are real-word) against generated ones:
    their own rho, their pairs' cosine with held-out groups, their mean against the held-out mean."""
    rng, out = random.Random(0), {}
    for kind, keep in (
        ("real-word", lambda t: not t.startswith("gen-")),
        ("generated", lambda t: t.startswith("gen-")),
    ):
        a = [i for i, t in enumerate(task_ids) if keep(t)]
        if len(a) < 2:
            continue
        null = [null_cos(gram, a, test, rng) for _ in range(draws)]
        (rho, rho_se), (with_test, with_test_se) = pair_cos(gram, a), pair_cos(gram, a, test)
        out[kind] = {"groups": len(a), "rho": rho, "rho_se": rho_se, "pair_cos_with_test": with_test,
                     "pair_cos_with_test_se": with_test_se, "mean_vs_test_mean": mean_cos(gram, a, test),
                     "mean_vs_test_mean_null_sd": statistics.pstdev(null)}  # fmt: skip
    return out


def compute_grams(args) -> tuple[dict[str, torch.Tensor], dict[str, int], int, int]:
    if not args.train or not args.test:
        raise SystemExit("give --train and --test run directories (or --from-gram)")
    # all-solved groups train only under the reward filter (the cosines do not depend on the advantages' scale)
    cfg = load_preset("tiny", train={"group_filter": "reward" if args.groups == "all-solved" else "correctness"})
    trainer = Trainer(args.model, cfg.train, temperature=cfg.engine.temperature)
    masks = {"skip_copies": args.skip_copies, "entropy_top": args.top_entropy}
    keep = KINDS[args.groups]
    groups = training_groups(args.train, keep)
    args.train_tasks = [g[0].task_id for g in groups]
    g_train = gradients(trainer, groups, cfg, "train", **masks)
    g_test = gradients(
        trainer,
        merged_split((g for run in args.test for g in test_groups(run, args.model)), keep),
        cfg,
        "test",
        **masks,
    )
    if len(g_train) < 2 or len(g_test) < 2:
        raise SystemExit(f"too few {args.groups} groups: {len(g_train)} training, {len(g_test)} held-out")
    # Every quantity reported is a cosine between means of these vectors: their inner products suffice,
    # per block of parameters (any set of blocks adds its blocks' products).
    n_train, n_test = len(g_train), len(g_test)
    vectors = torch.stack(g_train + g_test)
    del g_train[:], g_test[:]
    ranges = block_ranges(trainer)
    grams = {b: (vectors[:, lo:hi] @ vectors[:, lo:hi].T).double() for b, (lo, hi) in ranges.items()}
    sizes = {b: hi - lo for b, (lo, hi) in ranges.items()}
    if args.gram:
        torch.save({"grams": grams, "sizes": sizes, "train": n_train, "test": n_test,
                    "train_tasks": args.train_tasks}, args.gram)  # fmt: skip
    return grams, sizes, n_train, n_test


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--train", nargs="+", type=Path, default=[], help="`vivace train` run directories.")
    parser.add_argument("--test", nargs="+", type=Path, default=[], help="Run directories with a report (eval/).")
    parser.add_argument("--model", default="tiny", help="Checkpoint at which gradients are taken.")
    parser.add_argument("--draws", type=int, default=200)
    parser.add_argument("--gram", type=Path, help="Save the vectors' inner products here (torch.save).")
    parser.add_argument("--from-gram", type=Path, help="Analyse inner products saved by --gram instead.")
    parser.add_argument(
        "--skip-copies", type=int, default=0, metavar="N",
        help="Leave out of the loss every generated token that, with the N before it, repeats an earlier span.",
    )  # fmt: skip
    parser.add_argument(
        "--top-entropy", type=float, default=1.0, metavar="F",
        help="Keep in the loss only the fraction F of generated tokens (per packed row) with the highest entropy.",
    )  # fmt: skip
    parser.add_argument(
        "--same-task", action="store_true",
        help="Positive control instead: cosine of two groups of one task (from --train runs of one seed).",
    )  # fmt: skip
    parser.add_argument(
        "--by-theme", action="store_true",
        help="Also measure real-word and generated training repositories' groups apart.",
    )  # fmt: skip
    parser.add_argument(
        "--groups", choices=sorted(KINDS), default="split",
        help="split: groups split on success (what the preset trains); all-solved: groups that all solved "
        "with differing rewards (what a filter on efficiency would add).",
    )  # fmt: skip
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(2)
    if args.same_task:
        control = same_task_control(args)
        print(json.dumps(control, indent=2))
        return
    if args.from_gram:
        saved = torch.load(args.from_gram)
        grams, sizes, n_train, n_test = saved["grams"], saved["sizes"], saved["train"], saved["test"]
        grams = {b: g.full_tensor() if hasattr(g, "full_tensor") else g for b, g in grams.items()}
        args.train_tasks = saved.get("train_tasks")
        if args.by_theme and args.train_tasks is None:
            if not args.train:
                raise SystemExit("this gram file has no task ids: pass the --train runs it was made from")
            args.train_tasks = [g[0].task_id for g in training_groups(args.train)]
        if args.train_tasks is not None and len(args.train_tasks) != n_train:
            raise SystemExit(f"{len(args.train_tasks)} training tasks rebuilt, the gram has {n_train} groups")
    else:
        grams, sizes, n_train, n_test = compute_grams(args)
    train, test = list(range(n_train)), list(range(n_train, n_train + n_test))
    subsets = {"all": BLOCKS, "all but embeddings": BLOCKS[1:], **{b: (b,) for b in BLOCKS}}
    report = {"train_groups": n_train, "test_groups": n_test, "parameters": sizes,
              "subsets": {name: analyse(sum(grams[b] for b in bs), train, test, args.draws)
                          for name, bs in subsets.items()}}  # fmt: skip
    if args.by_theme:
        report["by_theme"] = by_theme(sum(grams[b] for b in BLOCKS), args.train_tasks, test, args.draws)
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print(f"{n_train} training groups, {n_test} held-out groups ({args.groups})")
    for name, r in report["subsets"].items():
        print(f"\n{name} ({sum(sizes[b] for b in subsets[name]):,} parameters): rho (mean cosine of two training "
              f"groups) {r['rho']:.4f} ± {r['rho_se']:.4f}; held-out halves {r['test_test_half']:.4f}; "
              f"all training vs held-out {r['full_train_vs_test']:.4f}")  # fmt: skip
        print(f"{'K':>4} {'train-train':>12} {'train-test':>11} {'sd':>6} {'null sd':>8}")
        for row in r["curve"]:
            print(f"{row['k']:>4} {row['train_train']:>12.4f} {row['train_test']:>11.4f} "
                  f"{row['train_test_sd']:>6.3f} {row['train_test_null_sd']:>8.3f}")  # fmt: skip
        print(
            f"two halves agree at cosine 0.5 only past ~{r['groups_for_half_agreement_at_least']:.0f} split groups "
            "each (rho + 2 standard errors)"
        )
    for kind, r in report.get("by_theme", {}).items():
        print(f"\n{kind} training groups ({r['groups']}), all parameters: rho {r['rho']:.4f} ± {r['rho_se']:.4f}; "
              f"pairs with held-out groups {r['pair_cos_with_test']:.4f} ± {r['pair_cos_with_test_se']:.4f}; "
              f"their mean vs the held-out mean {r['mean_vs_test_mean']:.3f} "
              f"(null sd {r['mean_vs_test_mean_null_sd']:.3f})")  # fmt: skip


if __name__ == "__main__":
    main()
