"""Expert demonstrations in RL groups (`train.expert_weight`, rl/expert.py): the oracle's episode
joins a group with an advantage against the policy's mean reward, and the trainer imitates its
tokens with importance weight 1 (they were never sampled)."""

from __future__ import annotations

import math

import torch

from test_scoring import task  # noqa: F401  (the injected-bug fixture on conftest's sample repo)
from vivace.config import TrainConfig, load_preset
from vivace.harness.chat import ChatFormat
from vivace.model.checkpoint import load_tokenizer
from vivace.rl.expert import expert_samples
from vivace.rl.rollout import Rollout
from vivace.rl.trainer import Sample, Trainer
from vivace.sandbox import open_backend


def _failed(task_id: str, reward: float) -> Rollout:
    return Rollout(task_id, None, reward)


async def test_demonstration_teaches_where_the_policy_failed(task, state_dir):  # noqa: F811
    cfg = load_preset(
        "default", sandbox={"backend": "plain", "state_dir": str(state_dir)}, train={"expert_weight": 0.5}
    )
    chat = ChatFormat(load_tokenizer("tiny"))
    backend = open_backend(cfg.sandbox)
    broken = task.model_copy(update={"id": "broken", "reference_patch": task.reference_patch.replace("a + b", "a * b")})
    try:
        batch = [
            (task, [_failed(task.id, 0.0), _failed(task.id, -0.2)]),  # the policy failed: mean -0.1
            (task, [_failed(task.id, 5.0), _failed(task.id, 5.0)]),  # better than any oracle score
            (broken, [_failed("broken", 0.0)] * 2),  # its oracle does not solve it
        ]
        samples, counts = await expert_samples(batch, cfg, chat, backend, version=7)
    finally:
        await backend.aclose()
    assert counts["expert_samples"] == 1 and counts["expert_not_better"] == 1 and counts["expert_failed"] == 1
    (demo,) = samples
    assert 0.5 * 0.1 < demo.advantage <= 0.5 * (2.0 + 0.1)  # weight x (oracle's total - the group's mean)
    assert all(math.isnan(x) for x in demo.logprobs) and set(demo.versions) == {7}
    said = chat.decode([i for i, m in zip(demo.ids, demo.mask, strict=True) if m])
    assert "edit_file" in said and "a + b" in said  # the fix, as the policy would have to write it
    assert 0 < sum(demo.mask) < len(demo.ids) / 2  # only the assistant's tokens are trained


def test_trainer_imitates_unsampled_tokens_with_weight_one():
    trainer = Trainer("tiny", TrainConfig(lr=1e-3, micro_batch_tokens=256))
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(7, 2000, (60,), generator=g).tolist()
    mask = [0] * 20 + [1] * 40
    demo = Sample(ids, mask, [math.nan] * 60, [0] * 60, advantage=1.0)

    def logp() -> float:
        return float(trainer._logprobs_no_grad([demo])[id(demo)].sum())

    before = logp()
    stats = trainer.train_step([demo])
    assert stats["is_weight_mean"] == 1.0 and stats["kl_sampler_trainer_k1"] == 0.0
    assert math.isfinite(stats["loss"]) and math.isfinite(stats["grad_norm"])
    assert logp() > before + 1.0  # its tokens became more likely
