"""Packed training rows: many episodes in one forward pass, each seeing only itself — and the
prompt they all start with computed once.

What: `forward_row` runs a row of episodes (SFT dialogues or RL rollouts) through a Hugging Face
causal LM and returns the logits of the trained positions with their targets; `pack` assigns
episodes to rows. Both the supervised warm start (sft_train.py) and the RL trainer use them.

Why a shared prefix: every agent episode opens with the same system turn (prompt + tool schemas,
~2,700 tokens with the tiny model's tokenizer) and is often only ~1,000 tokens more, and an RL
group's rollouts share the user's request too. A row computes that common prefix once; each
episode's own tokens attend to the prefix and to themselves (`packed` attention below), with
positions continuing after the prefix, so every logit equals the episode run alone and the
gradient is the sum over episodes, as if each were run separately. On 2 CPU threads that makes
a row of agent episodes ~2-3x cheaper per episode. The prefix is shared only where no episode
trains a target inside it (a trained prefix token would otherwise count once instead of once
per episode).

On a GPU a forward is bound by kernel launches (a 16k-token row of the tiny model: ~65 ms of
CPU time against ~11 ms of GPU time), so rows there should be long: a row's positions restart
with each episode, so it may hold far more than the model's context. Segments of similar length
attend in one padded call, so a long row of short episodes costs a few calls per layer, not one
per episode (H200, tiny model, 131k-token rows of 1,480 copy sequences: 686k tokens/s against
69k with a call per episode).

Not covered: several rows per forward (one row, batch 1: a longer row does the same job).
"""

from __future__ import annotations

import bisect
import itertools
import random
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import AttentionInterface

IGNORE = -100  # label of positions that are not trained
PACKED = "packed"  # the attention implementation training uses


@dataclass
class Episode:
    ids: list[int]
    labels: list[int]  # per position: the next token if its loss_mask is 1, else IGNORE


def make_episode(ids: list[int], mask: list[int] | None = None) -> Episode:
    """Targets are ids shifted left, kept where the *target's* mask is 1; the last position has none."""
    mask = [1] * len(ids) if mask is None else mask
    return Episode(ids, [t if m else IGNORE for t, m in zip(ids[1:], mask[1:], strict=True)] + [IGNORE])


PAD_SLACK = 1.25  # segments attend in one call when the longest is at most this times the shortest
MASK_BUDGET = 1 << 26  # mask elements per padded call (64M: 256 MB once SDPA makes it a float bias)


def packed_attention(module, query, key, value, attention_mask, scaling=None, cu_seq_lens_q=None, shared_prefix=0,
                     **kwargs):  # fmt: skip
    """Causal attention within each packed segment [start, end) of `cu_seq_lens_q` (query/key/value:
    batch 1, heads, length, dim); with `shared_prefix` P > 0 the first segment is [0, P) and every
    later one also attends to all of it. Returns (batch, length, heads, dim).

    Segments of similar length attend in one padded call (`_attend_padded`): a row of many short
    episodes (copy rows hold ~80) would otherwise cost a kernel launch per episode and layer,
    which leaves a GPU idle."""
    bounds = cu_seq_lens_q.tolist() if cu_seq_lens_q is not None else [0, query.shape[2]]
    groups = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(groups, 1), value.repeat_interleave(groups, 1)  # grouped-query heads
    segments = list(itertools.pairwise(bounds))
    parts, order = [], []
    if shared_prefix:
        a, b = segments.pop(0)
        parts.append(F.scaled_dot_product_attention(query[:, :, a:b], key[:, :, a:b], value[:, :, a:b],
                                                    is_causal=True, scale=scaling)[0].transpose(0, 1))  # fmt: skip
        order.append(torch.arange(a, b))
    for bucket in _buckets(segments, shared_prefix):
        parts.append(_attend_padded(query, key, value, bucket, shared_prefix, scaling))
        order += [torch.arange(a, b) for a, b in bucket]
    out = torch.cat(parts)  # (length, heads, dim) in bucket order
    where = torch.cat(order).to(out.device)
    return out[torch.argsort(where)][None].contiguous(), None


def _buckets(segments: list[tuple[int, int]], prefix: int) -> list[list[tuple[int, int]]]:
    """Segments sorted by length and grouped while the longest is within PAD_SLACK of the shortest
    and the group's attention mask (segments x longest x (prefix + longest)) stays within MASK_BUDGET."""
    buckets: list[list[tuple[int, int]]] = []
    for a, b in sorted((s for s in segments if s[1] > s[0]), key=lambda s: s[1] - s[0]):
        n = b - a
        last = buckets[-1] if buckets else None
        if (last and n <= PAD_SLACK * (last[0][1] - last[0][0])
                and (len(last) + 1) * n * (prefix + n) <= MASK_BUDGET):  # fmt: skip
            last.append((a, b))
        else:
            buckets.append([(a, b)])
    return buckets


def _attend_padded(query, key, value, segments: list[tuple[int, int]], prefix: int, scaling):
    """Causal attention for `segments` in one call, each padded to the longest (pads repeat the
    segment's last token and are masked out as keys), each also attending to the first `prefix`
    positions. Returns (their total length, heads, dim), segment by segment."""
    dev = query.device
    lens = torch.tensor([b - a for a, b in segments], device=dev)
    starts = torch.tensor([a for a, _ in segments], device=dev)
    longest = int(lens.max())
    offs = torch.arange(longest, device=dev)
    idx = starts[:, None] + torch.minimum(offs[None], lens[:, None] - 1)  # (segments, longest)
    q, k, v = (t[0][:, idx].transpose(0, 1) for t in (query, key, value))  # (segments, heads, longest, dim)
    mask = (offs[None, :] <= offs[:, None])[None] & (offs[None, None, :] < lens[:, None, None])
    if prefix:
        n = len(segments)
        k = torch.cat([key[:, :, :prefix].expand(n, -1, -1, -1), k], 2)
        v = torch.cat([value[:, :, :prefix].expand(n, -1, -1, -1), v], 2)
        mask = torch.cat([torch.ones(n, longest, prefix, dtype=torch.bool, device=dev), mask], 2)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None], scale=scaling)
    return out.transpose(1, 2)[offs[None] < lens[:, None]]


