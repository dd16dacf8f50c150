"""The benchmark runner: every (model, task) pair as one episode in a fresh sandboxed
workspace, scored by the same scorer RL uses, many at once.

Each episode: the task's starting tree as a snapshot (cached), a workspace, the task's setup
commands, `harness.run_episode` with the model's policy (scripted baselines are given the
task), then `bench.score`. Results stream to `results.jsonl` as they finish (a crash loses
nothing already done) and each trajectory is saved for inspection.

An episode that could not run is a row with `error`, not a measurement of the model: the task's
setup or sandbox failed, or the policy's server was unreachable or kept failing on its side once
its client's retries were spent (`Trajectory.unavailable`: no answer, 408, 429, 5xx). A request the
server refused (a context overflow) or a reply withheld by a content filter is the model's
episode, scored as a failure. The report counts error rows apart from success, and a resumed run
(`start_run`) runs them again. `RUN/run.json` holds what decides a run's episodes, so that a
resumed run is the same run: the same models, tasks, samples, limits and seeds.

Each row's details also hold `reference_tokens`: the assistant turns counted with the reference
tokenizer (vivace.model.tokenizer), so that models with different tokenizers, and policies that
report no tokens, are measured in the same unit. The policy's own counts stay in
`completion_tokens` (the efficiency reward uses them).

Not covered: the report (report.py) and choosing tasks (tasks.suites).
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import time
from collections.abc import Callable, Collection
from pathlib import Path
from typing import IO, Any

from vivace.aio import gather_all
from vivace.bench.results import result_rows
from vivace.bench.score import score
from vivace.config import VivaceConfig
from vivace.files import write_atomic
from vivace.harness.agent import run_episode
from vivace.harness.messages import Message, ToolCall
from vivace.harness.policies import load_policy
from vivace.harness.policy import close_policy, derive_seed
from vivace.harness.trajectory import Trajectory
from vivace.locks import Locked, lock_exclusively
from vivace.model.tokenizer import count_assistant_tokens, reference_chat_format
from vivace.sandbox import open_backend
from vivace.sandbox.base import SandboxError, WithEnv
from vivace.tasks.format import Task


class SetupError(ValueError):
    """The run could not start: a policy, the reference tokenizer or the sandbox backend was refused (the
    message says which and why). No episode ran; a command shows it as its one-line error."""


class TaskError(RuntimeError):
    """The task itself cannot start here: its repository, patch or commit cannot be had, or a setup
    command failed. Running it again changes nothing until the task (or the environment) is fixed."""


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_")[:80] or "model"


async def run_benchmark(
    models: list[str],
    tasks: list[Task],
    cfg: VivaceConfig,
    out_dir: Path,
    concurrency: int = 4,
    on_done: Callable[[dict[str, Any]], None] | None = None,
    samples: int = 1,
    once: Collection[str] = (),
    finished: Collection[dict[str, Any]] = (),
) -> list[dict[str, Any]]:
    """Runs every model on every task, `samples` episodes each (rows carry `sample`: 0, 1, …; a
    sampling policy's success rate over several is less noisy than one episode's), except the
    models in `once`, which run one episode per task (deterministic baselines: a second would
    repeat the first); returns the result rows (also appended to out_dir/results.jsonl).
    `finished`: rows of episodes already run (a resumed run, see start_run), not run again and
    returned with the new ones."""
    if samples < 1:
        raise ValueError(f"samples must be at least 1, not {samples}")
    out_dir.mkdir(parents=True, exist_ok=True)
    policies: dict[str, Any] = {}
    try:  # fail on a bad spec (or engine device) before any work
        for m in models:
            policies[m] = load_policy(m, cfg.engine)
        reference_chat_format()  # likewise a missing reference tokenizer, and its loading is not paid mid-run
        backend = open_backend(cfg.sandbox)
    except ValueError as e:
        await gather_all(*(close_policy(p) for p in policies.values()))
        raise SetupError(str(e)) from e
    sem = asyncio.Semaphore(concurrency)
    results_file = (out_dir / "results.jsonl").open("a")
    rows: list[dict[str, Any]] = []

    async def one(model: str, task: Task, sample: int) -> None:
        async with sem:
            row = await _episode(model, policies[model], task, cfg, backend, out_dir, sample)
        rows.append(row)
        results_file.write(json.dumps(row) + "\n")
        results_file.flush()
        if on_done:
            on_done(row)

    done = {_key(r) for r in finished}
    episodes = [(m, t, k) for m in models for t in tasks for k in range(1 if m in once else samples)]
    try:
        await gather_all(*(one(m, t, k) for m, t, k in episodes if (m, t.id, k) not in done))
    finally:
        results_file.close()
        await backend.aclose()
        await gather_all(*(close_policy(p) for p in policies.values()))
    order = {(m, t.id): i for i, (m, t) in enumerate((m, t) for m in models for t in tasks)}
    return sorted([*finished, *rows], key=lambda r: (order[(r["model"], r["task_id"])], r.get("sample", 0)))


RUN_FILE = "run.json"


def run_settings(models: list[str], tasks: list[Task], cfg: VivaceConfig, samples: int) -> dict[str, Any]:
    """What decides a run's episodes and their seeds, as saved in RUN/run.json. Where the sandbox
    lives and how the engine is placed (device, batch) are left out: a run may resume elsewhere."""
    sampling = cfg.engine.model_dump(mode="json", include={"temperature", "top_p", "top_k", "seed"})
    return {"models": models, "tasks": [t.id for t in tasks], "samples": samples, "sampling": sampling,
            "agent": cfg.agent.model_dump(mode="json"), "score": cfg.score.model_dump(mode="json")}  # fmt: skip


def start_run(out_dir: Path, settings: dict[str, Any], resume: bool = False) -> list[dict[str, Any]]:
    """Prepares out_dir for a run of `settings` (run_settings) and returns the rows of the episodes
    already finished there, which the run skips. A directory whose results.jsonl holds episodes is
    continued only with `resume`, and only with the settings it was started with (else two runs'
    rows would mix in one report); its errored episodes are dropped, so that they run again, and
    results.jsonl is rewritten to hold just the rows kept. Raises ValueError saying what to do."""
    results, saved = out_dir / "results.jsonl", out_dir / RUN_FILE
    _hold_run(out_dir)  # before anything is read or written: another run in it would mix rows in one report
    rows = read_results(results) if results.is_file() else []
    if rows and not resume:
        raise ValueError(
            f"{results} already holds {len(rows)} episodes: continue that run with --resume, or give another --out"
        )
    if rows and not saved.is_file():
        raise ValueError(f"--resume: {out_dir} has no {RUN_FILE} to check this run's settings against")
    if resume and saved.is_file():
        before = _saved_settings(saved)
        differ = [k for k in settings if _normal(k, before.get(k)) != _normal(k, settings[k])]
        if differ:
            raise ValueError(
                f"--resume: {out_dir} was run with other {', '.join(differ)} (see {saved}); resume it with the "
                "same options, or give another --out"
            )
    write_atomic(saved, json.dumps(settings, indent=1) + "\n")  # rewritten on each --resume: never half of it
    wanted = {(m, t, k) for m in settings["models"] for t in settings["tasks"] for k in range(settings["samples"])}
    kept: dict[tuple[str, str, int], dict[str, Any]] = {}
    for r in rows:
        if "error" not in r and _key(r) in wanted:
            kept.setdefault(_key(r), r)
    partial = results.with_name(results.name + ".partial")
    partial.write_text("".join(json.dumps(r) + "\n" for r in kept.values()))
    partial.replace(results)  # atomic: a kill now leaves the old file or the new one, never half of it
    return list(kept.values())


_HELD: dict[Path, IO[str]] = {}  # the run directories this process holds (until it ends)


def _hold_run(out_dir: Path) -> None:
    """An exclusive lock on OUT/.lock for the rest of this process, however it ends (flock): a second
    `vivace bench` into the same --out, resumed or not, is refused instead of appending its rows to the
    same results.jsonl, or rewriting it under the first run."""
    key = out_dir.resolve()
    if key in _HELD:
        return
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        f = lock_exclusively(out_dir / ".lock")
    except Locked as e:
        raise ValueError(
            f"{out_dir} is in use by another `vivace bench` (pid {e.holder}); wait for it to end, or give another --out"
        ) from None
    _HELD[key] = f


def read_results(path: Path) -> list[dict[str, Any]]:
    """The rows of a results.jsonl (bench.results.result_rows: a last line cut short is left out, and
    its episode runs again on resume), each checked to be a row as _episode writes it (`row_problem`):
    a row edited or written by something else raises ValueError naming the file, the line and what is
    wrong, before the report (or a resumed run) trips over it. So does a file that is not UTF-8 text."""
    rows = []
    try:
        for n, row in result_rows(path):
            if problem := row_problem(row):
                raise ValueError(f"{path}:{n}: not a benchmark result row ({problem}); fix or remove that line, "
                                 "or give another --out")  # fmt: skip
            rows.append(row)
    except UnicodeDecodeError as e:
        raise ValueError(
            f"{path}: not UTF-8 text (byte {e.start}): not a benchmark's results; give another --out"
        ) from None
    return rows


# What the report reads of a scored row (report._summary): its scores, and these numbers of its details.
SCORES = ("total", "correctness", "adherence", "efficiency", "claims", "format")
DETAIL_NUMBERS = ("turns", "tool_calls", "tool_calls_per_turn", "wall_s", "format_errors")


def row_problem(row: dict[str, Any]) -> str | None:
    """What makes `row` no result row of _episode's, in words (the first thing found), or None: model and
    task_id strings, a sample count from 0; an error row's error a string; a scored row's scores numbers,
    resolved a boolean, and details an object holding the numbers the report adds up."""

    def number(value: Any) -> bool:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)

    def shown(value: Any) -> str:
        return "missing" if value is None else json.dumps(value)[:40]

    if not all(isinstance(row.get(k), str) for k in ("model", "task_id")):
        return "want an object with model and task_id"
    sample = row.get("sample", 0)
    if not isinstance(sample, int) or isinstance(sample, bool) or sample < 0:
        return f"sample is {shown(sample)}, not an episode number from 0"
    if not isinstance(row.get("trajectory", ""), str):
        return f"trajectory is {shown(row['trajectory'])}, not a path"
    if "error" in row:
        return None if isinstance(row["error"], str) else f"error is {shown(row['error'])}, not a message"
    if bad := next((k for k in SCORES if not number(row.get(k))), None):
        return f"{bad} is {shown(row.get(bad))}, not a number"
    if not isinstance(row.get("resolved"), bool):
        return f"resolved is {shown(row.get('resolved'))}, not true or false"
    details = row.get("details")
    if not isinstance(details, dict):
        return f"details is {shown(details)}, not an object"
    wanted = DETAIL_NUMBERS + (("reference_tokens", "model_s") if details.get("reference_tokens") is not None else ())
    if bad := next((k for k in wanted if not number(details.get(k))), None):
        return f"details.{bad} is {shown(details.get(bad))}, not a number"
    return None


def _saved_settings(saved: Path) -> dict[str, Any]:
    """A run's RUN/run.json; ValueError naming it when it is not the JSON object start_run writes."""
    again = "restore it, or give another --out (its episodes cannot be checked to be this run's)"
    try:
        settings = json.loads(saved.read_text(encoding="utf-8"))
    except UnicodeDecodeError as e:
        raise ValueError(f"{saved}: not UTF-8 text (byte {e.start}); {again}") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{saved}: not JSON ({e.msg} at line {e.lineno} column {e.colno}); {again}") from None
    if not isinstance(settings, dict):
        raise ValueError(f"{saved}: a JSON {type(settings).__name__}, not a run's settings (an object); {again}")
    return settings


