"""The training loop: one controller owns it; the sampler, the rollouts and the trainer do the work.

Each step: take the next `tasks_per_step` complete groups from the rollout pipeline
(rl/pipeline.py: `group_size` episodes of each task in the run's seeded order, on the current
policy, scored with the benchmark's scorer; synchronous or asynchronous), turn rewards into group
advantages, train one step, and send the new weights to the samplers (bytes and seconds
measured). Everything a step produced goes to the run directory:

    runs/NAME/config.json         the whole configuration
    runs/NAME/metrics.jsonl       one line per step (rewards, components, advantages, loss, KL,
                                  throughput, weight sync, rollout times, agent behaviour)
    runs/NAME/tensorboard/        the same numbers as TensorBoard scalars
    runs/NAME/trajectories/step_N.jsonl   every rollout of step N (trajectory + reward)
    runs/NAME/timeline.jsonl      every episode attempt: start, end, worker, sampler, versions,
                                  per-turn model/tool time, outcome (finished, requeued, ...)
    runs/NAME/checkpoints/step_N/ weights (HF directory), optimizer, step, data position, RNG
    runs/NAME/summary.json        the run's first and last numbers, written at the end (its
                                  pipeline counts are this process's, from pipeline_from_step on)

Resume (`--resume runs/NAME`): the last checkpoint's weights, optimizer and RNG are loaded and the
task order continues from its data position (groups opened but not yet trained are opened
again), so the run goes on as if never stopped; metrics of steps after that checkpoint are
discarded and recomputed. If the trainer fails, the run stops with `TrainerFailed`, naming the
last checkpoint to resume from.

The work runs on Ray actors by default (rl/workers.py: sampler replicas, rollout workers, trainer
ranks), or in this process (`LocalWorkers`).
"""

from __future__ import annotations

import asyncio
import json
import pickle
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.utils.tensorboard import SummaryWriter

from vivace.config import TrainConfig, VivaceConfig
from vivace.files import sync_tree, write_atomic
from vivace.rl.metrics import behaviour, mean, percentile
from vivace.rl.pipeline import Pipeline
from vivace.rl.rollout import Rollout, to_samples
from vivace.rl.runs import latest_checkpoint, metrics_rows, prune_checkpoints
from vivace.rl.trainer import failed_writes_as_oserror
from vivace.rl.workers import RayWorkers
from vivace.tasks.format import Task
from vivace.tasks.suites import load_suite


def training_tasks(cfg: VivaceConfig) -> list[Task]:
    """The tasks a run trains on: the suite at cfg.train.split, only cfg.train.families and then only
    cfg.train.task_ids (in that order) when set."""
    tc = cfg.train
    tasks = load_suite(tc.suite, split=tc.split)
    if not tasks:
        raise ValueError(f"suite {tc.suite!r} has no tasks{f' in split {tc.split!r}' if tc.split else ''}; choose "
                         "another train.split (train, validation, test, or null for all) or train.suite")  # fmt: skip
    if tc.families is not None:
        known = sorted({t.family for t in tasks})
        if unknown := sorted(set(tc.families) - set(known)):
            raise ValueError(
                f"train.families: {', '.join(unknown)} not in suite {tc.suite!r} (split {tc.split}); "
                f"its families: {', '.join(known)}; list some of those, or set train.families to null for all "
                "(the tiny preset names the built-in families)"
            )
        tasks = [t for t in tasks if t.family in tc.families]
    if tc.task_ids is not None:
        by_id = {t.id: t for t in tasks}
        if missing := [i for i in tc.task_ids if i not in by_id]:
            raise ValueError(
                f"train.task_ids: {', '.join(missing[:5])}{' …' if len(missing) > 5 else ''} not among the "
                f"{len(tasks)} tasks of suite {tc.suite!r} (split {tc.split}, families {tc.families or 'all'})"
            )
        tasks = [by_id[i] for i in dict.fromkeys(tc.task_ids)]
    if not tasks:
        empty = "train.families" if tc.families == [] else "train.task_ids"
        raise ValueError(f"{empty} is an empty list: no tasks to train on; list some, or set it to null for all")
    return tasks


