"""The before/after report that ends an RL run: scripted policies stand in for the starting and
the trained policy on a few generated family tasks (one of a harder family), with a fake
metrics.jsonl; the report's numbers must match the benchmark rows, and `vivace train report`
refuses what it cannot evaluate with exit 2."""

from __future__ import annotations

import json
import statistics

import pytest
from typer.testing import CliRunner

from vivace.cli import app
from vivace.config import load_preset
from vivace.rl.evaluate import METRICS, evaluate_run, held_out_tasks, sign_test, stratified, trained_policy
from vivace.tasks.families import generate_families
from vivace.tasks.format import RepoSpec, Task, TestSpec

BEFORE, AFTER = "scripted:random-edit", "scripted:oracle"


@pytest.fixture(scope="module")
def tasks():
    return generate_families({"test": 3}, seed=0, families=("misspelled_name", "self_comparison", "arithmetic"))


def _metrics(run_dir, steps=3):
    with (run_dir / "metrics.jsonl").open("w") as f:
        for s in range(1, steps + 1):
            f.write(json.dumps({"step": s, "reward_mean": 0.1 * s, "success_rate": 0.25 * s, "agent_turns": 3.0,
                                "agent_tool_calls_per_turn": 1.5, "loss": 0.0}) + "\n")  # fmt: skip


async def test_report_numbers_match_the_rows(tasks, tmp_path, state_dir):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    _metrics(run_dir)
    cfg = load_preset(
        "tiny",
        sandbox={"backend": "plain", "state_dir": str(state_dir)},
        train={"eval_temperature": 0, "eval_samples": 1},
    )
    trained = load_preset("tiny", train={"sft_expert": 50, "sft_episodes": 2})  # the run's own config
    (run_dir / "config.json").write_text(trained.model_dump_json())
    seen: list[tuple[int, int, int]] = []
    report = await evaluate_run(cfg, run_dir, BEFORE, AFTER, tasks, concurrency=3, progress=lambda *a: seen.append(a))
    assert report["temperature"] == 0 and cfg.engine.temperature > 0  # greedy for the report only, not rollouts
    on_disk = json.loads((run_dir / "report.json").read_text())
    assert on_disk["before_after"] == json.loads(json.dumps(report["before_after"]))
    assert (run_dir / "report.html").read_text().count("<svg") >= 3  # two curves and success vs tokens

    rows = [json.loads(line) for line in (run_dir / "eval" / "results.jsonl").read_text().splitlines()]
    assert len(rows) == 2 * len(tasks)  # random-edit and oracle, each once though named twice
    assert seen[-1][:2] == (len(rows), len(rows)) and seen[-1][2] == sum(r["resolved"] for r in rows)
    family = {t.id: t.family for t in tasks}
    for label, spec in [("before", BEFORE), ("after", AFTER), (BEFORE, BEFORE), (AFTER, AFTER)]:
        p = report["policies"][label]
        mine = [r for r in rows if r["model"] == spec]
        assert p["spec"] == spec and p["episodes"] == len(tasks)
        assert p["success"] == pytest.approx(sum(r["resolved"] for r in mine) / len(mine))
        for f, e in p["families"].items():
            of_f = [r for r in mine if family[r["task_id"]] == f]
            assert (e["episodes"], e["solved"]) == (len(of_f), sum(r["resolved"] for r in of_f))
        assert p["tokens_per_episode"] == pytest.approx(sum(r["details"]["reference_tokens"] for r in mine) / len(mine))
    after = report["policies"]["after"]
    assert after["success"] == 1.0 and after["reads_before_first_edit"] >= 1  # the oracle reads, then edits
    assert after["repeated_rejected_per_episode"] == 0  # nor does it send a rejected call again
    assert "repeated_rejected_per_episode" in report["before_after"]
    assert report["families"]["arithmetic"]["learnable"] is False
    assert after["success_harder"] == 1.0 and after["success_learnable"] == 1.0
    for key, change in report["before_after"].items():
        b, a = report["policies"]["before"][key], after[key]
        assert change == {"before": b, "after": a, "delta": None if b is None or a is None else pytest.approx(a - b)}
    assert [c["step"] for c in report["curves"]] == [1, 2, 3] and report["curves"][-1]["success_rate"] == 0.75
    pair = report["paired"]
    solved = {spec: {r["task_id"] for r in rows if r["model"] == spec and r["resolved"]} for spec in (BEFORE, AFTER)}
    up, down = len(solved[AFTER] - solved[BEFORE]), len(solved[BEFORE] - solved[AFTER])  # one episode per task
    per_task = [(t.id in solved[AFTER]) - (t.id in solved[BEFORE]) for t in tasks]
    half = 1.96 * statistics.stdev(per_task) / len(tasks) ** 0.5
    turns = {(r["model"], r["task_id"]): r["details"]["turns"] for r in rows}
    both = solved[BEFORE] & solved[AFTER]
    assert pair == {"episodes": len(tasks), "left_out": 0, "both": len(solved[BEFORE] & solved[AFTER]),
                    "before_only": down, "after_only": up, "tasks_up": up, "tasks_down": down,
                    "p_value": pytest.approx(sign_test(up, down)), "change": pytest.approx((up - down) / len(tasks)),
                    "change_ci95": pytest.approx([(up - down) / len(tasks) - half, (up - down) / len(tasks) + half]),
                    "turns_both_solved": None if not both else {"episodes": len(both),
                        "before": pytest.approx(statistics.fmean(turns[BEFORE, t] for t in both)),
                        "after": pytest.approx(statistics.fmean(turns[AFTER, t] for t in both))}}  # fmt: skip
    lo, hi = pair["change_ci95"]
    assert report["shift"] == {"divergence": None, "kl": None}  # scripted policies have no tokens, no weights

    md = (run_dir / "report.md").read_text()
    for name in [*report["families"], BEFORE, AFTER, "before", "after", "Harder families", "→"]:
        assert name in md, name
    harder_section = md.split("### Harder families")[1].split("##")[0]
    assert "arithmetic" in harder_section and "misspelled_name" not in harder_section
    assert "**all learnable**" in md and "| **all** | 3 |" in md and "at temperature 0" in md
    assert f"{pair['after_only']} solved only after" in md
    assert "supervised term beside the policy gradient: 2 expert episodes per update" in md  # not RL's alone
    assert f"paired tasks: {up} solved more often after, {down} less often (sign test p = " in md
    assert (
        f"success change on the paired episodes: {pair['change'] * 100:+.1f} pts, 95% interval {lo * 100:+.1f} to" in md
    )


