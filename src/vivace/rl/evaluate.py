"""The before/after report that ends an RL run: what training changed, on tasks it never saw.

`evaluate_run` benchmarks the starting policy (`before`), the trained one (`after`, the run's last
checkpoint) and baselines (a floor and a ceiling: `scripted:random-edit`, `scripted:oracle`) on
held-out tasks with `bench.runner.run_benchmark`, so the episode and the scorer are exactly those
of the benchmark and of the rollouts. Results go to RUN/eval/ (results.jsonl, trajectories);
the report to RUN/report.json (machine-readable, per policy and per family), RUN/report.md and a
self-contained RUN/report.html (tables, SVG curves, bench's success-vs-tokens plot):

- reward and success over training steps (from RUN/metrics.jsonl);
- held-out success per policy, overall and per task family (`metadata["family"]`, else
  `metadata["kind"]`); families with `metadata["learnable"] is False` are the harder ones and
  are shown apart, so a gain on the learnable families is not averaged away (or faked) by them;
- per policy: tool calls per turn (over the turns that call a tool, as the scorer counts them; the
  training curves' calls/turn is over all turns, the final answer's included, so the two are labelled
  apart), turns per episode and per solved task, reference tokens per episode, reads/searches before
  the first edit (rl.metrics.behaviour on the saved trajectories; an episode that never edits counts
  all its reads), unsupported-claim rate, format errors, repeats of a call the tools had rejected;
- episodes that could not run count as unsolved (in success, reward, the family tables and the paired
  counts; the behaviour numbers leave them out), and the report says how many there were;
- a "before -> after" line with the delta for each of those, and the paired count: episodes
  only the trained policy solved, only the starting one, or both. The benchmark seeds each
  (task, sample) episode the same for every policy (common random numbers), so where the
  weights barely differ the two sample the same tokens, and the pair shows what training
  changed with far less sampling noise than two independent success rates. On the episodes both
  solved, the paired line also gives each policy's mean turns: speed measured on the same episodes.

Held-out tasks are drawn round-robin over families in a seeded order (`held_out_tasks`), so a
small evaluation still covers every family. With several episodes per task
(`train.eval_samples`), a scripted baseline still runs one: it acts the same every time.

Policies are loaded as `vivace bench` loads them (`load_policy(spec)`: the engine's default
sampling settings), so the numbers compare with any other benchmark run.

The paired line also counts tasks, not episodes: how many tasks the trained policy solved more often
than the starting one and how many less often, with the two-sided exact sign test of that split (the
chance of one at least as uneven if training had changed nothing). Tasks are the unit because the
episodes of one task are not independent: on the tiny preset ~95% of held-out tasks are solved in
both of their episodes or in neither (docs/benchmarks.md). With a few changed tasks no split is
significant (4 to 0 gives p = 0.125); the report says so rather than leaving a rate to be over-read.

A report made again (`vivace train report RUN --tasks N --samples K`) moves the earlier one and its
episodes into RUN/reports/1/, 2/, ...; if the new one fails or is interrupted, the earlier one is put
back (a hard kill mid-report can still leave it only under reports/).

Last, how far training moved the policy (rl.shift): how many paired episodes are token for token the
same, where the others part, and KL(before ‖ after) on the starting policy's sampled tokens. A flat
success count then reads as "the episodes changed but not their outcome" or as "nothing changed".
"""

from __future__ import annotations

import contextlib
import html
import json
import math
import random
import shutil
import statistics
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from vivace.bench.report import _plot as success_vs_tokens_plot
from vivace.bench.report import summarize
from vivace.bench.runner import run_benchmark
from vivace.config import VivaceConfig
from vivace.harness.policies import deterministic
from vivace.harness.trajectory import Trajectory
from vivace.rl.metrics import behaviour
from vivace.rl.runs import checkpoint_step, latest_checkpoint, metrics_rows
from vivace.rl.shift import divergence, policy_shift
from vivace.tasks.format import Task
from vivace.tasks.suites import load_suite

