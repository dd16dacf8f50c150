"""A run's directory on disk: its name, saved configuration, checkpoints and atomic writes.

Nothing here imports torch or the engine, so `vivace train` can refuse a run directory it cannot use
(a name already taken, a --resume of something that is not a run, a run already complete) in about a
second, before the training stack loads. The layout the controller writes is described in
rl/controller.py.
"""

from __future__ import annotations

import itertools
import json
import shutil
import time
from pathlib import Path
from typing import IO, Any

from pydantic import ValidationError

from vivace.bench.results import result_rows
from vivace.config import VivaceConfig, validation_message
from vivace.files import write_atomic
from vivace.locks import Locked, lock_exclusively


def run_path(cfg: VivaceConfig, name: str | None) -> Path:
    """Where a new run named `name` goes (absolute; train-DATE-TIME when None), not made yet; a
    FileExistsError when a run already lives there, a ValueError for a name that would leave
    train.runs_dir (absolute, `..`) or is it."""
    name = name or time.strftime("train-%Y%m%d-%H%M%S")
    parts = Path(name).parts
    if not parts or Path(name).is_absolute() or ".." in parts:  # "." and "./." have no parts
        raise ValueError(f"--name {name!r}: give a name for a directory under train.runs_dir "
                         f"({cfg.train.runs_dir}), e.g. --name exp1; to put runs elsewhere, set train.runs_dir")  # fmt: skip
    return _untaken((cfg.train.runs_dir / name).resolve())  # absolute: actors write into it from their own cwd


def make_run_dir(path: Path, cfg: VivaceConfig) -> Path:
    """The run directory `path` (from `run_path`), made, with the whole configuration saved in it."""
    _untaken(path)  # again: another run may have taken it since
    path.mkdir(parents=True, exist_ok=True)
    write_atomic(path / "config.json", cfg.model_dump_json(indent=2))
    return path


class RunInUse(Exception):
    """Another process holds the run directory's lock."""


def lock_run(run_dir: Path) -> IO[str]:
    """An exclusive lock on RUN/.lock until the returned file is closed or the process ends (vivace.locks):
    two processes writing one run would interleave metrics and checkpoints."""
    try:
        return lock_exclusively(run_dir / ".lock")
    except Locked as e:
        raise RunInUse(f"{run_dir} is in use by another `vivace train` or `vivace train report` (pid {e.holder}); "
                       "wait for it to end, or stop it first") from None  # fmt: skip


def claim_run_dir(path: Path, cfg: VivaceConfig, *, unnamed: bool) -> tuple[Path, IO[str]]:
    """`make_run_dir` for `vivace train`: the directory made and locked BEFORE its configuration is written,
    so a second command naming it is refused without touching the live run's files. An unnamed run
    (train-DATE-TIME) whose name another run took meanwhile (two started in one second) takes the next
    free suffix: -2, -3, ..."""
    for n in itertools.count(1):
        here = path if n == 1 else path.with_name(f"{path.name}-{n}")
        if here.exists() and not here.is_dir():
            if unnamed:
                continue
            raise FileExistsError(f"{here} is a file, not a run directory; pick another --name")
        try:
            here.mkdir(parents=True, exist_ok=True)
        except OSError as e:  # the message alone: str() of OSError(errno, text) starts "[Errno N]"
            raise OSError(f"cannot make the run directory {here} ({e.strerror}); set train.runs_dir "
                          "(--config) to a directory you can write") from None  # fmt: skip
        try:
            lock = lock_run(here)
        except RunInUse:
            if unnamed:
                continue
            raise
        try:
            _untaken(here)
        except FileExistsError:
            lock.close()
            if unnamed:
                continue
            raise
        write_atomic(here / "config.json", cfg.model_dump_json(indent=2))
        return here, lock
    raise AssertionError("unreachable")


def new_run_dir(cfg: VivaceConfig, name: str | None) -> Path:
    return make_run_dir(run_path(cfg, name), cfg)


