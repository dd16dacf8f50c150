"""One tree's searchable state: a shared base index plus an overlay of the files it changed.

`apply` takes changed files (path -> new text, None when deleted): their base chunks are
hidden, their new chunks are embedded (through the shared cache: a one-line edit re-embeds
only the chunk it touched) and kept in the overlay; a file edited back to its base content
leaves the overlay. The base is never modified, so thousands of views can share it.

`search` ranks base and overlay chunks together: BM25 (overlay documents scored with the
base's statistics), dense cosine similarity, or both fused by reciprocal rank (RRF), where chunks
defining a code-shaped name the query gives (snake_case, camelCase, a name with digits), then chunks
holding one, come first. Dense
candidates below MIN_SIMILARITY are dropped, so a query unrelated to the code finds nothing
instead of the least unrelated chunks.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from vivace.search.chunking import Chunk, chunk_file
from vivace.search.embed import EmbeddingCache
from vivace.search.index import BaseIndex, doc_tokens, embed_text
from vivace.search.lexical import Postings, tokenize
from vivace.search.merkle import MerkleTree
from vivace.search.scan import text_hash
from vivace.search.types import MODES, Mode, SearchHit

RRF_K = 60  # reciprocal rank fusion: score = sum over retrievers of 1 / (RRF_K + rank)
CANDIDATES = 100  # per retriever, before fusion
MIN_SIMILARITY = 0.15  # cosine below which a dense candidate is not a result
SNIPPET_LINES = 5
EMPTY_QUERY = "the query is empty; describe the code to find in words or identifiers"


@dataclass
class _Overlay:
    chunks: list[Chunk] = field(default_factory=list)
    vectors: np.ndarray | None = None
    tokens: list[list[str]] = field(default_factory=list)
    postings: Postings | None = None  # BM25's view of `tokens` (built once for the merged overlay)


class IndexView:
    """A base plus this tree's changes. Thread-safe: `apply` and `search` may run concurrently."""

    def __init__(self, base: BaseIndex, cache: EmbeddingCache | None):
        self.base, self.cache = base, cache
        self.tree = MerkleTree(base.tree.files)  # this view's files and hashes
        self.files: dict[str, _Overlay] = {}  # path -> overlay chunks of a changed or added file
        self.hidden: set[str] = set()  # base files this view changed or deleted
        self._visible: np.ndarray | None = None  # base chunk mask; None: all visible
        self._merged: _Overlay | None = None
        self._lock = threading.Lock()

    @property
    def root(self) -> str:
        return self.tree.root

    def apply(self, changes: Mapping[str, str | None]) -> int:
        """Record changed files (path -> text; None: deleted or not indexable); returns the number
        of chunks that had to be embedded (0 when every changed chunk was seen before)."""
        # `is not None`, never truthiness: an EmbeddingCache is a sized container, empty (falsy)
        # until its shards load, and an overlay without vectors hides its files from dense search.
        before = self.cache.embedder.encoded if self.cache is not None else 0
        updates: dict[str, _Overlay | None] = {}
        digests: dict[str, str | None] = {}
        for path, text in changes.items():
            digest = text_hash(text) if text is not None else None
            if digest == self.tree.files.get(path):
                continue  # touched, not changed
            digests[path] = digest
            if digest is not None and digest == self.base.tree.files.get(path):
                updates[path] = None  # back to its base content
                continue
            chunks = chunk_file(path, text) if text is not None else []
            vectors = self.cache.embed([embed_text(c) for c in chunks]) if self.cache is not None and chunks else None
            updates[path] = _Overlay(chunks, vectors, [doc_tokens(c) for c in chunks])
        with self._lock:
            for path, overlay in updates.items():
                self.tree.set(path, digests[path])
                self.files.pop(path, None)
                if overlay is None:
                    self.hidden.discard(path)
                    continue
                if path in self.base.tree.files:
                    self.hidden.add(path)
                if overlay.chunks:
                    self.files[path] = overlay
            self._visible = self._mask()
            self._merged = None
        return (self.cache.embedder.encoded - before) if self.cache is not None else 0

    def _mask(self) -> np.ndarray | None:
        if not self.hidden:
            return None
        mask = np.ones(len(self.base.chunks), bool)
        for path in self.hidden:
            lo, hi = self.base.ranges.get(path, (0, 0))
            mask[lo:hi] = False
        return mask

    def _overlay(self) -> _Overlay:
        with self._lock:
            if self._merged is None:
                parts = [self.files[p] for p in sorted(self.files)]
                chunks = [c for p in parts for c in p.chunks]
                vecs = [p.vectors for p in parts if p.vectors is not None]
                # row i of the vectors must be chunk i: a file without vectors among files with them
                # would shift every later row onto another file's chunk
                assert len(vecs) in (0, len(parts)), "overlay files with and without vectors"
                vectors = np.concatenate(vecs) if vecs else None
                assert vectors is None or len(vectors) == len(chunks), "overlay vectors and chunks differ"
                tokens = [t for p in parts for t in p.tokens]
                self._merged = _Overlay(chunks, vectors, tokens, Postings(tokens))
            return self._merged

    def chunks(self) -> list[Chunk]:
        """Every searchable chunk: visible base chunks, then the overlay's (tests compare this with a rebuild)."""
        visible = self._visible
        base = [c for i, c in enumerate(self.base.chunks) if visible is None or visible[i]]
        return base + self._overlay().chunks

    def search(self, query: str, k: int = 10, mode: Mode = "hybrid", dirs: list[str] | None = None) -> list[SearchHit]:
        """The k best chunks for `query`, best first; `dirs` keeps paths under those directories."""
        if mode not in MODES:
            raise ValueError(f"unknown search mode {mode!r}; modes: {', '.join(MODES)}")
        if not query.strip():  # every chunk would tie: the "results" would be arbitrary
            raise ValueError(EMPTY_QUERY)
        if mode == "dense" and (self.cache is None or self.base.vectors is None):
            raise ValueError("dense search needs an embedding model; this index has none (use bm25)")
        overlay, visible = self._overlay(), self._visible
        base_ok = _under(self.base.paths, dirs, self.base.file_ids, visible)
        over_ok = _under([c.path for c in overlay.chunks], dirs, None, None)
        rankings: list[list[tuple[int, float]]] = []  # (candidate id, score); ids >= len(base) are overlay
        terms = tokenize(query)
        if mode in ("bm25", "hybrid"):
            lex = self.base.lexical
            over = lex.score_docs(terms, overlay.postings or overlay.tokens)
            rankings.append(_top(lex.scores(terms), over, base_ok, over_ok, 0.0))
        if mode in ("dense", "hybrid") and self.cache is not None and self.base.vectors is not None:
            q = self.cache.embedder.encode_query(query)
            over = overlay.vectors @ q if overlay.vectors is not None else np.zeros(0, np.float32)
            assert len(over) == len(overlay.chunks), "overlay chunks without vectors in dense search"
            rankings.append(_top(self.base.vectors @ q, over, base_ok, over_ok, MIN_SIMILARITY))
        if len(rankings) == 1:
            best = rankings[0][:k]
        else:
            fused: dict[int, float] = {}
            for ranking in rankings:
                for rank, (cid, _) in enumerate(ranking):
                    fused[cid] = fused.get(cid, 0.0) + 1.0 / (RRF_K + rank + 1)
            best = sorted(fused.items(), key=lambda kv: (-kv[1], kv[0]))
            if names := _identifiers(query):
                # Fusion is flat at the top (1/61 vs 1/62): near-duplicates the embedding ranks first
                # (load_settings_v3) outranked the one chunk BM25 found holding the identifier asked for.
                best.sort(key=lambda kv: _named_first(self._chunk(kv[0], overlay), names))
            best = best[:k]
        return [_hit(self._chunk(i, overlay), s, set(terms)) for i, s in best]

    def _chunk(self, i: int, overlay: _Overlay) -> Chunk:
        """A candidate id's chunk: the base's, then the overlay's."""
        n = len(self.base.chunks)
        return self.base.chunks[i] if i < n else overlay.chunks[i - n]


