"""`vivace train` (RL on the built-in defaults or a config), `vivace train report` (the
before/after evaluation of a finished run, rl/evaluate.py) and `vivace train bench-pipeline`
(synchronous vs asynchronous rollouts); registered on the app in cli.py.

A run that completes its steps with `train.eval_tasks > 0` ends with the same evaluation; its
report's path is the last line printed (with --json: the "report" key of the summary line).
Ctrl-C ends a run after the step in flight, with a checkpoint, still evaluates it, says the step
reached and how to resume, and exits 130; a second Ctrl-C stops at once and says how to resume or
report. SIGTERM (a scheduler's time limit or preemption, `timeout`, `kill`) does the same without
the evaluation, and exits 143.

`--resume RUN` uses the run's own config.json (--config, --preset and --name are refused; --steps and
--seed may change, and are saved into it so a later plain `--resume RUN` finishes the run); a run
already at its steps is left untouched. A run holds an exclusive lock on RUN/.lock while it lives: a
second one on the same directory is refused (exit 2). A directory that cannot be written (disk full,
read-only) is refused before a resume (exit 2); met during a run it ends it with one line naming the
file, the last complete checkpoint and the resume command, and exit 1: the run was accepted and failed,
as a failing trainer does. An `--address` that cannot be reached (checked before the run directory is made)
or joined is refused (exit 2)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer
from rich.live import Live
from rich.markup import escape
from rich.table import Table

from vivace.cli import (
    BackendOpt,
    ConfigOpt,
    LoggedProgress,
    PresetOpt,
    StateOpt,
    _config,
    app,
    check_out,
    err,
    fail,
    out,
    run_cancelling_on_sigterm,
    seed_in_range,
    sigterm_interrupts,
    status_say,
    stopped_by_signal,
    with_sandbox_options,
    write_problem,
)
from vivace.config import VivaceConfig, load_config
from vivace.files import write_atomic
from vivace.model.spec import TINY_NAMES
from vivace.rl.runs import (
    RunInUse,
    checkpoint_dirs,
    claim_run_dir,
    latest_checkpoint,
    load_run_config,
    lock_run,
    metrics_rows,
    run_path,
)

train_app = typer.Typer(help="Train the policy with RL; `train bench-pipeline` measures the rollout pipeline.")
app.add_typer(train_app, name="train")


@train_app.callback(invoke_without_command=True)
def train_command(
    ctx: typer.Context,
    preset: PresetOpt = "tiny",
    config_file: ConfigOpt = None,
    steps: Annotated[int | None, typer.Option(help="Steps in the run (default: the config's).")] = None,
    seed: Annotated[
        int | None,
        typer.Option(
            callback=seed_in_range, help="Seed of the task order, sampling and held-out draw (default: the config's)."
        ),
    ] = None,
    name: Annotated[
        str | None, typer.Option(help="Run directory name under train.runs_dir (default: train-DATE-TIME).")
    ] = None,
    resume: Annotated[
        Path | None, typer.Option(help="Continue the run in this directory from its last checkpoint.")
    ] = None,
    address: Annotated[str | None, typer.Option(help="Ray cluster to join (default: start a local one).")] = None,
    local: Annotated[
        bool, typer.Option("--local", help="Run sampler, rollouts and trainer in this process (no Ray).")
    ] = False,
    backend: BackendOpt = None,
    state_dir: StateOpt = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print each step's metrics and the summary as JSON lines.")
    ] = False,
) -> None:
    """Train the policy with RL: rollouts in sandboxes, scored by the benchmark, group advantages, updates."""
    if ctx.invoked_subcommand is not None:
        return
    lock = None
    try:  # the refusals that need only the configuration and the run directory, before the training stack loads
        if resume is not None:
            # By the source's name: typer ships its own copy of click, whose enum is not click's.
            given = [f"--{o.removesuffix('_file')}" for o in ("preset", "config_file", "name")
                     if getattr(ctx.get_parameter_source(o), "name", "DEFAULT") != "DEFAULT"]  # fmt: skip
            if given:
                raise _Refused(f"{' and '.join(given)} cannot be given with --resume: the run's own "
                               f"{resume / 'config.json'} is used; only --steps and --seed may change")  # fmt: skip
            saved = load_run_config(resume)
            base = saved.train.model
            if base not in TINY_NAMES and not Path(base).expanduser().exists():
                raise _Refused(f"the run's base checkpoint (train.model in {resume / 'config.json'}) is gone from "
                               f"{base}: put it back there, or set train.model in that file to where it is now")  # fmt: skip
            run_dir = resume.resolve()
            _check_writable(run_dir)
            cfg = saved.model_copy(deep=True)
        else:
            cfg = _absolute_paths(load_config(preset, config_file))
            run_dir = run_path(cfg, name)
        if steps is not None:
            if steps < 1:
                raise _Refused(f"--steps {steps}: a run needs at least 1 step; give --steps 1 or more")
            cfg.train.steps = steps
        if seed is not None:
            cfg.train.seed = seed
        if resume is not None and _already_complete(run_dir, cfg.train.steps):
            return
        cfg = with_sandbox_options(cfg, backend, state_dir)
    except _Refused as e:
        fail(str(e))
    except (ValueError, OSError) as e:  # OSError: an unreadable file or directory (run_path's FileExistsError)
        fail(str(e))

    from vivace.rl.controller import training_tasks
    from vivace.rl.evaluate import held_out_tasks
    from vivace.rl.workers import ClusterUnavailable, check_ray_installed, check_reachable

    try:
        if not local:
            check_ray_installed()
        if address is not None and not local:
            check_reachable(address)
        # Checked before training: a bad split, suite, family list, model or sft_data must not surface only after the run.
        tasks = training_tasks(cfg)
        warnings = check_train_config(cfg, tasks)  # with the model and sft_data (check_model_and_data)
        eval_tasks = held_out_tasks(cfg, cfg.train.eval_tasks) if cfg.train.eval_tasks else []
        if resume is None:
            run_dir, lock = claim_run_dir(run_dir, cfg, unnamed=name is None)
        else:
            lock = lock_run(run_dir)
        if resume is not None:
            if (steps is not None and steps != saved.train.steps) or (seed is not None and seed != saved.train.seed):
                # Saved, so the plain `--resume RUN` that a stop prints finishes the run as extended.
                saved.train.steps, saved.train.seed = cfg.train.steps, cfg.train.seed
                write_atomic(run_dir / "config.json", saved.model_dump_json(indent=2))
            err.print(_resume_point(run_dir))
    except (_Refused, RunInUse, ClusterUnavailable) as e:
        fail(str(e))
    except (ValueError, OSError) as e:  # OSError: an unreadable file or directory (claim_run_dir's FileExistsError)
        fail(str(e))
    for warning in warnings:  # legal, but likely not what was meant: said once, before the run
        err.print(f"[yellow]warning:[/] {escape(warning)}", highlight=False)
    with lock:
        _train_locked(cfg, run_dir, resume is not None, tasks, eval_tasks, address, local, as_json)


def _train_locked(cfg: VivaceConfig, run_dir: Path, resume: bool, tasks: list, eval_tasks: list, address: str | None,
                  local: bool, as_json: bool) -> None:  # fmt: skip
    """The run itself, while this process holds the run directory's lock."""
    from vivace.rl.controller import NoExpertData, StartFailed, TrainerFailed, train
    from vivace.rl.workers import ClusterUnavailable, LocalWorkers, RayWorkers

    if cfg.sandbox.backend == "auto" and address is None:
        cfg.sandbox.backend = _sandbox_here(cfg)  # not saved: a resume elsewhere decides again
    loss = _ClusterLoss(run_dir, cfg)
    workers = LocalWorkers(cfg) if local else RayWorkers(cfg, address=address, on_note=err.print, on_cluster=loss)
    table_rows: list[dict] = []

    def render() -> Table:
        t = Table(title=f"vivace train — {run_dir}", expand=False)
        for col in ("step", "reward", "success", "turns", "calls/turn", "loss", "KL s‖t", "sample tok/s", "step s"):
            t.add_column(col, justify="right")
        for r in table_rows[-15:]:
            t.add_row(str(r["step"]), f"{r['reward_mean']:.3f}", f"{r['success_rate']:.0%}", f"{r['agent_turns']:.1f}",
                      f"{r['agent_tool_calls_per_turn']:.2f}", f"{r.get('loss', 0):.4f}",
                      f"{r.get('kl_sampler_trainer_k3', 0):.1e}", f"{r['sampling_tokens_per_s']:.0f}", f"{r['step_s']:.1f}")  # fmt: skip
        return t

    tc = cfg.train
    budget = "".join([f", at most {tc.max_minutes:g} min of RL" if tc.max_minutes else "",
                      f", {tc.total_minutes:g} min in all" if tc.total_minutes else ""])  # fmt: skip
    err.print(f"run directory: {run_dir}  ({tc.steps} steps{budget}, {tc.tasks_per_step} tasks x "
              f"{tc.group_size} rollouts per step, model {tc.model})")  # fmt: skip

    # A live table on a terminal; a JSON line per step with --json; a plain line per step in a log file or a
    # pipe, where rich's live table would only show at the end.
    live = Live(render(), console=err, refresh_per_second=2) if err.is_terminal and not as_json else None

    def on_step(row: dict) -> None:
        trained.append(row.get("samples", 0))
        if as_json:
            print(json.dumps(row), flush=True)
        elif live is None:
            err.print(_step_line(row, cfg.train.steps))
        else:
            table_rows.append(row)
            live.update(render())

    stop, received = threading.Event(), []  # received: the stop signals, in order
    trained: list[int] = []  # samples trained per step of this process

    def stopping(signum: int) -> None:
        said = _SIGNAL_NAMES[signum]
        then = "evaluates it" if eval_tasks and signum == signal.SIGINT else "ends"
        err.print(f"[yellow]{said}:[/] the run stops after the step in flight, saves a checkpoint and {then} "
                  f"({said} again to stop at once)")  # fmt: skip

    def run() -> dict:
        with live or contextlib.nullcontext(), _stop_signals(stop, received, stopping):
            return asyncio.run(train(cfg, run_dir, resume=resume, workers=workers, tasks=tasks,
                                     on_step=on_step, stop=stop.is_set, on_note=err.print))  # fmt: skip

    try:
        summary = run()
    except TrainerFailed as e:
        fail(str(e), 1)
    except StartFailed as e:  # a model or checkpoint that does not load: its one line says which and why
        fail(str(e), 1)
    except (NoExpertData, ClusterUnavailable) as e:  # a bad input, not a bug: no traceback
        fail(str(e))
    except KeyboardInterrupt:
        last = latest_checkpoint(run_dir)
        where = f"its last checkpoint is {last}; continue with `vivace train --resume {run_dir}`" if last else (
            f"no checkpoint was written; `vivace train --resume {run_dir}` starts it again from step 0")  # fmt: skip
        err.print(f"[yellow]stopped:[/] {escape(where)}.", highlight=False)
        raise typer.Exit(128 + (received[-1] if received else signal.SIGINT)) from None
    except OSError as e:  # disk full, a read-only directory: the run cannot go on here, and says where it stands
        what = _shown(Path(e.filename)) if e.filename else _shown(run_dir)
        last = latest_checkpoint(run_dir)
        fail(f"cannot write {what}: {e.strerror or e}; the last complete checkpoint is "
             f"{f'step {_step_of(last)}' if last else 'none (the run restarts from step 0)'}; after fixing it, "
             f"resume with `vivace train --resume {run_dir}`", 1)  # fmt: skip
    if workers.cluster_lost or summary.get("stopped_by") == "cluster_lost":  # no evaluation: Ray ends us soon
        loss.say_stopped()
        raise typer.Exit(1)
    loss.cancel()
    if summary.get("stopped_by") in _BUDGETS:
        err.print(f"RL stopped after step {summary.get('steps')} of {tc.steps}: {_BUDGETS[summary['stopped_by']]}.")
    if trained and not any(trained):
        err.print(f"[yellow]warning:[/] {escape(_nothing_trained(run_dir, len(trained)))}", highlight=False)
    stopped = summary.get("stopped_by") == "interrupted"  # before the configured steps
    if received and received[0] == signal.SIGTERM:  # the machine is going away: no time for the evaluation
        err.print(f"stopped by SIGTERM {_stopped_at(run_dir, cfg)}; continue with `vivace train --resume {run_dir}`, "
                  f"or evaluate it with `vivace train report {_shown(run_dir)}`.", style="yellow", markup=False,
                  highlight=False)  # fmt: skip
        raise typer.Exit(128 + signal.SIGTERM)
    report = None
    if eval_tasks:
        try:
            with sigterm_interrupts(received):
                report = _evaluate(cfg, run_dir, eval_tasks)[1]
        except ValueError as e:
            fail(f"the run finished but its evaluation could not start: {e}")
        except KeyboardInterrupt:
            policy = escape(str(latest_checkpoint(run_dir)))
            err.print(f"[yellow]evaluation stopped:[/] the trained policy is {policy}; `vivace train report "
                      f"{escape(str(_shown(run_dir)))}` evaluates it and writes the report.", highlight=False)  # fmt: skip
            raise typer.Exit(128 + (received[-1] if received else signal.SIGINT)) from None
    if as_json:
        print(json.dumps({"summary": summary, **({"report": str(report)} if report else {})}))
    else:
        out.print_json(json.dumps(summary))
        if report:
            print(f"report: {report}")  # plain print: one unwrapped line, whatever the terminal width
    if stopped:  # Ctrl-C before the configured steps: said like SIGTERM, and a status a script can tell apart
        err.print(f"stopped by Ctrl-C {_stopped_at(run_dir, cfg)}; continue with `vivace train --resume {run_dir}`.",
                  style="yellow", markup=False, highlight=False)  # fmt: skip
        raise typer.Exit(128 + signal.SIGINT)


