"""The rollout pipeline (rl/pipeline.py): staleness bounds, partial episodes, failures re-queued,
counts that balance — with scripted workers whose 'sampler' is a version counter (fast), then
with the real engine and trainer in this process, then on Ray with actors killed mid-run (slow)."""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from conftest import wait_for_idle_ray
from vivace.bench.score import Score
from vivace.config import load_preset
from vivace.harness.trajectory import Tokens, Trajectory
from vivace.rl.controller import EVAL_FIXED_S, evaluation_s, train
from vivace.rl.rollout import EpisodeResult, Rollout
from vivace.rl.runs import new_run_dir
from vivace.rl.workers import WorkerLost
from vivace.tasks.format import RepoSpec, Task, TestSpec


def tasks(n: int = 6) -> list[Task]:
    return [
        Task(id=f"t{i}", repo=RepoSpec(path="/nonexistent"), request=f"task {i}",
             tests=TestSpec(command="true", fail_to_pass=["t::a"], pass_to_pass=[]))
        for i in range(n)
    ]  # fmt: skip


class ScriptedWorkers:
    """Workers whose episodes are a few 'turns' of random length; each sampled token records the
    version the 'sampler' holds at that moment, as the engine does. Faults are injected by rate, and
    every kind with a non-zero rate is also forced once among the first attempts, so a test that asks
    for each kind sees it whatever order the event loop happens to run the episodes in. Each attempt
    draws from its own generator, so one attempt's luck does not depend on the others' timing."""

    cluster_lost = False

    def __init__(self, seed: int = 0, worker_lost: float = 0.0, sampler_lost: float = 0.0, env_failed: float = 0.0):
        self.seed = seed
        self.rates = {"worker_lost": worker_lost, "sampler_lost": sampler_lost, "env_failed": env_failed}
        self.version = 0
        self.trained: list[tuple[int, list[list[int]]]] = []  # (trainer version, per-sample sampled versions)
        self.attempt_ids: list[str] = []
        self.replaced = {"workers_replaced": 0, "samplers_replaced": 0}
        self._ids = iter(range(1 << 30))
        self.forced = {1 + 2 * i: kind for i, kind in enumerate(k for k, rate in self.rates.items() if rate > 0)}

    async def start(self, version, checkpoint):
        self.version = version

    def capacity(self):
        return [3, 2]

    async def episode(self, worker: int, task: Task) -> EpisodeResult:
        number = next(self._ids)
        attempt, rng = f"a{number}", random.Random(self.seed * 1_000_003 + number)
        versions = []
        for _ in range(rng.randint(1, 4)):
            await asyncio.sleep(rng.lognormvariate(-5, 1.0))
            versions += [self.version] * 3
        fault = rng.random()
        for kind, rate in self.rates.items():
            if self.forced.get(number) == kind or (number not in self.forced and fault < rate):
                if kind == "worker_lost":
                    raise WorkerLost(f"worker {worker} died (injected)")
                return EpisodeResult(kind, sampler=0, error=f"{kind} (injected)")
            fault -= rate
        n = len(versions)
        tokens = Tokens(ids=[1] * (n + 2), loss_mask=[0, 0] + [1] * n, logprobs=[0.0] * (n + 2),
                        versions=[-1, -1] + versions)  # fmt: skip
        traj = Trajectory(task_id=task.id, request=attempt, policy="scripted", system_prompt="", system_prompt_version="t",
                          turns=[], final_message="", diff="",
                          stop_reason="done", wall_s=0.0, tokens=tokens)  # fmt: skip
        reward = rng.random()
        score = Score(task_id=task.id, total=reward, correctness=reward, adherence=0, efficiency=0, claims=1,
                      format=1, resolved=False)  # fmt: skip
        return EpisodeResult("ok", Rollout(task.id, traj, score.total, {}, False, {}), sampler=0)

    async def replace_worker(self, worker):
        self.replaced["workers_replaced"] += 1

    async def heal_samplers(self, version):
        self.replaced["samplers_replaced"] += 1
        return 1

    async def sampler_stats(self):
        return {"generated_tokens": 0, "busy_s": 0.0}

    async def train_step(self, samples):
        self.trained.append(
            (self.version, [[v for v, m in zip(s.versions, s.mask, strict=True) if m] for s in samples])
        )
        await asyncio.sleep(0.01)
        return {"loss": 0.0}

    async def sync(self, version):
        self.version = version
        return 0, 0.0

    async def save(self, path: Path):
        path.mkdir(parents=True, exist_ok=True)

    async def close(self):
        pass


async def run(tmp_path: Path, workers, name: str, **train) -> tuple[dict, list[dict]]:
    cfg = load_preset("smoke", train={"steps": 8, "tasks_per_step": 2, "group_size": 3, "checkpoint_every": 100,
                                      "runs_dir": str(tmp_path / "runs"), **train})  # fmt: skip
    rows: list[dict] = []
    run_dir = new_run_dir(cfg, name)
    summary = await train_run(cfg, run_dir, workers, rows)
    return summary, rows


async def train_run(cfg, run_dir, workers, rows):
    return await train(cfg, run_dir, tasks=tasks(), workers=workers, on_step=rows.append)


def balanced(counts: dict) -> None:
    got = {k: counts.get(f"episodes_{k}", 0) for k in ("started", "finished", "requeued", "unfinished_at_end")}
    assert got["started"] == got["finished"] + got["requeued"] + got["unfinished_at_end"], counts
    assert got["finished"] == counts.get("episodes_trained", 0) + counts["episodes_buffered"], counts
    assert counts["episodes_in_flight"] == 0


@pytest.mark.parametrize("reason", ["aborted_stale", "unfinished_at_end"])
async def test_an_attempt_cancelled_before_its_first_step_is_still_settled(reason):
    """An attempt aborted (a version too new) or closed right after its launch, before its task ever ran, was
    counted as started and never settled: the counts did not balance (seen once in a parallel `make test`),
    and an aborted member was never requeued, so its group could never complete."""
    from vivace.rl.pipeline import Group, Pipeline

    cfg = load_preset("smoke", train={"tasks_per_step": 1, "group_size": 2, "pipeline": "async"})
    pipe = Pipeline(cfg, ScriptedWorkers(seed=3), lambda seq: tasks()[seq], version=0, position=1)
    group = Group(0, tasks()[0], 2, 0)
    pipe.groups[0] = group
    free = list(pipe.free)
    pipe._launch(group, 1, 0, 0)  # created; its first step would come on the loop's next turn
    (att,) = pipe.in_flight.values()
    if reason == "unfinished_at_end":
        counts = await pipe.close()
    else:
        pipe._abort(att, reason)
        await asyncio.gather(att.task, return_exceptions=True)
        await asyncio.sleep(0)  # the done callbacks
        counts = pipe.snapshot()
        assert list(pipe.queue) == [(group, 1, 0)]  # back in line, first
    assert counts["episodes_started"] == 1 and counts.get(f"episodes_{reason}") == 1
    assert pipe.in_flight == {} and pipe.free == free
    balanced(counts)


@pytest.mark.parametrize("pipeline", ["sync", "async"])
async def test_max_staleness_zero_is_exactly_on_policy(tmp_path, pipeline):
    workers = ScriptedWorkers(seed=1)
    summary, rows = await run(tmp_path, workers, pipeline, pipeline=pipeline, max_staleness=0)
    assert len(workers.trained) == 8
    for version, samples in workers.trained:
        assert samples and all(v == version for s in samples for v in s)
    assert sum(r["samples_too_stale"] for r in rows) == 0  # nothing was produced only to be dropped
    balanced(summary["pipeline"])


