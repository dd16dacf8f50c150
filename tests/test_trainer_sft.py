"""The trainer's supervised term (`train.sft_data`): expert episodes' cross-entropy added to each update,
so RL can keep the policy near its warm start's behaviour on data RL's tasks do not show."""

from __future__ import annotations

import json

import pytest
import torch

from vivace.config import TrainConfig
from vivace.rl.sft_train import SftDataError
from vivace.rl.trainer import Sample, Trainer


def write_episodes(path, n: int = 6, length: int = 48) -> None:
    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(7, 2000, (16,), generator=g).tolist()  # one system turn, as real episodes share
    with path.open("w") as f:
        for _ in range(n):
            reply = torch.randint(7, 2000, (length - 16,), generator=g).tolist()
            f.write(json.dumps({"ids": prompt + reply, "loss_mask": [0] * 16 + [1] * (length - 16)}) + "\n")


def test_supervised_term_fits_the_expert_episodes(tmp_path):
    data = tmp_path / "expert.jsonl"
    write_episodes(data, n=2)
    trainer = Trainer("tiny-init", TrainConfig(model="tiny-init", sft_data=data, sft_episodes=2, lr=3e-3))
    losses = [trainer.train_step([])["sft_loss"] for _ in range(8)]
    assert losses[-1] < 0.5 * losses[0], losses


def test_supervised_term_adds_to_the_policy_gradient(tmp_path):
    """The same rollouts give a different update with the expert term on than off."""
    data = tmp_path / "expert.jsonl"
    write_episodes(data, n=2)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(7, 2000, (40,), generator=g).tolist()
    rollout = Sample(ids, [0] * 10 + [1] * 30, [0.0] * 10 + [-7.0] * 30, [-1] * 10 + [0] * 30, 1.0)
    states = []
    for coef in (0.0, 1.0):
        trainer = Trainer("tiny-init", TrainConfig(model="tiny-init", sft_data=data, sft_coef=coef, lr=1e-3, seed=0))
        stats = trainer.train_step([rollout])
        assert ("sft_loss" in stats) == (coef > 0)
        states.append(trainer.full_state_dict())
    assert any(not torch.equal(states[0][k], states[1][k]) for k in states[0])


def test_expert_episodes_cycle_in_a_seeded_order_tied_to_the_step(tmp_path):
    """Every episode is visited once per cycle, and the step alone says where the cycle is (a resumed
    run continues it)."""
    data = tmp_path / "expert.jsonl"
    write_episodes(data, n=6)
    cfg = TrainConfig(model="tiny-init", sft_data=data, sft_episodes=2, micro_batch_tokens=64, seed=3)
    trainer = Trainer("tiny-init", cfg)
    seen = []
    for step in range(3):
        trainer.step = step
        seen += [id(e) for row in trainer._expert_rows() for e in row]
    assert sorted(seen) == sorted(id(e) for e in trainer.expert)
    trainer.step = 1
    again = Trainer("tiny-init", cfg)
    again.step = 1
    assert [e.ids for r in trainer._expert_rows() for e in r] == [e.ids for r in again._expert_rows() for e in r]


def test_an_update_takes_each_expert_episode_at_most_once(tmp_path):
    """More episodes asked per update than the file holds: each is taken once (a repeat would only add its
    gradient again, at the cost of another forward and backward)."""
    data = tmp_path / "expert.jsonl"
    write_episodes(data, n=2)
    trainer = Trainer("tiny-init", TrainConfig(model="tiny-init", sft_data=data, sft_episodes=4, micro_batch_tokens=64))
    for step in range(2):
        trainer.step = step
        assert sorted(id(e) for row in trainer._expert_rows() for e in row) == sorted(map(id, trainer.expert))


@pytest.mark.parametrize(
    "line, message",
    [("not json", "not JSON"), ('{"ids": [1, 99999]}', "outside the vocabulary"), ('{"ids": "x"}', '"ids"')],
)
def test_a_malformed_expert_file_fails_before_training(tmp_path, line, message):
    data = tmp_path / "expert.jsonl"
    data.write_text(line + "\n")
    with pytest.raises(SftDataError, match=message):
        Trainer("tiny-init", TrainConfig(model="tiny-init", sft_data=data))


def test_a_missing_expert_file_says_how_to_make_one(tmp_path):
    with pytest.raises(SftDataError, match="vivace sft data"):
        Trainer("tiny-init", TrainConfig(model="tiny-init", sft_data=tmp_path / "none.jsonl"))
