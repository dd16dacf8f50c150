"""What a model spec names (`tiny`, `tiny-init` or a checkpoint directory), found without importing torch
or transformers, so that a command refuses a wrong `--model` in a moment rather than after seconds of
imports (checkpoint.py, which loads the model, re-exports these)."""

from __future__ import annotations

import json
from pathlib import Path

ASSETS = Path(__file__).parent / "assets"
TINY_DIR = ASSETS / "tiny"
TINY_INIT = "tiny-init"  # the seeded, untrained tiny model: where the warm start begins
TINY_NAMES = ("tiny", TINY_INIT)  # the specs with the tiny preset's architecture (no checkpoint path)


def initialised(spec: str) -> bool:
    """Whether `spec` names a freshly initialised model rather than a checkpoint: `tiny-init`, or `tiny`
    where no trained checkpoint is shipped. ValueError where `vivace sft ship` was cut short."""
    if spec == TINY_INIT:
        return True
    if spec != "tiny" or (TINY_DIR / "config.json").is_file():
        return False
    for left in (TINY_DIR.with_name("tiny.old"), TINY_DIR.with_name("tiny.new")):
        if (left / "config.json").is_file():  # the untrained model in its place would pass for it
            raise ValueError(f"the shipped tiny checkpoint is missing and {left} holds one: `vivace sft ship` was "
                             f"cut short; move {left} to {TINY_DIR}, or ship again")  # fmt: skip
    return True


def missing_checkpoint(spec: str) -> str | None:
    """The error for a `spec` that reads as a path (it holds a '/' or starts with '.' or '~') where nothing
    is: "SPEC: no such checkpoint directory; …"; None otherwise (a bare name is the caller's to answer with
    the forms it accepts)."""
    if not ("/" in spec or spec.startswith((".", "~"))) or Path(spec).expanduser().exists():
        return None
    return (f"{spec}: no such checkpoint directory; give a directory as `vivace sft train` or any Hugging Face "
            "model saves it")  # fmt: skip


def model_dir(spec: str) -> Path:
    """The checkpoint directory `spec` names (`tiny`: the shipped one); ValueError if it holds no model."""
    path = TINY_DIR if spec == "tiny" else Path(spec).expanduser()
    if spec != "tiny" and (missing := missing_checkpoint(spec)):
        raise ValueError(missing)
    if not (path / "config.json").is_file() or _train_run_policy(path):
        raise ValueError(
            f"{spec!r} is not a model: expected `tiny` or a checkpoint directory with config.json "
            "(as written by save_checkpoint or any Hugging Face model)" + _policy_hint(path)
        )
    return path


def _policy_hint(path: Path) -> str:
    """Where the policy is, when `path` is a `vivace train` run or one of its checkpoints ("" otherwise)."""
    if (path / "model" / "config.json").is_file():
        return f"; {path} is a `vivace train` checkpoint: its policy is {path / 'model'}"
    if policy := _train_run_policy(path):
        return f"; {path} is a `vivace train` run: its latest policy is {policy}"
    return ""


def _train_run_policy(path: Path) -> Path | None:
    """The newest checkpoint's policy of `vivace train` run directory `path` (whose config.json is the run's
    configuration, not a model's); None if `path` is not such a run or has no checkpoint with a policy."""
    steps = [p for p in path.glob("checkpoints/step_*/model") if p.parent.name[5:].isdecimal()]
    if not steps or not (path / "config.json").is_file():
        return None
    try:
        if "model_type" in json.loads((path / "config.json").read_text()):
            return None  # a model after all, that happens to keep checkpoints beside it
    except (OSError, ValueError):
        pass
    return max(steps, key=lambda p: int(p.parent.name[5:]))


def require_model(spec: str) -> None:
    """ValueError (model_dir's) unless `spec` names a model: a tiny name, or a checkpoint directory."""
    if spec not in TINY_NAMES:
        model_dir(spec)