async def test_async_tokens_are_at_most_k_versions_old_and_some_are(tmp_path):
    workers = ScriptedWorkers(seed=2)
    summary, rows = await run(tmp_path, workers, "k2", pipeline="async", max_staleness=2, rollout_concurrency=5)
    ages = [version - v for version, samples in workers.trained for s in samples for v in s]
    assert ages and max(ages) <= 2 and min(ages) >= 0
    assert any(a > 0 for a in ages)  # the bound was actually exercised, not trivially met
    assert all(r.get("staleness_max", 0) <= 2 for r in rows)
    balanced(summary["pipeline"])


async def test_abort_mode_trains_only_single_version_episodes(tmp_path):
    workers = ScriptedWorkers(seed=3)
    summary, _ = await run(tmp_path, workers, "abort", pipeline="async", max_staleness=1, partial_episodes="abort")
    for version, samples in workers.trained:
        for s in samples:
            assert len(set(s)) == 1 and version - s[0] <= 1
    assert summary["pipeline"].get("episodes_aborted_update", 0) > 0
    balanced(summary["pipeline"])


async def test_failures_are_requeued_and_every_count_balances(tmp_path):
    workers = ScriptedWorkers(seed=4, worker_lost=0.1, sampler_lost=0.1, env_failed=0.1)
    summary, rows = await run(tmp_path, workers, "faults", pipeline="async", max_staleness=1)
    counts = summary["pipeline"]
    balanced(counts)
    for kind in ("worker_lost", "sampler_lost", "env_failed"):
        assert counts[f"episodes_{kind}"] > 0, kind
    assert counts["workers_replaced"] > 0 and counts["samplers_replaced"] > 0
    # No finished attempt is trained twice, and every trained rollout is one finished attempt.
    trained = [json.loads(line) for p in sorted((tmp_path / "runs" / "faults" / "trajectories").glob("*.jsonl"))
               for line in p.read_text().splitlines()]  # fmt: skip
    attempts = [t["trajectory"]["request"] for t in trained if t["trajectory"]]
    assert len(attempts) == len(set(attempts))
    assert len(trained) == counts["episodes_trained"] == 8 * 2 * 3
    # Environment failures past max_attempts become failed rollouts, not lost ones.
    failed = [t for t in trained if t["trajectory"] is None]
    assert all(t["error"] for t in failed)
    timeline = [json.loads(line) for line in (tmp_path / "runs" / "faults" / "timeline.jsonl").read_text().splitlines()]
    assert len(timeline) == counts["episodes_started"]
    assert {t["outcome"] for t in timeline} <= {"finished", "requeued", "unfinished_at_end"}


async def test_a_failing_trainer_stops_the_run_naming_the_checkpoint(tmp_path):
    from vivace.rl.controller import TrainerFailed

    class Failing(ScriptedWorkers):
        async def train_step(self, samples):
            if len(self.trained) == 3:
                raise RuntimeError("CUDA error: an illegal memory access (injected)")
            return await super().train_step(samples)

    cfg = load_preset("smoke", train={"steps": 8, "tasks_per_step": 2, "group_size": 3, "checkpoint_every": 2,
                                      "runs_dir": str(tmp_path / "runs")})  # fmt: skip
    run_dir = new_run_dir(cfg, "fail")
    with pytest.raises(TrainerFailed) as info:
        await train_run(cfg, run_dir, Failing(seed=5), [])
    message = str(info.value)
    assert "step 4" in message and "illegal memory access" in message
    assert "checkpoints/step_2" in message and f"--resume {run_dir}" in message


@pytest.mark.slow
async def test_ray_run_survives_a_killed_rollout_worker_and_sampler_replica(tmp_path):
    """The acceptance fault test: real actors (2 rollout workers, 2 sampler replicas, trainer),
    one worker and one replica killed mid-run; the run completes and the counts balance."""
    import ray

    from vivace.rl.synthetic import latency_episode
    from vivace.rl.workers import RayWorkers
    from vivace.sandbox import open_backend

    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "main.py").write_text("x = 1\n")
    cfg = load_preset("smoke", agent={"max_turn_tokens": 16},
                      train={"steps": 4, "tasks_per_step": 2, "group_size": 2, "rollout_workers": 2,
                             "sampler_replicas": 2, "rollout_concurrency": 8, "pipeline": "async", "max_staleness": 1,
                             "checkpoint_every": 100, "runs_dir": str(tmp_path / "runs")},
                      sandbox={"backend": "plain", "state_dir": str(tmp_path / "state")})  # fmt: skip
    episode = latency_episode(open_backend(cfg.sandbox).snapshot(str(repo)), median_s=0.5, sigma=0.5, turns=(3, 5))
    wait_for_idle_ray()
    notes: list[str] = []
    workers = RayWorkers(cfg, episode, on_note=notes.append)
    run_dir = new_run_dir(cfg, "faults")
    killed: list[str] = []

    async def saboteur() -> None:
        timeline = run_dir / "timeline.jsonl"
        while not (timeline.exists() and len(timeline.read_text().splitlines()) >= 3):
            await asyncio.sleep(0.2)
        ray.kill(workers.workers[0])
        ray.kill(workers.samplers[1])
        killed.append("both")

    sabotage = asyncio.create_task(saboteur())
    summary = await train(cfg, run_dir, tasks=tasks(4), episode=episode, workers=workers)
    assert sabotage.done() and killed
    assert not notes  # a cluster with room for the run says nothing
    counts = summary["pipeline"]
    print(json.dumps(counts))
    balanced(counts)
    assert counts["episodes_trained"] == 4 * 2 * 2 and summary["steps"] == 4
    assert counts.get("episodes_worker_lost", 0) >= 1 and counts.get("workers_replaced", 0) >= 1
    assert counts.get("samplers_replaced", 0) >= 1


async def test_resume_reopens_groups_opened_but_not_trained(tmp_path):
    """Async runs open groups ahead of the trainer; a checkpoint records them and a resume trains
    them, so across the cut every task-order position is trained once and none is skipped."""
    cfg = load_preset("smoke", train={"steps": 3, "tasks_per_step": 2, "group_size": 2, "checkpoint_every": 1,
                                      "pipeline": "async", "max_staleness": 2, "runs_dir": str(tmp_path / "runs")})  # fmt: skip
    run_dir = new_run_dir(cfg, "cut")
    await train_run(cfg, run_dir, ScriptedWorkers(seed=6), [])
    state = json.loads((run_dir / "checkpoints" / "step_3" / "state.json").read_text())
    assert state["pending"]  # opened ahead of the trainer when the run stopped
    cfg.train.steps = 6
    await train(cfg, run_dir, resume=True, tasks=tasks(), workers=ScriptedWorkers(seed=7))
    trained = [json.loads(line)["position"] for i in range(1, 7)
               for line in (run_dir / "trajectories" / f"step_{i}.jsonl").read_text().splitlines() if json.loads(line)["member"] == 0]  # fmt: skip
    assert len(trained) == len(set(trained)) == 6 * 2
    final = json.loads((run_dir / "checkpoints" / "step_6" / "state.json").read_text())
    assert set(trained).isdisjoint(final["pending"])  # nothing opened is lost: trained or still pending
    assert set(trained) | set(final["pending"]) == set(range(final["data_position"]))
    # The resumed run appends its attempts to the timeline: each line says which run it is of (the first
    # run's attempts of steps 1-3 came twice, told apart by nothing, after a kill and a resume).
    timeline = [json.loads(line) for line in (run_dir / "timeline.jsonl").read_text().splitlines()]
    sessions = list(dict.fromkeys(t["session"] for t in timeline))
    assert len(sessions) == 2 and sessions[0] < sessions[1]
    for session in sessions:
        outcomes = Counter(t["outcome"] for t in timeline if t["session"] == session)
        assert outcomes["finished"] >= 3 * 2 * 2  # at least the groups each trained


