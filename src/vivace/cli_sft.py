"""`vivace sft data`: expert dialogues for the warm start; registered on the app in cli.py."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Annotated

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from vivace.cli import BackendOpt, PresetOpt, StateOpt, _config, app, err, out

sft_app = typer.Typer(help="Supervised warm start: expert data.", no_args_is_help=True)
app.add_typer(sft_app, name="sft")


@sft_app.command("data")
def sft_data(
    out_file: Annotated[Path, typer.Option("--out", help="JSONL file to write.")] = Path("runs/sft/expert.jsonl"),
    suite: Annotated[str, typer.Option(help="Named suite: bundled, bugs, features.")] = "bundled",
    split: Annotated[
        str | None, typer.Option(help="Split to draw from (train, validation, test; default train).")
    ] = "train",
    styles: Annotated[str, typer.Option(help="Comma-separated: efficient, serial, redundant, no-tests.")] = (
        "efficient,serial,redundant,no-tests"
    ),
    n: Annotated[int | None, typer.Option("--n", help="First N tasks only.")] = None,
    model: Annotated[str, typer.Option(help="Whose tokenizer renders the tokens: tiny or a checkpoint.")] = "tiny",
    minimal: Annotated[bool, typer.Option(help="Minimal unique old_string fragments (else whole diff hunks).")] = True,
    max_tokens: Annotated[
        int | None, typer.Option(help="Drop episodes longer than this (default: the model's context).")
    ] = None,
    concurrency: Annotated[int, typer.Option(help="Episodes at the same time.")] = 4,
    preset: PresetOpt = "default",
    backend: BackendOpt = None,
    state_dir: StateOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the counts as JSON.")] = False,
) -> None:
    """Run scripted:oracle and its correct-but-inefficient variants through the real harness on the
    training split; write the resolved episodes as token ids + loss masks (and chat messages)."""
    from vivace.rl.sft import expert_data
    from vivace.tasks.suites import load_suite

    try:
        cfg = _config(preset, backend, state_dir)
        tasks = load_suite(suite, split=split)[:n]
        if not tasks:
            raise ValueError(f"suite {suite!r} has no tasks in split {split!r}")
        wanted = tuple(s.strip() for s in styles.split(",") if s.strip())
        if max_tokens is None:
            from transformers import AutoConfig

            from vivace.model.checkpoint import load_tokenizer, tiny_config

            config = tiny_config(len(load_tokenizer(model))) if model == "tiny" else AutoConfig.from_pretrained(model)
            max_tokens = config.max_position_embeddings
        with Progress(TextColumn("expert episodes"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=err) as bar:  # fmt: skip
            job = bar.add_task("episodes", total=len(tasks) * len(wanted))
            result = asyncio.run(expert_data(cfg, tasks, out_file, model=model, styles=wanted, minimal=minimal,
                                             max_tokens=max_tokens, concurrency=concurrency,
                                             progress=lambda done, total: bar.update(job, completed=done)))  # fmt: skip
    except ValueError as e:
        err.print(f"[red]error:[/] {e}")
        raise typer.Exit(2) from e
    if as_json:
        print(json.dumps(result))
    else:
        out.print_json(json.dumps(result))