def test_paired_outcomes_match_episodes_by_task_and_sample():
    from vivace.rl.evaluate import paired

    rows = [{"model": m, "task_id": t, "sample": k, "resolved": ok} for m, t, k, ok in [
        ("b", "t1", 0, True), ("a", "t1", 0, False),  # lost
        ("b", "t1", 1, False), ("a", "t1", 1, True),  # gained
        ("b", "t2", 0, True), ("a", "t2", 0, True),  # kept
        ("b", "t3", 0, False), ("x", "t3", 0, True),  # after never ran it: not a pair
    ]]  # fmt: skip
    rows.append({"model": "a", "task_id": "t2", "sample": 1, "error": "boom"})  # failed to run: not the policy's
    rows.append({"model": "b", "task_id": "t2", "sample": 1, "resolved": True})
    rows += [{"model": m, "task_id": "t4", "sample": k, "resolved": ok} for m, k, ok in [
        ("b", 0, False), ("a", 0, True), ("b", 1, False), ("a", 1, True)]]  # gained twice: one task up  # fmt: skip
    for r in rows:
        if "error" not in r:
            r["details"] = {"turns": 4 if r["model"] == "b" else 3}
    assert paired(rows, "b", "a") == {
        "episodes": 5, "left_out": 1, "both": 1, "before_only": 1, "after_only": 3,
        # t1 one lost, one gained (no change); t2 kept in the pair that ran (the errored pair is left out,
        # not counted as lost); t4 up
        "tasks_up": 1, "tasks_down": 0, "p_value": 1.0,
        # per-task changes 0 (t1), 0 (t2), +1 (t4): mean 1/3, sample sd 0.577 over 3 tasks
        "change": pytest.approx(1 / 3),
        "change_ci95": pytest.approx([1 / 3 - 1.96 * 0.57735 / 3**0.5, 1 / 3 + 1.96 * 0.57735 / 3**0.5], abs=1e-4),
        # speed on the one pair both solved (t2, 0); episodes only one policy solved are not in it
        "turns_both_solved": {"episodes": 1, "before": 4, "after": 3},
    }  # fmt: skip
    both_again = [{"model": m, "task_id": "t5", "sample": 0, "resolved": True, "details": {"turns": n}}
                  for m, n in (("b", 9), ("a", 5))]  # fmt: skip
    assert paired(rows + both_again, "b", "a")["turns_both_solved"] == {"episodes": 2, "before": 6.5, "after": 4.0}
    assert paired([r for r in rows if r["task_id"] != "t2"], "b", "a")["turns_both_solved"] is None
    ok = [r for r in rows if "error" not in r and not (r["task_id"] == "t2" and r["sample"] == 1)]
    assert {k: v for k, v in paired(ok, "b", "a").items() if k != "left_out"} == {
        k: v for k, v in paired(rows, "b", "a").items() if k != "left_out"
    }  # the same as if the failed pair had never been asked for
    one_task = [r for r in rows if r["task_id"] == "t4"]
    assert paired(one_task, "b", "a")["change"] == 1.0 and paired(one_task, "b", "a")["change_ci95"] is None
    assert paired([], "b", "a")["change"] is None