async def test_a_resume_replaces_the_recomputed_steps_in_tensorboard(tmp_path):
    """Killed after step 3 with its last checkpoint at step 2, the run recomputes step 3: metrics.jsonl was
    cut back, but TensorBoard showed both the killed run's step 3 and the new one."""
    import shutil

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cfg = load_preset("smoke", train={"steps": 3, "tasks_per_step": 2, "group_size": 2, "checkpoint_every": 2,
                                      "runs_dir": str(tmp_path / "runs")})  # fmt: skip
    run_dir = new_run_dir(cfg, "killed")
    await train_run(cfg, run_dir, ScriptedWorkers(seed=6), [])
    shutil.rmtree(run_dir / "checkpoints" / "step_3")  # the kill came before step 3's checkpoint
    await train(cfg, run_dir, resume=True, tasks=tasks(), workers=ScriptedWorkers(seed=7))
    board = EventAccumulator(str(run_dir / "tensorboard"))
    board.Reload()
    steps = [e.step for e in board.Scalars("reward_mean")]
    assert steps == [1, 2, 3]
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert board.Scalars("reward_mean")[-1].value == pytest.approx(metrics[-1]["reward_mean"])


async def test_time_budget_stops_after_a_step_with_a_checkpoint(tmp_path):
    """`max_minutes` ends the run after the step that leaves no room for another: fewer steps than
    asked, the last one checkpointed (resumable), and the summary says why it stopped."""
    summary, rows = await run(tmp_path, ScriptedWorkers(seed=8), "budget", max_minutes=1e-6)
    assert len(rows) == 1 and summary["steps"] == 1 and summary["stopped_by"] == "max_minutes"
    assert (tmp_path / "runs" / "budget" / "checkpoints" / "step_1" / "state.json").is_file()
    summary, rows = await run(tmp_path, ScriptedWorkers(seed=8), "no-budget", steps=2)
    assert summary["stopped_by"] == "steps" and len(rows) == 2


async def test_total_budget_leaves_room_for_the_evaluation(tmp_path):
    """`total_minutes` covers the evaluation after RL: a run whose projected evaluation would not fit stops
    after its first step, checkpointed, and says which budget stopped it; without an evaluation it runs on."""
    summary, rows = await run(tmp_path, ScriptedWorkers(seed=8), "total", steps=3, total_minutes=0.5, eval_tasks=56)
    assert len(rows) == 1 and summary["stopped_by"] == "total_minutes"  # 60 s of evaluation alone exceed 30 s
    assert (tmp_path / "runs" / "total" / "checkpoints" / "step_1" / "state.json").is_file()
    summary, rows = await run(tmp_path, ScriptedWorkers(seed=8), "no-eval", steps=3, total_minutes=0.5)
    assert summary["stopped_by"] == "steps" and len(rows) == 3


def test_evaluation_projection_scales_a_steps_rollouts_to_the_held_out_episodes():
    tc = load_preset("tiny").train  # 4 x 4 rollouts a step, 16 at once; 56 tasks x 2 samples, 16 at once
    assert tc.eval_tasks == 56 and tc.tasks_per_step * tc.group_size == 16 == tc.eval_concurrency
    # 224 episodes of the two policies at 40 s per 16 (the 2-core machine: 541-571 s measured) + the fixed part
    assert evaluation_s(tc, [35.0, 45.0]) == 224 * 2.5 + EVAL_FIXED_S
    tc.eval_concurrency = 4  # a quarter as many at once: each batch's worth takes four times as long
    assert evaluation_s(tc, [40.0]) == 224 * 10 + EVAL_FIXED_S
    tc.eval_tasks = 0
    assert evaluation_s(tc, [40.0]) == 0


async def test_stop_request_ends_the_run_after_the_step_in_flight_resumably(tmp_path):
    """The CLI's first Ctrl-C sets `stop`: the step in flight finishes, is checkpointed (here
    between the every-100-steps checkpoints) and the summary says why; --resume continues from it."""
    cfg = load_preset("smoke", train={"steps": 5, "tasks_per_step": 2, "group_size": 3, "checkpoint_every": 100,
                                      "runs_dir": str(tmp_path / "runs")})  # fmt: skip
    run_dir = new_run_dir(cfg, "ctrl-c")
    rows: list[dict] = []
    summary = await train(cfg, run_dir, tasks=tasks(), workers=ScriptedWorkers(seed=9), on_step=rows.append,
                          stop=lambda: len(rows) >= 2)  # fmt: skip
    assert [r["step"] for r in rows] == [1, 2] and summary["stopped_by"] == "interrupted"
    assert summary["checkpoint"].endswith("step_2")
    summary = await train(cfg, run_dir, resume=True, tasks=tasks(), workers=ScriptedWorkers(seed=9),
                          on_step=rows.append)  # fmt: skip
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5] and summary["stopped_by"] == "steps"


async def test_keep_checkpoints_deletes_all_but_the_newest_and_resume_still_works(tmp_path):
    cfg = load_preset("smoke", train={"steps": 5, "tasks_per_step": 2, "group_size": 3, "checkpoint_every": 1,
                                      "keep_checkpoints": 2, "runs_dir": str(tmp_path / "runs")})  # fmt: skip
    run_dir = new_run_dir(cfg, "keep")
    (run_dir / "checkpoints" / "step_0").mkdir(parents=True)  # an unfinished save from an earlier crash
    await train_run(cfg, run_dir, ScriptedWorkers(seed=10), [])
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step_4", "step_5"]
    cfg.train.steps = 6
    summary = await train(cfg, run_dir, resume=True, tasks=tasks(), workers=ScriptedWorkers(seed=10))
    assert summary["steps"] == 6 and summary["checkpoint"].endswith("step_6")
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step_5", "step_6"]
    cfg.train.keep_checkpoints = None
    run_dir = new_run_dir(cfg, "keep-all")
    await train_run(cfg, run_dir, ScriptedWorkers(seed=10), [])
    assert len(list((run_dir / "checkpoints").iterdir())) == 6