class _ClusterLoss:
    """The driver's side of a Ray cluster that stops answering (RayWorkers' ClusterWatch): say so, let
    the run stop after the step in flight, and end the process itself, with the resume command, before
    Ray's core does so silently (60 s after the outage began; the watch reports it after about 6)."""

    GRACE_S = 45.0

    def __init__(self, run_dir: Path, cfg: VivaceConfig, exit_now: Callable[[int], None] = os._exit):
        self.run_dir, self.cfg, self.exit_now = run_dir, cfg, exit_now
        self.timer: threading.Timer | None = None
        self.said = False

    def __call__(self, down: bool) -> None:
        self.cancel()
        if not down:
            err.print("[green]the Ray cluster answers again:[/] the run goes on")
            return
        err.print("[red]the Ray cluster stopped answering[/] (its GCS): the run stops after the step in flight if "
                  "that can still end, and within a minute in any case unless the cluster is back")  # fmt: skip
        self.timer = threading.Timer(self.GRACE_S, self._give_up)
        self.timer.daemon = True
        self.timer.start()

    def cancel(self) -> None:
        if self.timer is not None:
            self.timer.cancel()

    def say_stopped(self) -> None:
        if not self.said:
            self.said = True
            err.print(f"stopped: the Ray cluster is gone {_stopped_at(self.run_dir, self.cfg)}; once it is back "
                      f"(or on another), continue with `vivace train --resume {self.run_dir}`.", style="red",
                      markup=False, highlight=False)  # fmt: skip

    def _give_up(self) -> None:
        """The step in flight did not end in time, or Ray's shutdown hangs on the dead cluster."""
        self.say_stopped()
        sys.stderr.flush()
        sys.stdout.flush()
        self.exit_now(1)