def _key(row: dict[str, Any]) -> tuple[str, str, int]:
    return row["model"], row["task_id"], row.get("sample", 0)


def _normal(key: str, value: Any) -> Any:
    """Settings compared as sets where the order does not change the episodes (models, tasks)."""
    return sorted(value) if key in ("models", "tasks") and isinstance(value, list) else value


async def run_task(
    policy: Any, task: Task, cfg: VivaceConfig, backend: Any, seed: int | None = None
) -> tuple[Trajectory, Any]:
    """One episode of `task` in a fresh workspace, scored: (trajectory, Score). The benchmark and
    RL rollouts both go through here, so a rollout is exactly a benchmark episode. `seed`: the
    episode's sampling seed (None, as in RL rollouts: the sampler's own randomness)."""
    # Building the task's starting tree and snapshot is file copying: off the event loop.
    try:
        snapshot = await asyncio.to_thread(lambda: backend.snapshot(task.source(cache_dir=cfg.sandbox.state_dir)))
    except (SandboxError, OSError, ValueError) as e:  # and TaskFormatError: a missing path or commit, a bad patch
        raise TaskError(f"the task's repository cannot be had: {e}") from e
    try:
        ws = await backend.create(snapshot)
    finally:
        backend.release(snapshot)  # the workspace holds its own claim: the cache may evict it once closed
    if task.env:
        ws = WithEnv(ws, task.env)
    try:
        for command in task.setup:
            res = await ws.exec(command, timeout=cfg.sandbox.timeout_s)
            if res.exit_code != 0:
                output = "\n".join(part.strip() for part in (res.stdout, res.stderr) if part.strip())
                said = "\n".join(output.splitlines()[-8:])  # whole last lines
                raise TaskError(f"setup command {command!r} failed (exit code {res.exit_code}; the sandbox has "
                                f"no network, so what it installs must be in the environment already): {said}")  # fmt: skip
        setup_diff = await ws.diff() if task.setup else ""  # what the setup changed is not the agent's
        bound = policy.for_task(task) if hasattr(policy, "for_task") else policy
        traj = await run_episode(bound, ws, task.request, cfg.agent, task_id=task.id, seed=seed)
        return traj, await score(task, traj, ws, cfg.score, setup_diff=setup_diff)
    finally:
        await ws.close()