@pytest.mark.parametrize(
    "damage,said",
    [
        (lambda run: (run / "checkpoints" / "step_2" / "state.json").write_text("{oops"), "cannot resume from this "
         "checkpoint (JSONDecodeError"),
        (lambda run: (run / "checkpoints" / "step_2" / "state.json").write_text('{"step": "2"}'), "holds no step"),
        (lambda run: (run / "checkpoints" / "step_2" / "rng.pt").write_bytes(b"x"), "rng.pt is not a file of plain "
         "tensors"),
        (lambda run: (run / "checkpoints" / "step_2" / "rng.pt").write_bytes(b""), "cannot resume from this"),
        (lambda run: (run / "metrics.jsonl").write_text("garbage\n" + (run / "metrics.jsonl").read_text()),
         "metrics.jsonl:1: not a metrics row (not JSON"),
    ],
    ids=["state-json", "state-step", "rng-garbage", "rng-empty", "metrics-line"],
)  # fmt: skip
async def test_a_damaged_checkpoint_or_metrics_file_stops_a_resume_by_name(tmp_path, damage, said):
    """A resume reads the checkpoint's state.json and rng.pt and rewrites metrics.jsonl up to it: damage in any
    of them is StartFailed naming the file (the CLI's one-line error), never a traceback nor a line dropped
    without a word; rng.pt is read as plain tensors, never as a pickle that could run code."""
    from vivace.rl.controller import StartFailed

    cfg = load_preset("smoke", train={"steps": 2, "tasks_per_step": 1, "group_size": 2, "checkpoint_every": 1,
                                      "runs_dir": str(tmp_path / "runs")})  # fmt: skip
    run_dir = new_run_dir(cfg, "damaged")
    await train_run(cfg, run_dir, ScriptedWorkers(seed=11), [])
    damage(run_dir)
    cfg.train.steps = 3
    with pytest.raises(StartFailed, match=re.escape(said)):
        await train(cfg, run_dir, resume=True, tasks=tasks(), workers=ScriptedWorkers(seed=11))


def test_directories_not_named_step_n_are_neither_resumed_nor_pruned(tmp_path):
    from vivace.rl.runs import latest_checkpoint, prune_checkpoints

    checkpoints = tmp_path / "checkpoints"
    for name in ("step_1", "step_2", "step_final", "step_", "step_2.bak"):
        (checkpoints / name).mkdir(parents=True)
        (checkpoints / name / "state.json").write_text("{}")
    assert latest_checkpoint(tmp_path) == checkpoints / "step_2"
    prune_checkpoints(tmp_path, 1)
    assert sorted(p.name for p in checkpoints.iterdir()) == ["step_", "step_2", "step_2.bak", "step_final"]


def test_a_busy_cluster_is_said_to_be_short_of_what_the_run_needs():
    """A second run on a cluster another run fills waits for its actors to be scheduled: it says so."""
    from vivace.rl.workers import resources_short

    total = {"CPU": 8.0, "GPU": 2.0}
    assert resources_short(total, {"CPU": 8.0, "GPU": 2.0}, {"CPU": 2.0, "GPU": 2.0}) is None
    assert resources_short(total, {"CPU": 8.0}, {"CPU": 2.0, "GPU": 0.0}) is None  # no GPU asked for
    said = resources_short(total, {"CPU": 0.5, "GPU": 2.0}, {"CPU": 2.0, "GPU": 1.0})
    assert said == "0.5 of 8 CPUs free, 2 needed"


def _placed(gpus: int, trainer: float, sampler: float, trainers: int, samplers: int) -> list[list[str]]:
    """The actors on each GPU as Ray places fractional requests (best fit: the fullest GPU with room), in the
    order RayWorkers creates them (trainer ranks first); raises AssertionError when one does not fit."""
    free, where = [1.0] * gpus, [[] for _ in range(gpus)]
    for name, share in [(f"t{i}", trainer) for i in range(trainers)] + [(f"s{i}", sampler) for i in range(samplers)]:
        fits = [g for g in range(gpus) if free[g] + 1e-9 >= share]
        assert fits, f"{name} ({share:g} GPU) does not fit: {free}"
        g = min(fits, key=lambda g: free[g])
        free[g] -= share
        where[g].append(name)
    return where


@pytest.mark.parametrize("gpus", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("trainers", [1, 2, 4])
@pytest.mark.parametrize("samplers", [1, 2, 3, 8])
def test_gpu_shares_fit_and_never_put_two_trainer_ranks_on_one_gpu(gpus, trainers, samplers):
    """Every layout gpu_shares gives is schedulable (even fractions of 0.667 GPU left the third actor of
    three on two GPUs waiting forever), and no GPU holds two trainer ranks (NCCL refuses a group with two
    ranks on one device); a cluster without room for that is a ValueError saying how many ranks fit."""
    from vivace.rl.workers import gpu_shares

    if 1 < trainers and gpus <= trainers:
        with pytest.raises(
            ValueError, match=f"trainer_ranks {trainers} needs {trainers} GPUs .* most {max(1, gpus - 1)}"
        ):
            gpu_shares(gpus, trainers, samplers)
        return
    trainer, sampler = gpu_shares(gpus, trainers, samplers)
    placed = _placed(gpus, trainer, sampler, trainers, samplers)
    assert all(sum(a.startswith("t") for a in on) <= 1 for on in placed), placed
    if gpus >= trainers + samplers:
        assert (trainer, sampler) == (1.0, 1.0)
    assert gpu_shares(0, trainers, samplers) == (0.0, 0.0)  # CPUs only


def test_broadcast_sync_only_between_whole_gpus_or_on_cpus():
    """NCCL needs a GPU of its own per member and one backend for all: `auto` broadcasts only then (gloo on
    CPUs is chosen only explicitly, as before), and an explicit broadcast that NCCL cannot form is refused."""
    from vivace.rl.workers import broadcast_sync

    assert broadcast_sync("auto", 1.0, 1.0, "auto") and broadcast_sync("broadcast", 1.0, 1.0, "cuda")
    assert not broadcast_sync("auto", 0.5, 0.5, "auto") and not broadcast_sync("auto", 1.0, 1.0, "cpu")
    assert not broadcast_sync("auto", 0.0, 0.0, "auto") and broadcast_sync("broadcast", 0.0, 0.0, "auto")  # gloo
    assert not broadcast_sync("object_store", 1.0, 1.0, "auto")
    for shares, device in (((0.5, 0.5), "auto"), ((1.0, 0.5), "auto"), ((1.0, 1.0), "cpu")):
        with pytest.raises(
            ValueError, match="weight_sync broadcast needs NCCL .* use weight_sync auto or object_store"
        ):
            broadcast_sync("broadcast", *shares, device)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_first_stop_signal_asks_for_a_stop_and_the_second_stops_at_once(signum, monkeypatch):
    import vivace.cli_train as cli_train
    from vivace.cli_train import _stop_signals

    before = signal.signal(signum, signal.default_int_handler)  # as in a terminal, whatever ran pytest
    try:
        stop, received, said = threading.Event(), [], []
        monkeypatch.setattr(cli_train, "SAME_STOP_S", 0.0)  # the second comes later than the window
        with _stop_signals(stop, received, said.append):
            signal.raise_signal(signum)
            assert stop.is_set() and said == [signum]
            with pytest.raises(KeyboardInterrupt):
                signal.raise_signal(signum)
        assert received == [signum, signum] and signal.getsignal(signum) is signal.default_int_handler
        # GNU timeout signals the process, then its process group: one stop, twice, microseconds apart.
        monkeypatch.setattr(cli_train, "SAME_STOP_S", 1.0)
        stop, received, said = threading.Event(), [], []
        with _stop_signals(stop, received, said.append):
            signal.raise_signal(signum)
            signal.raise_signal(signum)  # the same stop: no KeyboardInterrupt
            assert stop.is_set() and said == [signum] and received == [signum, signum]
        signal.signal(signum, signal.SIG_IGN)  # started under nohup: the signal stays ignored
        ignored = threading.Event()
        with _stop_signals(ignored, [], said.append):
            signal.raise_signal(signum)
        assert not ignored.is_set() and signal.getsignal(signum) == signal.SIG_IGN
    finally:
        signal.signal(signum, before)


class _SignalledWorkers(ScriptedWorkers):
    """Scripted workers that send this process `signals` while the first step trains."""

    def __init__(self, *signals: int):
        super().__init__(seed=11)
        self.signals = list(signals)

    async def train_step(self, samples):
        for s in self.signals:
            signal.raise_signal(s)
            await asyncio.sleep(0)
        self.signals = []
        return await super().train_step(samples)


@pytest.mark.parametrize("times", [1, 2])
def test_sigterm_checkpoints_and_exits_143_without_the_evaluation(times, tmp_path, monkeypatch):
    """A scheduler's SIGTERM: the step in flight finishes and is saved, the held-out evaluation (minutes)
    is skipped, and the exit status says why; a second SIGTERM stops at once. Either way the message says
    how to go on, and the driver's handler is put back."""
    from typer.testing import CliRunner

    import vivace.cli_train as cli_train
    import vivace.rl.workers as workers
    from vivace.cli import app

    monkeypatch.setattr(workers, "LocalWorkers", lambda cfg: _SignalledWorkers(*[signal.SIGTERM] * times))
    monkeypatch.setattr(cli_train, "SAME_STOP_S", 0.0)  # the second SIGTERM stands for one sent seconds later
    config = tmp_path / "cfg.json"
    config.write_text(json.dumps({"train": {"steps": 4, "tasks_per_step": 2, "group_size": 3, "checkpoint_every": 100,
                                            "eval_tasks": 2, "runs_dir": str(tmp_path / "runs")}}))  # fmt: skip

    def unhandled(signum, frame):  # without the CLI's handler the run goes on: the asserts fail, pytest lives
        pass

    before = signal.signal(signal.SIGTERM, unhandled)
    args = ["train", "--local", "--preset", "smoke", "--config", str(config), "--backend", "plain", "--name", "t"]
    try:
        result = CliRunner().invoke(app, args)
        assert signal.getsignal(signal.SIGTERM) is unhandled
    finally:
        signal.signal(signal.SIGTERM, before)
    assert result.exit_code == 143, result.output
    checkpoints = sorted(p.name for p in (tmp_path / "runs" / "t" / "checkpoints").glob("step_*"))
    if times == 1:
        assert "stopped by SIGTERM" in result.output and "--resume" in result.output
        assert checkpoints == ["step_1"] and not (tmp_path / "runs" / "t" / "eval").exists()
        summary = json.loads((tmp_path / "runs" / "t" / "summary.json").read_text())
        assert summary["stopped_by"] == "interrupted" and summary["steps"] == 1
    else:
        assert "stopped:" in result.output and "no checkpoint was written" in result.output and not checkpoints
        assert "--resume" in result.output  # what to run next, as after any other stop


def test_handlers_a_block_installs_are_undone():
    """ray.init, inside `signal_handler`, installs its own SIGTERM handlers in the driver (an exit, and a
    C++ stack dump); afterwards the handler the process had is back, so the CLI's graceful stop runs."""
    from vivace.signals import signal_handler

    def ours(signum, frame):
        pass

    before = signal.signal(signal.SIGTERM, ours)
    try:
        with signal_handler(signal.SIG_IGN, (signal.SIGTERM,)):
            signal.signal(signal.SIGTERM, lambda s, f: sys.exit(s))  # what ray.init does
        assert signal.getsignal(signal.SIGTERM) is ours
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # started ignored: left ignored, and restored so
        with signal_handler(ours, (signal.SIGTERM,)):
            assert signal.getsignal(signal.SIGTERM) == signal.SIG_IGN
            signal.signal(signal.SIGTERM, lambda s, f: sys.exit(s))
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGTERM, before)


