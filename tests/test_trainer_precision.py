"""The trainer in bf16 (`train.param_dtype`, FSDP2 mixed precision): its layers compute in bf16, while the
weights the optimizer updates, AdamW's state and what the sampler and checkpoints get stay fp32; and the
update points where the fp32 one does."""

from __future__ import annotations

import pytest
import torch

from vivace.config import TrainConfig
from vivace.model.checkpoint import load_model
from vivace.rl.trainer import Sample, Trainer


def _sample(advantage: float = 1.0) -> Sample:
    ids = list(range(50, 90))
    return Sample(ids, [0] * 10 + [1] * 30, [0.0] * 10 + [-7.0] * 30, [-1] * 10 + [0] * 30, advantage)


def _computes_in(trainer: Trainer) -> set[torch.dtype]:
    """The dtypes a decoder layer's projection produced during one step."""
    seen: set[torch.dtype] = set()
    hook = trainer.model.model.layers[0].self_attn.q_proj.register_forward_hook(lambda m, i, out: seen.add(out.dtype))
    trainer.train_step([_sample()])
    hook.remove()
    return seen


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_layers_compute_in_param_dtype_and_everything_kept_is_fp32(tmp_path, dtype):
    trainer = Trainer("tiny-init", TrainConfig(model="tiny-init", lr=1e-3, param_dtype=dtype))
    assert _computes_in(trainer) == {getattr(torch, dtype)}
    assert {p.dtype for p in trainer.model.parameters()} == {torch.float32}  # the shards the optimizer updates
    moments = [v for s in trainer.optimizer.state.values() for k, v in s.items() if k != "step"]
    assert moments and {v.dtype for v in moments} == {torch.float32}
    weights = trainer.full_state_dict()  # what the sampler receives
    assert {v.dtype for v in weights.values()} == {torch.float32}
    trainer.save(tmp_path / "step_1")
    saved = load_model(str(tmp_path / "step_1" / "model")).model.state_dict()
    assert all(saved[k].dtype == torch.float32 and torch.equal(saved[k], v) for k, v in weights.items())


def test_a_bf16_step_points_where_the_fp32_step_does():
    """One step from the same weights on the same rollouts: the bf16 update moves the weights in the fp32
    update's direction (cosine near 1), with a gradient norm within 2% of it."""
    start = {k: v.clone() for k, v in load_model("tiny-init").model.state_dict().items()}
    moves, norms = {}, {}
    for dtype in ("float32", "bfloat16"):
        trainer = Trainer("tiny-init", TrainConfig(model="tiny-init", lr=1e-3, param_dtype=dtype))
        norms[dtype] = trainer.train_step([_sample(1.0), _sample(-0.5)])["grad_norm"]
        after = trainer.full_state_dict()
        moves[dtype] = torch.cat([(after[k] - start[k]).flatten() for k in sorted(after)])
    assert moves["float32"].abs().max() > 1e-4  # the step moved the weights
    cosine = torch.nn.functional.cosine_similarity(moves["float32"], moves["bfloat16"], dim=0)
    assert cosine > 0.95, cosine  # 0.987 measured
    assert abs(norms["bfloat16"] / norms["float32"] - 1) < 0.02, norms  # 0.1% measured
