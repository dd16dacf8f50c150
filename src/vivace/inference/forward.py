"""One engine step as a single "ragged" forward pass over many sequences.

What: `RaggedForward(model)` runs the decoder on the concatenation of every running sequence's
new tokens (a decode step contributes one token, a prefill chunk many), appends their keys and
values to each sequence's `KVCache`, and returns the logits at each sequence's last new token.

Why by hand: transformers' own forward wants rectangular, padded batches with one shared cache;
continuous batching needs sequences of different lengths joining and leaving every step. The
projections, norms, rotary embedding and MLP/MoE blocks are the model's own modules, called on
the packed tokens, so the numerics are the model's; only attention is run per sequence over its
own cache (PyTorch's scaled_dot_product_attention, grouped-query aware).

Supports decoder-only models with the Llama/Qwen2/Qwen3(-MoE) layer layout (`self_attn` with
q/k/v/o projections and optional q/k norms, `mlp`, two RMSNorms, `model.rotary_emb`). Sliding
window attention is not supported (such models are refused).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers.models.qwen3_moe.modeling_qwen3_moe import apply_rotary_pos_emb

SUPPORTED = ("Qwen3MoeForCausalLM", "Qwen3ForCausalLM", "Qwen2ForCausalLM", "Qwen2MoeForCausalLM", "LlamaForCausalLM")


class KVCache:
    """One sequence's keys and values for every layer, preallocated to its maximum length."""

    def __init__(self, n_layers: int, n_kv_heads: int, head_dim: int, capacity: int, dtype, device):
        self.k = torch.empty(n_layers, n_kv_heads, capacity, head_dim, dtype=dtype, device=device)
        self.v = torch.empty_like(self.k)
        self.length = 0  # positions filled (the same in every layer after a step)

    @property
    def capacity(self) -> int:
        return self.k.shape[2]

    def copy_prefix(self, other: KVCache, n: int) -> None:
        """Takes the first n positions of another cache (prefix reuse)."""
        self.k[:, :, :n] = other.k[:, :, :n]
        self.v[:, :, :n] = other.v[:, :, :n]
        self.length = n

    def nbytes(self) -> int:
        return 2 * self.k.numel() * self.k.element_size()


@dataclass
class Segment:
    cache: KVCache
    n_tokens: int  # new tokens of this sequence in the step (its positions follow cache.length)


class RaggedForward:
    def __init__(self, model: torch.nn.Module):
        arch = type(model).__name__
        cfg = model.config
        if arch not in SUPPORTED:
            raise ValueError(f"the engine runs {', '.join(SUPPORTED)}; {arch} is not supported")
        if getattr(cfg, "use_sliding_window", False) and getattr(cfg, "sliding_window", None):
            raise ValueError("sliding-window attention is not supported by the engine")
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
    def __call__(self, tokens: list[int], segments: list[Segment]) -> torch.Tensor:
        """Logits [len(segments), vocab] at each segment's last token; caches are extended."""
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
                c, n = s.cache, s.n_tokens
                end = c.length + n
                c.k[li, :, c.length : end] = k[0, :, a:b]
                c.v[li, :, c.length : end] = v[0, :, a:b]
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
        last = torch.tensor([b - 1 for _, b in bounds], device=device)
        return self.model.lm_head(self.base.norm(x[last])).float()