DEFAULT_BASELINES = ("scripted:random-edit", "scripted:oracle")
# (key, label, format): the per-policy numbers, in the order the report shows them.
METRICS = [
    ("success", "held-out success", "pct"),
    ("success_learnable", "success, learnable families", "pct"),
    ("success_harder", "success, harder families", "pct"),
    ("mean_reward", "reward (benchmark score)", "{:.3f}"),
    ("tool_calls_per_turn", "tool calls per turn with calls", "{:.2f}"),
    ("turns_per_episode", "turns per episode", "{:.1f}"),
    ("turns_per_solved", "turns per solved task", "{:.1f}"),
    ("tokens_per_episode", "tokens per episode (reference)", "{:.0f}"),
    ("reads_before_first_edit", "reads/searches before the first edit", "{:.1f}"),
    ("unsupported_claim_rate", "unsupported-claim rate", "pct"),
    ("format_errors_per_episode", "format errors per episode", "{:.2f}"),
    ("repeated_rejected_per_episode", "repeats of a rejected call per episode", "{:.2f}"),
]
CURVE_KEYS = ("reward_mean", "success_rate", "agent_turns", "agent_tool_calls_per_turn")
MAX_CURVE_ROWS = 20


# ---- choosing what to evaluate ------------------------------------------------------------------


def held_out_tasks(cfg: VivaceConfig, n: int | None = None, split: str | None = None) -> list[Task]:
    """`n` tasks (default: one per family) of the evaluation suite (cfg.train.eval_suite, else the
    training suite) at `split` (default cfg.train.eval_split), round-robin over families in an
    order seeded by cfg.train.seed."""
    split = split or cfg.train.eval_split
    suite = cfg.train.eval_suite or cfg.train.suite
    tasks = load_suite(suite, split=split)
    if not tasks:
        raise ValueError(f"suite {suite!r} has no tasks in split {split!r} (a task's split is its metadata.split; "
                         "train when it names none); choose another train.eval_split or train.eval_suite, or set "
                         "train.eval_tasks to 0 for no evaluation")  # fmt: skip
    return stratified(tasks, n, cfg.train.seed)


def stratified(tasks: list[Task], n: int | None, seed: int) -> list[Task]:
    by_family: dict[str, list[Task]] = {}
    for t in sorted(tasks, key=lambda t: t.id):  # the suite's file order must not change the draw
        by_family.setdefault(t.family, []).append(t)
    rng = random.Random(seed)
    families = sorted(by_family)
    rng.shuffle(families)
    for f in families:
        rng.shuffle(by_family[f])
    n = len(families) if n is None else n
    picked: list[Task] = []
    while len(picked) < n and any(by_family.values()):
        picked += [by_family[f].pop() for f in families if by_family[f]][: n - len(picked)]
    return picked


def trained_policy(run_dir: Path) -> str:
    """The policy spec of the run's last checkpoint (its Hugging Face directory)."""
    ckpt = latest_checkpoint(run_dir)
    if ckpt is None or not (ckpt / "model" / "config.json").is_file():
        raise ValueError(f"{run_dir} has no checkpoint with weights (checkpoints/step_N/model); "
                         f"finish the run first: `vivace train --resume {run_dir}`")  # fmt: skip
    return str(ckpt / "model")


# ---- running it ---------------------------------------------------------------------------------


async def evaluate_run(
    cfg: VivaceConfig,
    run_dir: Path,
    before: str,
    after: str,
    tasks: list[Task],
    baselines: Iterable[str] = DEFAULT_BASELINES,
    concurrency: int = 4,
    progress: Callable[[int, int, int], None] | None = None,
) -> dict[str, Any]:
    """Benchmarks before, after and the baselines on `tasks` into run_dir/eval/, writes
    report.json/.md/.html into run_dir and returns the report. `progress(done, total, solved)`
    follows the episodes."""
    if cfg.train.eval_temperature is not None:
        cfg = cfg.model_copy(deep=True)
        cfg.engine.temperature = cfg.train.eval_temperature
    roles = {"before": before, "after": after, **{b: b for b in baselines}}
    specs = list(dict.fromkeys(roles.values()))  # a policy named twice runs once
    # Scripted baselines act the same in every episode of a task: one each says it all.
    once = {b for b in baselines if deterministic(b)} - {before, after}
    out_dir = run_dir / "eval"
    kept = keep_previous_report(run_dir)
    try:
        return await _evaluate_into(cfg, run_dir, out_dir, roles, specs, once, tasks, concurrency, progress)
    except BaseException:  # failed or interrupted (Ctrl-C): the earlier report goes back where it was
        restore_previous_report(run_dir, kept)
        raise


