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

import contextlib
import fcntl
import json
import logging
import os
import re
import shutil
import time
import uuid
import zipfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from vivace.search.chunking import Chunk, chunk_file
from vivace.search.embed import EmbeddingCache
from vivace.search.lexical import LexicalIndex, tokenize
from vivace.search.merkle import MerkleTree
from vivace.search.scan import text_hash

FORMAT = 1
Progress = Callable[[str, int, int], None]  # (stage, done, total); may raise to stop a build between batches
# What a bad base raises. Not any OSError: EMFILE, EACCES or EIO may pass, and must not remove a good base.
DAMAGED = (ValueError, KeyError, TypeError, IndexError, EOFError, zipfile.BadZipFile, FileNotFoundError,
           IsADirectoryError, NotADirectoryError)  # fmt: skip
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
        """Write the base to `directory`, published whole by one rename: a reader, in this process or
        another, sees all of it or nothing. A base another writer published there first is kept (the
        directory is named by the tree's root, so it holds the same) unless it is of another model."""
        directory = Path(directory)
        tmp = directory.with_name(f".{directory.name}.{uuid.uuid4().hex[:8]}")
        meta = {"format": FORMAT, "model": self.model, "files": self.tree.files, "root": self.root}
        try:
            tmp.mkdir(parents=True)
            (tmp / "meta.json").write_text(json.dumps(meta))
            rows = [[c.path, c.start, c.end, list(c.symbols), c.text] for c in self.chunks]
            (tmp / "chunks.json").write_text(json.dumps(rows))
            if self.vectors is not None:
                np.save(tmp / "vectors.npy", self.vectors.astype(np.float16))
            _publish(tmp, directory, meta)
        finally:  # published (renamed away) or failed: no copy is left behind
            shutil.rmtree(tmp, ignore_errors=True)

    @classmethod
    def load(cls, directory: Path, model: str | None, dim: int | None = None) -> BaseIndex | None:
        """The base saved in `directory`, or None when it is missing, damaged, of another format
        or made with another embedding model. A damaged base is removed (and then rebuilt)."""
        directory = Path(directory)
        for _ in range(2):  # read again when another process replaced the base while it was read
            seen = _identity(directory)
            try:
                return cls._read(directory, model, dim)
            except (*DAMAGED, AttributeError) as e:
                damage = e
            except OSError as e:  # not damage: kept for the next process (this one builds the index again)
                log.warning("search cache: could not read the index in %s, skipped (%s)", directory, e)
                return None
            if _discard_if_unchanged(directory, seen):
                log.warning(
                    "search cache: the index in %s is damaged (%s: %s); rebuilding it",
                    directory, type(damage).__name__, damage,
                )  # fmt: skip
                return None
        return None

    @classmethod
    def _read(cls, directory: Path, model: str | None, dim: int | None) -> BaseIndex | None:
        if not (directory / "meta.json").is_file():
            return None
        meta = json.loads((directory / "meta.json").read_text())
        if meta.get("format") != FORMAT or meta.get("model") != model:
            return None
        chunks = _chunks(json.loads((directory / "chunks.json").read_text()), meta["files"])
        vectors = None
        if model is not None:
            vectors = np.load(directory / "vectors.npy").astype(np.float32)
            if vectors.ndim != 2 or vectors.shape != (len(chunks), dim or vectors.shape[-1]):
                raise ValueError(f"vectors of shape {vectors.shape} for {len(chunks)} chunks of {dim} dimensions")
            # Saved vectors are unit length: a NaN or inf is damage (flipped bytes), and would score
            # every chunk NaN, so that dense search returns nothing for as long as the base is reused.
            if not np.isfinite(vectors).all():
                raise ValueError(f"{int((~np.isfinite(vectors)).any(axis=-1).sum())} vectors hold NaN or inf")
        base = cls(meta["files"], chunks, vectors, model)
        if base.root != meta.get("root"):  # a file's hash changed (still valid JSON): no longer this tree's
            raise ValueError(f"its files' root is {base.root}, not {meta.get('root')}")
        return base


