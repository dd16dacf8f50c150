"""`vivace train`: RL on the built-in defaults or a config; registered on the app in cli.py."""

from __future__ import annotations

import asyncio
import json
import tomllib
from pathlib import Path
from typing import Annotated

import typer
from rich.live import Live
from rich.table import Table

from vivace.cli import BackendOpt, PresetOpt, StateOpt, app, err, out
from vivace.config import VivaceConfig, load_preset


def load_config(preset: str, config_file: Path | None) -> VivaceConfig:
    """A preset, with a JSON or TOML file's sections merged over it."""
    overrides: dict = {}
    if config_file is not None:
        text = config_file.read_text()
        overrides = tomllib.loads(text) if config_file.suffix == ".toml" else json.loads(text)
        if not isinstance(overrides, dict):
            raise ValueError(f"{config_file}: expected a table of sections (sandbox, agent, engine, train, ...)")
    return load_preset(preset, **overrides)


@app.command("train")
def train_command(
    preset: PresetOpt = "tiny",
    config_file: Annotated[
        Path | None, typer.Option("--config", help="JSON or TOML file of sections merged over the preset.")
    ] = None,
    steps: Annotated[int | None, typer.Option(help="Steps in the run (default: the config's).")] = None,
    name: Annotated[str | None, typer.Option(help="Run directory name under runs/ (default: train-DATE-TIME).")] = None,
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
    from vivace.rl.controller import new_run_dir, train
    from vivace.rl.workers import LocalWorkers, RayWorkers

    try:
        if resume is not None:
            cfg = VivaceConfig.model_validate_json((resume / "config.json").read_text())
            run_dir = resume.resolve()
        else:
            cfg = load_config(preset, config_file)
        if steps is not None:
            cfg.train.steps = steps
        if backend is not None:
            cfg.sandbox.backend = backend  # type: ignore[assignment]
        if state_dir is not None:
            cfg.sandbox.state_dir = state_dir
        if resume is None:
            run_dir = new_run_dir(cfg, name)
    except (ValueError, FileExistsError, FileNotFoundError) as e:
        err.print(f"[red]error:[/] {e}")
        raise typer.Exit(2) from e

    workers = LocalWorkers(cfg) if local else RayWorkers(cfg, address=address)
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

    err.print(f"run directory: {run_dir}  ({cfg.train.steps} steps, {cfg.train.tasks_per_step} tasks x "
              f"{cfg.train.group_size} rollouts per step, model {cfg.train.model})")  # fmt: skip
    if as_json:
        summary = asyncio.run(
            train(
                cfg,
                run_dir,
                resume=resume is not None,
                workers=workers,
                on_step=lambda r: print(json.dumps(r), flush=True),
            )
        )
        print(json.dumps({"summary": summary}))
        return
    with Live(render(), console=err, refresh_per_second=2) as live:

        def on_step(row: dict) -> None:
            table_rows.append(row)
            live.update(render())

        summary = asyncio.run(train(cfg, run_dir, resume=resume is not None, workers=workers, on_step=on_step))
    out.print_json(json.dumps(summary))
