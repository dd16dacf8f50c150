"""`vivace sft`: expert dialogues (data), their variants (augment, copies, drills), the supervised warm
start on them (train), its probes (eval) and shipping (ship); registered on the app in cli.py.

Every command refuses an --out that holds data (a non-empty file; for train, a non-empty directory)
rather than replace it, and writes files under OUT.partial until complete. Ctrl-C / SIGTERM exit
130 / 143: train saves what it learned, data leaves the episodes kept in OUT.partial, the quick
writers leave nothing. Nothing resumes: a stopped run is redone, or trained on from (--init).

An --out that cannot be written is refused before the work (cli.check_writable); a write that fails
after it (a disk that filled) is one line and exit 1, not a traceback."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import random
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, TextIO

import typer
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn

from vivace.cli import (
    BackendOpt,
    LoggedProgress,
    PresetOpt,
    StateOpt,
    _config,
    app,
    check_writable,
    err,
    fail,
    out,
    path_problem,
    run_cancelling_on_sigterm,
    seed_in_range,
    sigterm_interrupts,
    stopped_by_signal,
)
from vivace.locks import try_lock

sft_app = typer.Typer(help="Supervised warm start: expert data, training.", no_args_is_help=True)
app.add_typer(sft_app, name="sft")


def _fresh_file(path: Path) -> None:
    """Refuses an --out that would replace what is there (a file with content: the user's data), that
    cannot be a file (a directory, a path under a file) or that cannot be written (check_writable)."""
    if problem := path_problem(path, directory=False):
        raise ValueError(f"--out: {problem}")
    if path.exists() and path.stat().st_size:
        raise ValueError(f"--out {path} already exists; give another --out, or delete it first to write it again")
    check_writable(path, directory=False)


def _no_partial_set(partial: Path) -> None:
    """Refuses to start over a stopped run's partial set (its stop message pointed at it), or a run writing
    it now: an empty one, which holds nothing, is removed."""
    if partial.is_file() and not partial.stat().st_size:
        partial.unlink()
    elif partial.exists():
        raise ValueError(f"{partial} holds {_lines_in(partial)} episodes of a run that was stopped, or is running "
                         "now; move it aside (it is a usable partial set) or delete it, then run this again")  # fmt: skip


@contextlib.contextmanager
def _written(path: Path) -> Iterator[TextIO]:
    """The file to write `path` through: PATH.partial until the block ends, then renamed over it; a block
    that fails or is stopped removes it, so nothing half-written ever carries the name. A write that fails
    (ENOSPC from write() names no file) exits 1 with one line; other errors, a failed read, propagate."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    try:
        f = _locked_partial(partial, path)
        try:  # renamed or removed while still locked: no second writer can open it in between
            yield f
            f.flush()
            partial.replace(path)
        except BaseException:
            partial.unlink(missing_ok=True)
            raise
        finally:
            f.close()
    except BaseException as e:
        if isinstance(e, OSError) and e.filename in (None, str(partial), str(path)):
            fail(f"cannot write {path}: {e.strerror or e}; nothing was written: free some space or give an --out "
                 "you can write, and run the command again", 1)  # fmt: skip
        raise


def _locked_partial(partial: Path, path: Path) -> TextIO:
    """PARTIAL, empty and open for writing under an exclusive flock, so that a second command writing the
    same --out at the same time is refused (two interleaved their lines into one file, and each said it
    had written it). A partial left by a killed run holds no lock and is started over."""
    while True:
        f = partial.open("a")
        if not try_lock(f):
            f.close()
            fail(f"another command is writing {path} now ({partial} is in use); wait for it to end, or give "
                 "another --out")  # fmt: skip
        with contextlib.suppress(FileNotFoundError):
            if os.stat(partial).st_ino == os.fstat(f.fileno()).st_ino:
                f.truncate(0)
                return f
        f.close()  # locked a file the other writer had just renamed to its --out: not ours to write; again


def _say_written(out_file: Path, n: int, what: str, as_json: bool) -> None:
    if as_json:
        print(json.dumps({"out": str(out_file), "written": n}))
    else:
        out.print(f"wrote {n} {what} to {out_file}")


@sft_app.command("data")
def sft_data(
    out_file: Annotated[Path, typer.Option("--out", help="JSONL file to write.")] = Path("runs/sft/expert.jsonl"),
    suite: Annotated[str, typer.Option(help="Named suite: bundled, bugs, features, families.")] = "families",
    tasks_path: Annotated[Path | None, typer.Option("--tasks", help="Tasks file (.jsonl) instead of a suite.")] = None,
    split: Annotated[
        str | None, typer.Option(help="Split to draw from (train, validation, test; default train).")
    ] = "train",
    styles: Annotated[str, typer.Option(help="Comma-separated: efficient, serial, redundant, no-tests.")] = (
        "efficient,serial,redundant,no-tests"
    ),
    n: Annotated[int | None, typer.Option("--n", min=1, help="First N tasks only.")] = None,
    model: Annotated[str, typer.Option(help="Whose tokenizer renders the tokens: tiny or a checkpoint.")] = "tiny",
    minimal: Annotated[bool, typer.Option(help="Minimal unique old_string fragments (else whole diff hunks).")] = True,
    max_tokens: Annotated[
        int | None, typer.Option(min=1, help="Drop episodes longer than this (default: the model's context).")
    ] = None,
    styles_per_task: Annotated[
        int | None, typer.Option(min=1, help="Only this many styles per task, taken in turn (default: all).")
    ] = None,
    concurrency: Annotated[int, typer.Option(min=1, help="Episodes at the same time.")] = 4,
    preset: PresetOpt = "default",
    backend: BackendOpt = None,
    state_dir: StateOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the counts as JSON.")] = False,
) -> None:
    """Run scripted:oracle and its correct-but-inefficient variants through the real harness on the
    training split; write the resolved episodes as token ids + loss masks (and chat messages).
    Written to OUT.partial until every episode has run; Ctrl-C or SIGTERM leaves that file (exit 130/143)."""
    from vivace.rl.sft import expert_data, partial_path
    from vivace.tasks.suites import load_suite

    received: list[int] = []
    done = [0, 0]  # episodes run, episodes planned
    try:
        _fresh_file(out_file)
        _no_partial_set(partial_path(out_file))
        cfg = _config(preset, backend, state_dir)
        # A tasks file is a suite like any other: a task whose metadata names no split is its repository's
        # (a user's repository: train), as `train.suite` and `tasks select` take it.
        tasks = load_suite(str(tasks_path) if tasks_path is not None else suite, split=split)[:n]
        if not tasks:
            raise ValueError(f"{tasks_path or f'suite {suite!r}'} has no tasks in split {split!r}; a task's split is "
                             "its metadata.split (train when it names none), and --split picks one")  # fmt: skip
        if split in ("test", "validation"):  # deliberate, perhaps: but a warm start trained on them is not held out
            err.print(f"[yellow]note:[/] expert data from the {split} split: a policy trained on it has seen those "
                      f"tasks, so its {split} numbers (the benchmark's held-out ones) no longer measure held-out "
                      "tasks")  # fmt: skip
        wanted = tuple(s.strip() for s in styles.split(",") if s.strip())
        if not wanted:
            raise ValueError(f"--styles {styles!r} names no style; choose from efficient, serial, redundant, no-tests")
        if max_tokens is None:
            max_tokens = _context_of(model)

        def show(n_done: int, total: int) -> None:
            done[:] = [n_done, total]
            bar.update(job, completed=n_done, total=total)

        with LoggedProgress() as bar:
            job = bar.add_task("expert episodes", total=len(tasks) * len(wanted))
            episodes = expert_data(cfg, tasks, out_file, model=model, styles=wanted, minimal=minimal,
                                   max_tokens=max_tokens, styles_per_task=styles_per_task, concurrency=concurrency,
                                   progress=show)  # fmt: skip
            result = run_cancelling_on_sigterm(received, episodes)
    except ValueError as e:
        fail(str(e))
    except (KeyboardInterrupt, asyncio.CancelledError):
        partial = partial_path(out_file)
        raise stopped_by_signal(received, f"{done[0]} of {done[1] or '?'} episodes ran; the {_lines_in(partial)} kept "
                                f"are in {partial} (a partial set; {out_file} was not written). `sft data` does not "
                                "resume: run it again for the whole set") from None  # fmt: skip
    except OSError as e:  # a disk that filled, a mount gone read-only: expert_data cut the file back to whole lines
        partial = partial_path(out_file)
        fail(f"cannot write {e.filename or partial}: {e.strerror or e}; the {_lines_in(partial)} episodes kept before "
             f"it are in {partial}, whole lines ({out_file} was not written); free space or give another --out, and "
             "run it again", 1)  # fmt: skip
    if as_json:
        print(json.dumps(result))
    else:
        out.print_json(json.dumps(result))
    if not result["kept"]:  # an empty set is no training data: say so, not exit 0 for `sft train` to trip on
        why = "; ".join(f"{k}: {v}" for k, v in list(result.get("not_kept", {}).items())[:3])
        too_long = sum(v for k, v in result.items() if k.startswith("too_long:"))
        hint = (f"{too_long} were longer than --max-tokens {max_tokens}: raise it" if too_long else
                "see `not_kept` above for why each was not (the first: " + (why or "none recorded") + ")")  # fmt: skip
        fail(f"none of the {result['episodes']} episodes was kept, so {out_file} holds no training data; {hint}", 1)


def _lines_in(path: Path) -> int:
    """Lines in a JSONL file (one episode each); 0 when there is none."""
    return path.read_bytes().count(b"\n") if path.is_file() else 0


def _context_of(model: str) -> int:
    """The context length (tokens) of `tiny` or a checkpoint directory; ValueError if it is neither."""
    from vivace.model.checkpoint import load_tokenizer, model_config

    load_tokenizer(model)  # names a missing or tokenizer-less directory
    try:
        return model_config(model).max_position_embeddings
    except (ValueError, AttributeError) as e:
        raise ValueError(f"--model {model}: not a checkpoint with a usable config.json ({e}); give tiny "
                         "or a directory that `vivace sft train` wrote") from None  # fmt: skip


@sft_app.command("augment")
def sft_augment(
    data: Annotated[
        list[Path], typer.Option("--data", help="Expert episodes from `vivace sft data` (repeat for several).")
    ] = (Path("runs/sft/expert.jsonl"),),
    out_file: Annotated[Path, typer.Option("--out", help="JSONL file to write.")] = Path("runs/sft/augmented.jsonl"),
    variants: Annotated[int, typer.Option(min=1, help="Renamed, cut-short copies per episode.")] = 4,
    seed: Annotated[int, typer.Option(callback=seed_in_range, help="Seed of the new names and cuts.")] = 0,
    model: Annotated[str, typer.Option(help="Whose tokenizer renders the tokens: tiny or a checkpoint.")] = "tiny",
    cut: Annotated[
        list[str] | None,
        typer.Option(
            help="Where a copy may end, drawn per copy: first_file, first_edit, whole, retry (a failed read first) or retry_edit (a failed edit first) (repeat)."
        ),
    ] = None,
    theme_names: Annotated[
        bool,
        typer.Option("--theme-names", help="Rename the theme's record nouns and fields too, not only the package."),
    ] = False,
    train_context: Annotated[
        bool, typer.Option("--train-context", help="Train every token after the system turn, not only the assistant's.")
    ] = False,
    invented_share: Annotated[
        float, typer.Option(help="Share of the packages given a made-up name (the rest: a word of the name pool).")
    ] = 0.5,
    letters_share: Annotated[
        float,
        typer.Option(help="Share of the made-up names that are random letters (no syllable pattern to predict)."),
    ] = 0.0,
    package: Annotated[
        list[str] | None,
        typer.Option(help="Rename the package to one of these words instead (repeat; e.g. for a held-out probe)."),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the counts as JSON.")] = False,
) -> None:
    """Copies of expert episodes with the package renamed (fresh names a model can only copy) and cut
    after the first turn naming one of its files or the first edit: dense practice at copying."""
    from vivace.harness.chat import ChatFormat
    from vivace.harness.tools import default_tools
    from vivace.harness.tools.base import tool_schema
    from vivace.model.checkpoint import load_tokenizer
    from vivace.rl.sft_augment import CUTS, augment_episodes, check_package_names, read_expert_rows

    cuts = tuple(cut or CUTS)
    for name, share in (("--invented-share", invented_share), ("--letters-share", letters_share)):
        if not 0.0 <= share <= 1.0:
            fail(f"{name} {share}: give a share between 0 and 1")
    if bad := [c for c in cuts if c not in (*CUTS, "whole", "retry", "retry_edit")]:
        fail(f"unknown --cut {', '.join(bad)}; choose from first_file, first_edit, whole, retry, retry_edit")
    files = list(data)
    try:
        check_package_names(package or ())
        _fresh_file(out_file)
        rows = [row for path in files for row in read_expert_rows(path)]
        chat = ChatFormat(load_tokenizer(model))
    except ValueError as e:
        fail(str(e))
    tools = [tool_schema(t) for t in default_tools()]

    counts = {"episodes": len(rows), "written": 0, "tokens": 0, "trained_tokens": 0}
    received: list[int] = []
    try:
        with LoggedProgress() as bar, sigterm_interrupts(received), _written(out_file) as w:
            job = bar.add_task("augmenting episodes", total=len(rows))
            for row in augment_episodes(
                iter(rows),
                chat,
                tools,
                variants,
                seed,
                invented_share=invented_share,
                progress=lambda n: bar.update(job, completed=n),
                cuts=cuts,
                theme_names=theme_names,
                train_context=train_context,
                letters_share=letters_share,
                packages=package,
            ):
                w.write(json.dumps(row) + "\n")
                counts["written"] += 1
                counts["tokens"] += len(row["ids"])
                counts["trained_tokens"] += sum(row["loss_mask"])
    except KeyboardInterrupt:
        raise stopped_by_signal(received, f"nothing was written to {out_file}; run the command again") from None
    if counts["written"] == 0:
        err.print("[yellow]note:[/] no copies written: no episode names a file in a package directory to rename")
    result = {"out": str(out_file), **counts}
    print(json.dumps(result)) if as_json else out.print_json(json.dumps(result))


@sft_app.command("copies")
def sft_copies(
    out_file: Annotated[Path, typer.Option("--out", help="JSONL file to write.")] = Path("runs/sft/copies.jsonl"),
    n: Annotated[int, typer.Option("--n", min=1, help="Sequences.")] = 40000,
    vocab: Annotated[
        str,
        typer.Option(help="Token ids to draw from, LO:HI (HI excluded), or `pieces`: those invented names break into."),
    ] = "300:4096",
    repeats: Annotated[int, typer.Option(min=1, help="Copies of the span after the first.")] = 3,
    filler: Annotated[
        str, typer.Option(help="Random tokens before each copy, LO:HI (both included): how far back the copy looks.")
    ] = "0:8",
    lookback: Annotated[
        int | None,
        typer.Option(help="Instead: this many random tokens, then as many of spans copied from anywhere in them."),
    ] = None,
    behind_system: Annotated[
        bool, typer.Option(help="Put each row behind the harness's system turn, where the agent copies.")
    ] = False,
    model: Annotated[str, typer.Option(help="Whose tokenizer renders the system turn: tiny or a checkpoint.")] = "tiny",
    seed: Annotated[int, typer.Option(callback=seed_in_range, help="Seed of the tokens.")] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="Print the count as JSON.")] = False,
) -> None:
    """Synthetic copying sequences (a random span repeated after random fillers; loss on the repeats):
    the first stage of the warm start, where the induction heads that copying needs form."""

    def span(option: str, text: str) -> tuple[int, int]:
        try:
            lo, hi = (int(x) for x in text.split(":"))
        except ValueError:
            raise ValueError(f"{option} {text!r}: give LO:HI, e.g. 300:800") from None
        return lo, hi

    received: list[int] = []
    try:
        _fresh_file(out_file)  # before the imports below (torch): a refused --out says so in under a second
        from vivace.model.checkpoint import load_tokenizer
        from vivace.rl.copying import LOOKBACK_SPAN, copy_sequences, lookback_sequences, name_pieces, system_opening

        tokenizer = load_tokenizer(model)
        vocab_size = len(tokenizer)
        pool = name_pieces(model) if vocab == "pieces" else None
        if pool is not None and lookback is None:
            raise ValueError("--vocab pieces goes with --lookback")
        lo, hi = (min(pool), max(pool) + 1) if pool else span("--vocab", vocab)
        if not 0 <= lo < hi:
            raise ValueError(f"--vocab {vocab}: give LO:HI with 0 <= LO < HI (HI excluded), e.g. 300:800")
        if hi > vocab_size:
            raise ValueError(f"--vocab {vocab}: {model}'s tokenizer has ids 0..{vocab_size - 1} only; keep HI <= "
                             f"{vocab_size} (ids past it cannot be trained)")  # fmt: skip
        # The chat's control tokens (<|im_end|>, <tool_call>, ...) drawn as random text would teach the model
        # to write them anywhere, ending turns and opening calls at random.
        # (`pieces` are pieces of names, never control tokens.)
        if pool is None and (control := sorted(i for i in tokenizer.added_tokens_decoder if lo <= i < hi)):
            names = ", ".join(f"{i} {tokenizer.convert_ids_to_tokens(i)}" for i in control[:4])
            more = f" and {len(control) - 4} more" if len(control) > 4 else ""
            above, below = (max(control) + 1, hi), (lo, min(control))
            instead = next((f", e.g. {a}:{b}" for a, b in (above, below) if a < b), "")
            raise ValueError(f"--vocab {vocab}: holds the chat's control tokens ({names}{more}); give a LO:HI "
                             f"without them{instead}")  # fmt: skip
        gap = span("--filler", filler)
        if not 0 <= gap[0] <= gap[1]:
            raise ValueError(f"--filler must be LO:HI with 0 <= LO <= HI, got {filler!r}")
        if lookback is not None and lookback < LOOKBACK_SPAN[1]:
            raise ValueError(
                f"--lookback {lookback}: give {LOOKBACK_SPAN[1]} or more, room for the longest span copied"
            )
        if lookback is not None:
            rows = lookback_sequences(n, (lo, hi), seed, context=lookback, pool=pool)
        else:
            rows = copy_sequences(n, (lo, hi), seed, repeats=repeats, filler=gap)
        opening = system_opening(model) if behind_system else []
        with sigterm_interrupts(received), _written(out_file) as f:
            for row in rows:
                row = {"ids": opening + row["ids"], "loss_mask": [0] * len(opening) + row["loss_mask"]}
                f.write(json.dumps(row) + "\n")
    except ValueError as e:
        fail(str(e))
    except KeyboardInterrupt:
        raise stopped_by_signal(received, f"nothing was written to {out_file}; run the command again") from None
    _say_written(out_file, n, "sequences", as_json)