def _chunks(rows: Any, files: Any) -> list[Chunk]:
    """chunks.json's rows as chunks, checked: well-formed JSON of the wrong shape is damage too (a
    string line number would fail every search that hit it, for as long as the base is reused)."""
    if not isinstance(files, dict) or not all(isinstance(h, str) for h in files.values()):
        raise ValueError("meta.json's files are not a map of paths to hashes")
    if not isinstance(rows, list):
        raise ValueError("chunks.json holds no list of chunks")
    chunks: list[Chunk] = []
    done: set[str] = set()  # files whose chunks are all read (a base's ranges need them grouped by file)
    for i, row in enumerate(rows):
        if not (isinstance(row, list) and len(row) == 5):
            raise ValueError(f"chunk {i} is not [path, start, end, symbols, text]")
        path, start, end, symbols, text = row
        if not (isinstance(path, str) and type(start) is int and type(end) is int and isinstance(text, str)):
            raise ValueError(f"chunk {i} has a field of the wrong type")
        if not (isinstance(symbols, list) and all(isinstance(x, str) for x in symbols)):
            raise ValueError(f"chunk {i}'s symbols are not a list of names")
        if not 1 <= start <= end:
            raise ValueError(f"chunk {i} spans lines {start}-{end}")
        if path not in files:
            raise ValueError(f"chunk {i}'s file is not among the indexed files")
        if chunks and path != chunks[-1].path:
            done.add(chunks[-1].path)
        if path in done:
            raise ValueError(f"chunk {i}'s file has chunks elsewhere: not grouped by file")
        chunks.append(Chunk(path, start, end, text, tuple(symbols)))
    return chunks


# -- publishing and removing bases, safely across threads and processes -------------------------------


@contextlib.contextmanager
def bases_locked(directory: Path) -> Iterator[None]:
    """An exclusive lock (flock, so across processes too) over replacing or removing the bases in
    `directory`; readers never take it: they see a base whole or not at all."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _publish(tmp: Path, directory: Path, meta: dict[str, Any]) -> None:
    """Rename `tmp` to `directory`. rename() replaces nothing but an empty directory, so a base another
    writer published first stays; one of another model or format (or a stray file) is replaced."""
    with bases_locked(directory.parent):
        _sweep_leftovers(directory.parent, keep=tmp)
        try:
            os.rename(tmp, directory)
            return
        except OSError:
            if not os.path.lexists(directory):
                raise
        if _same_base(directory, meta):
            return
        _discard(directory)
        os.rename(tmp, directory)


_LEFTOVER = re.compile(r"\.[0-9a-f]+\.((old\.)?[0-9a-f]{8}|lock)")  # save()'s, _discard()'s and build locks' names
LEFTOVER_AGE_S = 3600.0  # a save writes its copy in seconds: one untouched for an hour is no live writer's


def _sweep_leftovers(bases: Path, keep: Path) -> None:
    """Remove the copies that saves and discards killed midway (SIGKILL, a power cut) left in `bases`:
    each holds a whole base (its vectors too), and nothing else would ever remove them."""
    cutoff = time.time() - LEFTOVER_AGE_S
    for entry in os.scandir(bases):
        if entry.path == str(keep) or not _LEFTOVER.fullmatch(entry.name):
            continue
        try:
            if entry.stat(follow_symlinks=False).st_mtime >= cutoff:
                continue
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path)
            else:
                os.unlink(entry.path)
        except OSError:  # removed meanwhile, or not ours to remove: left as it is
            pass


def _same_base(directory: Path, meta: dict[str, Any]) -> bool:
    """Whether `directory` holds the base `meta` describes. By its files, not its "root" field: a meta.json
    with one hash changed still names the right root, and was kept by every save while no load used it."""
    try:
        theirs = json.loads((directory / "meta.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(theirs, dict) and all(theirs.get(k) == meta[k] for k in ("format", "model", "files"))


def _identity(path: Path) -> tuple[int, int, int] | None:
    """Which directory stands at `path` (a replaced one differs, even where its inode number is reused)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_ctime_ns


def _discard_if_unchanged(directory: Path, seen: tuple[int, int, int] | None) -> bool:
    """Remove the damaged base at `directory` unless another process replaced it since it was read."""
    try:
        with bases_locked(directory.parent):
            if seen is None or _identity(directory) != seen:
                return False
            _discard(directory)
    except OSError:  # gone, or a read-only cache: it is rebuilt in memory all the same
        pass
    return True


def discard_base(directory: Path, locked: bool = False) -> None:
    """Remove the saved base at `directory`, if any, under the bases' lock (`locked`: the caller holds it;
    a reader holding the base open keeps reading it; a later load rebuilds it)."""
    try:
        with contextlib.nullcontext() if locked else bases_locked(directory.parent):
            if os.path.lexists(directory):
                _discard(directory)
    except OSError as e:  # a read-only cache, or removed meanwhile: it only stays on disk
        log.debug("search cache: could not remove %s: %s", directory, e)


def _discard(path: Path) -> None:
    """Remove a base, or whatever stands in its place; renamed aside first, so that no reader sees it
    half deleted."""
    aside = path.with_name(f".{path.name}.old.{uuid.uuid4().hex[:8]}")
    os.rename(path, aside)
    if aside.is_dir() and not aside.is_symlink():
        shutil.rmtree(aside, ignore_errors=True)
    else:
        aside.unlink()