async def _evaluate_into(cfg, run_dir, out_dir, roles, specs, once, tasks, concurrency, progress) -> dict[str, Any]:
    shutil.rmtree(out_dir, ignore_errors=True)  # results.jsonl is appended to: a rerun starts clean
    samples = cfg.train.eval_samples
    total = sum(1 if s in once else samples for s in specs) * len(tasks)
    done, solved = [0], [0]

    def on_done(row: dict[str, Any]) -> None:
        done[0] += 1
        solved[0] += bool(row.get("resolved"))
        if progress:
            progress(done[0], total, solved[0])

    t0 = time.monotonic()
    rows = await run_benchmark(specs, tasks, cfg, out_dir, concurrency, on_done, samples, once)
    report = build_report(run_dir, roles, tasks, rows, out_dir, time.monotonic() - t0)
    report["temperature"] = cfg.engine.temperature
    report["shift"] = measure_shift(rows, roles["before"], roles["after"], out_dir, cfg)
    report["samples"] = samples
    report["once"] = sorted(once) if samples > 1 else []  # policies that ran one episode per task
    write_report(run_dir, report)
    return report


def keep_previous_report(run_dir: Path) -> Path | None:
    """Move an earlier report (report.json/.md/.html and its episodes, eval/) into
    run_dir/reports/N/ before a new one replaces it: a report on more tasks or samples must not
    cost the one `vivace train` wrote. Returns where it went (None: there was none)."""
    if not (run_dir / "report.json").is_file():  # none, or one that never finished: nothing to keep
        return None
    previous = [run_dir / name for name in ("report.json", "report.md", "report.html", "eval")]
    kept = run_dir / "reports"
    n = 1 + max((int(p.name) for p in kept.glob("*") if p.name.isdigit()), default=0)
    dest = kept / str(n)
    dest.mkdir(parents=True)
    for p in previous:
        if p.exists():
            p.rename(dest / p.name)
    return dest


def restore_previous_report(run_dir: Path, kept: Path | None) -> None:
    """Undo `keep_previous_report` when the new report did not complete: the partial one (its eval/,
    no report files yet) is dropped and the earlier one is back at the top of run_dir."""
    if kept is None:
        return
    for name in ("report.json", "report.md", "report.html", "eval"):
        if (kept / name).exists():
            target = run_dir / name
            if target.is_dir():
                shutil.rmtree(target)
            else:
                target.unlink(missing_ok=True)
            (kept / name).rename(target)
    kept.rmdir()
    with contextlib.suppress(OSError):  # reports/ stays when it holds other reports
        kept.parent.rmdir()


def measure_shift(
    rows: list[dict[str, Any]], before: str, after: str, out_dir: Path, cfg: VivaceConfig
) -> dict[str, Any]:
    """How far training moved the policy (rl.shift): the paired episodes' divergence, and the KL on the
    starting policy's first episode of each task (~20 s on 2 cores for the tiny preset)."""
    episodes: dict[tuple[str, int], dict[str, Trajectory]] = {}
    for r in rows:
        if r["model"] in (before, after) and "error" not in r and "trajectory" in r:  # not one whose save failed
            key = (r["task_id"], r.get("sample", 0))
            episodes.setdefault(key, {})[r["model"]] = Trajectory.load(out_dir / r["trajectory"])
    pairs = [(e[before], e[after]) for e in episodes.values() if before in e and after in e]
    first = [e[before] for (_, sample), e in episodes.items() if sample == 0 and before in e]
    try:  # two copies of a large policy may not fit where one served: the report must not be lost for it
        kl = policy_shift(before, after, first, cfg.engine)
    except (RuntimeError, OSError, ValueError) as e:  # torch.OutOfMemoryError is a RuntimeError
        kl = {"error": f"{type(e).__name__}: {e}"[:300]}
    return {"divergence": divergence(pairs), "kl": kl}


# ---- the numbers --------------------------------------------------------------------------------