@sft_app.command("drills")
def sft_drills(
    data: Annotated[list[Path], typer.Option("--data", help="Episode JSONL file(s) with ids and loss_mask.")],
    out_file: Annotated[Path, typer.Option("--out", help="JSONL file to write.")] = Path("runs/sft/drills.jsonl"),
    window: Annotated[int, typer.Option(min=1, help="Most tokens of context kept before each path.")] = 1024,
    seed: Annotated[int, typer.Option(callback=seed_in_range, help="Seed of the window lengths.")] = 0,
    model: Annotated[str, typer.Option(help="Whose tokenizer wrote the ids: tiny or a checkpoint.")] = "tiny",
    argument: Annotated[
        list[str] | None, typer.Option(help="Tool-call arguments to drill (repeat; default: path).")
    ] = None,
    keep: Annotated[float, typer.Option(help="Share of the drills written (seeded), to size a data mix.")] = 1.0,
    as_json: Annotated[bool, typer.Option("--json", help="Print the count as JSON.")] = False,
) -> None:
    """Path retrieval drills: for each path argument in the episodes, the system turn, the context
    before it and the path, with the loss on the path only (see rl/copying.py)."""
    from vivace.model.checkpoint import load_tokenizer
    from vivace.rl.copying import path_drills
    from vivace.rl.sft_train import jsonl_objects, read_episodes, require_turn_start

    if not 0 < keep <= 1:
        fail(f"--keep must be in (0, 1], got {keep}")
    try:
        _fresh_file(out_file)
        tok = load_tokenizer(model)
        turn_start = require_turn_start(tok, f"{model}: a drill (it keeps its episode's system turn)")
        for p in data:  # checked whole before anything is written
            read_episodes(p, len(tok))
    except ValueError as e:
        fail(str(e))
    sample = random.Random(seed + 1)
    n = 0
    received: list[int] = []
    try:
        with sigterm_interrupts(received), _written(out_file) as w:
            for p in data:
                rows = (row for _, row in jsonl_objects(p))
                for row in path_drills(rows, tok.decode, turn_start, window, seed, tuple(argument or ["path"])):
                    if keep < 1 and sample.random() >= keep:
                        continue
                    w.write(json.dumps(row) + "\n")
                    n += 1
    except KeyboardInterrupt:
        raise stopped_by_signal(received, f"nothing was written to {out_file}; run the command again") from None
    _say_written(out_file, n, "drills", as_json)
    if n == 0:
        err.print(
            f"[yellow]note:[/] the episodes have no {escape('/'.join(argument or ['path']))} argument in a trained span"
        )