async def _episode(
    model: str, policy: Any, task: Task, cfg: VivaceConfig, backend: Any, out_dir: Path, sample: int = 0
) -> dict:
    row: dict[str, Any] = {"model": model, "task_id": task.id, "sample": sample, "split": task.split,
                           "kind": task.metadata.get("kind"), "family": task.metadata.get("family")}  # fmt: skip
    t0 = time.monotonic()
    try:
        # Every policy gets the same seed for the same (task, sample): sampled policies compared on
        # one benchmark draw the same random numbers, so their difference is their weights', not luck.
        traj, result = await run_task(policy, task, cfg, backend, seed=derive_seed(cfg.engine.seed, task.id, sample))
    except Exception as e:  # one broken task or environment must not end the whole run
        row.update(error=f"{type(e).__name__}: {e}", resolved=False, total=0.0, seconds=time.monotonic() - t0)
        return row
    name = f"{task.id}.json" if sample == 0 else f"{task.id}.s{sample}.json"
    path = out_dir / "trajectories" / slug(model) / name
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        traj.save(path)
        record = {"trajectory": str(path.relative_to(out_dir))}
    except (OSError, ValueError) as e:  # one episode's record failing must not end the run either: its row stays
        record = {"trajectory_error": f"{type(e).__name__}: {e}"}
    # The policy's server was down or kept failing, or the workspace could not be diffed (so not
    # scored): no measure of the model.
    if traj.unavailable or traj.diff_failed:
        why = f"the policy failed: {traj.error}" if traj.unavailable else f"not scored: {traj.error}"
        row.update(error=why, resolved=False, total=0.0, **record, seconds=time.monotonic() - t0)
        return row
    row.update(result.model_dump(), **record, seconds=time.monotonic() - t0)
    row["details"]["reference_tokens"] = reference_tokens(traj)
    return row


def reference_tokens(traj: Trajectory) -> int:
    """What the episode's assistant turns cost in reference tokens (text, tool-call blocks, end of
    turn), re-rendered from the recorded turns; a malformed call is rendered from its raw text."""
    messages = [
        Message("assistant", t.content, tuple(ToolCall(c.id, c.name, c.arguments) for c in t.tool_calls))
        for t in traj.turns
    ]
    return count_assistant_tokens(messages)