AttentionInterface.register(PACKED, packed_attention)


def shared_prefix(episodes: list[Episode]) -> int:
    """Positions the row can compute once for all `episodes`: their common token prefix, cut so
    that every episode keeps a token of its own and trains no target inside it. 0 for one episode."""
    if len(episodes) < 2:
        return 0
    n = min(common_prefix([e.ids for e in episodes]), min(len(e.ids) for e in episodes) - 1)
    for e in episodes:
        trained = next((i for i in range(max(n, 0)) if e.labels[i] != IGNORE), None)
        if trained is not None:
            n = trained
    return max(n, 0)


def forward_row(model, episodes: list[Episode], router: bool = False, trained_only: bool = False,
                share_prefix: bool = True):  # fmt: skip
    """One packed row through the model: (output, labels), `output.logits[0]` aligned with `labels`.
    Attention stays inside each episode (plus the shared prefix) with `packed` attention; sdpa or
    eager attention are still correct with `share_prefix=False` (transformers reads the position
    restarts as packed sequences). `trained_only`: logits at the trained positions only (most of an
    agent episode is prompt and tool output, so the vocabulary projection is skipped there)."""
    p = shared_prefix(episodes) if share_prefix else 0
    first = episodes[0]
    ids = torch.tensor(first.ids[:p] + [i for e in episodes for i in e.ids[p:]])
    pos = torch.cat([torch.arange(p)] + [torch.arange(p, len(e.ids)) for e in episodes])
    labels = torch.tensor(first.labels[:p] + [t for e in episodes for t in e.labels[p:]])
    sizes = ([p] if p else []) + [len(e.ids) - p for e in episodes]
    bounds = torch.tensor([0, *itertools.accumulate(sizes)])
    keep = torch.nonzero(labels != IGNORE)[:, 0] if trained_only else 0  # 0: every position
    if trained_only:
        labels = labels[keep]
    elif p:  # every episode's own logits, in order: the prefix's positions repeated per episode
        raise ValueError("a shared prefix returns trained positions only: pass trained_only=True")
    dev = model.device
    # use_cache=False: with a cache, sdpa/eager would not read the position restarts as packing.
    out = model(input_ids=ids[None].to(dev), position_ids=pos[None].to(dev), use_cache=False,
                output_router_logits=router, cu_seq_lens_q=bounds, shared_prefix=p, logits_to_keep=keep)  # fmt: skip
    return out, labels.to(dev)


def row_tokens(episodes: list[Episode]) -> int:
    """Positions a row of `episodes` computes (the shared prefix once)."""
    return sum(len(e.ids) for e in episodes) - shared_prefix(episodes) * max(len(episodes) - 1, 0)


def pack(lengths: list[int], seq_len: int, rng: random.Random | None = None, shared: int = 0) -> list[list[int]]:
    """Episode indices per row: best-fit decreasing into rows of `seq_len` positions, where the
    first `shared` tokens of every episode are common and counted once per row; with `rng`, equal
    lengths are taken in a random order and the rows are shuffled."""
    order = list(range(len(lengths)))
    if rng is not None:
        rng.shuffle(order)
    order.sort(key=lambda i: -lengths[i])  # stable: ties keep the shuffled order
    rows: list[list[int]] = []
    free: list[tuple[int, int]] = []  # (room left, row), sorted
    for i in order:
        own = lengths[i] - shared
        k = bisect.bisect_left(free, (own, -1))
        if k == len(free):
            rows.append([])
            room, r = seq_len - shared, len(rows) - 1
        else:
            room, r = free.pop(k)
        rows[r].append(i)
        if room > own:
            bisect.insort(free, (room - own, r))
    if rng is not None:
        rng.shuffle(rows)
    return rows


def common_prefix(seqs: list[list[int]]) -> int:
    """Length of the token prefix every sequence starts with."""
    if not seqs:
        return 0
    n = min(len(s) for s in seqs)
    first = seqs[0]
    for s in seqs[1:]:
        k = 0
        while k < n and s[k] == first[k]:
            k += 1
        n = k
    return n


def pack_episodes(
    episodes: list[Episode], seq_len: int, rng: random.Random | None = None, opening: int = 32
) -> list[tuple[list[int], int]]:
    """Episode indices per row with each row's computed positions: episodes that open with the same
    `opening` tokens (agent episodes: the system turn) are packed together around their shared
    prefix; the rest (plain sequences) without one. With `rng`, ties and row order are shuffled."""
    groups: dict[tuple[int, ...] | None, list[int]] = {}
    for i, e in enumerate(episodes):
        groups.setdefault(tuple(e.ids[:opening]), []).append(i)
    singles = [i for key, members in list(groups.items()) if len(members) < 2 for i in groups.pop(key)]
    if singles:
        groups[None] = singles
    rows: list[tuple[list[int], int]] = []
    for key, members in groups.items():
        shared = shared_prefix([episodes[i] for i in members]) if key is not None else 0
        lengths = [len(episodes[i].ids) for i in members]
        for row in pack(lengths, seq_len, rng, shared):
            rows.append(([members[j] for j in row], sum(lengths[j] for j in row) - shared * (len(row) - 1)))
    if rng is not None:
        rng.shuffle(rows)
    return rows