def build_report(run_dir: Path, roles: dict[str, str], tasks: list[Task], rows: list[dict[str, Any]],
                 out_dir: Path, seconds: float) -> dict[str, Any]:  # fmt: skip
    by_id = {t.id: t for t in tasks}
    families = _families(tasks)
    harder = {f for f, v in families.items() if not v["learnable"]}
    bench = summarize([{**r, "model": label} for label, spec in roles.items() for r in rows if r["model"] == spec])
    policies = {
        label: {"spec": spec, **policy_stats([r for r in rows if r["model"] == spec], by_id, harder, out_dir),
                "bench": bench.get(label, {})}
        for label, spec in roles.items()
    }  # fmt: skip
    # The rows of the steps the evaluated checkpoint holds: a run killed after a step's row but before its
    # checkpoint has rows the trained policy never saw.
    trained = checkpoint_step(Path(roles["after"]))
    every = training_curves(run_dir / "metrics.jsonl")
    curves = [c for c in every if trained is None or c["step"] <= trained]
    return {
        "run": run_dir.name,
        "run_dir": str(run_dir),
        "tasks": [t.id for t in tasks],
        "task_splits": sorted({str(t.split) for t in tasks}),
        "families": families,
        "policies": policies,
        "before_after": {k: _change(policies["before"].get(k), policies["after"].get(k)) for k, _, _ in METRICS},
        "paired": paired(rows, roles["before"], roles["after"]),
        "curves": curves,
        "training": {"steps": len(curves), "first": curves[0] if curves else None, "last": curves[-1] if curves else None,
                     "supervised": supervised_term(run_dir), "steps_after_checkpoint": len(every) - len(curves)},
        "eval_seconds": seconds,
    }  # fmt: skip


def supervised_term(run_dir: Path) -> dict[str, Any] | None:
    """The run's supervised term (train.sft_data or sft_expert), from its config.json; None when off: a
    report must say when the change is not the policy gradient's alone."""
    try:
        tc = json.loads((run_dir / "config.json").read_text())["train"]
    except (OSError, ValueError, KeyError):
        return None
    if not tc.get("sft_coef") or not (tc.get("sft_data") or tc.get("sft_expert")):
        return None
    data = tc.get("sft_data") or f"the expert on {tc['sft_expert']} training tasks and renamed copies"
    return {"coef": tc["sft_coef"], "episodes_per_update": tc.get("sft_episodes"), "data": str(data)}