def check_model_and_data(cfg: VivaceConfig) -> tuple[int, int]:
    """train.model (its tokenizer, config, and weight files whose headers fit that config; a context
    that holds the agent's system turn) and train.sft_data read as the trainer will read it, before the
    run directory exists: a wrong model path, weights that do not load or a bad data file stop here,
    not in a trainer rank after minutes of start-up (the weights themselves are read there). Returns
    the model's context and the system turn's length in tokens."""
    from vivace.harness.chat import ChatFormat
    from vivace.harness.messages import Message
    from vivace.harness.prompts import SYSTEM_PROMPT
    from vivace.harness.tools import default_tools
    from vivace.harness.tools.base import tool_schema
    from vivace.inference.forward import causal_lm_class, engine_refusal
    from vivace.model.checkpoint import load_tokenizer, model_config, require_weights, vocab_problem

    tc = cfg.train
    try:
        tokenizer = load_tokenizer(tc.model)
        config = model_config(tc.model)
        require_weights(tc.model, config)
    except ValueError as e:
        raise ValueError(f"train.model: {e}") from None
    # The samplers' engine and the trainer's rows read these only once their actors start, a minute in.
    if problem := engine_refusal(causal_lm_class(config), config) or vocab_problem(tokenizer, config):
        raise ValueError(f"train.model: {problem}")
    context = getattr(config, "max_position_embeddings", None) or 1 << 30
    tools = [tool_schema(t) for t in default_tools()]
    prompt = len(ChatFormat(tokenizer).prompt_ids([Message("system", SYSTEM_PROMPT), Message("user", "")], tools))
    if prompt >= context:
        raise ValueError(f"train.model: its context is {context} tokens and the agent's system turn alone takes "
                         f"{prompt}: no episode can start; give a model with a longer context")  # fmt: skip
    if tc.sft_data is None or tc.sft_coef == 0:  # the trainer does not read it
        return context, prompt
    from vivace.rl.sft_train import check_rendered_with, read_episodes

    path = Path(tc.sft_data)
    if not path.is_file():
        what = "is a directory" if path.is_dir() else "does not exist"
        raise ValueError(f"{path}: train.sft_data {what}; give a JSONL file made by `vivace sft data`, or null")
    # Ids are checked against the tokenizer, as `vivace sft train` does: one beyond it is no token of this model.
    read_episodes(path, len(tokenizer))  # an SftDataError (a ValueError) naming file and line
    check_rendered_with(path, tokenizer)
    return context, prompt


class TaskOrder:
    """An endless, seeded order over the tasks: a fresh permutation every epoch, so a task-order
    position (the pipeline's; a checkpoint's `data_position`) is all it takes to continue it.

    With `replay` > 0, that share of the positions (a seeded draw per position) goes instead to a
    task whose last group split on success, oldest first: only such groups train under the
    correctness filter, and a task the policy solves sometimes is where it learns (prioritised
    level replay, Jiang et al. 2021). A replayed task re-enters the queue only if it splits again,
    and at most `replay_limit` times, so a short queue does not keep handing back the same one. The
    replay state (queue, replays per task, fresh tasks handed out, positions not yet reported) goes
    into the checkpoint (`state`)."""

    def __init__(
        self, tasks: list[Task], seed: int, replay: float = 0.0, replay_limit: int = 3, state: dict | None = None
    ):
        if not tasks:
            raise ValueError("no tasks to train on: check --suite and the split")
        self.tasks, self.seed, self.replay, self.limit = tasks, seed, replay, replay_limit
        self.by_id = {t.id: t for t in tasks}
        state = state or {}
        self.fresh: int = state.get("fresh", 0)
        self.queue: list[str] = list(state.get("queue", []))
        self.handed: dict[int, str] = {int(p): i for p, i in state.get("handed", {}).items()}
        self.replays: dict[str, int] = dict(state.get("replays", {}))  # times each task was replayed
        self.replayed: set[int] = set()  # positions handed out as replays (for the step's metrics)

    def at(self, position: int) -> Task:
        if not self.replay:
            return self._fresh(position)
        if position not in self.handed:
            if self.queue and random.Random(f"{self.seed}:replay:{position}").random() < self.replay:
                task_id = self.handed[position] = self.queue.pop(0)
                self.replays[task_id] = self.replays.get(task_id, 0) + 1
                self.replayed.add(position)
            else:
                self.handed[position] = self._fresh(self.fresh).id
                self.fresh += 1
        return self.by_id[self.handed[position]]

    def report(self, position: int, resolved: list[bool]) -> bool:
        """The outcome of the group at `position`: a split group queues its task for replay.
        Returns whether the group was a replay."""
        task_id = self.handed.pop(position, None)
        was_replay = position in self.replayed
        self.replayed.discard(position)
        split = any(resolved) and not all(resolved)
        if task_id is not None and split and self.replays.get(task_id, 0) < self.limit:
            self.queue.append(task_id)
        return was_replay

    def state(self) -> dict:
        handed = {str(p): i for p, i in self.handed.items()}
        return {"fresh": self.fresh, "queue": self.queue, "handed": handed, "replays": self.replays}

    def _fresh(self, index: int) -> Task:
        epoch, i = divmod(index, len(self.tasks))
        perm = list(range(len(self.tasks)))
        random.Random(f"{self.seed}:{epoch}").shuffle(perm)
        return self.tasks[perm[i]]