class _Refused(Exception):
    """A resume or a new run this command will not start (exit 2, no traceback)."""


def cpu_has_bf16(cpuinfo: str | None = None) -> bool | None:
    """Whether this CPU computes in bf16 natively (AVX-512 BF16 or AMX), by its flags in `cpuinfo` (default:
    /proc/cpuinfo); None where they cannot be read (not Linux)."""
    try:
        text = Path("/proc/cpuinfo").read_text() if cpuinfo is None else cpuinfo
        flags = next(line for line in text.splitlines() if line.startswith("flags"))
    except (OSError, StopIteration):
        return None
    return bool({"avx512_bf16", "amx_bf16"} & set(flags.split()))


def check_train_config(cfg: VivaceConfig, tasks: list) -> list[str]:
    """What the config's fields alone cannot say, checked before the run directory and Ray: a
    setting that can never train is a ValueError naming it and what to do; one that is legal but
    likely not what was meant comes back as a warning (printed once, before the run)."""
    import torch

    from vivace.inference.sampling import is_greedy
    from vivace.rl.controller import check_model_and_data

    tc, warnings = cfg.train, []
    s = cfg.score
    if not any((s.correctness, s.adherence, s.efficiency, s.claims, s.format, tc.milestone_read, tc.milestone_edit)):
        raise ValueError("score: every weight is 0 (and train.milestone_read and train.milestone_edit too), so every "
                         "reward is 0 and no group can train; give score.correctness a weight above 0 (default 1.0)")  # fmt: skip
    context, prompt = check_model_and_data(cfg)
    if tc.eval_tasks:
        _check_baselines(tc.eval_baselines)
    greedy = is_greedy(cfg.engine.temperature)
    if greedy or cfg.engine.top_k == 1:
        knob = f"engine.temperature is {cfg.engine.temperature:g}" if greedy else "engine.top_k is 1"
        warnings.append(f"{knob}: rollouts are greedy, so a group's {tc.group_size} rollouts come out the same, "
                        "score alike and train nothing; sample (engine.temperature 0.7, engine.top_k 0) to train, "
                        "and set train.eval_temperature 0 for a greedy evaluation")  # fmt: skip
    elif cfg.engine.top_p < 1 or cfg.engine.top_k > 1:
        knob = f"engine.top_p {cfg.engine.top_p}" if cfg.engine.top_p < 1 else f"engine.top_k {cfg.engine.top_k}"
        warnings.append(f"{knob}: rollouts are drawn from the cut distribution, but their logprobs (and the trainer's) "
                        "are the whole one's, so every importance weight is off by the mass the cut kept (x1.05 on "
                        "average at top_p 0.9, x1.16 at top_k 50 on the tiny policy); use engine.top_p 1 and "
                        "engine.top_k 0 for RL, and engine.temperature to sample less widely")  # fmt: skip
    if cfg.agent.max_tokens <= prompt:
        warnings.append(f"agent.max_tokens {cfg.agent.max_tokens} is not above the {prompt} tokens of the agent's "
                        "system turn: every episode stops after its first turn (stop reason max_tokens) and can "
                        "neither edit nor test; it counts the whole conversation: give "
                        f"{prompt + 4 * cfg.agent.max_turn_tokens} or more (agent.max_turn_tokens limits one turn)")  # fmt: skip
    if cfg.agent.max_turn_tokens >= context:
        warnings.append(f"agent.max_turn_tokens {cfg.agent.max_turn_tokens} is not below the model's context "
                        f"({context} tokens): a turn ends where the context does, {context - prompt} tokens after "
                        "the system turn at most")  # fmt: skip
    if tc.pipeline == "async" and tc.max_staleness == 0:
        warnings.append("train.pipeline async with train.max_staleness 0: no rollout may run ahead of the trainer, "
                        "so it runs as sync; give max_staleness 1 or more to overlap rollouts with updates")  # fmt: skip
    if tc.param_dtype == "bfloat16" and not torch.cuda.is_available():
        slow = ("; and this CPU has no bf16 instructions (avx512_bf16, amx_bf16), where a bf16 step of the tiny "
                "policy took about 10x a float32 one") if cpu_has_bf16() is False else ""  # fmt: skip
        warnings.append("train.param_dtype bfloat16 with no GPU here: on a CPU the trainer's memory grows with every "
                        "new rollout shape (about 2 -> 3 GB over 30 steps of the tiny policy, where fp32 held about 1 GB; "
                        f"docs/benchmarks.md), which a long run may not survive{slow}; use float32 on CPUs (trainers "
                        "on a joined cluster's GPU nodes are not affected)")  # fmt: skip
    if tc.tasks_per_step > len(tasks):
        warnings.append(f"train.tasks_per_step {tc.tasks_per_step} is more than the {len(tasks)} training "
                        f"task{'s' if len(tasks) != 1 else ''}: a step rolls out some tasks more than once")  # fmt: skip
    return warnings


