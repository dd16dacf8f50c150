"""What a process pays to use an embedding cache of N vectors on disk: the time and peak memory of its
first `embed` (the cache loaded, K texts looked up: half of them cached, half new), each in a fresh
process, so that its memory is its own: private (anonymous) memory, and file pages mapped (the page
cache's, shared by every process that maps them).

    .venv/bin/python scripts/bench_embedding_cache.py [N] [SHARD_SIZE] [K]

Put another checkout's src first on PYTHONPATH to measure its code on the same cache.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

DIM = 384  # all-MiniLM-L6-v2's

CHILD = """
import json, resource, sys, time
from pathlib import Path
import numpy as np
from vivace.search.embed import EmbeddingCache

class Fake:
    id, dim, batch_size = "fake", 384, 32
    encoded = 0
    def encode(self, texts):
        self.encoded += len(texts)
        v = np.random.default_rng(0).standard_normal((len(texts), 384)).astype(np.float32)
        return v / np.linalg.norm(v, axis=1, keepdims=True)

def status(field):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":")) / 1024

texts = json.loads(sys.argv[2])
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
anon, file = status("RssAnon"), status("RssFile")
cache = EmbeddingCache(Fake(), Path(sys.argv[1]))
t0 = time.perf_counter()
vectors = cache.embed(texts)
elapsed = time.perf_counter() - t0
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"first_embed_s": round(elapsed, 3), "peak_rss_added_mb": round((peak - before) / 1024, 1),
                  "private_rss_added_mb": round(status("RssAnon") - anon, 1),
                  "shared_file_rss_added_mb": round(status("RssFile") - file, 1),
                  "encoded": cache.embedder.encoded, "shape": list(vectors.shape)}))
"""


def make_cache(directory: Path, n: int, per: int) -> list[str]:
    """`n` vectors in shards of `per`; returns the texts of the first shard's first vectors (to look up)."""
    from vivace.search.embed import text_key

    rng = np.random.default_rng(0)
    shards = directory / "fake"
    shards.mkdir(parents=True)
    known = []
    for s, i in enumerate(range(0, n, per)):
        m = min(per, n - i)
        texts = [f"chunk {i + j}" for j in range(m)]
        known += texts[:100] if s < 10 else []
        v = rng.standard_normal((m, DIM)).astype(np.float32)
        v /= np.linalg.norm(v, axis=1, keepdims=True)
        keys = np.frombuffer(b"".join(text_key(t) for t in texts), dtype="S16")
        np.savez(shards / f"shard-{s:012x}.npz", keys=keys, vectors=v.astype(np.float16))
    return known


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 500_000
    per = int(sys.argv[2]) if len(sys.argv) > 2 else 50_000
    k = int(sys.argv[3]) if len(sys.argv) > 3 else 1_000
    with tempfile.TemporaryDirectory() as tmp:
        known = make_cache(Path(tmp), n, per)
        texts = known[: k // 2] + [f"new text {i}" for i in range(k - k // 2)]
        out = subprocess.run([sys.executable, "-c", CHILD, tmp, json.dumps(texts)], capture_output=True, text=True,
                             check=True)  # fmt: skip
        print(json.dumps({"vectors_on_disk": n, "shard_size": per, "texts": k, **json.loads(out.stdout)}))


if __name__ == "__main__":
    main()
