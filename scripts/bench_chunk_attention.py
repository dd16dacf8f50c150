"""A prompt chunk's attention on CPU: one masked call against the engine's two flash calls (the cached past,
then the chunk itself, causal; inference/forward.py `_chunk_attention`), at the tiny model's shape (4 query
heads, 2 key/value heads, head dim 32). Prints the median of 7 calls per shape and the largest difference.

    .venv/bin/python scripts/bench_chunk_attention.py
"""

import functools
import time

import torch
import torch.nn.functional as F

from vivace.inference.forward import _chunk_attention


def _masked(q, k, v, mask):
    return F.scaled_dot_product_attention(q[None], k[None], v[None], attn_mask=mask, enable_gqa=True)[0]


def median_ms(fn, n: int = 7) -> float:
    fn()
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return sorted(times)[n // 2] * 1000


def main() -> None:
    torch.manual_seed(0)
    print(f"{'chunk':>6} {'past':>6} {'masked ms':>10} {'split ms':>9} {'ratio':>6} {'max diff':>9}")
    for n, past in [(1400, 2700), (300, 3500), (40, 3000), (2700, 0)]:
        q, k, v = torch.randn(4, n, 32), torch.randn(2, past + n, 32), torch.randn(2, past + n, 32)
        mask = torch.arange(past + n)[None, :] <= torch.arange(past, past + n)[:, None]

        masked = functools.partial(_masked, q, k, v, mask)
        split = functools.partial(_chunk_attention, q, (k[:, :past], v[:, :past]), (k[:, past:], v[:, past:]), 32**-0.5)
        diff = (masked() - split()).abs().max().item()
        a, b = median_ms(masked), median_ms(split)
        print(f"{n:>6} {past:>6} {a:>10.1f} {b:>9.1f} {b / a:>6.2f} {diff:>9.1e}")


if __name__ == "__main__":
    main()