def _check_baselines(specs: list[str]) -> None:
    """train.eval_baselines, checked before the run: an unknown one would stop the evaluation after training."""
    from vivace.harness.policies import load_policy, names_model

    for spec in specs:
        if names_model(spec):  # loaded when evaluated
            continue
        try:
            load_policy(spec)  # scripted ones: cheap, and a replay file is read
        except (ValueError, OSError) as e:
            raise ValueError(f"train.eval_baselines: {e}") from None


def _nothing_trained(run_dir: Path, steps: int) -> str:
    """Why a run whose steps all trained nothing did so, from its metrics: the policy is unchanged."""
    rows = metrics_rows(run_dir / "metrics.jsonl")[-steps:]
    keys = ("groups_zero_variance", "groups_same_correctness", "rollouts_failed", "samples_too_stale",
            "samples_masked_truncated", "samples_without_tokens")  # fmt: skip
    why = ", ".join(f"{k} {n}" for k in keys if (n := sum(r.get(k, 0) for r in rows)))
    return (f"no step trained anything ({sum(r.get('groups', 0) for r in rows)} groups over {len(rows)} steps: "
            f"{why or 'no samples'}); the policy is unchanged. Groups whose rollouts all score alike carry no "
            "signal: sample more diversely (engine.temperature), or give more rollouts per task (train.group_size) "
            "or easier tasks")  # fmt: skip