def test_report_says_when_the_interval_holds_zero():
    from vivace.rl.evaluate import change_lines

    def line(change, lo, hi):
        paired = {"episodes": 8, "after_only": 1, "before_only": 1, "both": 2, "change": change,
                  "change_ci95": [lo, hi]}  # fmt: skip
        return [x for x in change_lines({"before_after": {k: {"before": None, "after": None, "delta": None}
                                                          for k, _, _ in METRICS}, "paired": paired})
                if x.startswith("success change")][0]  # fmt: skip

    assert line(0.02, -0.01, 0.05).endswith("95% interval -1.0 to +5.0 pts (from the spread over tasks): it holds "
                                            "zero, so this report cannot tell the change from sampling luck")  # fmt: skip
    assert line(0.1, 0.04, 0.16).endswith("95% interval +4.0 to +16.0 pts (from the spread over tasks)")


def test_change_lines_give_speed_on_the_episodes_both_solved():
    from vivace.rl.evaluate import change_lines

    empty = {k: {"before": None, "after": None, "delta": None} for k, _, _ in METRICS}
    paired = {"episodes": 8, "after_only": 1, "before_only": 1, "both": 2,
              "turns_both_solved": {"episodes": 2, "before": 4.6, "after": 4.1}}  # fmt: skip
    assert "turns on the 2 paired episodes both solved: 4.6 → 4.1 (-0.5; speed on the same episodes)" in change_lines(
        {"before_after": empty, "paired": paired}
    )
    paired["turns_both_solved"] = None  # none solved by both; or a report written before the key existed
    assert not [x for x in change_lines({"before_after": empty, "paired": paired}) if x.startswith("turns on")]


def test_sign_test_is_the_exact_two_sided_binomial():
    assert sign_test(0, 0) == 1.0  # nothing changed
    assert sign_test(4, 0) == sign_test(0, 4) == 2 / 16  # all four one way
    assert sign_test(4, 1) == pytest.approx(2 * (1 + 5) / 32)
    assert sign_test(3, 3) == 1.0
    assert sign_test(10, 0) < 0.01 < sign_test(8, 1) < 0.05 < sign_test(7, 1)  # 0.002, 0.039, 0.070


async def test_several_episodes_per_task(tasks, tmp_path, state_dir):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    _metrics(run_dir)
    cfg = load_preset("tiny", sandbox={"backend": "plain", "state_dir": str(state_dir)}, train={"eval_samples": 2})
    seen = []
    report = await evaluate_run(cfg, run_dir, BEFORE, AFTER, tasks[:2], baselines=("scripted:null",), concurrency=3,
                                progress=lambda done, total, solved: seen.append((done, total)))  # fmt: skip
    rows = [json.loads(line) for line in (run_dir / "eval" / "results.jsonl").read_text().splitlines()]
    # before and after sample twice; the scripted baseline runs once per task (it would repeat itself)
    assert sorted((r["model"], r["task_id"], r["sample"]) for r in rows) == sorted(
        [(m, t.id, k) for m in (BEFORE, AFTER) for t in tasks[:2] for k in (0, 1)]
        + [("scripted:null", t.id, 0) for t in tasks[:2]]
    )
    assert seen[-1] == (10, 10)
    assert report["policies"]["scripted:null"]["episodes"] == 2 and report["once"] == ["scripted:null"]
    paths = {r["trajectory"] for r in rows}
    assert len(paths) == len(rows) and all((run_dir / "eval" / p).is_file() for p in paths)  # none overwritten
    assert report["samples"] == 2 and report["policies"]["after"]["episodes"] == 4
    assert report["policies"]["after"]["success"] == 1.0
    md = (run_dir / "report.md").read_text()
    assert "2 tasks × 2 episodes each (one for `scripted:null`: scripted" in md
    assert report["training"]["supervised"] is None and "supervised term" not in md  # a run without one