# Beside the policies' episodes, the evaluation loads both models, runs the scripted baselines, measures the
# policy shift and writes the report: ~100 s on the slower 2-core machine (docs/benchmarks.md).
EVAL_FIXED_S = 90.0


def evaluation_s(tc: TrainConfig, batch_s: list[float]) -> float:
    """The held-out evaluation's projected seconds: its episodes of the starting and the trained policy, each
    costing what a rollout did in this run's steps (a step's batch over its episodes, scaled when the
    evaluation runs fewer at once), plus EVAL_FIXED_S. 0 without an evaluation."""
    if not tc.eval_tasks or not batch_s:
        return 0.0
    per_step = tc.tasks_per_step * tc.group_size
    at_once = min(per_step, tc.rollout_concurrency)
    episode_s = sum(batch_s) / len(batch_s) / per_step * max(1.0, at_once / tc.eval_concurrency)
    return 2 * tc.eval_tasks * tc.eval_samples * episode_s + EVAL_FIXED_S


class NoExpertData(ValueError):
    """train.sft_expert: the expert solved none of the tasks it was recorded on, so the supervised term has
    no data (the run stops before its first step)."""


class TrainerFailed(RuntimeError):
    """The trainer failed; the run stopped at its last checkpoint."""


class StartFailed(RuntimeError):
    """The workers could not start: the model or the checkpoint to resume from does not load (changed since
    `check_model_and_data`, or a checkpoint of the run that is damaged). Nothing was trained."""