def _step_of(checkpoint: Path) -> int:
    return int(checkpoint.name.removeprefix("step_"))


def _stopped_at(run_dir: Path, cfg: VivaceConfig) -> str:
    last = latest_checkpoint(run_dir)
    step = _step_of(last) if last else 0
    return f"at step {step}/{cfg.train.steps}: the last checkpoint is {last}"


def _already_complete(run_dir: Path, steps: int) -> bool:
    """Says so when the run's last checkpoint is at (or past) `steps`: a resume would train nothing, and
    must not rewrite its summary or add an empty TensorBoard file."""
    last = latest_checkpoint(run_dir)
    if last is None or _step_of(last) < steps:
        return False
    err.print(f"run already complete at step {_step_of(last)} (give --steps M to extend)")
    return True


def _check_writable(run_dir: Path) -> None:
    """A resume that could not write its first checkpoint is refused (cli.write_problem)."""
    if problem := write_problem(run_dir):
        raise _Refused(f"cannot write {run_dir}: {problem}; fix it (permissions, a read-only mount, "
                       f"free space) and resume again with `vivace train --resume {run_dir}`")  # fmt: skip


def _resume_point(run_dir: Path) -> str:
    """Where a resume starts, in words: the last complete checkpoint, or step 0 (and why)."""
    last = latest_checkpoint(run_dir)
    if last is not None:
        return f"resuming {_shown(run_dir)} from step {_step_of(last)} ({_shown(last)})"
    if dirs := checkpoint_dirs(run_dir):
        return (f"resuming {_shown(run_dir)} from step 0: its only checkpoint, {_shown(dirs[-1][1])}, is incomplete "
                "(no state.json; the save was cut off)")  # fmt: skip
    return f"resuming {_shown(run_dir)} from step 0: it has no checkpoint yet"


