"""A run directory in the states users leave it in: a hand-edited metrics row, a kill between a step's
row and its checkpoint, a damaged checkpoint state, a second report started on a run, a --name that
leaves train.runs_dir, a seed torch cannot take. Each is refused with one line naming the problem, before
anything expensive, or reported as what it is (found by probing `vivace train` and `train report`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from test_report_numbers import TASKS, _row
from vivace.cli import app
from vivace.config import load_preset
from vivace.rl.controller import StartFailed, _resume_state, _truncate_metrics, write_summary
from vivace.rl.evaluate import build_report, markdown_report
from vivace.rl.runs import checkpoint_step, claim_run_dir, lock_run, metrics_rows, run_path


def _rows(*steps: object) -> str:
    return "".join(json.dumps({"step": s, "reward_mean": 0.1, "rollouts": 2, "step_s": 1.0}) + "\n" for s in steps)


def _run(tmp_path: Path, metrics: str, checkpoint: int = 1) -> Path:
    """A run directory as `vivace train` leaves it: config.json, metrics.jsonl, a complete checkpoint."""
    cfg = load_preset("smoke")
    cfg.train.runs_dir = tmp_path
    run, lock = claim_run_dir(run_path(cfg, "r"), cfg, unnamed=False)
    lock.close()
    (run / "metrics.jsonl").write_text(metrics)
    model = run / "checkpoints" / f"step_{checkpoint}" / "model"
    model.mkdir(parents=True)
    (model / "config.json").write_text("{}")
    (model.parent / "state.json").write_text(json.dumps({"step": checkpoint}))
    return run


@pytest.mark.parametrize("bad", ['{"note": "added by hand"}', '{"step": "2"}', '{"step": true}', '{"step": 0}'])
def test_a_metrics_row_without_a_step_number_is_named_by_file_and_line(tmp_path, bad):
    """A row with no integer step was a KeyError (or a TypeError comparing "2" with 1) in a resume, and in
    a report only after the whole evaluation."""
    f = tmp_path / "metrics.jsonl"
    f.write_text(_rows(1) + bad + "\n" + _rows(3))
    with pytest.raises(ValueError, match=r"metrics.jsonl:2: not a metrics row \(no step number"):
        metrics_rows(f)
    with pytest.raises(ValueError, match="metrics.jsonl:2"):
        _truncate_metrics(tmp_path, 1)  # the resume turns it into "cannot resume: ...; remove or mend that line"
    assert metrics_rows(tmp_path / "none.jsonl") == []


def test_the_report_leaves_out_steps_the_evaluated_checkpoint_never_saw(tmp_path):
    """Killed after step 3's row but before its checkpoint: the report evaluated step 2 and said
    "training: 3 steps", with step 3 in its curves."""
    run = _run(tmp_path, _rows(1, 2, 3), checkpoint=2)
    after = str(run / "checkpoints" / "step_2" / "model")
    assert checkpoint_step(Path(after)) == 2 and checkpoint_step(run) is None
    out = run / "eval"
    out.mkdir()
    rows = [_row(out, m, t, 0, False) for m in ("b", after) for t in TASKS]
    report = build_report(run, {"before": "b", "after": after}, TASKS, rows, out, 1.0)
    report |= {"shift": {"divergence": None, "kl": None}, "samples": 1, "once": []}
    assert [c["step"] for c in report["curves"]] == [1, 2] and report["training"]["steps"] == 2
    assert report["training"]["steps_after_checkpoint"] == 1 and report["training"]["last"]["step"] == 2
    assert "training: 2 steps (the checkpoint evaluated; 1 later step, killed before its checkpoint" in (
        markdown_report(report)
    )


def test_a_report_is_refused_while_the_run_or_another_report_holds_it(tmp_path):
    """A second `train report` on one run cleared RUN/eval/ under the first one's episodes (the first then
    died with a FileNotFoundError); a report during the run itself would do the same."""
    run = _run(tmp_path, _rows(1))
    with lock_run(run):
        result = CliRunner().invoke(app, ["train", "report", str(run), "--backend", "plain"])
    assert result.exit_code == 2 and "in use by another `vivace train` or `vivace train report`" in " ".join(
        result.output.split()
    )
    assert not (run / "eval").exists()


def test_a_report_with_a_damaged_metrics_row_is_refused_before_any_episode(tmp_path):
    run = _run(tmp_path, _rows(1) + "garbage\n" + _rows(2))
    result = CliRunner().invoke(app, ["train", "report", str(run), "--backend", "plain"])
    said = " ".join(result.output.split())
    assert result.exit_code == 2 and "metrics.jsonl:2: not a metrics row" in said, said
    assert not (run / "eval").exists()


@pytest.mark.parametrize(
    "state",
    [
        {"step": 2, "data_position": "x"},
        {"step": 2, "pending": [1, "a"]},
        {"step": 2, "order": [1]},
        {"step": 2, "data_position": -1},
        {"step": True},
    ],  # fmt: skip
)
def test_a_damaged_checkpoint_state_is_refused_before_the_run_starts(tmp_path, state):
    """`data_position: "x"` surfaced as "the rollout pipeline failed: can only concatenate str (not "int")
    to str", from inside the pipeline after the workers had started."""
    (tmp_path / "state.json").write_text(json.dumps(state))
    torch.save({"torch": torch.get_rng_state()}, tmp_path / "rng.pt")
    with pytest.raises(StartFailed, match="cannot resume from this checkpoint .* move it out of checkpoints/"):
        _resume_state(tmp_path)


def test_a_sound_checkpoint_state_resumes(tmp_path):
    state = {"step": 2, "data_position": 8, "pending": [6, 7], "order": {"fresh": 8}}
    (tmp_path / "state.json").write_text(json.dumps(state))
    torch.save({"torch": torch.get_rng_state()}, tmp_path / "rng.pt")
    assert _resume_state(tmp_path) == state


@pytest.mark.parametrize("name", ["..", ".", "a/../..", "/tmp/elsewhere", "./."])
def test_a_run_name_that_leaves_the_runs_directory_is_refused(tmp_path, name):
    """`--name ..` put the run in the working directory, replacing a config.json of the user's own."""
    cfg = load_preset("smoke")
    cfg.train.runs_dir = tmp_path / "runs"
    with pytest.raises(ValueError, match="give a name for a directory under train.runs_dir"):
        run_path(cfg, name)
    assert run_path(cfg, "group/exp1") == (tmp_path / "runs" / "group" / "exp1").resolve()  # a subdirectory is fine


def test_a_run_is_not_written_into_a_directory_of_other_files_or_over_a_file(tmp_path):
    cfg = load_preset("smoke")
    cfg.train.runs_dir = tmp_path
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep")
    with pytest.raises(FileExistsError, match="holds other files, not a run"):
        run_path(cfg, "mine")
    (tmp_path / "afile").write_text("")
    with pytest.raises(FileExistsError, match="is a file, not a run directory; pick another --name") as e:
        claim_run_dir(tmp_path / "afile", cfg, unnamed=False)
    assert "Errno" not in str(e.value)
    here, lock = claim_run_dir(tmp_path / "afile", cfg, unnamed=True)  # an unnamed run takes the next name
    lock.close()
    assert here.name == "afile-2"
    # A run that died before its first step (config.json and the lock only) may be started again by name.
    again, lock = claim_run_dir(here, cfg, unnamed=False)
    lock.close()
    assert again == here


@pytest.mark.parametrize("seed", ["99999999999999999999999", str(-(2**63) - 1)])
def test_a_seed_torch_cannot_take_is_refused_before_the_run_directory(tmp_path, seed):
    """--seed past 64 bits gave "Overflow when unpacking long long" from torch.manual_seed, after the run
    directory had been made."""
    config = tmp_path / "c.json"
    config.write_text(json.dumps({"train": {"runs_dir": str(tmp_path / "runs")}}))
    result = CliRunner().invoke(app, ["train", "--preset", "smoke", "--config", str(config), "--seed", seed])
    said = " ".join(result.output.split())
    assert result.exit_code == 2 and "does not fit in 64 bits" in said, said
    assert not (tmp_path / "runs").exists()
    with pytest.raises(ValueError, match="less than or equal"):
        load_preset("smoke").train.seed = 2**63


def test_the_summary_says_which_steps_its_pipeline_counts_cover(tmp_path):
    """After a resume, summary.json's pipeline counts are the resumed process's (4 episodes of an
    8-rollout run), with nothing saying so."""
    (tmp_path / "metrics.jsonl").write_text(_rows(1, 2, 3, 4))
    summary = write_summary(tmp_path, {"episodes_finished": 4}, first_step=3)
    assert summary["rollouts"] == 8 and summary["pipeline_from_step"] == 3
    assert json.loads((tmp_path / "summary.json").read_text())["pipeline_from_step"] == 3