def _families(tasks: list[Task]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for t in tasks:
        f = out.setdefault(t.family, {"tasks": 0, "learnable": True})
        f["tasks"] += 1
        f["learnable"] = f["learnable"] and t.metadata.get("learnable") is not False
    return dict(sorted(out.items()))


def policy_stats(rows: list[dict[str, Any]], by_id: dict[str, Task], harder: set[str], out_dir: Path) -> dict[str, Any]:
    """One policy's held-out numbers; rows that failed to run count as unsolved episodes."""
    scored = [r for r in rows if "error" not in r]
    solved = [r for r in scored if r["resolved"]]
    d = [r["details"] for r in scored]
    moves = [behaviour(Trajectory.load(out_dir / r["trajectory"])) for r in scored if "trajectory" in r]
    fam = {r["task_id"]: by_id[r["task_id"]].family for r in rows}
    per_family: dict[str, dict[str, Any]] = {}
    for r in rows:
        e = per_family.setdefault(fam[r["task_id"]], {"episodes": 0, "solved": 0})
        e["episodes"] += 1
        e["solved"] += bool(r.get("resolved"))
    for e in per_family.values():
        e["success"] = e["solved"] / e["episodes"]
    return {
        "episodes": len(rows),
        "errors": len(rows) - len(scored),
        "solved": len(solved),
        "success": _rate(rows),
        "success_learnable": _rate([r for r in rows if fam[r["task_id"]] not in harder]),
        "success_harder": _rate([r for r in rows if fam[r["task_id"]] in harder]),
        "mean_reward": _mean([r["total"] for r in rows]),
        "tool_calls_per_turn": _mean([x["tool_calls_per_turn"] for x in d]),
        "turns_per_episode": _mean([x["turns"] for x in d]),
        "turns_per_solved": _mean([r["details"]["turns"] for r in solved]),
        "tokens_per_episode": _mean([x["reference_tokens"] for x in d if x.get("reference_tokens") is not None]),
        "completion_tokens_per_episode": _mean([x.get("completion_tokens", 0) for x in d]),
        "reads_before_first_edit": _mean([m["reads_before_first_edit"] for m in moves]),
        "unsupported_claim_rate": _mean([1.0 if x["unsupported_claims"] else 0.0 for x in d]),
        "format_errors": sum(x["format_errors"] for x in d),
        "format_errors_per_episode": _mean([x["format_errors"] for x in d]),
        "repeated_rejected_per_episode": _mean([m["repeated_rejected_calls"] for m in moves]),
        "families": dict(sorted(per_family.items())),
    }


def paired(rows: list[dict[str, Any]], before: str, after: str) -> dict[str, Any]:
    """Episode by episode, before against after: the benchmark gives both policies the same seed
    for the same (task, sample), so where their weights agree they sample the same tokens, and
    the episodes only one of them solved are what training changed. Then task by task: the tasks
    solved in more of their paired episodes after (`tasks_up`) and in fewer (`tasks_down`), and
    the sign test's p-value of that split. `change` is the success rate's change over the paired
    episodes (each task weighs alike) and `change_ci95` its 95% interval from the spread of the
    per-task changes (normal approximation, kept within the -1..+1 a rate's change can span; None
    under two tasks): how large a change this evaluation can tell from sampling luck. A pair with an episode
    that could not run (an `error` row: a setup or the policy's server failed) says nothing about what
    training changed: it is left out, and counted (`left_out`). `turns_both_solved` is the mean turns of
    each policy over the episodes both solved: speed on the same episodes, which turns per solved task is
    not when the two solve different ones (a harder task newly solved takes more turns)."""
    outcome: dict[tuple[str, int], dict[str, bool]] = {}
    turns: dict[tuple[str, int], dict[str, int]] = {}
    failed: set[tuple[str, int]] = set()
    for r in rows:
        if r["model"] in (before, after):
            key = (r["task_id"], r.get("sample", 0))
            outcome.setdefault(key, {})[r["model"]] = bool(r.get("resolved"))
            if "error" in r:
                failed.add(key)
            elif (n := (r.get("details") or {}).get("turns")) is not None:
                turns.setdefault(key, {})[r["model"]] = n
    both_ran = {key: o for key, o in outcome.items() if before in o and after in o}
    pairs = {key: o for key, o in both_ran.items() if key not in failed}
    change: dict[str, int] = {}
    episodes: dict[str, int] = {}
    for (task, _), o in pairs.items():
        change[task] = change.get(task, 0) + o[after] - o[before]
        episodes[task] = episodes.get(task, 0) + 1
    up, down = sum(d > 0 for d in change.values()), sum(d < 0 for d in change.values())
    per_task = [change[t] / episodes[t] for t in change]
    mean = statistics.fmean(per_task) if per_task else None
    half = 1.96 * statistics.stdev(per_task) / math.sqrt(len(per_task)) if len(per_task) > 1 else None
    both_solved = [turns[key] for key, o in pairs.items() if o[before] and o[after] and len(turns.get(key, {})) == 2]
    return {
        "episodes": len(pairs),
        "left_out": len(both_ran) - len(pairs),
        "both": sum(o[before] and o[after] for o in pairs.values()),
        "before_only": sum(o[before] and not o[after] for o in pairs.values()),
        "after_only": sum(o[after] and not o[before] for o in pairs.values()),
        "tasks_up": up,
        "tasks_down": down,
        "p_value": sign_test(up, down),
        "change": mean,
        "change_ci95": [max(-1.0, mean - half), min(1.0, mean + half)]
        if mean is not None and half is not None
        else None,
        "turns_both_solved": {
            "episodes": len(both_solved),
            "before": statistics.fmean(t[before] for t in both_solved),
            "after": statistics.fmean(t[after] for t in both_solved),
        }
        if both_solved
        else None,
    }


def sign_test(up: int, down: int) -> float:
    """Two-sided exact sign test: the chance of a split at least as uneven as `up` against `down`
    if each changed task were as likely to go either way (training changed nothing)."""
    n = up + down
    tail = sum(math.comb(n, i) for i in range(min(up, down) + 1)) / 2**n
    return min(1.0, 2 * tail)


def training_curves(metrics_file: Path) -> list[dict[str, Any]]:
    """The curve keys of each step in metrics.jsonl. A last line cut short (the run was killed while
    appending it) is left out, as bench.results does for results.jsonl: it must not cost the report
    after the whole evaluation has run."""
    return [{"step": r["step"], **{k: r[k] for k in CURVE_KEYS if k in r}} for r in metrics_rows(metrics_file)]


def _rate(rows: list[dict[str, Any]]) -> float | None:
    return sum(bool(r.get("resolved")) for r in rows) / len(rows) if rows else None


def _mean(xs: list[float]) -> float | None:
    return statistics.fmean(xs) if xs else None


def _change(before: float | None, after: float | None) -> dict[str, float | None]:
    delta = after - before if before is not None and after is not None else None
    return {"before": before, "after": after, "delta": delta}


# ---- rendering ----------------------------------------------------------------------------------


def write_report(run_dir: Path, report: dict[str, Any]) -> None:
    (run_dir / "report.json").write_text(json.dumps(report, indent=1))
    (run_dir / "report.md").write_text(markdown_report(report))
    (run_dir / "report.html").write_text(html_report(report))


def _fmt(value: float | None, fmt: str) -> str:
    if value is None:
        return "n/a"
    return f"{value:.1%}" if fmt == "pct" else fmt.format(value)


def _fmt_delta(value: float | None, fmt: str) -> str:
    if value is None:
        return "n/a"
    return f"{value * 100:+.1f} pts" if fmt == "pct" else ("{:+" + fmt[2:]).format(value)


def change_lines(report: dict[str, Any]) -> list[str]:
    """One "label: before → after (delta)" line per metric."""
    out = []
    for key, label, fmt in METRICS:
        c = report["before_after"][key]
        out.append(f"{label}: {_fmt(c['before'], fmt)} → {_fmt(c['after'], fmt)} ({_fmt_delta(c['delta'], fmt)})")
    if (p := report.get("paired")) and p["episodes"]:
        left_out = f" ({p['left_out']} pairs left out: an episode could not run)" if p.get("left_out") else ""
        out.append(f"paired episodes (same task, same seed): {p['after_only']} solved only after, {p['before_only']} "
                   f"only before, {p['both']} by both, of {p['episodes']}{left_out}")  # fmt: skip
        if "tasks_up" in p:  # reports written before the task-level count have none
            out.append(f"paired tasks: {p['tasks_up']} solved more often after, {p['tasks_down']} less often "
                       f"(sign test p = {p['p_value']:.2f}{'' if p['p_value'] < 0.05 else ': not beyond chance'})")  # fmt: skip
        if p.get("change_ci95"):  # nor the interval
            lo, hi = p["change_ci95"]
            luck = ": it holds zero, so this report cannot tell the change from sampling luck" if lo <= 0 <= hi else ""
            out.append(f"success change on the paired episodes: {p['change'] * 100:+.1f} pts, 95% interval "
                       f"{lo * 100:+.1f} to {hi * 100:+.1f} pts (from the spread over tasks){luck}")  # fmt: skip
        if t := p.get("turns_both_solved"):
            out.append(f"turns on the {t['episodes']} paired episodes both solved: {t['before']:.1f} → {t['after']:.1f} "
                       f"({t['after'] - t['before']:+.1f}; speed on the same episodes)")  # fmt: skip
    shift = report.get("shift") or {}
    if d := shift.get("divergence"):
        split = d["sampled_before_divergence"]
        out.append(f"paired episodes token for token the same before and after: {d['identical']} of {d['episodes']}"
                   + (f"; the others part after a median of {split:g} sampled tokens" if split is not None else ""))  # fmt: skip
    if (k := shift.get("kl")) and "error" in k:
        out.append(f"policy shift: not measured ({k['error']})")
    elif k:
        out.append(f"policy shift on the starting policy's {k['tokens']} sampled tokens of {k['episodes']} episodes "
                   f"(T {k['temperature']:g}): KL(before ‖ after) {k['kl_mean']:.2g} nats/token, top token changed "
                   f"at {k['top_changed']:.2%} of them, their log-probability {k['logprob_change']:+.3f}")  # fmt: skip
    return out


Table = tuple[list[str], list[list[str]]]


def family_table(report: dict[str, Any], learnable: bool) -> Table:
    """Success per family (rate and solved/episodes) for every policy, with subtotal rows."""
    fams = report["families"]
    names = [f for f, v in fams.items() if v["learnable"] == learnable]
    harder = [f for f, v in fams.items() if not v["learnable"]]
    rows = [_group_row(report, f, [f]) for f in names]
    if learnable and harder:
        rows += [_group_row(report, "**all learnable**", names), _group_row(report, "**all**", list(fams))]
    elif learnable:
        rows.append(_group_row(report, "**all**", names))
    elif len(names) > 1:
        rows.append(_group_row(report, "**all harder**", names))
    return ["family", "tasks", *report["policies"]], rows


def _group_row(report: dict[str, Any], name: str, families: list[str]) -> list[str]:
    cells = []
    for p in report["policies"].values():
        entries = [p["families"][f] for f in families if f in p["families"]]
        solved, episodes = sum(e["solved"] for e in entries), sum(e["episodes"] for e in entries)
        cells.append(f"{solved / episodes:.0%} ({solved}/{episodes})" if episodes else "n/a")
    return [name, str(sum(report["families"][f]["tasks"] for f in families)), *cells]


# Per-family success has its own tables; per-episode format errors are shown as a total here.
_POLICY_COLUMNS = [
    m for m in METRICS if m[0] not in ("success_learnable", "success_harder", "format_errors_per_episode")
]


def policy_table(report: dict[str, Any]) -> Table:
    head = ["policy", *(label for _, label, _ in _POLICY_COLUMNS), "format errors"]
    rows = [[label, *(_fmt(p[k], fmt) for k, _, fmt in _POLICY_COLUMNS), str(p["format_errors"])]
            for label, p in report["policies"].items()]  # fmt: skip
    return head, rows


def curve_table(report: dict[str, Any]) -> Table:
    curves = report["curves"]
    if len(curves) > MAX_CURVE_ROWS:  # evenly spaced steps, first and last kept; all are in report.json
        idx = sorted({round(i * (len(curves) - 1) / (MAX_CURVE_ROWS - 1)) for i in range(MAX_CURVE_ROWS)})
        curves = [curves[i] for i in idx]
    head = ["step", "reward", "success", "turns", "calls/turn (all turns)"]
    fmts = ("{:.3f}", "pct", "{:.1f}", "{:.2f}")
    rows = [[str(c["step"]), *(_fmt(c.get(k), f) for k, f in zip(CURVE_KEYS, fmts, strict=True))] for c in curves]
    return head, rows


def _md_table(table: Table) -> list[str]:
    head, rows = table
    return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head), *("| " + " | ".join(r) + " |" for r in rows)]


