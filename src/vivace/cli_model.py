"""`vivace tokenizer train`: the model's commands (registered on the app in cli.py, kept here so
cli.py stays a readable index)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.progress import BarColumn, MofNCompleteColumn, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from vivace.cli import (
    LoggedProgress,
    app,
    check_writable,
    err,
    fail,
    out,
    sigterm_interrupts,
    stopped_by_signal,
    writes_or_exit,
)

tokenizer_app = typer.Typer(help="The reference tokenizer (byte-level BPE shipped with vivace).", no_args_is_help=True)
app.add_typer(tokenizer_app, name="tokenizer")


@tokenizer_app.command("train")
def tokenizer_train(
    out_dir: Annotated[
        Path,
        typer.Option(
            "--out",
            help="Directory for the tokenizer files; must be new or empty (the shipped reference, "
            "model/assets/tokenizer, is replaced only by emptying it first).",
        ),
    ] = Path("runs/tokenizer"),
    vocab_size: Annotated[
        int, typer.Option("--vocab-size", help="Tokens in the vocabulary, control tokens included.")
    ] = 4096,
    as_json: Annotated[bool, typer.Option("--json", help="Print the numbers as JSON.")] = False,
) -> None:
    """Train the byte-level BPE on vivace's code and harness conversations and save it."""
    from vivace.model import tokenizer as T

    check_writable(out_dir, directory=True)  # a file there is named as one (not as a directory holding files)
    if out_dir.is_dir() and any(out_dir.iterdir()):
        # Retraining on today's source gives another vocabulary: replacing the shipped reference (which
        # tiny-init and the benchmark's token counts use) must be a deliberate act, and so must any other.
        fail(f"--out {out_dir} already holds files; give a new directory, or empty it first")
    if vocab_size < (least := 256 + len(T.SPECIAL_TOKENS)):  # before the corpus is read
        fail(f"--vocab-size {vocab_size}: give {least} or more (256 bytes + the control tokens)")
    progress = LoggedProgress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                              TimeElapsedColumn())  # fmt: skip
    received: list[int] = []
    written: dict[str, int] = {}
    try:
        with progress, sigterm_interrupts(received):  # SIGTERM as Ctrl-C: one line saying what was saved
            code, conversations = _read_corpus(progress)
            bar = progress.add_task(f"training BPE ({vocab_size} tokens)", total=1)
            t0 = time.monotonic()
            try:
                tok = T.train_tokenizer(code + conversations, vocab_size)
            except ValueError as e:
                fail(str(e))
            train_s = time.monotonic() - t0
            progress.advance(bar)
            with writes_or_exit(out_dir, "the tokenizer trained was not saved; give an --out you can write and run "
                                "it again"):  # fmt: skip
                out_dir.mkdir(parents=True, exist_ok=True)
                written = T.save_tokenizer(tok, out_dir)
            bar = progress.add_task("measuring compression", total=2)
            code_cpt = T.chars_per_token(tok, code)
            progress.advance(bar)
            conversation_cpt = T.chars_per_token(tok, conversations)
            progress.advance(bar)
    except KeyboardInterrupt:
        raise stopped_by_signal(received, _what_was_saved(out_dir, written)) from None
    code_bytes = sum(len(t.encode("utf-8")) for t in code)
    conversation_bytes = sum(len(t.encode("utf-8")) for t in conversations)
    result = {
        "out_dir": str(out_dir),
        "vocab_size": len(tok),
        "corpus_bytes": code_bytes + conversation_bytes,
        "code_bytes": code_bytes,
        "conversation_bytes": conversation_bytes,
        "code_files": len(code),
        "conversations": len(conversations),
        "train_s": round(train_s, 2),
        "chars_per_token_code": round(code_cpt, 3),
        "chars_per_token_conversations": round(conversation_cpt, 3),
        "files": written,
    }
    if len(tok) < vocab_size:  # BPE ran out of pairs worth merging: a model sized for vocab_size wastes rows
        err.print(f"[yellow]note:[/] the corpus gave {len(tok):,} tokens, fewer than --vocab-size {vocab_size:,}; "
                  "give more text for more, or size the model's vocabulary to this one")  # fmt: skip
    if as_json:
        sys.stdout.write(json.dumps(result) + "\n")
        return
    table = Table(title=f"tokenizer written to {out_dir}")
    table.add_column("measure")
    table.add_column("value", justify="right")
    for key, value in result.items():
        if key not in ("out_dir", "files"):
            table.add_row(key, f"{value:,}" if isinstance(value, int) else str(value))
    table.add_row("files", ", ".join(f"{name} ({size:,} B)" for name, size in written.items()))
    out.print(table)


def _read_corpus(progress: LoggedProgress) -> tuple[list[str], list[str]]:
    """The training corpus: the code files' texts and the harness conversations', each read under a bar."""
    from vivace.model import corpus as C
    from vivace.tasks.format import bundled_repos

    bar = progress.add_task("corpus: code files", total=len(C.code_files()))
    code = []
    for text in C.code_texts():
        code.append(text)
        progress.advance(bar)
    bar = progress.add_task("corpus: conversations", total=len(bundled_repos()) * C.CONVERSATIONS_PER_REPO)
    conversations = []
    for text in C.conversation_texts():
        conversations.append(text)
        progress.advance(bar)
    return code, conversations


def _what_was_saved(out_dir: Path, written: dict[str, int]) -> str:
    """What a stopped `tokenizer train` left in `out_dir`, in words."""
    if written:
        return f"the tokenizer is saved in {out_dir} (its compression was not measured)"
    if out_dir.is_dir() and any(out_dir.iterdir()):
        return f"{out_dir} holds part of a tokenizer; empty it and run it again"
    return f"nothing was written to {out_dir}; run it again"