def _task(i: int, family: str | None, kind: str = "bug") -> Task:
    meta = {"kind": kind, "split": "test", **({"family": family} if family else {})}
    return Task(id=f"t{i}", repo=RepoSpec(bundled="_blank"), request="fix it",
                tests=TestSpec(command="true", fail_to_pass=["t::a"]), metadata=meta)  # fmt: skip


def test_held_out_tasks_cover_every_family_first():
    tasks = [_task(i, f) for i, f in enumerate(["a"] * 5 + ["b"] * 2 + ["c"] + [None])]
    for seed in range(5):
        picked = stratified(tasks, 4, seed)
        assert sorted(t.family for t in picked) == ["a", "b", "bug", "c"]  # no family -> its kind
        assert [t.id for t in stratified(list(reversed(tasks)), 4, seed)] == [t.id for t in picked]
    assert len(stratified(tasks, None, 0)) == 4 and len(stratified(tasks, 50, 0)) == len(tasks)


def test_missing_checkpoint_and_empty_split_are_refused(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="--resume"):
        trained_policy(tmp_path)
    monkeypatch.setattr("vivace.rl.evaluate.load_suite", lambda name, split=None: [])
    with pytest.raises(ValueError, match="no tasks in split 'validation'"):
        held_out_tasks(load_preset("tiny"), 3, "validation")


def test_held_out_tasks_come_from_eval_suite_when_set(monkeypatch):
    """Training on a user's tasks file, the held-out benchmark can still be a named suite."""
    asked = []
    monkeypatch.setattr(
        "vivace.rl.evaluate.load_suite", lambda name, split=None: asked.append((name, split)) or [_task(0, "a")]
    )
    cfg = load_preset("tiny", train={"suite": "mine.jsonl"})
    held_out_tasks(cfg, 1)
    cfg.train.eval_suite = "families"
    held_out_tasks(cfg, 1, "validation")
    assert asked == [("mine.jsonl", "test"), ("families", "validation")]


def test_report_command_refuses_what_it_cannot_evaluate(tmp_path):
    runner = CliRunner()
    result = runner.invoke(app, ["train", "report", str(tmp_path)])
    assert result.exit_code == 2 and "config.json" in result.output
    (tmp_path / "config.json").write_text(load_preset("tiny").model_dump_json())
    result = runner.invoke(app, ["train", "report", str(tmp_path)])
    assert result.exit_code == 2 and "--resume" in result.output
    result = runner.invoke(app, ["train", "report", str(tmp_path), "--split", "holdout"])
    assert result.exit_code == 2 and "unknown split" in result.output


DAMAGED_CONFIGS = [(b"{\n", "not valid JSON (Expecting"), (b"\xff{}", "not UTF-8 text"), (None, "cannot read it"),
                   (b'{"train": {"bogus": 1}}', "train.bogus: unknown setting")]  # fmt: skip


