"""One engine step as a single "ragged" forward pass over many sequences.

What: `RaggedForward(model)` runs the decoder on the concatenation of every running sequence's
new tokens (a decode step contributes one token, a prefill chunk many), appends their keys and
values to each sequence's `KVCache`, and returns the logits at each sequence's last new token.

Why by hand: transformers' own forward wants rectangular, padded batches with one shared cache;
continuous batching needs sequences of different lengths joining and leaving every step. The
projections, norms, rotary embedding and MLP/MoE blocks are the model's own modules, called on
the packed tokens, so the numerics are the model's; only attention is run per sequence over its
own cache (PyTorch's scaled_dot_product_attention, grouped-query aware).

Shared prefixes are read once per step ("cascade" attention). A cache made by `copy_prefix`
remembers where its first positions came from (`origin`: the cache they were first computed in,
and how many). Decoding sequences with the same origin — a step's rollouts all start from one
system turn, ~2,800 of a short episode's ~3,600 tokens with the tiny preset — attend to that
common prefix together: one matrix product of all their queries against one copy of its keys,
then each against the rest of its own cache, the two parts merged by their log-sum-exp. Decode
attention is memory-bound (each query reads its whole cache), so this cuts the bytes read per
step by about the number of sequences sharing the prefix. The copies are still made: prompt
chunks (several new tokens) attend over their own cache in one call, as before. Only on the devices
in CASCADE_DEVICE_TYPES: CPU, since on a GPU it measured slower.

Supports decoder-only models with the Llama/Mistral/Qwen2/Qwen3(-MoE) layer layout (`self_attn`
with q/k/v/o projections and optional q/k norms, `mlp`, two RMSNorms, `model.rotary_emb`); other
architectures are refused by name rather than run with the wrong numerics. Sliding-window
attention is not supported: a model whose window is shorter than its context (Mistral 7B v0.1,
Qwen2 with use_sliding_window) is refused, since every token past the window would differ.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers.models.qwen3_moe.modeling_qwen3_moe import apply_rotary_pos_emb

SUPPORTED = (
    "Qwen3MoeForCausalLM",
    "Qwen3ForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen2MoeForCausalLM",
    "LlamaForCausalLM",
    "MistralForCausalLM",
)


class KVCache:
    """One sequence's keys and values for every layer, preallocated to its maximum length."""

    def __init__(self, n_layers: int, n_kv_heads: int, head_dim: int, capacity: int, dtype, device):
        self.k = torch.empty(n_layers, n_kv_heads, capacity, head_dim, dtype=dtype, device=device)
        self.v = torch.empty_like(self.k)
        self.length = 0  # positions filled (the same in every layer after a step)
        # (cache, n): our first n positions hold the same keys/values as that cache's (the cache they
        # were computed in, followed through copies of copies); positions are written once, so it stays true.
        self.origin: tuple[KVCache, int] | None = None

    @property
    def capacity(self) -> int:
        return self.k.shape[2]

    def copy_prefix(self, other: KVCache, n: int) -> None:
        """Takes the first n positions of another cache (prefix reuse)."""
        self.k[:, :, :n] = other.k[:, :, :n]
        self.v[:, :, :n] = other.v[:, :, :n]
        self.length = n
        root, shared = other.origin if other.origin is not None else (other, n)
        self.origin = (root, min(shared, n))

    def shared_prefix(self) -> tuple[KVCache, int]:
        """The cache holding the most of our leading positions, and how many (ourselves when copied from none)."""
        return self.origin if self.origin is not None else (self, self.length)

    def nbytes(self) -> int:
        return 2 * self.k.numel() * self.k.element_size()

    def compact(self) -> KVCache:
        """A copy of just the filled positions, with no origin: what a finished sequence leaves for
        reuse. Its own cache was allocated for all of max_tokens (an agent asks for most of the context
        and ends its turn early), and its origin would hold the cache it was copied from."""
        if self.length == self.capacity and self.origin is None:
            return self
        layers, heads, _, head_dim = self.k.shape
        out = KVCache(layers, heads, head_dim, self.length, self.k.dtype, self.k.device)
        out.copy_prefix(self, self.length)
        out.origin = None
        return out


