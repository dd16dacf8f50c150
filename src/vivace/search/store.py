"""Base indexes by Merkle root: built once, kept in memory (LRU) and on disk, shared by views.

Workspaces made from one snapshot have the same root, so the first one's index serves all of
them; a tree that is not indexed yet but shares most of its files with a base in memory (a
workspace that changed things before its first search, a repository after a few commits)
uses that base plus an overlay instead of a new build. Disk layout: `DIR/bases/<root>/`
(index.py's format) and `DIR/repos/<hash of a directory's path>` naming the root last built
for that directory (`vivace index build`).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import logging
import os
import re
import threading
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Mapping
from pathlib import Path

from vivace.files import remove_stale
from vivace.search.embed import EmbeddingCache
from vivace.search.index import LEFTOVER_AGE_S, BaseIndex, bases_locked, discard_base

log = logging.getLogger(__name__)

# Saved bases past this size go, least recently used first (a base of a 3,400-file repository holds
# ~30 MB): an RL run or a developer's agent over many repositories saved one per snapshot searched,
# and none was ever removed. One used within MIN_IDLE_S stays whatever the size, as does one a
# directory's record names (`vivace index build`).
MAX_BASES_BYTES = 4 << 30
MIN_IDLE_S = 3600.0
_ROOT = re.compile(r"[0-9a-f]{8,64}")


class BaseStore:
    def __init__(self, cache: EmbeddingCache | None, directory: Path | None, capacity: int = 8):
        self.cache = cache
        self.dir = Path(directory) if directory is not None else None
        self.capacity = capacity
        self.builds = 0  # bases built by this store (tests count them)
        self._bases: OrderedDict[str, BaseIndex] = OrderedDict()
        self._lock = threading.Lock()

    @property
    def model(self) -> str | None:
        return self.cache.embedder.id if self.cache is not None else None

    def get(self, root: str) -> BaseIndex | None:
        with self._lock:
            base = self._bases.get(root)
            if base is not None:
                self._bases.move_to_end(root)
                return base
        if self.dir is None:
            return None
        dim = self.cache.embedder.dim if self.cache is not None else None
        base = BaseIndex.load(self.dir / "bases" / root, self.model, dim)
        if base is not None and base.root != root:  # kept, it would be read in vain by every process
            log.warning("search cache: %s holds the index of another tree; rebuilding it", self.dir / "bases" / root)
            discard_base(self.dir / "bases" / root)
            return None
        if base is not None:
            _mark_used(self.dir / "bases" / root)
            self._remember(base)
        return base

    def put(self, base: BaseIndex, built: bool = True) -> None:
        self.builds += built
        self._remember(base)
        if self.dir is not None:
            try:
                base.save(self.dir / "bases" / base.root)
                _mark_used(self.dir / "bases" / base.root)
                self.prune()
            except OSError as e:  # a read-only or full cache disk costs a rebuild later, never a failed search
                log.warning("search cache: could not save the index under %s: %s", self.dir / "bases", e)

    def prune(self) -> list[str]:
        """Remove saved bases, least recently used first, until they hold at most MAX_BASES_BYTES; spares
        those used within MIN_IDLE_S and those a directory's record names. Returns the roots removed."""
        bases = self.dir / "bases" if self.dir is not None else None
        if bases is None or not bases.is_dir():
            return []
        entries = []
        for entry in os.scandir(bases):
            if _ROOT.fullmatch(entry.name) and entry.is_dir(follow_symlinks=False):
                with contextlib.suppress(OSError):  # removed meanwhile
                    entries.append((*_usage(Path(entry.path)), entry.name))
        total = sum(size for _, size, _ in entries)
        if total <= MAX_BASES_BYTES:
            return []
        removed = []
        # Under the bases' lock, which set_last_root holds while it records a root: records read before
        # it could miss one written meanwhile, and remove the base it had just named.
        with bases_locked(bases):
            recorded, now = self._recorded_roots(), time.time()
            for last_use, size, root in sorted(entries):
                if total <= MAX_BASES_BYTES or now - last_use < MIN_IDLE_S:
                    break
                if root in recorded or _used_since(bases / root, last_use):
                    continue
                discard_base(bases / root, locked=True)
                removed.append(root)
                total -= size
        return removed

    @contextlib.asynccontextmanager
    async def building(self, root: str) -> AsyncIterator[None]:
        """Held while `root`'s base is built, across processes: two builds of one tree at once each
        embedded all of it. A waiter polls (so that Ctrl-C stops it) and should then look for the
        base again. Without a writable cache, builds just go unserialised."""
        fd, path = None, self.dir / "bases" / f".{root}.lock" if self.dir is not None else None
        if path is not None:
            with contextlib.suppress(OSError):
                path.parent.mkdir(parents=True, exist_ok=True)
                fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            while fd is not None:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    await asyncio.sleep(0.1)
                except OSError:  # no locks on this file system
                    break
            yield
        finally:
            if fd is not None:
                # Removed while held: a process that opened it meanwhile, then locks it, finds the base saved.
                # One a killed build left is swept as a leftover (index._sweep_leftovers).
                with contextlib.suppress(OSError):
                    if os.stat(path).st_ino == os.fstat(fd).st_ino:
                        path.unlink()
                os.close(fd)

    def saved(self, root: str) -> bool:
        """Whether the base of `root` is on disk, for other processes to reuse."""
        return self.dir is not None and (self.dir / "bases" / root / "meta.json").is_file()

    def closest(self, files: Mapping[str, str], threshold: float) -> BaseIndex | None:
        """The base in memory holding the most of `files` (same path and hash), if it holds at
        least `threshold` of them."""
        with self._lock:
            bases = list(self._bases.values())
        best, best_n = None, 0
        for base in bases:
            theirs = base.tree.files
            n = sum(1 for p, h in files.items() if theirs.get(p) == h)
            if n > best_n:
                best, best_n = base, n
        return best if files and best_n >= threshold * len(files) else None

    def _remember(self, base: BaseIndex) -> None:
        with self._lock:
            self._bases[base.root] = base
            self._bases.move_to_end(base.root)
            while len(self._bases) > self.capacity:
                self._bases.popitem(last=False)

    # -- directories (the CLI) ------------------------------------------------------------------

    def _pointer(self, repo: Path) -> Path | None:
        if self.dir is None:
            return None
        # fsencode: a directory's name need not be UTF-8 (its stray bytes are surrogates here).
        key = hashlib.blake2b(os.fsencode(Path(repo).resolve()), digest_size=12).hexdigest()
        return self.dir / "repos" / key

    def last_root(self, repo: Path) -> str | None:
        pointer = self._pointer(repo)
        if pointer is None or not pointer.is_file():
            return None
        try:
            root = pointer.read_bytes().decode("ascii").strip()
            if not re.fullmatch(r"[0-9a-f]{8,64}", root):
                raise ValueError(f"not a Merkle root: {root[:40]!r}")
        except (OSError, ValueError) as e:  # damaged: as if the directory had never been indexed
            log.warning("search cache: ignoring damaged %s (%s)", pointer, e)
            return None
        return root

    def set_last_root(self, repo: Path, root: str) -> None:
        """Record `root` as `repo`'s index. The base it replaces is removed unless another directory's
        record names it: every `index build` of a changed tree saved a whole new base, and nothing
        removed the old ones (a daily build grew the cache by an index a day). Rebuilding a removed
        base costs chunking and BM25 only: its vectors stay in the embedding cache.

        Under the bases' lock, and only to a base on disk: a search that opened an older base, recording
        it after a build of the same directory had replaced it, removed the build's base and named one
        already removed."""
        pointer = self._pointer(repo)
        if pointer is None:
            return
        try:
            with bases_locked(self.dir / "bases"):
                if not self.saved(root):  # its save failed, or another build of `repo` replaced it since
                    return
                previous = self.last_root(repo)
                pointer.parent.mkdir(parents=True, exist_ok=True)
                remove_stale(pointer.parent, ".*", LEFTOVER_AGE_S)  # records a writer killed midway left
                tmp = pointer.with_name(f".{pointer.name}.{os.getpid()}")
                tmp.write_text(root + "\n")
                tmp.replace(pointer)  # whole or not at all: a reader never finds half a root
                if previous is not None and previous != root and previous not in self._recorded_roots():
                    discard_base(self.dir / "bases" / previous, locked=True)
        except OSError as e:  # costs the next search a closest-base lookup, never a failure
            log.warning("search cache: could not record the index of %s: %s", repo, e)

    def _recorded_roots(self) -> set[str]:
        """The roots some directory's record names."""
        repos = self.dir / "repos" if self.dir is not None else None
        roots = set()
        for pointer in repos.iterdir() if repos is not None and repos.is_dir() else ():  # none: nothing recorded
            if pointer.name.startswith("."):  # a record being written, or one a killed writer left
                continue
            with contextlib.suppress(OSError):
                roots.add(pointer.read_bytes().decode("ascii", "replace").strip())
        return roots


def _mark_used(directory: Path) -> None:
    """Note that the saved base was used now (its directory's mtime), for `prune`'s order."""
    with contextlib.suppress(OSError):  # removed meanwhile, or a read-only cache
        os.utime(directory)


def _used_since(directory: Path, last_use: float) -> bool:
    """Whether the saved base was used (or removed) after `last_use`, the time prune read."""
    try:
        return directory.stat().st_mtime != last_use
    except OSError:
        return True


def _usage(directory: Path) -> tuple[float, int]:
    """(last use, bytes) of a saved base: a base is its directory's few files."""
    size = sum(e.stat(follow_symlinks=False).st_size for e in os.scandir(directory))
    return directory.stat().st_mtime, size