@pytest.mark.parametrize("command", ["report", "resume"])
@pytest.mark.parametrize("content,said", DAMAGED_CONFIGS, ids=["json", "utf8", "directory", "unknown"])
def test_a_damaged_run_config_is_named(command, content, said, tmp_path):
    config = tmp_path / "config.json"
    if content is None:
        config.mkdir()
    else:
        config.write_bytes(content)
    args = ["train", "report", str(tmp_path)] if command == "report" else ["train", "--resume", str(tmp_path)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2 and f"{config}: {said}" in result.output, result.output
    assert "Traceback" not in result.output and "errors.pydantic.dev" not in result.output


def test_report_command_ignores_directories_that_are_not_checkpoints(tmp_path):
    """checkpoints/step_final (a copy, a renamed one) is not a checkpoint this code wrote: not step_<int>."""
    (tmp_path / "config.json").write_text(load_preset("tiny").model_dump_json())
    (tmp_path / "checkpoints" / "step_final" / "model").mkdir(parents=True)
    result = CliRunner().invoke(app, ["train", "report", str(tmp_path)])
    assert result.exit_code == 2 and "has no checkpoint with weights" in result.output, result.output


def test_report_command_runs_the_evaluation(tasks, tmp_path, state_dir, monkeypatch):
    """`vivace train report RUN`: the run's starting policy vs its last checkpoint (both stood in
    for by scripted policies here), the report's path as the last line, or in the JSON."""
    cfg = load_preset("tiny", train={"model": BEFORE, "eval_baselines": []})
    (tmp_path / "config.json").write_text(cfg.model_dump_json())
    _metrics(tmp_path, steps=2)
    monkeypatch.setattr("vivace.rl.evaluate.trained_policy", lambda run_dir: AFTER)
    monkeypatch.setattr("vivace.rl.evaluate.held_out_tasks", lambda cfg, n, split: tasks[:n])
    args = ["train", "report", str(tmp_path), "--tasks", "2", "--backend", "plain", "--state-dir", str(state_dir)]
    result = CliRunner().invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout.strip().splitlines()[-1])
    assert data["report"] == str(tmp_path / "report.md") and len(data["tasks"]) == 2
    assert data["policies"]["after"]["success"] == 1.0 and set(data["policies"]) == {"before", "after"}
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert result.stdout.strip().splitlines()[-1] == f"report: {tmp_path / 'report.md'}"
    # Not a terminal (a log, a pipe): progress comes as plain lines while it runs, ending at the total.
    shown = [line for line in result.stderr.splitlines() if line.startswith("held-out episodes (")]
    assert shown and shown[-1].endswith("solved): 8/8")
    # Again with another number of episodes per task: the new report replaces the last, which is kept.
    first = (tmp_path / "report.md").read_text()
    result = CliRunner().invoke(app, [*args, "--samples", "1", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout.strip().splitlines()[-1])
    assert data["samples"] == 1 and data["paired"]["episodes"] == 2
    assert (tmp_path / "reports" / "2" / "report.md").read_text() == first
    assert (tmp_path / "reports" / "2" / "eval" / "results.jsonl").is_file()
    assert len((tmp_path / "eval" / "results.jsonl").read_text().splitlines()) == 4
    result = CliRunner().invoke(app, [*args, "--samples", "0"])
    assert result.exit_code == 2 and "--samples" in result.output


def test_an_interrupted_report_leaves_the_previous_one_in_place(tasks, tmp_path, state_dir, monkeypatch):
    """Ctrl-C during `vivace train report`: the earlier report stays at the top of the run (not
    moved to reports/N/ with nothing in its place), the command says so and exits 130."""
    cfg = load_preset("tiny", train={"model": BEFORE, "eval_baselines": []})
    (tmp_path / "config.json").write_text(cfg.model_dump_json())
    _metrics(tmp_path, steps=2)
    monkeypatch.setattr("vivace.rl.evaluate.trained_policy", lambda run_dir: AFTER)
    monkeypatch.setattr("vivace.rl.evaluate.held_out_tasks", lambda cfg, n, split: tasks[:n])
    args = ["train", "report", str(tmp_path), "--tasks", "1", "--samples", "1", "--backend", "plain",
            "--state-dir", str(state_dir)]  # fmt: skip
    assert CliRunner().invoke(app, args).exit_code == 0
    first = {p.relative_to(tmp_path): p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}

    async def interrupted(*args, **kwargs):
        (tmp_path / "eval").mkdir(exist_ok=True)
        (tmp_path / "eval" / "results.jsonl").write_text("{}\n")  # a partial new one
        raise KeyboardInterrupt

    monkeypatch.setattr("vivace.rl.evaluate.run_benchmark", interrupted)
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 130 and "Traceback" not in result.output, result.output
    assert "report stopped; the previous report is still at" in result.output
    assert {p.relative_to(tmp_path): p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == first