def _sandbox_here(cfg: VivaceConfig) -> str:
    """'isolated' when this machine can isolate commands, else 'plain' (open_backend prints why):
    decided once in the driver, because the rollout actors' own warnings are not forwarded to it."""
    from vivace.sandbox import open_backend
    from vivace.sandbox.plain import PlainBackend

    backend = open_backend(cfg.sandbox)
    asyncio.run(backend.aclose())
    return "plain" if isinstance(backend, PlainBackend) else "isolated"


def _absolute_paths(cfg: VivaceConfig) -> VivaceConfig:
    """The config with the files it names relative to the working directory (a tasks file as the suite, a
    checkpoint as the model, sft_data) made absolute, as the run's config.json keeps them: `--resume` from
    another directory said "tasks.jsonl: no such task file or directory"."""
    from vivace.tasks.suites import SUITES

    tc = cfg.train
    for key in ("suite", "eval_suite"):
        if (value := getattr(tc, key)) and value not in SUITES and Path(value).expanduser().exists():
            setattr(tc, key, str(Path(value).expanduser().resolve()))
    if tc.model not in ("tiny", "tiny-init") and Path(tc.model).expanduser().exists():
        tc.model = str(Path(tc.model).expanduser().resolve())
    if tc.sft_data is not None:
        tc.sft_data = tc.sft_data.expanduser().resolve()
    return cfg


_BUDGETS = {
    "max_minutes": "its time budget (train.max_minutes) left no room for another step",
    "total_minutes": "the run's time budget (train.total_minutes) leaves room for the evaluation only",
}
_SIGNAL_NAMES = {signal.SIGINT: "Ctrl-C", signal.SIGTERM: "SIGTERM"}


SAME_STOP_S = 1.0  # a second stop signal sooner than this after the first is the same stop (see below)


def _stop_signals(stop: threading.Event, received: list[int], announce):
    """The first SIGINT or SIGTERM sets `stop` and calls `announce(signum)`; the next raises
    KeyboardInterrupt, unless it comes within SAME_STOP_S of the first: GNU `timeout` sends its signal
    to the process and then to its process group, so one stop arrives twice, microseconds apart (it
    ended 3 of 5 runs at once, with no checkpoint). Each signal is appended to `received`."""
    from vivace.signals import signal_handler

    first: list[float] = []

    def handler(signum, frame):
        received.append(signum)
        if stop.is_set():
            if first and time.monotonic() - first[0] < SAME_STOP_S:
                return  # the same stop, sent twice
            raise KeyboardInterrupt
        first.append(time.monotonic())
        stop.set()
        announce(signum)

    return signal_handler(handler, (signal.SIGINT, signal.SIGTERM))


def _shown(path: Path) -> Path:
    """The path relative to the working directory when it is under it (runs/NAME/...)."""
    try:
        return path.resolve().relative_to(Path.cwd())
    except ValueError:
        return path


def _step_line(row: dict, steps: int) -> str:
    """One RL step as a plain line, for output that is not a terminal."""
    return (f"step {row['step']}/{steps}: reward {row['reward_mean']:.3f}, success {row['success_rate']:.0%}, "
            f"{row['agent_turns']:.1f} turns, {row['agent_tool_calls_per_turn']:.2f} calls/turn, "
            f"{row['step_s']:.0f} s")  # fmt: skip