def test_train_decides_the_sandbox_once_and_warns_in_the_driver(monkeypatch, capsys, tmp_path):
    """Rollout actors' output is not forwarded, so the driver decides isolated vs plain and says so."""
    import vivace.cli_train as cli_train
    import vivace.sandbox.isolated as isolated
    from vivace.sandbox.base import BackendUnavailable

    def unavailable(config):
        raise BackendUnavailable("isolated sandbox unavailable: the isolated backend needs root")

    monkeypatch.setattr(isolated, "IsolatedBackend", unavailable)
    with pytest.warns(RuntimeWarning, match="NOT isolated"):
        chosen = cli_train._sandbox_here(load_preset("smoke", sandbox={"state_dir": str(tmp_path / "state")}))
    assert chosen == "plain"
    said = capsys.readouterr().err
    assert "needs root" in said and "NOT isolated" in said


def test_a_joined_clusters_node_that_cannot_isolate_is_named_in_the_driver(monkeypatch, tmp_path):
    """On a joined cluster each node decides `auto` for itself, and a fallback's warning stays in that
    worker's log: the driver says which node runs commands unisolated and why, once per node, also for
    a worker that replaces a dead one."""
    from types import SimpleNamespace

    import vivace.sandbox.isolated as isolated
    from vivace.rl.workers import RayWorkers, _RolloutActor

    monkeypatch.setattr(isolated, "probe", lambda: "the isolated backend needs root")
    cfg = load_preset("smoke", sandbox={"backend": "auto", "state_dir": str(tmp_path / "state")})
    with pytest.warns(RuntimeWarning, match="NOT isolated"):
        unisolated = _RolloutActor(cfg, None)
    node, why = unisolated.where()
    assert node and "needs root" in why

    def handle(answer):
        async def where():
            return answer

        return SimpleNamespace(where=SimpleNamespace(remote=where))

    notes: list[str] = []
    workers = RayWorkers(cfg, on_note=notes.append)
    asyncio.run(workers._note_unisolated([handle(("10.0.0.7", why)), handle(("10.0.0.8", None)),
                                          handle(("10.0.0.7", why))]))  # fmt: skip
    assert len(notes) == 1 and "10.0.0.7" in notes[0] and "NOT isolated" in notes[0] and "needs root" in notes[0]
    asyncio.run(workers._note_unisolated([handle(("10.0.0.7", why))]))  # a replacement on the same node
    assert len(notes) == 1
    asyncio.run(unisolated.close())