def _intro(report: dict[str, Any]) -> list[str]:
    p = report["policies"]
    fams = report["families"]
    harder = [f for f, v in fams.items() if not v["learnable"]]
    once = report.get("once", [])
    return [
        f"- before: `{p['before']['spec']}`; after: `{p['after']['spec']}`",
        f"- baselines: {', '.join(f'`{k}`' for k in p if k not in ('before', 'after')) or 'none'}",
        f"- held-out: {len(report['tasks'])} tasks"
        + (f" × {report['samples']} episodes each" if report.get("samples", 1) > 1 else "")
        + (f" (one for {', '.join(f'`{k}`' for k in once)}: scripted, the same every time)" if once else "")
        + f" (split {', '.join(report['task_splits'])}) over "
        f"{len(fams)} families: {', '.join(fams)}" + (f" (harder: {', '.join(harder)})" if harder else ""),
        f"- training: {report['training']['steps']} steps"
        + (
            f" (the checkpoint evaluated; {later} later step{'s' * (later > 1)}, killed before its checkpoint, left "
            "out)"
            if (later := report["training"].get("steps_after_checkpoint"))
            else ""
        )
        + f"; evaluation took {report['eval_seconds']:.0f} s"
        + (f" at temperature {report['temperature']:g}" if report.get("temperature") is not None else ""),
        *_supervised_line(report["training"].get("supervised")),
        *_errors_line(p),
    ]


