"""The base index of one file tree: chunks, their vectors, BM25, and the tree's Merkle hashes.

A base is built once per distinct tree (its Merkle root) and never changes afterwards, so
any number of workspaces can search it at the same time; each workspace keeps its own
changes in an overlay (view.py). Building is chunking (tree-sitter), embedding through the
shared cache (only texts never seen before reach the model) and one bm25s index.

On disk a base is a directory: meta.json (files and their hashes, the model's identity),
chunks.json and vectors.npy (float16). BM25 is rebuilt from the chunks when loaded, which is
cheap next to embedding and keeps the format independent of bm25s' own.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
import uuid
import zipfile
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np

from vivace.search.chunking import Chunk, chunk_file
from vivace.search.embed import EmbeddingCache
from vivace.search.lexical import LexicalIndex, tokenize
from vivace.search.merkle import MerkleTree
from vivace.search.scan import text_hash

FORMAT = 1
Progress = Callable[[str, int, int], None]  # (stage, done, total); may raise to stop a build between batches
DAMAGED = (OSError, ValueError, KeyError, TypeError, IndexError, EOFError, zipfile.BadZipFile)  # what a bad file raises
log = logging.getLogger(__name__)


def embed_text(chunk: Chunk) -> str:
    """What the embedder reads for a chunk: its path and the names it defines (hints of purpose
    that survive the model's truncation at 256 word pieces, which a merged chunk's last
    definitions would not), then its code."""
    names = ", ".join(chunk.symbols[:12])
    return f"{chunk.path}: {names}\n{chunk.text}" if names else f"{chunk.path}\n{chunk.text}"


def doc_tokens(chunk: Chunk) -> list[str]:
    return tokenize(chunk.path) + tokenize(chunk.text)


def chunk_files(texts: Mapping[str, str]) -> list[Chunk]:
    """Chunks of every file, grouped by path in sorted order."""
    return [c for path in sorted(texts) for c in chunk_file(path, texts[path])]


class BaseIndex:
    """Immutable index of one tree. `files`: path -> content hash of every indexed file."""

    build_s: float = 0.0  # seconds the build took (chunk + embed + BM25); 0 for a loaded base

    def __init__(self, files: Mapping[str, str], chunks: list[Chunk], vectors: np.ndarray | None, model: str | None):
        assert vectors is None or len(vectors) == len(chunks), "a base needs one vector per chunk"
        self.tree = MerkleTree(files)
        self.chunks = chunks
        self.vectors = vectors  # (len(chunks), dim) float32, L2-normalised; None: no embedder (BM25 only)
        self.model = model  # the embedder's identity (embed.fingerprint)
        self.lexical = LexicalIndex([doc_tokens(c) for c in chunks])
        self.paths = sorted({c.path for c in chunks})
        ids = {p: i for i, p in enumerate(self.paths)}
        self.file_ids = np.array([ids[c.path] for c in chunks], dtype=np.int32)  # chunk -> index in paths
        self.ranges: dict[str, tuple[int, int]] = {}  # path -> [first, last) chunk indices
        for i, c in enumerate(chunks):
            lo, _ = self.ranges.get(c.path, (i, i))
            self.ranges[c.path] = (lo, i + 1)

    @property
    def root(self) -> str:
        return self.tree.root

    @classmethod
    def build(
        cls, texts: Mapping[str, str], cache: EmbeddingCache | None, progress: Progress | None = None
    ) -> BaseIndex:
        """Index the given file texts (path -> text)."""
        t0 = time.perf_counter()
        chunks = chunk_files(texts)
        if progress:
            progress("chunked", len(chunks), len(chunks))
        vectors = None
        if cache is not None:
            step = (lambda done, total: progress("embedded", done, total)) if progress else None
            try:
                vectors = cache.embed([embed_text(c) for c in chunks], step)
            finally:  # a build stopped half way keeps what it embedded: the next one resumes there
                cache.flush()
        model = cache.embedder.id if cache is not None else None  # not truthiness: an empty cache is falsy
        base = cls({p: text_hash(t) for p, t in texts.items()}, chunks, vectors, model)
        base.build_s = time.perf_counter() - t0
        return base

    def save(self, directory: Path) -> None:
        """Write the base to `directory` (replaced atomically)."""
        directory = Path(directory)
        tmp = directory.with_name(f".{directory.name}.{uuid.uuid4().hex[:8]}")
        tmp.mkdir(parents=True)
        meta = {"format": FORMAT, "model": self.model, "files": self.tree.files, "root": self.root}
        (tmp / "meta.json").write_text(json.dumps(meta))
        rows = [[c.path, c.start, c.end, list(c.symbols), c.text] for c in self.chunks]
        (tmp / "chunks.json").write_text(json.dumps(rows))
        if self.vectors is not None:
            np.save(tmp / "vectors.npy", self.vectors.astype(np.float16))
        if directory.exists():
            shutil.rmtree(directory, ignore_errors=True)
        os.replace(tmp, directory)

    @classmethod
    def load(cls, directory: Path, model: str | None) -> BaseIndex | None:
        """The base saved in `directory`, or None when it is missing, damaged, of another format
        or made with another embedding model."""
        directory = Path(directory)
        if not (directory / "meta.json").is_file():
            return None
        try:
            meta = json.loads((directory / "meta.json").read_text())
            if meta.get("format") != FORMAT or meta.get("model") != model:
                return None
            rows = json.loads((directory / "chunks.json").read_text())
            chunks = [Chunk(p, s, e, t, tuple(sy)) for p, s, e, sy, t in rows]
            vectors = None
            if model is not None:
                vectors = np.load(directory / "vectors.npy").astype(np.float32)
                if vectors.shape != (len(chunks), vectors.shape[-1]):
                    raise ValueError(f"{vectors.shape[0]} vectors for {len(chunks)} chunks")
                # Saved vectors are unit length: a NaN or inf is damage (flipped bytes), and would score
                # every chunk NaN, so that dense search returns nothing for as long as the base is reused.
                if not np.isfinite(vectors).all():
                    raise ValueError(f"{int((~np.isfinite(vectors)).any(axis=-1).sum())} vectors hold NaN or inf")
            return cls(meta["files"], chunks, vectors, model)
        except (*DAMAGED, AttributeError) as e:
            log.warning(
                "search cache: the index in %s is damaged (%s: %s); rebuilding it", directory, type(e).__name__, e
            )
            shutil.rmtree(directory, ignore_errors=True)  # saved bases are renamed in whole: it stays damaged
            return None