def test_the_local_ray_cluster_is_started_out_of_ctrl_c_and_sigterm_reach():
    """Processes started under `blocked_in_children` (Ray's daemons and actors) inherit SIGINT and SIGTERM
    blocked, so a terminal's Ctrl-C or a job-wide SIGTERM (`timeout`, Slurm) cannot reach them even where
    they install a handler of their own (Ray's catch SIGTERM; the old ignored disposition did not survive
    that). The driver loses nothing: a signal that arrives meanwhile runs its handler by the block's end,
    and a handler installed inside the block (ray.init's) is undone first."""
    from vivace.signals import blocked_in_children

    # The child installs its own SIGTERM handler, as Ray's processes do, then says whether it is blocked.
    code = (
        "import signal, sys; signal.signal(signal.SIGTERM, lambda *a: print('caught', flush=True)); "
        "print(*(s in signal.pthread_sigmask(signal.SIG_BLOCK, []) for s in (signal.SIGINT, signal.SIGTERM)), "
        "flush=True); sys.stdin.readline()"
    )
    got = []
    before = [signal.signal(signal.SIGINT, lambda s, f: got.append(s)), signal.signal(signal.SIGTERM, signal.SIG_DFL)]
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    try:
        with blocked_in_children():
            child = subprocess.Popen(
                [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
            )
            signal.signal(signal.SIGTERM, lambda s, f: got.append("ray's"))  # as ray.init does
            # A Ctrl-C while Ray starts, sent to this thread: os.kill's process-wide signal may go to any
            # thread that an earlier test left alive with SIGINT unblocked.
            signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
        assert got == [signal.SIGINT]  # handled, by the driver's own handler, no later than the block's end
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # ray.init's handler undone
        assert signal.pthread_sigmask(signal.SIG_BLOCK, []) == mask
        assert child.stdout.readline() == "True True\n"
        child.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        assert child.poll() is None  # neither killed nor interrupted: the signal waits, blocked
        child.communicate("\n", timeout=10)
        assert child.returncode == 0
        after = subprocess.run([sys.executable, "-c", code], input="\n", capture_output=True, text=True)
        assert after.stdout == "False False\n"
    finally:
        signal.signal(signal.SIGINT, before[0])
        signal.signal(signal.SIGTERM, before[1])


def test_replay_brings_back_split_tasks_and_resumes_the_same():
    """train.replay: a task whose group split on success comes back (oldest first) at about the
    replay share of positions, one that all failed or all solved does not, fresh tasks keep their
    seeded order, and a TaskOrder rebuilt from its state hands out what the original would."""
    from vivace.rl.controller import TaskOrder

    pool = tasks(40)
    assert [TaskOrder(pool, 3).at(p).id for p in range(40)] == [
        TaskOrder(pool, 3, replay=0.0).at(p).id for p in range(40)
    ]

    order = TaskOrder(pool, 3, replay=0.5)
    replayed, fresh = [], []
    for p in range(36):  # fewer fresh tasks than the pool: no task comes back by a new epoch
        task = order.at(p)
        split = int(task.id[1:]) % 3 == 0  # these tasks split every time; the others never do
        (replayed if order.report(p, [True, False] if split else [False, False]) else fresh).append(task.id)
    assert replayed and all(int(t[1:]) % 3 == 0 for t in replayed)
    assert max(replayed.count(t) for t in replayed) <= 3  # replay_limit
    assert len(set(fresh)) == len(fresh) and 8 <= len(replayed) <= 24  # about half, once the queue fills
    assert [t.id for t in (TaskOrder(pool, 3)._fresh(i) for i in range(len(fresh)))] == fresh

    # Resume: positions handed out but not reported, the queue and the fresh count survive.
    a = TaskOrder(pool, 5, replay=0.5)
    for p in range(20):
        a.at(p)
        if p < 15:
            a.report(p, [True, False])
    b = TaskOrder(pool, 5, replay=0.5, state=json.loads(json.dumps(a.state())))
    assert [b.at(p).id for p in range(15, 30)] == [a.at(p).id for p in range(15, 30)]


@pytest.mark.parametrize("case", ["config-is-a-directory", "sft-data-missing", "sft-data-truncated",
                                  "suite-file-empty", "no-tasks-in-split", "model-not-a-checkpoint"])  # fmt: skip
def test_train_refuses_bad_inputs_before_making_the_run_directory(case, tmp_path):
    """Inputs the run could not use stop it at once with exit 2 and the file named, not with a traceback
    from the trainer or the task order after an empty run directory was made."""
    from typer.testing import CliRunner

    from vivace.cli import app
    from vivace.tasks.format import save_jsonl

    suite, sft, config = tmp_path / "one.jsonl", tmp_path / "sft.jsonl", tmp_path / "cfg.json"
    save_jsonl(tasks(1), suite)  # a task of the train split
    sft.write_text('{"ids": [1, 2, 3], "loss_mask": [0, 1, 1]}\n{"ids": [1, 2\n')
    train = {"suite": str(suite), "families": None, "runs_dir": str(tmp_path / "runs"), "eval_tasks": 0}
    said = {
        "config-is-a-directory": "cannot read it",
        "sft-data-missing": f"{tmp_path / 'nope.jsonl'}: train.sft_data does not exist",
        "sft-data-truncated": f"{sft}:2: not JSON",
        "suite-file-empty": "no tasks",
        "no-tasks-in-split": "no tasks in split 'test'",
        "model-not-a-checkpoint": "has no tokenizer",
    }[case]
    if case == "config-is-a-directory":
        config.mkdir()
    else:
        train |= {
            "sft-data-missing": {"sft_data": str(tmp_path / "nope.jsonl")},
            "sft-data-truncated": {"sft_data": str(sft)},
            "suite-file-empty": {"suite": str(tmp_path / "empty.jsonl")},
            "no-tasks-in-split": {"split": "test"},
            "model-not-a-checkpoint": {"model": str(tmp_path)},
        }[case]
        (tmp_path / "empty.jsonl").write_text("\n")
        config.write_text(json.dumps({"train": train}))
    result = CliRunner().invoke(app, ["train", "--local", "--config", str(config), "--backend", "plain"])
    assert result.exit_code == 2 and said in result.output and "Traceback" not in result.output, result.output
    assert not (tmp_path / "runs").exists()


def _train_joining(tmp_path, monkeypatch, address: str, init):
    """`vivace train --address ADDRESS` with `ray.init` replaced by `init`."""
    import ray
    from typer.testing import CliRunner

    from vivace.cli import app

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", init)
    config = tmp_path / "cfg.json"
    config.write_text(json.dumps({"train": {"eval_tasks": 0, "runs_dir": str(tmp_path / "runs")}}))
    args = ["train", "--preset", "smoke", "--config", str(config), "--backend", "plain", "--address", address]
    return CliRunner().invoke(app, args)


@pytest.mark.parametrize("address", ["127.0.0.1:{closed}", "nosuchhost.invalid:6379"])
def test_an_address_nothing_answers_on_is_refused_at_once(address, tmp_path, monkeypatch):
    """Ray's join retries a closed or unresolvable address for many minutes; the run checks it first."""
    from vivace.rl.workers import _free_port

    def init(**kwargs):
        raise AssertionError("ray.init was called on an address nothing answers on")

    address = address.format(closed=_free_port())
    result = _train_joining(tmp_path, monkeypatch, address, init)
    said = " ".join(result.output.split())
    assert result.exit_code == 2 and f"cannot reach the Ray cluster at {address}" in said, result.output
    assert not (tmp_path / "runs").exists()


def test_a_cluster_that_refuses_the_join_is_named_not_taken_for_a_write_error(tmp_path, monkeypatch):
    """ray.init's ConnectionError (a wrong token, another Ray version) is an OSError: it must not read as
    'cannot write runs/NAME'."""
    import socket

    def init(**kwargs):
        raise ConnectionError(f"Failed to connect to Ray cluster at {kwargs['address']}")

    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        address = f"127.0.0.1:{listener.getsockname()[1]}"
        result = _train_joining(tmp_path, monkeypatch, address, init)
    said = " ".join(result.output.split())
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert f"cannot join the Ray cluster at {address}" in said and "RAY_AUTH_MODE=token" in said
    assert "cannot write" not in said


def test_paths_the_actors_open_are_absolute_for_a_cluster_running_elsewhere(tmp_path, monkeypatch):
    """A joined cluster's actors run in its `ray start` directory, not the driver's: a relative model,
    sft_data, state_dir or toolchain path would name something else there."""
    from vivace.rl.workers import _for_actors

    monkeypatch.chdir(tmp_path)
    (tmp_path / "ckpt").mkdir()
    cfg = load_preset("smoke", train={"model": "ckpt", "sft_data": "sft.jsonl"},
                      sandbox={"state_dir": "state", "toolchain": ["."]})  # fmt: skip
    sent = _for_actors(cfg)
    assert sent.train.model == str(tmp_path / "ckpt") and sent.train.sft_data == tmp_path / "sft.jsonl"
    assert sent.sandbox.state_dir == tmp_path / "state" and sent.sandbox.toolchain == [tmp_path]
    assert cfg.train.model == "ckpt" and cfg.sandbox.state_dir == Path("state")  # the run's config stays as given
    assert _for_actors(load_preset("smoke")).train.model == "tiny"


# ---- `vivace train` and `--resume` from the command line: stops, refusals, locks, write errors ----


def _cli_run(tmp_path, monkeypatch, *args, workers=None, steps=2):
    """`vivace train --local` on scripted workers (`workers()` makes them); the run is runs/t."""
    from typer.testing import CliRunner

    import vivace.rl.workers as rl_workers
    from vivace.cli import app

    monkeypatch.setattr(rl_workers, "LocalWorkers", lambda cfg: (workers or (lambda: ScriptedWorkers(seed=12)))())
    config = tmp_path / "cfg.json"
    config.write_text(json.dumps({"train": {"steps": steps, "tasks_per_step": 2, "group_size": 3,
                                            "checkpoint_every": 100, "eval_tasks": 0,
                                            "runs_dir": str(tmp_path / "runs")}}))  # fmt: skip
    base = ["train", "--local", "--backend", "plain"]
    if "--resume" not in args:
        base += ["--preset", "smoke", "--config", str(config), "--name", "t"]
    before = signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal
    try:
        return CliRunner().invoke(app, [*base, *args])
    finally:
        signal.signal(signal.SIGINT, before)


def test_ctrl_c_says_where_the_run_stopped_and_exits_130(tmp_path, monkeypatch):
    """One Ctrl-C: the step in flight is saved, and the run says the step, the checkpoint and the exact
    resume command, with 130 (not 0: the run did not reach its steps)."""
    result = _cli_run(tmp_path, monkeypatch, workers=lambda: _SignalledWorkers(signal.SIGINT), steps=4)
    run_dir = (tmp_path / "runs" / "t").resolve()
    assert result.exit_code == 130, result.output
    assert "stopped by Ctrl-C at step 1/4" in result.output and str(run_dir / "checkpoints" / "step_1") in result.output
    assert f"`vivace train --resume {run_dir}`" in result.output
    assert json.loads((run_dir / "summary.json").read_text())["stopped_by"] == "interrupted"


@pytest.mark.parametrize("option", [["--preset", "tiny"], ["--config", "cfg.json"], ["--name", "other"]])
def test_resume_refuses_options_that_its_config_json_overrides(option, tmp_path, monkeypatch):
    assert _cli_run(tmp_path, monkeypatch).exit_code == 0
    option = [str(tmp_path / o) if o == "cfg.json" else o for o in option]
    result = _cli_run(tmp_path, monkeypatch, "--resume", str(tmp_path / "runs" / "t"), *option)
    assert result.exit_code == 2, result.output
    assert f"{option[0]} cannot be given with --resume" in result.output and "config.json" in result.output
    assert "--steps and --seed" in result.output


def test_resume_of_a_complete_run_touches_nothing_and_steps_extend_it(tmp_path, monkeypatch):
    """A finished run resumed again says so and exits 0 before making workers or writing a file;
    --steps extends it and is saved, so the plain resume command then finds it complete."""
    assert _cli_run(tmp_path, monkeypatch).exit_code == 0
    run_dir = tmp_path / "runs" / "t"
    files = {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}

    def no_workers():
        raise AssertionError("workers were made for a complete run")

    result = _cli_run(tmp_path, monkeypatch, "--resume", str(run_dir), workers=no_workers)
    assert result.exit_code == 0 and "run already complete at step 2 (give --steps M to extend)" in result.output
    assert {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()} == files
    result = _cli_run(tmp_path, monkeypatch, "--resume", str(run_dir), "--steps", "3")
    assert result.exit_code == 0, result.output
    assert "from step 2" in result.output
    assert json.loads((run_dir / "config.json").read_text())["train"]["steps"] == 3
    assert json.loads((run_dir / "summary.json").read_text())["steps"] == 3
    result = _cli_run(tmp_path, monkeypatch, "--resume", str(run_dir), workers=no_workers)
    assert result.exit_code == 0 and "run already complete at step 3" in result.output


def test_resume_says_when_it_restarts_from_step_0(tmp_path, monkeypatch):
    assert _cli_run(tmp_path, monkeypatch).exit_code == 0
    run_dir = tmp_path / "runs" / "t"
    import shutil

    shutil.rmtree(run_dir / "checkpoints")
    (run_dir / "checkpoints" / "step_1").mkdir(parents=True)  # a save cut off before its state.json
    result = _cli_run(tmp_path, monkeypatch, "--resume", str(run_dir))
    assert result.exit_code == 0, result.output
    assert "from step 0" in result.output and "incomplete" in result.output


def test_resume_after_a_kill_mid_append_to_metrics(tmp_path, monkeypatch):
    """A run killed while appending a step's metrics line leaves it cut short: resuming raised
    JSONDecodeError (and the report's curves too). The cut line goes; the rest is kept."""
    assert _cli_run(tmp_path, monkeypatch).exit_code == 0
    run_dir = tmp_path / "runs" / "t"
    with (run_dir / "metrics.jsonl").open("a") as f:
        f.write('{"step": 3, "rew')
    result = _cli_run(tmp_path, monkeypatch, "--resume", str(run_dir), "--steps", "3")
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert json.loads((run_dir / "summary.json").read_text())["steps"] == 3


def test_a_second_process_on_the_same_run_is_refused_naming_the_holder(tmp_path, monkeypatch):
    import fcntl

    assert _cli_run(tmp_path, monkeypatch).exit_code == 0
    run_dir = tmp_path / "runs" / "t"
    with (run_dir / ".lock").open("w") as held:  # another process's lock (flock is per open file)
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        held.write("4242")
        held.flush()
        result = _cli_run(tmp_path, monkeypatch, "--resume", str(run_dir), "--steps", "3")
        assert result.exit_code == 2 and "pid 4242" in result.output, result.output
        assert json.loads((run_dir / "config.json").read_text())["train"]["steps"] == 2  # nothing changed
    assert _cli_run(tmp_path, monkeypatch, "--resume", str(run_dir), "--steps", "3").exit_code == 0


class _DiskFullWorkers(ScriptedWorkers):
    async def save(self, path: Path):
        import errno

        raise OSError(errno.ENOSPC, "No space left on device", str(path / "model"))


def test_a_write_error_ends_the_run_with_one_line_saying_how_to_resume(tmp_path, monkeypatch):
    result = _cli_run(tmp_path, monkeypatch, workers=lambda: _DiskFullWorkers(seed=12))
    run_dir = (tmp_path / "runs" / "t").resolve()
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    said = " ".join(result.output.split())
    assert "cannot write" in said and "No space left on device" in said and "last complete checkpoint is none" in said
    assert f"`vivace train --resume {run_dir}`" in said


class _ClusterLostWorkers(ScriptedWorkers):
    """Scripted workers whose cluster stops answering while the first step trains."""

    async def train_step(self, samples):
        self.cluster_lost = True
        return await super().train_step(samples)


def test_a_cluster_that_stops_answering_ends_the_run_with_its_checkpoint_and_the_resume_command(tmp_path, monkeypatch):
    """Ray's core ends a driver whose cluster is gone a minute later, from C++, saying nothing of the
    run: the run stops after the step in flight instead, saves it, skips the evaluation and says how to
    resume, exit 1."""
    result = _cli_run(tmp_path, monkeypatch, workers=lambda: _ClusterLostWorkers(seed=12), steps=4)
    run_dir = (tmp_path / "runs" / "t").resolve()
    said = " ".join(result.output.split())
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    assert "the Ray cluster is gone at step 1/4" in said and str(run_dir / "checkpoints" / "step_1") in said
    assert f"`vivace train --resume {run_dir}`" in said
    assert json.loads((run_dir / "summary.json").read_text())["stopped_by"] == "cluster_lost"


def test_cluster_watch_reports_an_outage_and_the_return(tmp_path):
    """A GCS whose port stops accepting is reported down after `failures` probes, once; back up when
    it accepts again."""
    import socket

    from vivace.rl.workers import ClusterWatch

    def listen(port=0):
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))
        s.listen()
        return s

    gcs = listen()
    port = gcs.getsockname()[1]
    changes: list[bool] = []
    watch = ClusterWatch(f"127.0.0.1:{port}", changes.append, interval_s=0.05, failures=3)
    try:
        time.sleep(0.4)
        assert changes == [] and watch.down_since is None
        gcs.close()
        deadline = time.monotonic() + 5
        while not changes and time.monotonic() < deadline:
            time.sleep(0.02)
        assert changes == [True] and watch.down_since is not None
        time.sleep(0.3)
        assert changes == [True]  # said once per outage
        gcs = listen(port)
        deadline = time.monotonic() + 5
        while len(changes) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert changes == [True, False] and watch.down_since is None
    finally:
        watch.close()
        gcs.close()


