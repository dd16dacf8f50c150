"""Choosing the next token for a batch of sequences, each with its own sampling parameters.

The logprob returned for a sampled token is under the temperature-scaled distribution, before
top-k/top-p truncation: `log_softmax(logits / T)`, and the raw `log_softmax(logits)` for greedy
(T = 0, or below MIN_TEMPERATURE) decoding. That is what a trainer recomputes from its own forward pass given the same
temperature, so sampler/trainer mismatch is measured like for like (T = 1: the model's own
distribution). `most_likely` reports the top alternatives from that same distribution (a sampled
token among them has its logprob there, to float rounding). Randomness comes from a
per-request generator when the request has a seed (so a seeded request gives the same tokens
whatever else is in the batch), else from the engine's.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from vivace.harness.policy import SamplingParams

# Below this (and above 0) sampling is greedy: 1/T overflows float32 near 1e-38 (NaN logprobs, and the
# last token id drawn every time), and well before that the distribution is one token anyway.
MIN_TEMPERATURE = 1e-4


def is_greedy(temperature: float) -> bool:
    return temperature < MIN_TEMPERATURE


def sample(
    logits: torch.Tensor, params: Sequence[SamplingParams], generators: Sequence[torch.Generator]
) -> tuple[list[int], list[float]]:
    """logits [B, V] (float32) -> (token per row, its logprob per row)."""
    greedy = torch.tensor([is_greedy(p.temperature) for p in params], device=logits.device)
    scaled = _scale(logits, params)
    logp = torch.log_softmax(scaled, dim=-1)
    filtered = _truncate(scaled, params)
    # Inverse-CDF sampling: one uniform number per row (cheap to draw from per-request generators).
    cdf = torch.cumsum(torch.softmax(filtered, dim=-1), dim=-1)
    u = torch.cat([torch.rand(1, generator=g) for g in generators]).to(logits.device)
    drawn = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None], right=True)[:, 0].clamp_(max=logits.shape[-1] - 1)
    tokens = torch.where(greedy, torch.argmax(logits, dim=-1), drawn)
    chosen = logp.gather(1, tokens[:, None])[:, 0]
    return tokens.tolist(), chosen.tolist()


def most_likely(
    logits: torch.Tensor, params: Sequence[SamplingParams], ks: Sequence[int]
) -> list[tuple[tuple[int, float], ...]]:
    """logits [B, V] -> per row, its `ks[row]` most likely (token, logprob), most likely first, under
    the distribution `sample` reports logprobs from (temperature-scaled, before top-k/top-p)."""
    logp = torch.log_softmax(_scale(logits, params), dim=-1)
    values, tokens = logp.topk(min(max(ks), logp.shape[-1]), dim=-1)
    values, tokens = values.tolist(), tokens.tolist()
    return [tuple(zip(tokens[i][:k], values[i][:k], strict=True)) for i, k in enumerate(ks)]


def _scale(logits: torch.Tensor, params: Sequence[SamplingParams]) -> torch.Tensor:
    """logits / T per row (greedy, T below MIN_TEMPERATURE: the logits as they are)."""
    temps = torch.tensor([1.0 if is_greedy(p.temperature) else p.temperature for p in params], device=logits.device)
    return logits / temps[:, None]


def _truncate(scaled: torch.Tensor, params: Sequence[SamplingParams]) -> torch.Tensor:
    """Masks (to -inf) what top-k and top-p cut; rows without either are left as they are."""
    vocab = scaled.shape[-1]
    top_k = torch.tensor([p.top_k if 0 < p.top_k < vocab else vocab for p in params], device=scaled.device)
    top_p = torch.tensor([min(max(p.top_p, 0.0), 1.0) for p in params], device=scaled.device)
    if bool((top_k == vocab).all()) and bool((top_p >= 1.0).all()):
        return scaled
    ordered, order = torch.sort(scaled, dim=-1, descending=True)
    rank = torch.arange(vocab, device=scaled.device)[None, :]
    probs = torch.softmax(ordered, dim=-1)
    before = torch.cumsum(probs, dim=-1) - probs  # mass of the tokens ranked above this one
    cut = (rank >= top_k[:, None]) | ((before >= top_p[:, None]) & (rank > 0))
    ordered = ordered.masked_fill(cut, float("-inf"))
    return torch.empty_like(scaled).scatter_(1, order, ordered)