async def train(
    cfg: VivaceConfig,
    run_dir: Path,
    resume: bool = False,
    on_step: Callable[[dict[str, Any]], None] | None = None,
    tasks: list[Task] | None = None,
    episode: Any = None,
    workers: Any = None,
    stop: Callable[[], bool] | None = None,
    on_note: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Runs (or resumes) the loop until `cfg.train.steps`; returns the summary. `tasks` and
    `episode` replace the suite and the benchmark episode (synthetic environments, tests);
    `workers` is where the work runs (default: Ray actors, see rl/workers.py). When `stop()`
    turns true (the CLI's first Ctrl-C), the run ends after the step in flight, with a checkpoint.
    `on_note` hears about work before the first step (recording the supervised term's data)."""
    tc = cfg.train
    t_run = time.monotonic()  # total_minutes counts from here: the expert's recording and Ray's start too
    torch.manual_seed(tc.seed)
    tasks = tasks if tasks is not None else training_tasks(cfg)
    if tc.sft_data is not None:
        tc.sft_data = tc.sft_data.resolve()  # actors read it from their own working directory
    elif tc.sft_expert and tc.sft_coef > 0:
        tc.sft_data = await _expert_file(cfg, run_dir, tasks, on_note or (lambda note: None))
    start, ckpt, pending, state = 0, None, [], {}
    if resume:
        ckpt = latest_checkpoint(run_dir)
        if ckpt is not None:
            state = _resume_state(ckpt)
            start, pending = state["step"], state.get("pending", [])
        try:
            _truncate_metrics(run_dir, start)
        except (OSError, ValueError) as e:  # a line that is not a metrics row: not dropped without a word
            raise StartFailed(f"cannot resume: {e}; remove or mend that line, then resume again") from e
    position = state.get("data_position", 0)
    # A checkpoint from before replay existed has no order state: its fresh tasks end at its position.
    order = TaskOrder(tasks, tc.seed, tc.replay, tc.replay_limit, state.get("order") or {"fresh": position})
    workers = workers or RayWorkers(cfg, episode)
    # A resumed run recomputes the steps after its checkpoint: TensorBoard drops the killed run's events
    # of those steps (from step purge_step on), as _truncate_metrics drops their metrics rows.
    board = SummaryWriter(str(run_dir / "tensorboard"), purge_step=start + 1 if resume else None)
    pipeline = None
    try:
        try:
            await workers.start(start, ckpt)
        except ValueError as e:  # load_model and Trainer.load name the model or checkpoint and say why
            raise StartFailed(f"the run could not start: {e}") from e
        pipeline = Pipeline(cfg, workers, order.at, version=start, position=position, pending=pending,
                            timeline=run_dir / "timeline.jsonl")  # fmt: skip
        pipeline.start()
        t_start, stopped_by = time.monotonic(), "steps"
        batch_s: list[float] = []  # what each step's rollouts took: the evaluation's time is projected from them
        for step in range(start, tc.steps):
            row = await _step(step, pipeline, workers, cfg, run_dir, order)
            batch_s.append(row["rollout_s"] if tc.pipeline == "sync" else row["step_s"])
            with (run_dir / "metrics.jsonl").open("a") as f:
                f.write(json.dumps(row) + "\n")
            for key, value in row.items():
                if isinstance(value, int | float) and key != "step":
                    board.add_scalar(key, value, row["step"])
            board.flush()
            if on_step:
                on_step(row)
            done = step + 1 - start
            # A time budget ends the run after the step that leaves no room for another one.
            now = time.monotonic()
            out_of_time = tc.max_minutes is not None and (now - t_start) * (done + 1) / done > tc.max_minutes * 60
            # A budget for the whole command: another step and then the held-out evaluation must fit in it.
            over_total = tc.total_minutes is not None and (
                (now - t_run) + (now - t_start) / done + evaluation_s(tc, batch_s) > tc.total_minutes * 60
            )
            # A cluster that stopped answering ends the run like a Ctrl-C, while its actors still can.
            lost = workers.cluster_lost
            interrupted = lost or (stop is not None and stop())
            ending = out_of_time or over_total or interrupted
            if (step + 1) % tc.checkpoint_every == 0 or step + 1 == tc.steps or ending:
                await _checkpoint(run_dir, workers, step + 1, pipeline, order, tc.keep_checkpoints)
            if ending and step + 1 < tc.steps:
                stopped_by = (
                    "cluster_lost" if lost else "interrupted" if interrupted else
                    "max_minutes" if out_of_time else "total_minutes"
                )  # fmt: skip
                break
    except TrainerFailed as e:
        last = latest_checkpoint(run_dir)
        where = f"its last checkpoint is {last}; continue with `vivace train --resume {run_dir}`" if last else (
            "no checkpoint was written yet; start it again")  # fmt: skip
        raise TrainerFailed(f"{e}. The run stopped: {where}.") from e.__cause__
    finally:
        final = await pipeline.close() if pipeline is not None else {}
        board.close()
        await workers.close()
    return write_summary(run_dir, final, stopped_by, first_step=start + 1)


async def _expert_file(cfg: VivaceConfig, run_dir: Path, tasks: list[Task], note: Callable[[str], None]) -> Path:
    """run_dir/expert.jsonl, recorded once (a resumed run finds it)."""
    from vivace.rl.sft import anchor_data

    path = run_dir / "expert.jsonl"
    if path.is_file():
        return path
    n = min(cfg.train.sft_expert, len(tasks))
    note(f"recording the expert on {n} training tasks for the supervised term ({path.name})")
    shown = set()

    def progress(done: int, total: int) -> None:
        tenth = done * 10 // total
        if tenth not in shown:
            shown.add(tenth)
            note(f"expert episodes: {done}/{total}")

    counts = await anchor_data(cfg, tasks, path, n=n, seed=cfg.train.seed, progress=progress)
    if not counts["episodes"]:
        raise NoExpertData(
            f"the expert solved none of the {n} training tasks it was run on: no data for train.sft_expert"
        )
    note(f"supervised term: {counts['episodes']} expert episodes and {counts['renamed']} renamed copies")
    return path


async def _step(
    step: int, pipeline: Pipeline, workers: Any, cfg: VivaceConfig, run_dir: Path, order: TaskOrder
) -> dict[str, Any]:
    t0 = time.perf_counter()
    before = await workers.sampler_stats()
    batch = await pipeline.next_batch()
    groups = [g.rollouts() for g in batch]
    replayed = sum(order.report(g.seq, [r.resolved for r in g.rollouts()]) for g in batch)
    rollout_s = time.perf_counter() - t0
    samples, counts = to_samples(groups, cfg, version=step)
    try:
        train_stats = await workers.train_step(samples) if samples else {}
    except Exception as e:
        raise TrainerFailed(f"the trainer failed at step {step + 1}: {type(e).__name__}: {e}") from e
    sync_bytes, sync_s = await workers.sync(step + 1)
    pipeline.set_version(step + 1)
    after = await workers.sampler_stats()
    flat = [r for g in groups for r in g]
    _save_rollouts(run_dir, step, [(g.seq, i, r) for g in batch for i, r in enumerate(g.rollouts())])
    step_s = time.perf_counter() - t0
    generated = after["generated_tokens"] - before["generated_tokens"]
    row = _row(step, flat, counts, train_stats, rollout_s, generated, step_s)
    replicas = cfg.train.sampler_replicas
    row.update(weight_sync_s=sync_s, weight_sync_bytes=sync_bytes,
               sampler_busy=(after["busy_s"] - before["busy_s"]) / (step_s * replicas) if step_s else 0.0,
               groups_replayed=replayed, replay_queue=len(order.queue),
               **pipeline.snapshot())  # fmt: skip
    return row


def _row(step, flat: list[Rollout], counts, train_stats, rollout_s, generated, step_s) -> dict:
    ok = [r for r in flat if r.trajectory is not None]
    behaviours = [behaviour(r.trajectory) for r in ok]
    row: dict[str, Any] = {
        "step": step + 1,
        "rollouts": len(flat),
        "reward_mean": mean([r.reward for r in flat]),
        "success_rate": mean([1.0 if r.resolved else 0.0 for r in flat]),
        # solved, yet cut off by a limit: the fix landed but the agent never stopped (loops after it)
        "solved_truncated": mean([1.0 if r.truncated else 0.0 for r in flat if r.resolved]),
        **{f"milestone_{k}": mean([1.0 if r.milestones.get(k) else 0.0 for r in ok]) for k in ("read", "edit")},
        **{f"reward_{k}": mean([r.components.get(k, 0.0) for r in ok]) for k in ("correctness", "adherence", "efficiency", "claims", "format")},
        **counts,
        **train_stats,
        "sampling_tokens": generated,
        "sampling_tokens_per_s": generated / step_s if step_s else 0.0,
        "rollout_s": rollout_s,  # waiting for the batch (all of the rollouts, in sync mode)
        "episode_s_p50": percentile([r.trajectory.wall_s for r in ok], 0.5),
        "episode_s_p99": percentile([r.trajectory.wall_s for r in ok], 0.99),
        "unsupported_claims": mean([1.0 if r.details.get("unsupported_claims") else 0.0 for r in ok]),
        "step_s": step_s,
    }  # fmt: skip
    for key in (
        "turns",
        "tool_calls_per_turn",
        "reads_before_first_edit",
        "edits",
        "test_runs",
        "lint_calls",
        "repeated_rejected_calls",
    ):
        row[f"agent_{key}"] = mean([b[key] for b in behaviours])
    return row


def _save_rollouts(run_dir: Path, step: int, rollouts: list[tuple[int, int, Rollout]]) -> None:
    """Step N's rollouts, each with its task-order position and member index in the group."""
    path = run_dir / "trajectories" / f"step_{step + 1}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for position, member, r in rollouts:
            f.write(json.dumps({"position": position, "member": member, "task_id": r.task_id, "reward": r.reward,
                                "resolved": r.resolved, "error": r.error,
                                "trajectory": r.trajectory.model_dump() if r.trajectory else None}) + "\n")  # fmt: skip


async def _checkpoint(
    run_dir: Path, workers: Any, step: int, pipeline: Pipeline, order: TaskOrder, keep: int | None = None
) -> None:
    path = run_dir / "checkpoints" / f"step_{step}"
    await workers.save(path)
    with failed_writes_as_oserror(path / "rng.pt"):
        torch.save({"torch": torch.get_rng_state()}, path / "rng.pt")
    state = {"step": step, "data_position": pipeline.position, "pending": pipeline.pending_positions(),
             "order": order.state()}  # fmt: skip
    await asyncio.to_thread(sync_tree, path)  # on disk before state.json says it is complete (a power loss)
    write_atomic(path / "state.json", json.dumps(state))  # written last, whole or not at all: complete
    if keep is not None:
        prune_checkpoints(run_dir, keep)


def _resume_state(ckpt: Path) -> dict[str, Any]:
    """A checkpoint's state.json, with the torch RNG restored from its rng.pt (read as plain tensors: a
    run directory may come from elsewhere, and a pickle could run code); StartFailed when either is damaged."""
    try:
        state = json.loads((ckpt / "state.json").read_text(encoding="utf-8"))
        if not isinstance(state, dict) or not _count(state.get("step")) or state["step"] < 1:
            raise ValueError(f"state.json holds no step number: {str(state)[:60]}")
        # The other fields as _checkpoint writes them: a damaged one must stop here, not inside the pipeline.
        pending, order = state.get("pending", []), state.get("order")
        if not _count(state.get("data_position", 0)) or not isinstance(pending, list) or not all(map(_count, pending)):
            raise ValueError(f"state.json's data_position or pending is not what a checkpoint holds: {str(state)[:80]}")
        if order is not None and not isinstance(order, dict):
            raise ValueError(f"state.json's order is not an object: {str(order)[:60]}")
        torch.set_rng_state(torch.load(ckpt / "rng.pt", weights_only=True)["torch"])
    except (OSError, ValueError, KeyError, TypeError, EOFError, RuntimeError, pickle.UnpicklingError) as e:
        first = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
        if isinstance(e, pickle.UnpicklingError):  # torch's text suggests weights_only=False: never here
            first = "rng.pt is not a file of plain tensors"
        raise StartFailed(f"{ckpt}: cannot resume from this checkpoint ({type(e).__name__}: {first}); it is "
                          "damaged: move it out of checkpoints/ to resume from the one before") from e  # fmt: skip
    return state


def _count(value: Any) -> bool:
    return type(value) is int and value >= 0  # bool is an int, and not a count


def _truncate_metrics(run_dir: Path, step: int) -> None:
    """metrics.jsonl up to `step`, the checkpoint a resume starts from; a last line cut short by a kill
    mid-append goes too (the next step's line would be glued to it)."""
    path = run_dir / "metrics.jsonl"
    if path.exists():
        keep = [row for row in metrics_rows(path) if row["step"] <= step]
        write_atomic(path, "".join(json.dumps(row) + "\n" for row in keep))


def write_summary(
    run_dir: Path, pipeline: dict[str, Any] | None = None, stopped_by: str = "steps", first_step: int = 1
) -> dict[str, Any]:
    """summary.json: the run's first and last steps, its totals, and this process's pipeline counts,
    which cover the steps from `first_step` on (a resumed run starts them afresh, as its timeline does)."""
    rows = metrics_rows(run_dir / "metrics.jsonl")
    first, last = rows[0], rows[-1]
    keys = ("reward_mean", "success_rate", "agent_turns", "agent_tool_calls_per_turn", "loss", "entropy")
    summary = {
        "steps": len(rows),
        # steps, max_minutes (RL's time budget), total_minutes (the command's), interrupted (Ctrl-C), cluster_lost
        "stopped_by": stopped_by,
        "first": {k: first.get(k) for k in keys},
        "last": {k: last.get(k) for k in keys},
        "rollouts": sum(r["rollouts"] for r in rows),
        "wall_s": sum(r["step_s"] for r in rows),
        "checkpoint": str(latest_checkpoint(run_dir)),
        "pipeline": pipeline or {},
        "pipeline_from_step": first_step,
    }
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary
