"""The RL report's numbers against a plain recomputation from the rows and trajectories it is built from,
and the cases where a number was right but its wording or range misled (found by the report audit)."""

from __future__ import annotations

import html
import json
import statistics

import pytest

from vivace.harness.trajectory import ToolRecord, Trajectory, Turn
from vivace.rl.evaluate import build_report, html_report, markdown_report, training_curves
from vivace.tasks.format import RepoSpec, Task, TestSpec


def _task(i: int, family: str, learnable: bool = True) -> Task:
    meta = {"kind": "bug", "split": "test", "family": family, **({} if learnable else {"learnable": False})}
    return Task(id=f"t{i}", repo=RepoSpec(bundled="_blank"), request="fix it",
                tests=TestSpec(command="true", fail_to_pass=["t::a"]), metadata=meta)  # fmt: skip


TASKS = [_task(0, "easy"), _task(1, "easy"), _task(2, "hard", learnable=False)]


def _row(out, model: str, task: Task, sample: int, resolved: bool, calls=(1, 0), error: str | None = None) -> dict:
    """A results row as the runner writes it, with its trajectory: `calls` is the tool calls of each turn."""
    row = {"model": model, "task_id": task.id, "sample": sample, "family": task.family}
    if error:
        return {**row, "error": error, "resolved": False, "total": 0.0}
    turns = [Turn(content="", tool_calls=[ToolRecord(id=f"{i}.{j}", name="read_file", arguments={"path": "a.py"},
                                                     result="x") for j in range(n)]) for i, n in enumerate(calls)]  # fmt: skip
    path = f"trajectories/{model}/{task.id}.{sample}.json"
    (out / path).parent.mkdir(parents=True, exist_ok=True)
    Trajectory(request="r", policy=model, system_prompt="s", system_prompt_version="1", turns=turns,
               stop_reason="done").save(out / path)  # fmt: skip
    tool_turns = sum(1 for n in calls if n)
    details = {"turns": len(calls), "tool_calls": sum(calls), "tool_calls_per_turn": sum(calls) / tool_turns,
               "reference_tokens": 10 * len(calls), "completion_tokens": 0, "unsupported_claims": [],
               "format_errors": 0, "model_s": 1.0, "wall_s": 1.0}  # fmt: skip
    return {**row, "resolved": resolved, "total": 1.0 + resolved, "adherence": 1.0, "trajectory": path,
            "details": details}  # fmt: skip


def _report(tmp_path, rows_of, metrics: str | None = None) -> dict:
    out = tmp_path / "eval"
    out.mkdir(parents=True)
    if metrics is not None:
        (tmp_path / "metrics.jsonl").write_text(metrics)
    report = build_report(tmp_path, {"before": "b", "after": "a"}, TASKS, rows_of(out), out, 1.0)
    return {**report, "shift": {"divergence": None, "kl": None}, "samples": 1, "once": []}


def test_numbers_match_a_plain_recomputation(tmp_path):
    """Turns per solved task over a policy that solved nothing is n/a, not 0; a family no episode of a
    policy ran is n/a in its table; every other number is the plain mean over the episodes."""
    calls = {"t0": (2, 1, 0), "t1": (1, 0), "t2": (3, 3, 1, 0)}

    def rows(out):
        return [_row(out, "b", t, 0, False, calls[t.id]) for t in TASKS] + [
            _row(out, "a", t, 0, t.id != "t1", calls[t.id]) for t in TASKS[:2]]  # fmt: skip

    report = _report(tmp_path, rows, metrics="")
    before, after = report["policies"]["before"], report["policies"]["after"]
    assert before["turns_per_solved"] is None and after["turns_per_solved"] == 3
    assert after["success"] == 0.5 and after["success_learnable"] == 0.5 and after["success_harder"] is None
    assert before["tool_calls_per_turn"] == pytest.approx(statistics.fmean([1.5, 1.0, 7 / 3]))
    assert before["turns_per_episode"] == 3 and before["tokens_per_episode"] == 30
    assert before["reads_before_first_edit"] == pytest.approx(statistics.fmean([3, 1, 7]))  # no edit: all reads
    assert before["mean_reward"] == 1.0 and after["mean_reward"] == 1.5
    assert report["training"]["steps"] == 0 and report["curves"] == []
    md = markdown_report(report)
    assert "turns per solved task: n/a → 3.0 (n/a)" in md and "| hard | 1 | 0% (0/1) | n/a |" in md
    html_report(report)  # renders


def test_report_says_how_many_episodes_could_not_run(tmp_path):
    """An episode that could not run (a setup failing, the policy's server down) counts as unsolved in
    success, and its pair is left out of the paired counts (it says nothing about what training changed);
    a report that does not say so shows an outage as training's harm."""

    def rows(out):
        return [_row(out, "b", t, 0, True) for t in TASKS] + [_row(out, "a", TASKS[0], 0, True)] + [
            _row(out, "a", t, 0, False, error="the policy failed: 503") for t in TASKS[1:]]  # fmt: skip

    report = _report(tmp_path, rows)
    after = report["policies"]["after"]
    assert (after["errors"], after["success"], after["bench"]["success"]) == (2, 1 / 3, 1.0)
    assert (report["paired"]["before_only"], report["paired"]["episodes"], report["paired"]["left_out"]) == (0, 1, 2)
    said = "episodes that could not run (a setup or the policy's server failed), counted below as unsolved (the paired"
    assert said in markdown_report(report) and html.escape(said) in html_report(report)
    assert "of 1 (2 pairs left out: an episode could not run)" in markdown_report(report)
    clean = _report(tmp_path / "clean", lambda out: [_row(out, m, t, 0, True) for m in "ba" for t in TASKS])
    assert "could not run" not in markdown_report(clean)


def test_calls_per_turn_labels_say_over_which_turns(tmp_path):
    """The held-out number is the scorer's, over the turns that call a tool; the training curve's
    (rl.metrics.behaviour) is over all turns. The same agent reads 2.00 in one and 1.33 in the other,
    so one label for both read as a change where there was none."""
    metrics = json.dumps({"step": 1, "agent_tool_calls_per_turn": 4 / 3}) + "\n"
    report = _report(tmp_path, lambda out: [_row(out, m, t, 0, True, (2, 2, 0)) for m in "ba" for t in TASKS],
                     metrics=metrics)  # fmt: skip
    assert report["policies"]["after"]["tool_calls_per_turn"] == 2.0
    md = markdown_report(report)
    assert "- tool calls per turn with calls: 2.00 → 2.00" in md
    assert "| step | reward | success | turns | calls/turn (all turns) |" in md and "| 1.33 |" in md


def test_a_cut_short_last_metrics_line_does_not_cost_the_report(tmp_path):
    """A run killed while appending a step leaves half a line; the report is built after the whole
    evaluation has run, so it must read the complete steps rather than fail."""
    f = tmp_path / "metrics.jsonl"
    f.write_text(json.dumps({"step": 1, "reward_mean": 0.5}) + "\n" + '{"step": 2, "rew')
    assert training_curves(f) == [{"step": 1, "reward_mean": 0.5}]
    f.write_text('{"step": 1, "rew\n' + json.dumps({"step": 2}) + "\n")
    with pytest.raises(ValueError, match="metrics.jsonl:1"):  # damage elsewhere is still named
        training_curves(f)