@sft_app.command("eval")
def sft_eval(
    data: Annotated[list[Path], typer.Option("--data", help="Held-out episodes (JSONL; repeat for several).")],
    model: Annotated[list[str], typer.Option("--model", help="tiny or a checkpoint directory (repeat for several).")],
    seq_len: Annotated[int, typer.Option(min=1, help="Tokens per packed row.")] = 16384,
    threads: Annotated[int | None, typer.Option(min=1, help="CPU threads for torch (default: torch's choice).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per (model, file).")] = False,
) -> None:
    """Teacher-forced numbers of saved policies on held-out episodes, without training: loss, token
    accuracy, and per tool argument (path, old_string, new_string) how often its first token and its
    whole value are the greedy choice — the numbers `sft train --eval` logs."""
    from rich.table import Table

    from vivace.model.checkpoint import load_tokenizer
    from vivace.rl.sft_train import check_files, evaluate_checkpoint, read_episodes

    try:  # checked before any model loads: a typo or a bad line in the last file or model wastes no evaluation
        check_files(data)
        _same_tokenizer(model)
        vocab = len(load_tokenizer(model[0]))
        for d in data:
            read_episodes(d, vocab)
    except ValueError as e:
        fail(str(e))
    table = Table(
        "model",
        "data",
        "episodes",
        "loss",
        "token acc",
        "path",
        "old_string",
        "new_string",
        title="first token right / whole value right (teacher-forced, greedy)",
    )
    pairs = [(m, d) for m in model for d in data]
    received: list[int] = []
    finished = 0
    try:
        with sigterm_interrupts(received):
            for i, (m, d) in enumerate(pairs, 1):
                t0 = time.monotonic()
                err.print(f"[{i}/{len(pairs)}] evaluating {m} on {d}...", markup=False, highlight=False)
                try:
                    r = evaluate_checkpoint(m, d, seq_len, threads)
                except (ValueError, FileNotFoundError) as e:
                    if finished and not as_json:  # the numbers already measured are not thrown away
                        out.print(table)
                    fail(str(e))
                err.print(f"[{i}/{len(pairs)}] done in {time.monotonic() - t0:.0f} s", markup=False, highlight=False)
                finished = i
                if as_json:
                    print(json.dumps(r), flush=True)
                    continue
                probes = [f"{r[f'eval_first_{a}']:.2f} / {r[f'eval_exact_{a}']:.2f}" if f"eval_first_{a}" in r
                          else "-" for a in ("path", "old_string", "new_string")]  # fmt: skip
                left_out = r["read"] - r["episodes"]
                if left_out:  # a model with a shorter context scores a smaller subset: said, not hidden
                    err.print(f"note: {left_out} of {r['read']} episodes of {d} left out ({r['too_long']} longer "
                              f"than the context or --seq-len, {r['untrained']} with no trained token)",
                              markup=False, highlight=False)  # fmt: skip
                shown = f"{r['episodes']} of {r['read']}" if left_out else str(r["episodes"])
                table.add_row(Path(m).name, d.name, shown, f"{r['eval_loss']:.3f}",
                              f"{r['eval_token_acc']:.3f}", *probes)  # fmt: skip
    except KeyboardInterrupt:
        if finished and not as_json:  # the numbers already measured are not thrown away
            out.print(table)
        shown = "printed above" if finished else "none"
        raise stopped_by_signal(received, f"{finished} of {len(pairs)} evaluations finished ({shown})") from None
    if not as_json:
        out.print(table)