@pytest.mark.slow
def test_a_real_run_whose_gcs_dies_exits_1_with_the_resume_command_before_ray_would(tmp_path):
    """`vivace train` on a local Ray cluster whose GCS is killed after the first step: the driver says so,
    and exits 1 with the resume command in under a minute (Ray's core would end it at 60 s, silently)."""
    config = tmp_path / "cfg.json"
    config.write_text(json.dumps({"train": {"steps": 40, "runs_dir": str(tmp_path / "runs")},
                                  "sandbox": {"state_dir": str(tmp_path / "state")}}))  # fmt: skip
    cmd = [sys.executable, "-m", "vivace", "train", "--preset", "smoke", "--config", str(config), "--name", "g",
           "--backend", "plain"]  # fmt: skip
    log = tmp_path / "out.txt"
    with log.open("w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while "step 1/40" not in log.read_text() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(1)
        assert "step 1/40" in log.read_text(), log.read_text()
        gcs = subprocess.run(["pgrep", "-P", str(proc.pid), "-f", "gcs_server"], capture_output=True, text=True)
        assert gcs.stdout.split(), "no gcs_server child of the driver"
        killed = time.monotonic()
        for pid in gcs.stdout.split():
            os.kill(int(pid), signal.SIGKILL)
        rc = proc.wait(timeout=90)
        took = time.monotonic() - killed
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    said = " ".join(log.read_text().split())
    assert rc == 1 and took < 58, (rc, took, said)
    assert "the Ray cluster stopped answering" in said and "the Ray cluster is gone" in said
    assert f"vivace train --resume {(tmp_path / 'runs' / 'g').resolve()}" in said


def test_cluster_loss_ends_the_process_itself_before_ray_does(tmp_path, monkeypatch):
    """When the step in flight does not end within the grace (or Ray's shutdown hangs on the dead
    cluster), the driver exits 1 itself, saying how to resume; a cluster back in time cancels that."""
    import vivace.cli_train as cli_train

    exits: list[int] = []
    monkeypatch.setattr(cli_train._ClusterLoss, "GRACE_S", 0.1)
    cfg = load_preset("smoke")
    loss = cli_train._ClusterLoss(tmp_path, cfg, exit_now=exits.append)
    loss(True)
    loss(False)
    time.sleep(0.3)
    assert exits == []
    loss(True)
    time.sleep(0.3)
    assert exits == [1] and loss.said


def test_resume_refuses_a_directory_it_cannot_write(tmp_path, monkeypatch):
    import errno
    import tempfile

    assert _cli_run(tmp_path, monkeypatch).exit_code == 0

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(tempfile, "TemporaryFile", read_only)
    result = _cli_run(tmp_path, monkeypatch, "--resume", str(tmp_path / "runs" / "t"), "--steps", "3")
    assert result.exit_code == 2 and "Read-only file system" in result.output, result.output


def test_state_json_and_metrics_are_whole_or_untouched_when_a_write_is_cut(tmp_path, monkeypatch):
    """A kill between writing and renaming leaves no truncated state.json (latest_checkpoint would take
    it) and the old metrics.jsonl, not part of it."""
    import vivace.files as files
    import vivace.rl.controller as controller
    import vivace.rl.runs as runs

    class Order:
        def state(self):
            return {}

    class Pipe:
        position = 0

        def pending_positions(self):
            return []

    def killed(src, dst):
        raise KeyboardInterrupt

    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps({"step": i}) + "\n" for i in (1, 2, 3)))
    monkeypatch.setattr(files.os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        asyncio.run(controller._checkpoint(tmp_path, ScriptedWorkers(), 1, Pipe(), Order()))
    assert runs.latest_checkpoint(tmp_path) is None
    with pytest.raises(KeyboardInterrupt):
        controller._truncate_metrics(tmp_path, 1)
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 3
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file()) == ["metrics.jsonl", "rng.pt"]


