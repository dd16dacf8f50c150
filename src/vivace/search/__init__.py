"""Semantic codebase search: the index behind the `codebase_search` tool and `vivace index`.

    scan.py       which files are indexed, their stats, hashes and texts (runs inside workspaces too)
    languages.py  tree-sitter grammars by file extension, and which nodes are definitions
    chunking.py   files -> chunks (definitions, merged small siblings, split large nodes, line windows)
    embed.py      the sentence-transformers embedder (packaged model, offline) + cache by content hash
    lexical.py    code-aware tokens and BM25 (bm25s), with scoring of documents outside the index
    merkle.py     Merkle tree of file and directory hashes: tree identity and cheap diffs
    index.py      BaseIndex: one tree's chunks, vectors and BM25; built once, saved, shared
    view.py       IndexView: a base + one tree's changed files; bm25 / dense / hybrid (RRF) search
    store.py      bases by Merkle root, in memory and on disk
    tree.py       sources (workspace, directory), opening and refreshing one tree's index
    backend.py    HybridSearch: the harness's SearchBackend (one per process)
    bench.py      `vivace index bench`: localization, incremental re-indexing, latency, throughput
    finetune.py   `vivace index train-embedder`: pairs mined from trajectories, contrastive tuning

Nothing here imports torch or sentence-transformers until an embedding is needed.
"""

from vivace.search.types import MODES, Mode, SearchHit

__all__ = ["MODES", "Mode", "SearchHit"]