def _untaken(path: Path) -> Path:
    """`path` when a new run may go there: nothing there yet, or a run that never finished a step (its
    config.json and lock only). A directory of other files is not written into: the run's config.json,
    checkpoints/ and the rest would land beside, or over, someone's own files."""
    if (path / "metrics.jsonl").exists():
        raise FileExistsError(f"{path} already holds a run; resume it with --resume {path} or pick another --name")
    if path.is_dir() and not (path / "config.json").exists() and any(p.name != ".lock" for p in path.iterdir()):
        raise FileExistsError(f"{path} already exists and holds other files, not a run; pick another --name")
    return path


def metrics_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of a run's metrics.jsonl (none before the file exists), each checked to carry its step
    number, so a hand-edited or foreign line is a ValueError naming the file and line before anything
    expensive, not a KeyError inside a resume or after a report's whole evaluation. A last line cut
    short by a kill is left out (bench.results.result_rows); reading errors are the caller's."""
    if not path.is_file():
        return []
    rows = []
    for n, row in result_rows(path, "metrics row"):
        step = row.get("step")
        if type(step) is not int or step < 1:  # bool is an int, and not a step
            raise ValueError(f"{path}:{n}: not a metrics row (no step number: {json.dumps(row)[:80]})")
        rows.append(row)
    return rows


def checkpoint_step(path: Path) -> int | None:
    """The step of a checkpoint directory (RUN/checkpoints/step_N) or of its model/ inside; None for anything else."""
    for p in (path, path.parent):
        step = p.name.removeprefix("step_")
        if p.name.startswith("step_") and step.isdecimal() and p.parent.name == "checkpoints":
            return int(step)
    return None


def load_run_config(run_dir: Path) -> VivaceConfig:
    """The configuration `new_run_dir` saved; a missing or damaged one is a ValueError naming it."""
    path = run_dir / "config.json"
    if not path.exists():
        raise ValueError(f"{run_dir} is not a run directory (no config.json); give one `vivace train` made, "
                         "e.g. runs/NAME")  # fmt: skip
    try:
        text = path.read_bytes().decode("utf-8")
        json.loads(text)  # its syntax first: pydantic's own message for it names no line
        return VivaceConfig.model_validate_json(text)
    except OSError as e:
        problem = f"cannot read it ({e.strerror})"
    except UnicodeDecodeError as e:
        problem = f"not UTF-8 text (byte {e.start})"
    except json.JSONDecodeError as e:
        problem = f"not valid JSON ({e.msg} at line {e.lineno} column {e.colno})"
    except ValidationError as e:
        raise ValueError(f"{path}: {validation_message(e)}") from None
    raise ValueError(f"{path}: {problem}; the run's configuration is damaged: restore the file `vivace train` "
                     "wrote, or start a new run")  # fmt: skip


def checkpoint_dirs(run_dir: Path) -> list[tuple[int, Path]]:
    """(step, directory) of every checkpoint directory, complete or not, oldest first. Names other
    than step_<integer> are not checkpoints this code wrote (a copy, a renamed one) and are left alone."""
    found = []
    for p in (run_dir / "checkpoints").glob("step_*"):
        step = p.name.removeprefix("step_")
        if step.isdecimal() and p.is_dir():
            found.append((int(step), p))
    return sorted(found)


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete checkpoint (one with state.json), or None."""
    complete = [p for _, p in checkpoint_dirs(run_dir) if (p / "state.json").is_file()]
    return complete[-1] if complete else None


def prune_checkpoints(run_dir: Path, keep: int) -> None:
    """Delete all but the newest `keep` complete checkpoints (and unfinished ones older than them)."""
    dirs = checkpoint_dirs(run_dir)
    complete = [step for step, p in dirs if (p / "state.json").is_file()]
    if len(complete) <= keep:
        return
    for step, p in dirs:
        if step < complete[-keep]:
            (p / "state.json").unlink(missing_ok=True)  # first: a kill mid-delete leaves no "complete" husk
            shutil.rmtree(p)