def _evaluate(cfg: VivaceConfig, run_dir: Path, tasks: list) -> tuple[dict, Path]:
    """The before/after benchmark of a run, with a progress bar on stderr: (report, report.md)."""
    from vivace.rl.evaluate import evaluate_run, trained_policy

    after = trained_policy(run_dir)
    specs = {cfg.train.model, after, *cfg.train.eval_baselines}
    progress = LoggedProgress()
    bar = progress.add_task("held-out episodes", total=len(specs) * len(tasks))

    def show(done: int, total: int, solved: int) -> None:
        progress.update(bar, completed=done, total=total, description=f"held-out episodes ({solved} solved)")

    err.print(f"evaluating {cfg.train.model} (before) and {_shown(Path(after))} (after) beside "
              f"{', '.join(cfg.train.eval_baselines) or 'no baselines'} on {len(tasks)} held-out tasks")  # fmt: skip
    with progress:
        report = asyncio.run(evaluate_run(cfg, run_dir, cfg.train.model, after, tasks, cfg.train.eval_baselines,
                                          cfg.train.eval_concurrency, show))  # fmt: skip
    return report, _shown(run_dir / "report.md")


@train_app.command("report")
def report_command(
    run_dir: Annotated[Path, typer.Argument(help="A run directory made by `vivace train` (runs/NAME).")],
    tasks: Annotated[
        int | None, typer.Option("--tasks", help="Held-out tasks (default: the run's eval_tasks, else one per family).")
    ] = None,
    split: Annotated[
        str | None, typer.Option(help="Split the tasks come from (default: the run's eval_split).")
    ] = None,
    samples: Annotated[
        int | None,
        typer.Option(
            help="Episodes per task for the starting and the trained policy (default: the run's "
            "eval_samples); more make a small change easier to tell from sampling luck."
        ),
    ] = None,
    backend: BackendOpt = None,
    state_dir: StateOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
) -> None:
    """Benchmark a run's starting policy and its last checkpoint (and the baselines) on held-out
    tasks; write report.md, report.json and report.html into the run directory (an earlier report
    moves to RUN/reports/N/, and back if the new one does not complete; Ctrl-C exits 130)."""
    try:
        cfg = with_sandbox_options(load_run_config(run_dir), backend, state_dir)
        if split is not None and split not in ("train", "validation", "test"):
            raise ValueError(f"unknown split {split!r}; use train, validation or test")
        if tasks is not None and tasks < 1:
            raise ValueError("--tasks must be at least 1")
        if samples is not None:
            if samples < 1:
                raise ValueError("--samples must be at least 1")
            cfg.train.eval_samples = samples
        from vivace.rl.evaluate import held_out_tasks, markdown_report, trained_policy  # after the cheap refusals

        trained_policy(run_dir)
        metrics_rows(run_dir / "metrics.jsonl")  # a damaged row is found now, not after the whole evaluation
        chosen = held_out_tasks(cfg, tasks or cfg.train.eval_tasks or None, split)
        # The run's lock: a second report (or the run itself) would clear RUN/eval/ under this one's episodes.
        lock = lock_run(run_dir)
    except (ValueError, OSError, RunInUse) as e:
        fail(str(e))
    received: list[int] = []
    try:
        # SIGTERM as Ctrl-C: the earlier report is put back, not left moved away
        with lock, sigterm_interrupts(received):
            report, path = _evaluate(cfg, run_dir.resolve(), chosen)
    except ValueError as e:  # a checkpoint that cannot be loaded (damaged, of a model the engine cannot run)
        with contextlib.suppress(OSError):
            (run_dir / "eval").rmdir()  # made for this report, and empty: not left as if something were in it
        fail(f"the report could not be made: {e}", 1)
    except KeyboardInterrupt:  # evaluate_run has put the earlier report back
        previous = run_dir / "report.md"
        where = (
            f"the previous report is still at {_shown(previous)}" if previous.is_file() else "there was no earlier one"
        )
        err.print(f"[yellow]report stopped;[/] {escape(where)}", highlight=False)
        raise typer.Exit(128 + (received[-1] if received else signal.SIGINT)) from None
    if as_json:
        print(json.dumps({"report": str(path), **report}))
        return
    sys.stdout.write(markdown_report(report))  # raw: tables must not be wrapped to the terminal
    print(f"report: {path}")


