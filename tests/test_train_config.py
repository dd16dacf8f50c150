"""`vivace train`'s up-front checks: a configuration that can never train is refused before the run
directory and Ray (exit 2, one line naming the setting); one that is legal but likely useless trains
with a warning printed once at the start. Validation only: no run starts here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from vivace.cli import app
from vivace.config import PRESETS, load_config, load_preset

STARTED = 99  # the exit code of a run that got past the checks (the run itself is not started here)


@pytest.fixture(autouse=True)
def _no_run(monkeypatch):
    """The run itself (Ray, rollouts) is replaced: a configuration that passes the checks exits STARTED."""
    import typer

    import vivace.cli_train as cli_train

    def started(*args, **kwargs):
        raise typer.Exit(STARTED)

    monkeypatch.setattr(cli_train, "_train_locked", started)


def _train(tmp_path: Path, sections: dict, *args: str) -> tuple[int, str]:
    """`vivace train --preset smoke` with `sections` merged over it; (exit code, output on one line)."""
    sections = {**sections, "train": {**sections.get("train", {}), "runs_dir": str(tmp_path / "runs")}}
    config = tmp_path / "config.json"
    config.write_text(json.dumps(sections))
    result = CliRunner().invoke(app, ["train", "--preset", "smoke", "--config", str(config), "--name", "r", *args])
    return result.exit_code, " ".join(result.output.split())


def _refused(tmp_path: Path, sections: dict, *args: str) -> str:
    code, said = _train(tmp_path, sections, *args)
    assert code == 2, said  # not STARTED
    assert not (tmp_path / "runs").exists(), "refused after the run directory was made"
    return said


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_presets_validate_and_pass_the_checks(name):
    from vivace.cli_train import check_train_config
    from vivace.rl.controller import training_tasks

    cfg = load_preset(name)
    assert check_train_config(cfg, training_tasks(cfg)) == []  # no refusal, no warning for a shipped preset


def test_steps_0_on_the_command_line_is_one_line(tmp_path):
    said = _refused(tmp_path, {}, "--steps", "0")
    assert "--steps 0: a run needs at least 1 step" in said
    assert "validation error" not in said and "pydantic" not in said


def test_a_model_directory_without_weights_is_refused_up_front(tmp_path):
    from vivace.model.checkpoint import TINY_DIR

    model = tmp_path / "model"
    model.mkdir()
    for f in TINY_DIR.iterdir():  # config and tokenizer, no weights
        if not f.name.endswith((".safetensors", ".bin")):
            (model / f.name).write_bytes(f.read_bytes())
    said = _refused(tmp_path, {"train": {"model": str(model)}})
    assert f"train.model: {model} has a config but no weights" in said


def test_an_unknown_model_names_the_setting(tmp_path):
    said = _refused(tmp_path, {"train": {"model": "gpt-4"}})
    assert "train.model: 'gpt-4' has no tokenizer" in said


def test_all_zero_score_weights_are_refused(tmp_path):
    zero = {k: 0 for k in ("correctness", "adherence", "efficiency", "claims", "format")}
    said = _refused(tmp_path, {"score": zero})
    assert "score: every weight is 0" in said and "score.correctness" in said


def test_zero_score_weights_with_a_milestone_still_train():
    from vivace.cli_train import check_train_config
    from vivace.rl.controller import training_tasks

    cfg = load_preset("smoke", score={k: 0 for k in ("correctness", "adherence", "efficiency", "claims", "format")},
                      train={"milestone_edit": 0.5})  # fmt: skip
    check_train_config(cfg, training_tasks(cfg))  # the milestone still makes rewards differ


def test_an_unknown_eval_baseline_is_refused_before_training(tmp_path):
    said = _refused(tmp_path, {"train": {"eval_tasks": 1, "eval_baselines": ["scripted:oracle", "nosuch:policy"]}})
    assert "train.eval_baselines: unknown policy spec 'nosuch:policy'" in said


def test_a_missing_replay_baseline_is_refused(tmp_path):
    said = _refused(tmp_path, {"train": {"eval_tasks": 1, "eval_baselines": [f"scripted:replay:{tmp_path}/no.json"]}})
    assert "train.eval_baselines:" in said


def _warnings(**sections) -> list[str]:
    from vivace.cli_train import check_train_config
    from vivace.rl.controller import training_tasks

    cfg = load_preset("smoke", **sections)
    return check_train_config(cfg, training_tasks(cfg))


@pytest.mark.parametrize("engine", [{"temperature": 0}, {"top_k": 1}])
def test_greedy_rollouts_warn(engine):
    (said,) = _warnings(engine=engine)
    assert "rollouts are greedy" in said and "train nothing" in said


def test_max_tokens_below_the_system_turn_warns():
    (said,) = _warnings(agent={"max_tokens": 1024})
    assert said.startswith("agent.max_tokens 1024 is not above the") and "first turn" in said


def test_max_turn_tokens_beyond_the_context_warns():
    (said,) = _warnings(agent={"max_turn_tokens": 100_000})
    assert said.startswith("agent.max_turn_tokens 100000 is not below the model's context (8192 tokens)")


def test_async_without_staleness_warns():
    (said,) = _warnings(train={"pipeline": "async", "max_staleness": 0})
    assert "runs as sync" in said
    assert _warnings(train={"pipeline": "async", "max_staleness": 1}) == []


def test_more_tasks_per_step_than_tasks_warns():
    (said,) = _warnings(train={"tasks_per_step": 3, "task_ids": ["inventory-feature-1"]})
    assert said == "train.tasks_per_step 3 is more than the 1 training task: a step rolls out some tasks more than once"


def test_warnings_are_printed_once_before_the_run(tmp_path):
    """The CLI prints them (yellow `warning:` lines) after the checks, before the run starts."""
    code, said = _train(tmp_path, {"engine": {"temperature": 0}})
    assert code == STARTED and said.count("warning: engine.temperature is 0: rollouts are greedy") == 1


def test_a_run_that_trained_nothing_says_why(tmp_path):
    from vivace.cli_train import _nothing_trained

    rows = [{"step": s, "groups": 2, "groups_zero_variance": 2, "samples": 0} for s in (1, 2)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    said = _nothing_trained(tmp_path, 2)
    assert said.startswith("no step trained anything (4 groups over 2 steps: groups_zero_variance 4)")


def test_config_file_errors_keep_their_style(tmp_path):
    """Field constraints already refuse these, naming the file and the setting (unchanged)."""
    for sections, where in [({"train": {"group_size": 1}}, "train.group_size"), ({"train": {"lr": 0}}, "train.lr"),
                            ({"agent": {"max_turns": 0}}, "agent.max_turns")]:  # fmt: skip
        f = tmp_path / "c.json"
        f.write_text(json.dumps(sections))
        with pytest.raises(ValueError, match=rf"^{f}: {where}: .*`vivace config show` lists every setting"):
            load_config("smoke", f)