async def test_bench_pipeline_leaves_no_workspaces_behind(tmp_path, monkeypatch):
    """The backend it opened to take the snapshot was never closed: the next vivace command swept its
    owner directory as a dead process's (docs audit)."""
    import os

    import vivace.rl.bench as rl_bench
    from vivace.config import VivaceConfig

    async def no_training(*args, **kwargs):
        return {}

    monkeypatch.setattr(rl_bench, "train", no_training)
    monkeypatch.setattr(rl_bench, "measure", lambda run_dir, rows: {"trajectories_per_min": 1.0})
    cfg = VivaceConfig()
    cfg.sandbox.backend, cfg.sandbox.state_dir = "plain", tmp_path / "state"
    await rl_bench.bench_pipeline(cfg, tmp_path / "work", modes=["sync"], median_s=0.01, sigma=0.1, turns=(1, 1),
                                  local=True)  # fmt: skip
    owners = os.listdir(tmp_path / "state" / "owners")
    assert not [o for o in owners if o.startswith(f"{os.getpid()}-")], owners


def test_resume_after_the_base_checkpoint_moved_says_so(tmp_path, monkeypatch):
    """A run of a user's own checkpoint, resumed after that directory moved: it said the path "has no
    tokenizer", though the path did not exist at all."""
    assert _cli_run(tmp_path, monkeypatch).exit_code == 0
    config = tmp_path / "runs" / "t" / "config.json"
    saved = json.loads(config.read_text())
    saved["train"]["model"] = str(tmp_path / "moved-away")
    config.write_text(json.dumps(saved))
    result = _cli_run(tmp_path, monkeypatch, "--resume", str(tmp_path / "runs" / "t"), "--steps", "3")
    said = " ".join(result.output.split())
    assert result.exit_code == 2 and f"is gone from {tmp_path / 'moved-away'}: put it back there" in said, said