@train_app.command("bench-pipeline")
def bench_pipeline_command(
    preset: PresetOpt = "tiny",
    config_file: ConfigOpt = None,
    modes: Annotated[str, typer.Option(help="Comma-separated: sync, async, async-abort.")] = "sync,async",
    steps: Annotated[
        int, typer.Option(min=1, help="Training steps per mode (the first step's cold start is amortized over them).")
    ] = 16,
    tasks_per_step: Annotated[int, typer.Option(min=1, help="Groups per step.")] = 4,
    group_size: Annotated[int, typer.Option(min=1, help="Episodes per group.")] = 4,
    concurrency: Annotated[int, typer.Option(min=1, help="Episodes running at once (both modes).")] = 32,
    max_staleness: Annotated[int, typer.Option(min=0, help="Async: versions a trained token may lag.")] = 2,
    replicas: Annotated[int, typer.Option(min=1, help="Sampler replicas.")] = 1,
    median_s: Annotated[float, typer.Option(help="Median tool latency (seconds, above 0).")] = 1.0,
    sigma: Annotated[
        float, typer.Option(min=0, help="Log-normal sigma of tool latency (heavier tail when larger).")
    ] = 1.0,
    turns: Annotated[str, typer.Option(help="Turns per episode, drawn uniformly from MIN-MAX.")] = "2-6",
    turn_tokens: Annotated[int, typer.Option(min=1, help="Tokens the model samples per turn at most.")] = 128,
    work_dir: Annotated[Path, typer.Option(help="Where the runs go.")] = Path("runs/bench-pipeline"),
    local: Annotated[bool, typer.Option("--local", help="In this process instead of Ray actors.")] = False,
    backend: BackendOpt = None,
    state_dir: StateOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the results as JSON.")] = False,
) -> None:
    """Synchronous vs asynchronous rollouts on a heavy-tailed synthetic environment, side by side:
    trajectories per minute, sampler busy fraction, staleness, p50/p99 episode time."""
    from vivace.rl.bench import MODES, bench_pipeline
    from vivace.rl.workers import ClusterUnavailable, check_ray_installed

    cfg = _config(preset, backend, state_dir, config_file)
    try:
        chosen = [m.strip() for m in modes.split(",") if m.strip()]
        if not chosen or (unknown := [m for m in chosen if m not in MODES]):
            said = f"unknown {', '.join(map(repr, unknown))}" if chosen else "no mode"
            raise ValueError(f"--modes {modes!r}: {said}; choose from {', '.join(MODES)} (comma-separated)")
        if not 0 < median_s < float("inf"):  # inf: an environment whose calls never end
            raise ValueError(f"--median-s {median_s:g}: give a latency above 0 seconds")
        lo, _, hi = turns.partition("-")
        try:
            turn_range = (int(lo), int(hi or lo))
        except ValueError:
            raise ValueError(f"--turns {turns!r}: give MIN-MAX, e.g. 2-6") from None
        cfg.train = cfg.train.model_copy(update={"steps": steps, "tasks_per_step": tasks_per_step,
            "group_size": group_size, "rollout_concurrency": concurrency, "max_staleness": max_staleness,
            "sampler_replicas": replicas, "checkpoint_every": 1_000_000})  # fmt: skip
        cfg.agent = cfg.agent.model_copy(update={"max_turn_tokens": turn_tokens})
        cfg.engine = cfg.engine.model_copy(update={"max_batch": max(cfg.engine.max_batch, concurrency)})
        if not 1 <= turn_range[0] <= turn_range[1]:
            raise ValueError(f"--turns {turns!r}: give MIN-MAX with 1 <= MIN <= MAX")
        if not local:
            check_ray_installed()
    except ValueError as e:
        fail(str(e))
    except ClusterUnavailable as e:
        fail(str(e))
    check_out(work_dir, directory=True, option="--work-dir")
    received: list[int] = []
    try:
        with err.status("measuring the rollout pipeline...") as status:
            say = status_say(status)
            result = run_cancelling_on_sigterm(received, bench_pipeline(cfg, work_dir.resolve(), modes=chosen,
                                               median_s=median_s, sigma=sigma, turns=turn_range, local=local,
                                               say=say))  # fmt: skip
    except (KeyboardInterrupt, asyncio.CancelledError):
        raise stopped_by_signal(received, f"no numbers: the benchmark was cut short (its runs are under {work_dir}); "
                                "run it again, with fewer --steps for a shorter one") from None  # fmt: skip
    if as_json:
        print(json.dumps(result, indent=2))
        return
    table = Table(title="rollout pipeline: " + result["workload"]["tool_latency"])
    for col in ("mode", "traj/min", "vs sync", "sampler busy", "staleness", "episode p50 s", "p99 s", "requeued"):
        table.add_column(col, justify="right")
    for mode, r in result["modes"].items():
        speed = f"{r['speedup_vs_sync']:.2f}x" if r.get("speedup_vs_sync") else "-"
        stale = " ".join(f"{k}:{v}" for k, v in r["staleness"].items())
        table.add_row(mode, f"{r['trajectories_per_min']:.1f}", speed, f"{r['sampler_busy']:.0%}", stale,
                      f"{r['episode_s_p50']:.1f}", f"{r['episode_s_p99']:.1f}", str(r["episodes_requeued"]))  # fmt: skip
    out.print(table)
