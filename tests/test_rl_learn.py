"""RL end to end: the loop learns on a synthetic environment (and does not with the sign of the
advantage flipped); `vivace train` runs and resumes after SIGKILL with the same data order."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import wait_for_idle_ray
from vivace.config import load_preset
from vivace.rl.controller import train
from vivace.rl.runs import new_run_dir
from vivace.rl.synthetic import second_turn_episode, synthetic_episode
from vivace.rl.workers import LocalWorkers
from vivace.sandbox import open_backend
from vivace.tasks.format import RepoSpec, Task, TestSpec

VIVACE = [sys.executable, "-c", "from vivace.cli import main; main()"]


def synthetic_tasks(repo) -> list[Task]:
    requests = ["Look at the code and tell me what it does.", "Find where the value is computed.",
                "Read main.py, please.", "What does helper() return?"]  # fmt: skip
    return [
        Task(id=f"synthetic-{i}", repo=RepoSpec(path=str(repo)), request=r,
             tests=TestSpec(command="true", fail_to_pass=["t::a"], pass_to_pass=[]))
        for i, r in enumerate(requests)
    ]  # fmt: skip


async def learn(
    tmp_path, sign: float, steps: int, temperature: float = 1.0, turn: int = 1, group_size: int = 8
) -> list[dict]:
    """`turn` 1: reward for a tool call in the first turn; 2: in the second (the first one's imposed)."""
    repo = tmp_path / f"repo{sign}-{turn}"
    repo.mkdir()
    (repo / "main.py").write_text("def helper():\n    return 42\n")
    cfg = load_preset("smoke", agent={"max_turns": turn, "max_turn_tokens": 24},
                      train={"model": "tiny-init", "tasks_per_step": 2, "group_size": group_size, "steps": steps, "lr": 3e-3,
                             "checkpoint_every": steps, "runs_dir": str(tmp_path / "runs"), "rollout_concurrency": 16,
                             # the rewarded call is the untrained model's (cut off at 24 tokens): keep its tokens
                             "mask_malformed": False},
                      engine={"temperature": temperature},
                      sandbox={"backend": "plain", "state_dir": str(tmp_path / "state")})  # fmt: skip
    snapshot = open_backend(cfg.sandbox).snapshot(str(repo))
    rows: list[dict] = []
    run_dir = new_run_dir(cfg, f"learn{sign}-{turn}")
    episode = synthetic_episode(snapshot, sign=sign) if turn == 1 else second_turn_episode(snapshot, sign=sign)
    await train(cfg, run_dir, tasks=synthetic_tasks(repo), episode=episode, on_step=rows.append,
                workers=LocalWorkers(cfg, episode))  # fmt: skip
    return rows


@pytest.mark.slow
@pytest.mark.parametrize("turn", [1, 2], ids=["first_turn", "later_turn"])
async def test_policy_learns_and_flipped_sign_does_not(tmp_path, turn):
    """The reward is for a tool call in the first turn, or in the second behind an imposed call and its
    tool result (the shape of every agent episode: credit must reach a later turn's tokens)."""
    # At the untrained model's ~4% rate a group of 8 holds a success 28% of the time, and 2 of 5 runs at 8
    # never took off within 25 steps; a group of 16 holds one 48% of the time.
    steps = 25
    up = await learn(tmp_path, 1.0, steps, turn=turn, group_size=16)
    down = await learn(tmp_path, -1.0, steps, turn=turn, group_size=16)

    def rate(rows, part):  # how often the rewarded turn called a tool (correctness = the unsigned reward)
        chunk = rows[:5] if part == "first" else rows[-5:]
        return sum(r["reward_correctness"] for r in chunk) / len(chunk)

    print(
        json.dumps(
            {"learn": [rate(up, "first"), rate(up, "last")], "flipped": [rate(down, "first"), rate(down, "last")]}
        )
    )
    assert rate(up, "last") >= rate(up, "first") + 0.3
    # The flipped sign can only push a ~4% rate down, towards 0: of 160 episodes a few more or fewer is
    # noise (0.031 -> 0.044 happened once), not learning, which the first assertion sees as +0.3.
    assert rate(down, "last") <= rate(down, "first") + 0.05
    assert all(abs(r.get("kl_sampler_trainer_k1", 0.0)) < 1e-3 for r in up)  # sampler and trainer agree on CPU


async def test_trainer_scores_tokens_at_the_sampling_temperature(tmp_path):
    """Sampled at T=0.5, the sampler's logprobs are of logits/T; the trainer must compute the same
    distribution, or every importance weight is off by the temperature."""
    rows = await learn(tmp_path, 1.0, steps=3, temperature=0.5)
    trained = [r for r in rows if "kl_sampler_trainer_k1" in r]  # steps whose groups all tied train nothing
    assert trained and all(abs(r["kl_sampler_trainer_k1"]) < 1e-3 and r["is_weight_mean"] > 0.99 for r in trained)


def test_train_command_smoke(tmp_path):
    config = tmp_path / "c.json"
    # sft_expert: the expert's episodes for the supervised term are recorded before the first step. On the
    # learnable families (the tiny preset's suite) they are short; on the bundled suite each is ~7k tokens,
    # ~7 s of a step's training on 2 cores.
    config.write_text(json.dumps({"agent": {"max_turns": 2, "max_turn_tokens": 32},
                                  "train": {"runs_dir": str(tmp_path / "runs"), "suite": "families", "sft_expert": 2}}))  # fmt: skip
    run = subprocess.run([*VIVACE, "train", "--preset", "smoke", "--config", str(config), "--name", "s",
                          "--state-dir", str(tmp_path / "state"), "--local", "--json"],
                         capture_output=True, text=True, timeout=600)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    lines = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    assert [r["step"] for r in lines[:-1]] == [1, 2] and "summary" in lines[-1]
    run_dir = tmp_path / "runs" / "s"
    for name in ("config.json", "metrics.jsonl", "summary.json", "trajectories/step_1.jsonl",
                 "checkpoints/step_2/model/model.safetensors", "checkpoints/step_2/trainer.pt"):  # fmt: skip
        assert (run_dir / name).is_file(), name
    assert any((run_dir / "tensorboard").glob("events.out.tfevents.*"))
    assert "recording the expert on 2 training tasks" in run.stderr and (run_dir / "expert.jsonl").is_file()
    row = lines[0]
    for key in ("reward_mean", "success_rate", "weight_sync_s", "weight_sync_bytes", "sampling_tokens_per_s",
                "episode_s_p50", "episode_s_p99", "agent_tool_calls_per_turn", "groups_zero_variance", "solved_truncated"):  # fmt: skip
        assert key in row, key
    assert row["weight_sync_bytes"] > 1e6
    again = subprocess.run([*VIVACE, "train", "--preset", "smoke", "--config", str(config), "--name", "s"],
                           capture_output=True, text=True, timeout=120)  # fmt: skip
    assert again.returncode == 2 and "--resume" in again.stderr


@pytest.mark.slow
def test_resume_after_sigkill_keeps_the_data_order(tmp_path):
    config = tmp_path / "c.json"
    config.write_text(json.dumps({"agent": {"max_turns": 1, "max_turn_tokens": 16},
                                  "train": {"runs_dir": str(tmp_path / "runs"), "steps": 4, "tasks_per_step": 2,
                                            "checkpoint_every": 1}}))  # fmt: skip
    base = [
        *VIVACE,
        "train",
        "--preset",
        "smoke",
        "--config",
        str(config),
        "--state-dir",
        str(tmp_path / "st"),
        "--json",
    ]
    whole = subprocess.run([*base, "--name", "whole"], capture_output=True, text=True, timeout=900)
    assert whole.returncode == 0, whole.stderr[-2000:]
    proc = subprocess.Popen([*base, "--name", "cut"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    cut = tmp_path / "runs" / "cut"
    deadline = time.time() + 600
    while time.time() < deadline and not (cut / "checkpoints" / "step_2" / "state.json").exists():
        time.sleep(0.2)
    os.kill(proc.pid, signal.SIGKILL)  # during step 3 (or just after step 2's checkpoint)
    proc.wait()
    resumed = subprocess.run(
        [*VIVACE, "train", "--resume", str(cut), "--json"], capture_output=True, text=True, timeout=900
    )
    assert resumed.returncode == 0, resumed.stderr[-2000:]

    def order(run):
        return [[json.loads(line)["task_id"] for line in (tmp_path / "runs" / run / "trajectories" / f"step_{i}.jsonl").read_text().splitlines()]
                for i in range(1, 5)]  # fmt: skip

    assert order("cut") == order("whole")
    steps = [json.loads(line)["step"] for line in (cut / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4]
    rows = [json.loads(line) for line in (cut / "metrics.jsonl").read_text().splitlines()]
    assert all(r["weight_sync_bytes"] > 1e6 and r["weight_sync_s"] > 0 for r in rows)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("sync", "ranks"), [("object_store", 1), ("object_store", 2), ("broadcast", 1), ("broadcast", 2)]
)
async def test_ray_weight_sync_reaches_the_sampler(tmp_path, sync, ranks):
    """After every update the sampler actor must hold the trainer's weights: the next step's
    sampler logprobs then equal the trainer's (KL ~0) even with large updates. With two trainer ranks the
    broadcast streams each tensor as the ranks gather it; the object store gets the weights in 4 MB pieces
    (the tiny model's 37 MB in ~10), which every replica must load whole."""
    from vivace.rl.workers import RayWorkers

    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "main.py").write_text("def helper():\n    return 42\n")
    cfg = load_preset("smoke", agent={"max_turns": 1, "max_turn_tokens": 24},
                      # tiny-init: the shipped warm start calls a tool in every first turn (no group would split)
                      # 4 groups a step, 5 steps: tiny-init calls a tool in ~6% of first turns, so a group of 8
                      # splits ~40% of the time; with 2 groups and 4 steps, fewer than 2 steps trained in ~15% of runs
                      train={"model": "tiny-init", "tasks_per_step": 4, "group_size": 8, "steps": 5, "lr": 1e-2,
                             "weight_sync": sync, "trainer_ranks": ranks, "checkpoint_every": 4, "runs_dir": str(tmp_path / "runs"),
                             "mask_malformed": False},
                      sandbox={"backend": "plain", "state_dir": str(tmp_path / "state")})  # fmt: skip
    episode = synthetic_episode(open_backend(cfg.sandbox).snapshot(str(repo)))
    wait_for_idle_ray()  # the last case's actors: a run that waits for CPUs trains on fewer of its steps
    rows: list[dict] = []
    workers = RayWorkers(cfg, episode)
    workers.store_piece_bytes = 4 << 20
    await train(cfg, new_run_dir(cfg, f"{sync}{ranks}"), tasks=synthetic_tasks(repo), on_step=rows.append,
                workers=workers)  # fmt: skip
    trained = [r for r in rows if "kl_sampler_trainer_k1" in r]
    assert len(trained) >= 2 and all(r["grad_norm"] > 0 for r in trained)
    assert all(abs(r["kl_sampler_trainer_k1"]) < 1e-3 for r in trained), [r["kl_sampler_trainer_k1"] for r in trained]
    assert all(r["weight_sync_bytes"] > 1e6 for r in rows)