def _same_tokenizer(models: list[str]) -> None:
    """ValueError unless every model reads token ids with the same vocabulary: an episode file's ids
    are text in the tokenizer that rendered them, so models with another one would score other text."""
    from vivace.model.checkpoint import load_tokenizer
    from vivace.model.spec import require_model

    for m in models:
        require_model(m)
    vocabs = {m: load_tokenizer(m).get_vocab() for m in dict.fromkeys(models)}
    first, *rest = vocabs
    if other := next((m for m in rest if vocabs[m] != vocabs[first]), None):
        raise ValueError(f"--model {first} and --model {other} have different tokenizers, so the episodes' token "
                         "ids mean different text to each; evaluate them in separate runs, each on episodes "
                         "rendered with its own tokenizer (`vivace sft data --model`)")  # fmt: skip


@sft_app.command("ship")
def sft_ship(
    checkpoint: Annotated[
        Path, typer.Argument(help="The trained checkpoint directory (e.g. the warm start's last stage).")
    ],
    recipe: Annotated[
        str | None, typer.Option(help="How it was made, in words (a script and its arguments), for warm_start.json.")
    ] = None,
    allow_unfinished: Annotated[
        bool, typer.Option(help="Ship a checkpoint whose `sft train` run was stopped before its budget.")
    ] = False,
    dest: Annotated[
        Path | None, typer.Option(help="Where to write it (default: the package's tiny, what --model tiny loads).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the record as JSON.")] = False,
) -> None:
    """Make a checkpoint the shipped `tiny` policy: weights rounded to bf16 into
    vivace/model/assets/tiny (what `--model tiny` loads), with warm_start.json recording its source,
    its training summary and the record of the checkpoint it replaces."""
    from vivace.model.checkpoint import TINY_DIR, ship_checkpoint

    dest = dest or TINY_DIR
    if not (checkpoint / "config.json").is_file():
        fail(f"{checkpoint} is not a checkpoint (no config.json); train one with `vivace sft train`")
    try:
        record = ship_checkpoint(checkpoint, dest, allow_unfinished=allow_unfinished, recipe=recipe)
    except ValueError as e:  # weights that cannot be loaded, a run stopped short: the shipped assets are as they were
        fail(str(e))
    except OSError as e:  # a read-only install, a full disk
        fail(f"cannot write {e.filename or dest}: {e.strerror or e}; {dest} is left as it was. Ship into a checkout "
             "you can write (an editable install), or give --dest", 1)  # fmt: skip
    record.pop("sft_summary", None)
    record["dest"] = str(dest)
    print(json.dumps(record)) if as_json else out.print_json(json.dumps(record))