_CODE_NAME = re.compile(r"\b[A-Za-z_]\w*(?:_\w|[a-z][A-Z]|[A-Za-z]\d)\w*")  # snake_case, camelCase, v2


def _identifiers(text: str) -> set[str]:
    """The code-shaped names in `text` (not plain words), spelling-blind: load_settings_v2,
    loadSettingsV2 and LOAD_SETTINGS_V2 are one name."""
    return {m.replace("_", "").lower() for m in _CODE_NAME.findall(text)}


def _named_first(chunk: Chunk, names: set[str]) -> tuple[int, int]:
    """Sort key: chunks defining a name asked for, then those holding one, then the rest."""
    defined = {s.rsplit(".", 1)[-1].replace("_", "").lower() for s in chunk.symbols}
    return -len(names & defined), -_names_held(chunk.text, names)


def _names_held(text: str, names: set[str]) -> int:
    """How many of `names` (as `_identifiers` spells them) `text` holds; a substring test first, as
    most candidates hold none and the regex over every one cost more than the search."""
    flat = text.replace("_", "").lower()
    return len(names & _identifiers(text)) if any(n in flat for n in names) else 0


def _under(paths: list[str], dirs: list[str] | None, file_ids: np.ndarray | None, mask: np.ndarray | None):
    """Chunk mask of paths under `dirs` (and `mask`); None when everything is allowed."""
    if not dirs:
        return mask
    ok = np.array([any(d in (".", "") or p == d or p.startswith(d + "/") for d in dirs) for p in paths], bool)
    ok = ok[file_ids] if file_ids is not None else ok
    return ok if mask is None else ok & mask


def _top(base: np.ndarray, over: np.ndarray, base_ok, over_ok, floor: float) -> list[tuple[int, float]]:
    """The CANDIDATES best (id, score) of base and overlay scores above `floor`, best first."""
    scores = np.concatenate([base.astype(np.float32), over.astype(np.float32)])
    ok = scores > floor
    if base_ok is not None:
        ok[: len(base)] &= base_ok
    if over_ok is not None:
        ok[len(base) :] &= over_ok
    ids = np.flatnonzero(ok)
    if len(ids) > CANDIDATES:
        ids = ids[np.argpartition(-scores[ids], CANDIDATES)[:CANDIDATES]]
    ids = ids[np.lexsort((ids, -scores[ids]))]
    return [(int(i), float(scores[i])) for i in ids]


def _hit(chunk: Chunk, score: float, terms: set[str]) -> SearchHit:
    """A hit whose snippet starts just before the chunk's line sharing the most query terms."""
    lines = chunk.text.split("\n")
    overlap = [len(terms & set(tokenize(line))) for line in lines]
    best = max(range(len(overlap)), key=lambda n: (overlap[n], -n)) if overlap else 0
    first = max(0, best - 1) if overlap and overlap[best] else 0
    snippet = "\n".join(line[:200] for line in lines[first : first + SNIPPET_LINES])
    return SearchHit(chunk.path, chunk.start, chunk.end, score, snippet, chunk.symbol, chunk.start + first)