@dataclass
class Segment:
    cache: KVCache
    n_tokens: int  # new tokens of this sequence in the step (its positions follow cache.length)


# A shared prefix shorter than this is attended per sequence (the separate pass is not worth it).
MIN_CASCADE_PREFIX = 64
# Devices on which decoding sequences read a shared prefix once: CPU, where an RL step's decoding ran
# 1.66x faster. On an H200 it ran 0.84x: a GPU decode step is bound by kernel launches, and the
# per-sequence remainders add launches (docs/benchmarks.md, "The engine's decode step on a GPU").
CASCADE_DEVICE_TYPES = {"cpu"}


def _cascade_groups(segments: list[Segment]) -> tuple[list[tuple[KVCache, int, list[int]]], list[int]]:
    """Splits a step's segments into groups of decoding sequences (one new token each) that share a
    prefix of at least MIN_CASCADE_PREFIX positions — (the cache holding it, its length, segment
    indices) — and the rest (segment indices), attended one by one."""
    by_root: dict[int, tuple[KVCache, list[tuple[int, int]]]] = {}
    alone: list[int] = []
    for i, s in enumerate(segments):
        if s.n_tokens != 1:
            alone.append(i)
            continue
        root, shared = s.cache.shared_prefix()
        by_root.setdefault(id(root), (root, []))[1].append((i, shared))
    groups = []
    for root, members in by_root.values():
        shared = min(n for _, n in members)
        if len(members) > 1 and shared >= MIN_CASCADE_PREFIX:
            groups.append((root, shared, [i for i, _ in members]))
        else:
            alone += [i for i, _ in members]
    return groups, alone


_FLASH_CPU = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
# A prompt chunk at least this long is attended in two flash calls (_chunk_attention); below it the one masked
# call costs the same or less (40 tokens: 1.00-1.16x slower split; docs/benchmarks.md).
MIN_SPLIT_CHUNK = 128


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Unmasked attention of q [h, n, d] over k, v [h, S, d]: (output [h, n, d], log-sum-exp [h, n]).
    On CPU, PyTorch's flash kernel returns both in one call (public SDPA drops the log-sum-exp)."""
    if _FLASH_CPU is not None and q.device.type == "cpu":
        out, lse = _FLASH_CPU(q[None], k[None], v[None], 0.0, False, scale=scale)
        return out[0], lse[0]
    scores = torch.matmul(q, k.transpose(1, 2)) * scale
    lse = torch.logsumexp(scores, dim=-1)
    return torch.matmul(torch.exp(scores - lse[..., None]), v), lse