FRESH_LR, CONTINUE_LR = 2e-3, 1e-4  # `sft train`'s default peak rates: an untrained model, trained weights


@sft_app.command("train")
def sft_train(
    data: Annotated[
        list[str], typer.Option("--data", help="Episode JSONL file(s): repeat, or separate with commas.")
    ] = ("runs/sft/expert.jsonl",),
    out_dir: Annotated[Path, typer.Option("--out", help="Checkpoint directory (with train_log.jsonl).")] = Path(
        "runs/sft/model"
    ),
    init: Annotated[
        str,
        typer.Option(help="Starting weights: tiny (the shipped warm start), tiny-init (untrained) or a checkpoint."),
    ] = "tiny",
    eval_file: Annotated[Path | None, typer.Option("--eval", help="Held-out episodes (JSONL) for eval lines.")] = None,
    seq_len: Annotated[
        int,
        typer.Option(
            min=1, help="Tokens per packed row (default: the tiny model's context); longer episodes are skipped."
        ),
    ] = 8192,
    batch_tokens: Annotated[int, typer.Option(min=1, help="Tokens per optimizer step (rows accumulate).")] = 16384,
    lr: Annotated[
        float | None,
        typer.Option(
            help="Peak learning rate (cosine to --min-lr-ratio of it; default: 2e-3 for a fresh model, --init "
            "tiny-init, and 1e-4 to continue trained weights)."
        ),
    ] = None,
    min_lr_ratio: Annotated[
        float, typer.Option(min=0.0, max=1.0, help="Where the cosine ends, as a share of --lr (1: constant).")
    ] = 0.1,
    warmup_steps: Annotated[
        int, typer.Option(min=0, help="Linear warmup steps (at most a quarter of planned steps).")
    ] = 20,
    steps: Annotated[int | None, typer.Option(min=1, help="Stop after this many steps.")] = None,
    epochs: Annotated[float | None, typer.Option(help="Stop after this many passes (default 1 if no budget).")] = None,
    minutes: Annotated[float | None, typer.Option(help="Stop before this much wall time.")] = None,
    eval_every: Annotated[int, typer.Option(min=0, help="Eval every N steps (and at the end; 0: at the end).")] = 50,
    save_every: Annotated[
        int, typer.Option(min=0, help="Save the checkpoint every N steps (and at the end; 0: at the end).")
    ] = 200,
    seed: Annotated[int, typer.Option(callback=seed_in_range, help="Seed of the packing and the episode order.")] = 0,
    threads: Annotated[int | None, typer.Option(min=1, help="CPU threads for torch (default: torch's choice).")] = None,
    device: Annotated[str, typer.Option(help="auto (the GPU if torch sees one), cpu, cuda or cuda:N.")] = "auto",
    objective: Annotated[
        str,
        typer.Option(
            help="assistant: the assistant tokens (RL's mask); dialogue: every token after the system turn; "
            "paths: only the path values of the tool calls (the eval keeps the assistant mask)."
        ),
    ] = "assistant",
    embedding_rows: Annotated[
        Path | None,
        typer.Option(
            help="Train only these rows of the token embedding (a JSON list of token ids), nothing else: "
            "the first stage of the copy repair (scripts/repair_copy.sh)."
        ),
    ] = None,
    freeze_embedding: Annotated[
        bool, typer.Option(help="Train everything but the token embedding: the copy repair's second stage.")
    ] = False,
    arch: Annotated[
        str | None,
        typer.Option(
            help="A fresh model of another size (with --init tiny-init): the tiny preset's config with these "
            "fields changed, e.g. hidden_size=384,num_hidden_layers=6,num_attention_heads=6,head_dim=64. With a "
            "checkpoint as --init, only num_hidden_layers=N: the checkpoint deepened by identity layers."
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")] = False,
) -> None:
    """Train the policy on expert episodes: cross-entropy on the assistant tokens (loss_mask 1),
    packed rows, AdamW with warmup and cosine decay; writes a standard checkpoint to --out (a new or
    empty directory). Ctrl-C or SIGTERM stops at once, drops the step in flight and saves the weights of
    the last whole step (exit 130/143); a run does not resume, but the next one can start from its
    checkpoint (--init OUT)."""
    files = [Path(f.strip()) for d in data for f in d.split(",") if f.strip()]
    if lr is None:  # the from-scratch rate on the shipped warm start sent its loss from 1.43 to 8.28 in two steps
        lr = FRESH_LR if init == "tiny-init" else CONTINUE_LR
    for name, value in (("--lr", lr), ("--epochs", epochs), ("--minutes", minutes)):
        if value is not None and not (math.isfinite(value) and value > 0):  # inf trained NaN weights; NaN passed
            fail(f"{name} {value:g}: give a finite number above 0")
    check_writable(out_dir, directory=True)
    lock = _OutLock(out_dir)  # before the check: a second run must not clear what the first is writing
    try:
        _check_fresh_run_dir(out_dir)
        # after the refusals above, which need no torch: they answer in under a second, not after its import
        from vivace.model.checkpoint import parse_arch
        from vivace.rl.sft_train import SftDiverged, train_sft

        try:
            overrides = parse_arch(arch) if arch else None
        except ValueError as e:
            fail(f"--arch: {e}")
        rows = None
        if embedding_rows is not None:
            try:
                rows = json.loads(embedding_rows.read_text())
            except (OSError, ValueError) as e:  # unreadable, not UTF-8, not JSON
                fail(f"--embedding-rows {embedding_rows}: {e}")
            if not isinstance(rows, list) or not all(type(i) is int for i in rows):
                fail(f"--embedding-rows {embedding_rows}: expected a JSON list of token ids")
    except BaseException:  # a refusal: the lock is let go at once (a process that goes on, as in tests)
        lock.release()
        raise
    columns = (TextColumn("sft step"), MofNCompleteColumn(), BarColumn(),
               TextColumn("loss {task.fields[loss]}  {task.fields[tok_s]} tok/s  {task.fields[eval]}"), TimeElapsedColumn())  # fmt: skip
    received: list[int] = []  # SIGTERM (a scheduler's limit) stops and saves as Ctrl-C does, then exits 143
    try:
        with lock, LoggedProgress(*columns) as bar, sigterm_interrupts(received):
            job = bar.add_task("sft", total=steps, loss="-", tok_s="-", eval="")

            def show(line: dict) -> None:
                if "eval_loss" in line:
                    probes = "".join(f" {a} {line[f'eval_first_{a}']:.2f}/{line[f'eval_exact_{a}']:.2f}"
                                     for a in ("path", "old_string", "new_string") if f"eval_first_{a}" in line)  # fmt: skip
                    bar.update(job, eval=f"eval {line['eval_loss']:.3f} acc {line['eval_token_acc']:.3f}{probes}")
                else:
                    bar.update(job, completed=line["step"], total=line["planned_steps"], loss=f"{line['loss']:.4f}",
                               tok_s=f"{line['tok_s']:.0f}")  # fmt: skip

            result = train_sft(files, out_dir, init=init, eval_data=eval_file, seq_len=seq_len,
                               batch_tokens=batch_tokens, lr=lr, min_lr_ratio=min_lr_ratio, warmup_steps=warmup_steps, max_steps=steps, epochs=epochs,
                               time_budget_s=minutes * 60 if minutes is not None else None, eval_every=eval_every,
                               save_every=save_every, seed=seed, threads=threads, device=device,
                               objective=objective, config_overrides=overrides, embedding_rows=rows,
                               freeze_embedding=freeze_embedding, progress=show)  # fmt: skip
    except SftDiverged as e:
        fail(str(e), 1)
    except ValueError as e:
        fail(str(e))
    except KeyboardInterrupt:  # before the first step, or a second signal during the last save
        raise stopped_by_signal(received, _last_save(out_dir)) from None
    except OSError as e:  # a disk that filled, a mount gone read-only: the last save is whole
        fail(f"{e.filename or out_dir}: {e.strerror or e}; {_last_save(out_dir)}", 1)
    if result["counts"]["too_long"]:
        err.print(f"[yellow]note:[/] {result['counts']['too_long']} episode(s) longer than --seq-len {seq_len} "
                  "were skipped")  # fmt: skip
    if result["counts"]["untrained"]:
        err.print(f"[yellow]note:[/] {result['counts']['untrained']} episode(s) with no trained token (an all-0 "
                  "loss_mask, or none left by --objective) were skipped")  # fmt: skip
    if as_json:
        print(json.dumps(result))
    else:
        out.print_json(json.dumps(result))
    if result["stopped_by"] == "interrupted":
        raise stopped_by_signal(received, f"after step {result['step']}{f' of {steps}' if steps else ''}, the "
                                f"checkpoint so far is in {out_dir}; to train on from it, give --init {out_dir}, "
                                f"--lr {lr:g} (a checkpoint's default is {CONTINUE_LR:g}) and a new --out (the "
                                "optimizer state is not saved)")  # fmt: skip


# What `sft train` writes in --out before its first save: a run that failed or was killed before it (a
# diverged first step, a kill) leaves only these, and no model to keep or train on.
_BEFORE_FIRST_SAVE = {".saving", "train_log.jsonl", "sft_summary.json"}


class _OutLock:
    """An exclusive flock on the `sft train --out` directory itself, held for the run: two runs into one
    --out at once interleaved their train_log.jsonl and saved over each other (the weights left could be
    either run's). No file is left for it; a directory made for it and still empty when it is let go (a
    refusal) is removed, as if the command had never run."""

    def __init__(self, out_dir: Path):
        self.dir, self.made = out_dir, not out_dir.exists()
        out_dir.mkdir(parents=True, exist_ok=True)
        self.fd = os.open(out_dir, os.O_RDONLY | os.O_DIRECTORY)
        if not try_lock(self.fd):
            os.close(self.fd)
            fail(f"--out {out_dir} is in use by another `vivace sft train`; wait for it to end, or give another --out")

    def release(self) -> None:
        if self.made:
            with contextlib.suppress(OSError):  # not empty: what the run wrote stays
                self.dir.rmdir()
        os.close(self.fd)

    def __enter__(self) -> _OutLock:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def _check_fresh_run_dir(out_dir: Path) -> None:
    """Exit 2 unless `sft train --out` is new or empty. What a run stopped before its first save left (its
    log, a first save cut short in OUT/.saving) is removed, with a note: the rerun its own message advises
    must not be refused. A directory with a model is pointed at --init."""
    if out_dir.is_dir() and not (out_dir / "config.json").is_file():
        entries = list(out_dir.iterdir())
        # By kind too: a directory the user named train_log.jsonl is not a leftover to unlink.
        left = [p for p in entries if p.name in _BEFORE_FIRST_SAVE and p.is_dir() == (p.name == ".saving")]
        if entries and len(left) == len(entries):
            for p in left:
                shutil.rmtree(p) if p.is_dir() else p.unlink()
            err.print(f"[yellow]note:[/] removed what a run stopped before its first save left in "
                      f"{escape(str(out_dir))} ({', '.join(sorted(p.name for p in left))})")  # fmt: skip
    if not out_dir.is_dir() or not any(out_dir.iterdir()):
        return
    if (out_dir / "config.json").is_file():
        fail(f"--out {out_dir} already holds a run; give a new or empty directory. `sft train` does not resume: to "
             f"train on from that checkpoint, give --init {out_dir} and a new --out")  # fmt: skip
    fail(f"--out {out_dir} holds files but no model (a run stopped before its first save, or other files); give a "
         "new or empty directory, or delete that one")  # fmt: skip


def _last_save(out_dir: Path) -> str:
    """Where a stopped or failed `sft train` left its weights, in words."""
    if (out_dir / "model.safetensors").is_file():
        return f"the last save (every --save-every steps) is in {out_dir}"
    return "nothing was saved"
