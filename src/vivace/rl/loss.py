"""The token-level clipped policy-gradient loss, with truncated importance sampling.

Per generated token t of a sequence with advantage A (the sequence's, on every token):

    w_t = min(exp(logp_old_t - logp_behav_t), is_cap)     sampler→trainer correction (no grad)
    r_t = exp(logp_t - logp_old_t)                         the update's ratio
    L_t = -w_t * min(r_t * A, clip(r_t, 1 - clip_low, 1 + clip_high) * A)  [+ kl_coef * KL_t]

`logp_behav` is what the sampler reported when it sampled the token (another implementation,
maybe older weights: bounded staleness); `logp_old` is the trainer's own logprob under the
weights the update starts from; `logp` carries the gradient. The two ratios split the two
sources of off-policyness: clipping bounds the update (PPO, with a larger upper range so rare
good tokens can grow: "clip-higher"), the truncated weight corrects the sampler/trainer
mismatch without letting one token's ratio explode. With one update per batch r_t = 1 and the
gradient is w_t * A * ∇logp_t.

Aggregation is token-level: the sum over every generated token of the batch divided by their
number, so long and short episodes weigh by their tokens. Only tokens with mask 1 count
(the model's own tokens; prompts and tool results are 0). KL to a reference policy uses the k3
estimator (non-negative, unbiased), off by default.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class LossConfig:
    clip_low: float = 0.2
    clip_high: float = 0.28
    is_cap: float = 2.0  # truncation of the sampler→trainer importance weight
    kl_coef: float = 0.0  # KL to the reference policy (k3); 0 = off


def policy_loss(
    logp: torch.Tensor,
    logp_old: torch.Tensor,
    logp_behav: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    cfg: LossConfig,
    n_tokens: int | None = None,
    logp_ref: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """All inputs are per token, same shape. Returns (loss, statistics over masked tokens).

    `n_tokens` is the denominator (the whole batch's generated tokens, when this call is one
    micro-batch of it); default: this call's masked tokens."""
    mask = mask.to(logp.dtype)
    denom = float(n_tokens if n_tokens is not None else max(mask.sum().item(), 1.0))
    weight = torch.exp(logp_old - logp_behav).clamp(max=cfg.is_cap).detach()
    ratio = torch.exp(logp - logp_old.detach())
    clipped = ratio.clamp(1 - cfg.clip_low, 1 + cfg.clip_high)
    per_token = -weight * torch.minimum(ratio * advantages, clipped * advantages)
    if cfg.kl_coef and logp_ref is not None:
        diff = logp_ref.detach() - logp
        per_token = per_token + cfg.kl_coef * (torch.exp(diff) - diff - 1)
    loss = (per_token * mask).sum() / denom
    with torch.no_grad():
        m = mask.bool()
        count = max(int(m.sum()), 1)
        gap = (logp_behav - logp_old)[m]
        stats = {
            "tokens": float(m.sum()),
            "clip_fraction": float(((ratio != clipped) & m).sum()) / count,
            "is_weight_mean": float(weight[m].mean()) if m.any() else 0.0,
            "is_truncated_fraction": float(((torch.exp(logp_old - logp_behav) > cfg.is_cap) & m).sum()) / count,
            # KL(sampler || trainer) on the sampled tokens: k1 = E[log p_s - log p_t], k3 = E[r - 1 - log r]
            "kl_sampler_trainer_k1": float(gap.mean()) if m.any() else 0.0,
            "kl_sampler_trainer_k3": float((torch.exp(-gap) - 1 + gap).mean()) if m.any() else 0.0,
        }
        if logp_ref is not None:  # how far training has moved from the reference (the KL penalty's k3)
            ref_gap = (logp_ref - logp)[m]
            stats["kl_reference_k3"] = float((torch.exp(ref_gap) - ref_gap - 1).mean()) if m.any() else 0.0
    return loss, stats