def _errors_line(policies: dict[str, Any]) -> list[str]:
    """Episodes that could not run count as unsolved (success, reward, the family tables; the paired
    comparison leaves their pairs out): a reader must be told, or a setup failure or a server outage reads
    as the policy's doing."""
    failed = [f"{label} {p['errors']} of {p['episodes']}" for label, p in policies.items() if p.get("errors")]
    if not failed:
        return []
    return [f"- episodes that could not run (a setup or the policy's server failed), counted below as unsolved "
            f"(the paired comparison leaves their pairs out): {', '.join(failed)}; the benchmark's own success rate "
            "(report.json, `bench`) leaves them out"]  # fmt: skip


def _supervised_line(term: dict[str, Any] | None) -> list[str]:
    if not term:
        return []
    return [f"- supervised term beside the policy gradient: {term['episodes_per_update']} expert episodes per update "
            f"at weight {term['coef']:g} ({term['data']}); the change below is not RL's alone"]  # fmt: skip


def markdown_report(report: dict[str, Any]) -> str:
    lines = [f"# RL report: {report['run']}", "", *_intro(report), "", "## Before → after (held-out)", ""]
    lines += [f"- {line}" for line in change_lines(report)]
    lines += ["", "## Held-out success by family", "", *_md_table(family_table(report, True))]
    harder = family_table(report, False)
    if harder[1]:
        lines += ["", "### Harder families (not expected to be learnt)", "", *_md_table(harder)]
    lines += ["", "## Behaviour per policy (held-out)", "", *_md_table(policy_table(report))]
    lines += ["", "## Training curves", ""]
    lines += _md_table(curve_table(report)) if report["curves"] else ["(no metrics.jsonl)"]
    return "\n".join(lines) + "\n"