def _merge(a: tuple[torch.Tensor, torch.Tensor], b: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """One attention over two disjoint sets of keys, from each set's (output, log-sum-exp): the outputs
    weighted by their share of the softmax's total mass. The kernels' log-sum-exp is float32 whatever the
    queries' dtype, so the result is float32 too."""
    (out_a, lse_a), (out_b, lse_b) = a, b
    total = torch.logaddexp(lse_a, lse_b)
    return out_a * torch.exp(lse_a - total)[..., None] + out_b * torch.exp(lse_b - total)[..., None]


def _cascade_attention(
    q: torch.Tensor,
    prefix: tuple[torch.Tensor, torch.Tensor],
    rest: list[tuple[torch.Tensor, torch.Tensor]],
    scale: float,
) -> torch.Tensor:
    """Attention of m single-token queries q [heads, m, d] over a prefix they all share (keys, values
    [kv_heads, P, d]) followed by each one's own positions (rest[j]: keys, values [kv_heads, S_j, d],
    S_j >= 1: at least the query's own token). Returns [heads, m, d].

    A key/value head serves `rep` query heads (grouped-query attention); they are laid out as `rep`
    queries of that head, so both parts are plain multi-head attention without a mask."""
    heads, m, d = q.shape
    kv_heads = prefix[0].shape[0]
    rep = heads // kv_heads
    qg = q.reshape(kv_heads, rep, m, d)
    out_prefix, lse_prefix = _attend(qg.reshape(kv_heads, rep * m, d), *prefix, scale)
    out_prefix, lse_prefix = out_prefix.view(kv_heads, rep, m, d), lse_prefix.view(kv_heads, rep, m)
    parts = [_attend(qg[:, :, j], k, v, scale) for j, (k, v) in enumerate(rest)]
    out_rest = torch.stack([o for o, _ in parts], dim=2)  # [kv_heads, rep, m, d]
    lse_rest = torch.stack([lse for _, lse in parts], dim=2)
    return _merge((out_prefix, lse_prefix), (out_rest, lse_rest)).reshape(heads, m, d).to(q.dtype)


def _chunk_attention(
    q: torch.Tensor, past: tuple[torch.Tensor, torch.Tensor], own: tuple[torch.Tensor, torch.Tensor], scale: float
) -> torch.Tensor:
    """Attention of a prompt chunk's n queries q [heads, n, d] over the sequence's cached past (keys,
    values [kv_heads, P, d], all visible) and over the chunk's own positions (keys, values [kv_heads, n, d],
    causal). Returns [heads, n, d].

    Two flash calls merged by their log-sum-exp, where one masked call reads a boolean mask and computes
    the masked half of the chunk's own square: 1.5x faster for a 1,400-token chunk after a 2,700-token past
    on 2 CPU cores (docs/benchmarks.md). CPU only (_FLASH_CPU), chunks of MIN_SPLIT_CHUNK tokens or more."""
    heads, n, d = q.shape
    kv_heads = own[0].shape[0]
    rep = heads // kv_heads
    k, v = (t.repeat_interleave(rep, 0) for t in own)  # a query head per key head: the causal part is square
    out_own, lse_own = _FLASH_CPU(q[None], k[None], v[None], 0.0, True, scale=scale)
    out_own, lse_own = out_own[0], lse_own[0]
    if not past[0].shape[1]:
        return out_own
    out_past, lse_past = _attend(q.reshape(kv_heads, rep * n, d), *past, scale)  # grouped as in _cascade_attention
    return _merge((out_past.reshape(heads, n, d), lse_past.reshape(heads, n)), (out_own, lse_own)).to(q.dtype)


def sliding_window(cfg) -> int | None:
    """The attention window a config asks for, or None for full attention. Mistral's config has no
    switch (a set `sliding_window` is used); Qwen2/Qwen3 keep a `sliding_window` they ignore unless
    `use_sliding_window` (in transformers 5: `layer_types`) turns it on."""
    window = getattr(cfg, "sliding_window", None)
    if not window:
        return None
    layer_types = getattr(cfg, "layer_types", None)
    if layer_types is not None:
        return window if "sliding_attention" in layer_types else None
    return window if getattr(cfg, "use_sliding_window", True) else None


def engine_refusal(arch: str | None, cfg) -> str | None:
    """Why the engine cannot run a model of class `arch` with config `cfg`, or None: read from the config
    alone, so that `vivace train` refuses such a model before its run starts, as bench and serve do."""
    if arch not in SUPPORTED:
        return f"the engine runs {', '.join(SUPPORTED)}; {arch or 'this model'} is not supported"
    window = sliding_window(cfg)
    if window is not None and window < cfg.max_position_embeddings:
        return (f"{arch} with sliding-window attention (a window of {window} positions in a context of "
                f"{cfg.max_position_embeddings}) is not supported by the engine, which attends over the whole context")  # fmt: skip
    return None


def causal_lm_class(cfg) -> str | None:
    """The class name AutoModelForCausalLM makes for config `cfg` (its `architectures`, else its model_type's)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    named = getattr(cfg, "architectures", None) or []
    return named[0] if named else MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(getattr(cfg, "model_type", None))


class RaggedForward:
    def __init__(self, model: torch.nn.Module):
        cfg = model.config
        if refusal := engine_refusal(type(model).__name__, cfg):
            raise ValueError(refusal)
        self.model = model
        self.base = model.model
        self.n_layers = cfg.num_hidden_layers
        self.n_kv_heads = cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.max_positions = cfg.max_position_embeddings

    def new_cache(self, capacity: int) -> KVCache:
        p = self.base.embed_tokens.weight
        return KVCache(self.n_layers, self.n_kv_heads, self.head_dim, capacity, p.dtype, p.device)

    @torch.inference_mode()
    def __call__(self, tokens: list[int], segments: list[Segment], logit_rows: list[int] | None = None) -> torch.Tensor:
        """Logits [len(segments), vocab] at each segment's last token (or [len(logit_rows), vocab] at those
        rows of `tokens`: teacher-forced scoring); caches are extended."""
        device = self.base.embed_tokens.weight.device
        ids = torch.tensor(tokens, dtype=torch.long, device=device)
        positions = torch.cat(
            [torch.arange(s.cache.length, s.cache.length + s.n_tokens, device=device) for s in segments]
        )
        x = self.base.embed_tokens(ids)  # [N, hidden]
        cos, sin = self.base.rotary_emb(x, positions[None])  # [1, N, head_dim]
        bounds, start = [], 0
        for s in segments:
            bounds.append((start, start + s.n_tokens))
            start += s.n_tokens
        cascade = device.type in CASCADE_DEVICE_TYPES
        groups, alone = _cascade_groups(segments) if cascade else ([], list(range(len(segments))))
        split_chunks = _FLASH_CPU is not None and device.type == "cpu"
        for li, layer in enumerate(self.base.layers):
            attn = layer.self_attn
            h = layer.input_layernorm(x)
            q = attn.q_proj(h).view(1, len(tokens), -1, self.head_dim)
            k = attn.k_proj(h).view(1, len(tokens), -1, self.head_dim)
            if hasattr(attn, "q_norm"):
                q, k = attn.q_norm(q), attn.k_norm(k)
            q, k = apply_rotary_pos_emb(q.transpose(1, 2), k.transpose(1, 2), cos, sin)  # [1, heads, N, d]
            v = attn.v_proj(h).view(1, len(tokens), -1, self.head_dim).transpose(1, 2)
            out = torch.empty_like(q)
            for s, (a, b) in zip(segments, bounds, strict=True):
                c = s.cache
                c.k[li, :, c.length : c.length + s.n_tokens] = k[0, :, a:b]
                c.v[li, :, c.length : c.length + s.n_tokens] = v[0, :, a:b]
            for root, shared, members in groups:
                rows = [bounds[i][0] for i in members]
                rest = []
                for i in members:
                    c = segments[i].cache
                    rest.append((c.k[li, :, shared : c.length + 1], c.v[li, :, shared : c.length + 1]))
                prefix = (root.k[li, :, :shared], root.v[li, :, :shared])
                out[0, :, rows] = _cascade_attention(q[0, :, rows], prefix, rest, attn.scaling)
            for i in alone:
                s, (a, b) = segments[i], bounds[i]
                c, n = s.cache, s.n_tokens
                end = c.length + n
                if n >= MIN_SPLIT_CHUNK and split_chunks:
                    past = (c.k[li, :, : c.length], c.v[li, :, : c.length])
                    own = (c.k[li, :, c.length : end], c.v[li, :, c.length : end])
                    out[0, :, a:b] = _chunk_attention(q[0, :, a:b], past, own, attn.scaling)
                    continue
                mask = None
                if n > 1:  # causal within the chunk, full view of the cached past
                    mask = (
                        torch.arange(end, device=device)[None, :] <= torch.arange(c.length, end, device=device)[:, None]
                    )
                out[:, :, a:b] = F.scaled_dot_product_attention(
                    q[:, :, a:b], c.k[li : li + 1, :, :end], c.v[li : li + 1, :, :end],
                    attn_mask=mask, scale=attn.scaling, enable_gqa=True,
                )  # fmt: skip
            x = x + attn.o_proj(out.transpose(1, 2).reshape(len(tokens), -1))
            x = x + layer.mlp(layer.post_attention_layernorm(x)[None])[0]
        for s in segments:
            s.cache.length += s.n_tokens
        last = [b - 1 for _, b in bounds] if logit_rows is None else logit_rows
        last = torch.tensor(last, dtype=torch.long, device=device)
        return self.model.lm_head(self.base.norm(x[last])).float()
