"""Packed rows with a shared prefix (rl/packing.py): the prompt every episode opens with is
computed once, yet every trained logit and the gradient are those of each episode run alone."""

from __future__ import annotations

import itertools
import random

import pytest
import torch
from transformers import AutoModelForCausalLM

from vivace.model.checkpoint import tiny_config
from vivace.rl.packing import IGNORE, PACKED, forward_row, make_episode, pack, pack_episodes, row_tokens, shared_prefix

torch.set_num_threads(2)
SMALL = dict(hidden_size=64, moe_intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
             num_key_value_heads=1, head_dim=32, num_experts=4)  # fmt: skip


def _model():
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_config(512, **SMALL), dtype=torch.float32)
    model.set_attn_implementation(PACKED)
    return model


def _episodes(prefix_len: int = 40, n: int = 4, seed: int = 0):
    rng = random.Random(seed)
    prefix = [rng.randrange(512) for _ in range(prefix_len)]
    eps = []
    for _ in range(n):
        own = [rng.randrange(512) for _ in range(rng.randint(3, 30))]
        ids = prefix + own
        mask = [0] * (prefix_len + 1) + [rng.choice((0, 1, 1)) for _ in own[1:]]
        eps.append(make_episode(ids, mask))
    return eps


def _loss(model, eps, share):
    out, labels = forward_row(model, eps, trained_only=True, share_prefix=share)
    return torch.nn.functional.cross_entropy(out.logits[0], labels, reduction="sum"), out.logits[0]


def test_shared_prefix_stops_at_trained_targets_and_keeps_a_token_each():
    eps = _episodes(prefix_len=40)
    assert shared_prefix(eps) >= 40
    assert shared_prefix(eps[:1]) == 0
    same = [make_episode([1, 2, 3], [0, 0, 0]), make_episode([1, 2, 3], [0, 0, 0])]
    assert shared_prefix(same) == 2  # each episode keeps its last token
    trained = [make_episode([5, 6, 7, 8, 9], [0, 0, 1, 1, 1]), make_episode([5, 6, 7, 8, 1], [0, 0, 0, 0, 1])]
    assert shared_prefix(trained) == 1  # position 1 trains token 7 in the first episode
    assert trained[0].labels[1] != IGNORE


def test_shared_prefix_row_equals_each_episode_alone_logits_and_gradients():
    model = _model()
    eps = _episodes()
    assert shared_prefix(eps) > 0
    loss_shared, logits_shared = _loss(model, eps, share=True)
    loss_shared.backward()
    grads_shared = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    logits_alone = []
    total = 0.0
    for e in eps:
        loss, logits = _loss(model, [e], share=False)
        loss.backward()
        total += float(loss.detach())
        logits_alone.append(logits)
    torch.testing.assert_close(logits_shared, torch.cat(logits_alone), atol=1e-5, rtol=1e-4)
    assert abs(float(loss_shared.detach()) - total) < 1e-3
    for n, p in model.named_parameters():
        if p.grad is not None and n in grads_shared:
            torch.testing.assert_close(grads_shared[n], p.grad, atol=1e-5, rtol=1e-3)


def test_row_tokens_and_pack_count_the_prefix_once():
    eps = _episodes(prefix_len=100, n=6)
    p = shared_prefix(eps)
    assert row_tokens(eps) == sum(len(e.ids) for e in eps) - p * 5
    lengths = [len(e.ids) for e in eps]
    rows = pack(lengths, 200, shared=p)
    assert sorted(i for r in rows for i in r) == list(range(6))
    for r in rows:
        assert sum(lengths[i] for i in r) - p * (len(r) - 1) <= 200
    assert len(rows) < len(pack(lengths, 200))  # without sharing, at most one episode per row fits


def test_pack_episodes_shares_the_opening_per_group_and_packs_the_rest_plainly():
    agent = _episodes(prefix_len=100, n=6, seed=1)
    plain = [make_episode([random.Random(i).randrange(512) for _ in range(30)], [1] * 30) for i in range(5)]
    episodes = agent + plain
    rows = pack_episodes(episodes, 400, random.Random(0))
    assert sorted(i for r, _ in rows for i in r) == list(range(11))
    for row, cost in rows:
        members = [episodes[i] for i in row]
        assert {i < 6 for i in row} in ({True}, {False})  # agent episodes and plain ones never share a row
        assert cost == row_tokens(members) <= 400
    assert sum(cost for _, cost in rows) < sum(len(e.ids) for e in episodes) - 100 * 4  # the opening counted once a row


def _reference_attention(q, k, v, bounds, prefix):
    """Per segment, causal softmax attention written out (segments after a prefix also see all of it)."""
    out = torch.zeros_like(q)
    for a, b in itertools.pairwise(bounds):
        keys = list(range(prefix)) if prefix and a >= prefix else []
        for i in range(a, b):
            cols = keys + list(range(a, i + 1))
            w = torch.softmax(q[0, :, i, None] @ k[0, :, cols].transpose(-1, -2) / q.shape[-1] ** 0.5, -1)
            out[0, :, i] = (w @ v[0, :, cols])[:, 0]
    return out.transpose(1, 2)


@pytest.mark.parametrize("mask_budget", [1 << 26, 300])  # the default; so small that every bucket splits
def test_packed_attention_padded_buckets_match_a_written_out_reference_and_its_gradient(monkeypatch, mask_budget):
    """Many short segments of mixed lengths (copy rows) attend in a few padded calls: outputs and
    gradients equal attention computed segment by segment, with and without a shared prefix."""
    from vivace.rl import packing
    from vivace.rl.packing import _buckets, packed_attention

    monkeypatch.setattr(packing, "MASK_BUDGET", mask_budget)
    rng = random.Random(3)
    for prefix in (0, 7):
        sizes = ([prefix] if prefix else []) + [rng.choice((1, 2, 5, 9, 10, 11, 30)) for _ in range(23)]
        bounds = [0, *itertools.accumulate(sizes)]
        n = bounds[-1]
        buckets = _buckets(list(itertools.pairwise(bounds))[1 if prefix else 0 :], prefix)
        assert sorted(s for b in buckets for s in b) == list(itertools.pairwise(bounds))[1 if prefix else 0 :]
        assert (len(buckets) < 10) == (mask_budget > 300)  # few calls for 23 segments, unless the budget splits them
        q, k, v = (torch.randn(1, 2, n, 8, dtype=torch.float64, requires_grad=True) for _ in range(3))
        got, _ = packed_attention(None, q, k, v, None, cu_seq_lens_q=torch.tensor(bounds), shared_prefix=prefix)
        want = _reference_attention(q, k, v, bounds, prefix)
        assert got.shape == (1, n, 2, 8)
        assert torch.allclose(got, want, atol=1e-10)
        weights = torch.randn_like(want)
        g_got = torch.autograd.grad((got * weights).sum(), (q, k, v))
        g_want = torch.autograd.grad((want * weights).sum(), (q, k, v))
        for a, b in zip(g_got, g_want, strict=True):
            assert torch.allclose(a, b, atol=1e-10)