def _html_table(table: Table) -> str:
    head, rows = table
    th = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    trs = "".join("<tr>" + "".join(f"<td>{html.escape(c.strip('*'))}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><tr>{th}</tr>{trs}</table>"


def line_plot(curves: list[dict[str, Any]], key: str, title: str) -> str:
    """One metric over training steps as an inline SVG polyline."""
    pts = [(c["step"], c[key]) for c in curves if c.get(key) is not None]
    if not pts:
        return ""
    w, h, pad = 420, 220, 40
    x0, x1 = pts[0][0], max(pts[-1][0], pts[0][0] + 1)
    y0, y1 = min(0.0, *(y for _, y in pts)), max(1.0 if key == "success_rate" else 0.0, *(y for _, y in pts))
    y1 = y1 if y1 > y0 else y0 + 1

    def xy(x: float, y: float) -> str:
        return f"{pad + (w - 2 * pad) * (x - x0) / (x1 - x0):.1f},{h - pad - (h - 2 * pad) * (y - y0) / (y1 - y0):.1f}"

    line = " ".join(xy(x, y) for x, y in pts)
    return (
        f"<svg width='{w}' height='{h}' xmlns='http://www.w3.org/2000/svg'>"
        f"<line x1='{pad}' y1='{h - pad}' x2='{w - pad}' y2='{h - pad}' stroke='#000'/>"
        f"<line x1='{pad}' y1='{pad}' x2='{pad}' y2='{h - pad}' stroke='#000'/>"
        f"<polyline points='{line}' fill='none' stroke='#3366cc' stroke-width='2'/>"
        f"<text x='{w / 2}' y='{pad - 12}' font-size='13' text-anchor='middle'>{html.escape(title)}</text>"
        f"<text x='{w / 2}' y='{h - 10}' font-size='11' text-anchor='middle'>step {x0}..{pts[-1][0]}</text>"
        f"<text x='4' y='{pad + 4}' font-size='11'>{y1:.2g}</text><text x='4' y='{h - pad}' font-size='11'>{y0:.2g}</text>"
        "</svg>"
    )


def html_report(report: dict[str, Any]) -> str:
    title = f"RL report: {report['run']}"
    intro = "".join(f"<li>{html.escape(s[2:].replace('`', ''))}</li>" for s in _intro(report))
    changes = "".join(f"<li>{html.escape(s)}</li>" for s in change_lines(report))
    harder = family_table(report, False)
    curves = report["curves"]
    plots = line_plot(curves, "reward_mean", "mean reward") + line_plot(curves, "success_rate", "success rate")
    bench = {label: p["bench"] for label, p in report["policies"].items() if p["bench"]}
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title><style>"
        "body{font-family:system-ui,sans-serif;margin:2em}table{border-collapse:collapse;margin:1em 0}"
        "td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}td:first-child{text-align:left}"
        f"</style></head><body><h1>{html.escape(title)}</h1><ul>{intro}</ul>"
        f"<h2>Before → after (held-out)</h2><ul>{changes}</ul>"
        f"<h2>Held-out success by family</h2>{_html_table(family_table(report, True))}"
        + (f"<h3>Harder families (not expected to be learnt)</h3>{_html_table(harder)}" if harder[1] else "")
        + f"<h2>Behaviour per policy (held-out)</h2>{_html_table(policy_table(report))}"
        f"<h2>Training curves</h2>{plots}" + (_html_table(curve_table(report)) if curves else "<p>(no metrics.jsonl)</p>")
        + (success_vs_tokens_plot(bench) if len(bench) > 1 else "")
        + "</body></html>\n"
    )  # fmt: skip
