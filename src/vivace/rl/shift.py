"""How far training moved the policy, measured where it acts: on the episodes the starting policy sampled.

Held-out success can stay flat for two different reasons: the update changed the policy where it did
not matter, or it barely changed the policy at all. Success alone cannot tell them apart, so the RL
report also carries this measure. Both checkpoints are run teacher-forced over the token sequences of
the starting policy's held-out episodes, and at every token that policy sampled (loss_mask 1) the two
next-token distributions are compared, at the temperature the episodes were sampled at:

- `kl_mean`: KL(before ‖ after) in nats per sampled token (0 when nothing moved);
- `top_changed`: the share of those tokens where the most likely next token differs;
- `logprob_change`: the mean change in log-probability of the token that was sampled (negative:
  the trained policy is less likely to say what the starting one said).

Only checkpoints (`tiny` or a checkpoint directory) can be measured; for any other policy, or when no
episode has tokens, `policy_shift` returns None.

`divergence` needs no model: the benchmark seeds the paired episodes alike, so where the weights agree
the two policies sample the same tokens, and the first token where a pair differs is where the update
first changed what the policy did. Paired with the outcome counts it separates "the update changed the
episodes but not their outcome" from "the update changed nothing".
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Iterable
from typing import Any

import torch

from vivace.config import EngineConfig
from vivace.harness.trajectory import Trajectory
from vivace.inference.forward import RaggedForward, Segment


def divergence(pairs: Iterable[tuple[Trajectory, Trajectory]]) -> dict[str, Any] | None:
    """Over (before, after) episodes of the same task and seed: how many are token for token the same,
    and for the others the median number of tokens the starting policy sampled before the first
    difference. None when no pair has tokens on both sides."""
    same, before_split = 0, []
    for b, a in pairs:
        if b.tokens is None or a.tokens is None:
            continue
        first = next((i for i, (x, y) in enumerate(zip(b.tokens.ids, a.tokens.ids, strict=False)) if x != y), None)
        if first is None and len(b.tokens.ids) == len(a.tokens.ids):
            same += 1
        else:
            first = min(len(b.tokens.ids), len(a.tokens.ids)) if first is None else first
            before_split.append(sum(b.tokens.loss_mask[:first]))
    if not same and not before_split:
        return None
    return {"episodes": same + len(before_split), "identical": same,
            "sampled_before_divergence": statistics.median(before_split) if before_split else None}  # fmt: skip


def _load(spec: str, engine: EngineConfig):
    from vivace.inference.samplers import load_for_engine

    try:
        return load_for_engine(spec, engine).model  # as the engine that sampled the episodes loads it
    except ValueError:  # not a checkpoint: a scripted or remote policy
        return None


@torch.inference_mode()
def policy_shift(
    before: str, after: str, episodes: Iterable[Trajectory], engine: EngineConfig | None = None
) -> dict[str, Any] | None:
    """KL(before ‖ after), top-token changes and the sampled tokens' log-probability change, over the
    sampled tokens of `episodes` (the starting policy's own), both checkpoints loaded and compared as
    `engine` samples (device, dtype, temperature; 0 counts as 1). None when either policy is not a
    checkpoint or no episode has tokens."""
    engine = engine or EngineConfig()
    sequences = [e.tokens for e in episodes if e.tokens is not None and any(e.tokens.loss_mask[1:])]
    if not sequences:
        return None
    models = [_load(before, engine), _load(after, engine)]
    if None in models:
        return None
    if models[0].config.vocab_size != models[1].config.vocab_size:
        raise ValueError(
            f"{before!r} and {after!r} have different vocabularies; the shift compares one policy's checkpoints"
        )
    forwards = [RaggedForward(m) for m in models]  # as the engine computes what it samples
    t = engine.temperature or 1.0
    # The episodes open with the same system prompt (most of a short episode's tokens): run it once per
    # model and start every episode from a copy of its cache. It must end before any sampled token's
    # prediction, so it stops one token short of the earliest sampled token.
    first_sampled = min(s.loss_mask.index(1) for s in sequences)
    shared = max(0, min(len(os.path.commonprefix([s.ids for s in sequences])), first_sampled - 1))
    roots = []
    for f in forwards:
        roots.append(f.new_cache(shared))
        if shared:
            f(sequences[0].ids[:shared], [Segment(roots[-1], shared)])
    kl_sum, changed, delta_sum, tokens, kl_max = 0.0, 0, 0.0, 0, 0.0
    for seq in sequences:
        # row i of the episode's own tokens predicts token shared + i + 1: take the rows where that was sampled
        new = seq.ids[shared:-1]
        rows = [i for i, m in enumerate(seq.loss_mask[shared + 1 :]) if m]
        logp = []
        for f, root in zip(forwards, roots, strict=True):
            cache = f.new_cache(len(seq.ids))
            cache.copy_prefix(root, shared)
            logits = f(new, [Segment(cache, len(new))], logit_rows=rows)
            logp.append(torch.log_softmax(logits / t, dim=-1))
        kl = (logp[0].exp() * (logp[0] - logp[1])).sum(-1)
        sampled = torch.tensor([seq.ids[shared + 1 + i] for i in rows], device=kl.device)
        picked = [lp.gather(1, sampled[:, None])[:, 0] for lp in logp]
        kl_sum += float(kl.sum())
        kl_max = max(kl_max, float(kl.max()))
        changed += int((logp[0].argmax(-1) != logp[1].argmax(-1)).sum())
        delta_sum += float((picked[1] - picked[0]).sum())
        tokens += len(rows)
    return {
        "episodes": len(sequences),
        "tokens": tokens,
        "temperature": t,
        "kl_mean": kl_sum / tokens,
        "kl_max": kl_max,
        "top_changed": changed / tokens,
        "logprob_change": delta_sum / tokens,
    }
