"""Keeping one tree's index current: where files come from, the first open, and refreshes.

A source is a workspace (the scan script runs inside it through `exec`, so local, isolated
and remote workspaces behave alike) or a host directory (the same script, imported).

open: one scan hashing every file gives the tree's Merkle root; the base with that root is
used as is (the common case: the 2nd..Nth workspace of a snapshot reads nothing else), else a
base sharing most files plus an overlay of the difference (found by a Merkle diff), else a
new base built from the tree. refresh: one scan lists stats and returns the texts of files
modified since the previous scan; only files whose stat changed are re-chunked and, through
the content cache, only their changed chunks are re-embedded.
"""

from __future__ import annotations

import asyncio
import json
import logging
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from vivace.sandbox.base import Workspace
from vivace.search import scan as scan_mod
from vivace.search.config import SearchConfig
from vivace.search.embed import EmbeddingCache
from vivace.search.index import BaseIndex, Progress
from vivace.search.merkle import MerkleTree
from vivace.search.store import BaseStore
from vivace.search.view import IndexView

SCAN_SOURCE = Path(scan_mod.__file__).read_text()
SCAN_TIMEOUT_S = 120.0
MARGIN_NS = 100_000_000  # files modified this long before a scan are sent again (coarse mtime clocks)
TEXT_BUDGET = 150_000  # characters of file text per exec (compressed, well under the sandbox's output cap)
PAGE = 2_000  # files per scan exec when a whole listing does not fit in the output cap
READ_BATCH = 500  # paths per read exec (argv stays small)
log = logging.getLogger(__name__)
_warned_over: set[str] = set()  # Merkle roots whose max_files cut was logged


class Source(Protocol):
    async def scan(self, since_ns: int | None = None, hashes: bool = False) -> dict[str, Any]: ...

    async def read(self, paths: list[str]) -> dict[str, str | None]: ...


@dataclass
class DirectorySource:
    """A host directory, scanned in-process (off the event loop)."""

    root: Path
    config: SearchConfig

    async def scan(self, since_ns: int | None = None, hashes: bool = False) -> dict[str, Any]:
        c = self.config
        return await asyncio.to_thread(
            scan_mod.scan, str(self.root), since_ns, hashes, c.max_files, c.max_file_bytes, TEXT_BUDGET
        )

    async def read(self, paths: list[str]) -> dict[str, str | None]:
        got = await asyncio.to_thread(scan_mod.read_many, str(self.root), paths, self.config.max_file_bytes, 1 << 62)
        return got["texts"]


class _TooBig(Exception):
    """The sandbox dropped part of the output: ask for less."""


@dataclass
class WorkspaceSource:
    """A workspace, scanned by running scan.py inside it (`python3 -c`)."""

    ws: Workspace
    config: SearchConfig

    async def _run(self, args: dict[str, Any], paths: list[str] | None = None) -> dict[str, Any]:
        argv = ["python3", "-c", SCAN_SOURCE, json.dumps(args), *(paths or [])]
        res = await self.ws.exec(argv, timeout=SCAN_TIMEOUT_S)
        if res.stdout_dropped:
            raise _TooBig()
        if res.exit_code != 0:
            raise OSError(f"indexing the workspace failed (exit code {res.exit_code}): {res.stderr.strip()[-500:]}")
        try:
            return scan_mod.decode(res.stdout.strip())
        except ValueError as e:
            raise OSError(f"indexing the workspace failed: unreadable scan output ({e})") from e

    async def scan(self, since_ns: int | None = None, hashes: bool = False) -> dict[str, Any]:
        c = self.config
        args = {"mode": "scan", "since_ns": since_ns, "hashes": hashes, "max_files": c.max_files}
        args |= {"max_bytes": c.max_file_bytes, "budget": TEXT_BUDGET}
        try:
            return await self._run(args)
        except _TooBig:
            pass
        out: dict[str, Any] = {"files": [], "texts": {}, "skipped": 0}
        offset, page = 0, PAGE
        while True:
            try:
                got = await self._run(args | {"offset": offset, "limit": page, "budget": TEXT_BUDGET // 4})
            except _TooBig:
                if page <= 50:
                    raise OSError("indexing the workspace failed: the sandbox's output cap is too small") from None
                page //= 2
                continue
            out.setdefault("clock", got["clock"])  # the first page's clock: later edits are seen next time
            out["files"] += got["files"]
            out["texts"] |= got["texts"]
            out["skipped"] += got["skipped"]
            offset += page
            if offset >= got["total"]:
                return out | {"total": got["total"], "over_max_files": got.get("over_max_files", 0)}

    async def read(self, paths: list[str]) -> dict[str, str | None]:
        out: dict[str, str | None] = {}
        budget = TEXT_BUDGET * 2
        unread = list(paths)
        while unread:
            batch = unread[:READ_BATCH]
            try:
                got = await self._run(
                    {"mode": "read", "max_bytes": self.config.max_file_bytes, "budget": budget}, batch
                )
            except _TooBig:
                if budget > 8_000:
                    budget //= 2
                else:  # one file alone does not fit: leave it out of the index
                    out[unread.pop(0)] = None
                continue
            out |= got["texts"]
            done = len(batch) - len(got["rest"])
            unread = unread[done:]
        return out


@dataclass
class TreeState:
    """One tree's index: the view, and the file stats of its last scan."""

    view: IndexView
    stats: dict[str, tuple[int, int]]  # path -> (size, mtime_ns) of every file the scan listed
    clock: int  # the source's clock (ns) at the last scan
    skipped: int = 0  # files the first scan listed but could not index (binary, oversized, unreadable)
    over_max_files: int = 0  # files the first scan left out: the tree holds more than config.max_files
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    @property
    def bm25(self) -> Any:
        """The BM25 index searched (the shared base's: it is never rebuilt for a workspace)."""
        return self.view.base.lexical


class Indexer:
    """Opens and refreshes TreeStates over one store of bases and one embedding cache."""

    def __init__(self, config: SearchConfig, cache: EmbeddingCache | None, store: BaseStore | None = None):
        self.config, self.cache = config, cache
        cache_dir = config.cache_dir
        self.store = store or BaseStore(cache, cache_dir, config.bases_in_memory)
        self._locks: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # loop -> {root: Lock}

    def _root_lock(self, root: str) -> asyncio.Lock:
        # Held weakly: a lock lives while someone holds or awaits it (every episode's edits make a new root).
        locks = self._locks.setdefault(asyncio.get_running_loop(), weakref.WeakValueDictionary())
        return locks.setdefault(root, asyncio.Lock())

    async def open(self, source: Source, progress: Progress | None = None, share: bool = True) -> TreeState:
        """The source's index. `share`: a tree not indexed yet may reuse a similar base plus an
        overlay (False: it gets a base of its own, saved under its root, as `index build` wants)."""
        listing = await source.scan(hashes=True)
        files = {p: h for p, _, _, h in listing["files"] if h}
        tree = MerkleTree(files)
        base = await self.base_for(source, tree, progress, share)
        view = IndexView(base, self.cache)
        diff = base.tree.diff(tree)
        if diff:
            texts = await source.read([p for p, h in diff.items() if h is not None])
            await asyncio.to_thread(view.apply, {p: texts.get(p) if h is not None else None for p, h in diff.items()})
            if self.cache is not None:  # the next process opening this tree reuses these vectors
                await asyncio.to_thread(self.cache.flush)
        stats = {p: (size, mtime) for p, size, mtime, _ in listing["files"]}
        over = listing.get("over_max_files", 0)
        if over and tree.root not in _warned_over:
            _warned_over.add(tree.root)  # once per tree: every workspace of a snapshot would say the same
            log.warning("search: %d files over max_files=%d not indexed", over, self.config.max_files)
        return TreeState(view, stats, listing["clock"], listing.get("skipped", 0), over)

    async def base_for(
        self, source: Source, tree: MerkleTree, progress: Progress | None = None, share: bool = True
    ) -> BaseIndex:
        """The base with `tree`'s root; else (`share`) one sharing most of its files; else a new build."""
        async with self._root_lock(tree.root):
            base = await asyncio.to_thread(self.store.get, tree.root)
            if base is None and share:
                base = self.store.closest(tree.files, self.config.share_threshold)
            if base is None:
                async with self.store.building(tree.root):
                    base = await asyncio.to_thread(self.store.get, tree.root)  # built by another process meanwhile
                    if base is None:
                        texts = await source.read(sorted(tree.files))
                        texts = {p: t for p, t in texts.items() if t is not None}
                        base = await asyncio.to_thread(BaseIndex.build, texts, self.cache, progress)
                        await asyncio.to_thread(self.store.put, base)
        return base

    async def refresh(self, source: Source, state: TreeState) -> int:
        """Bring `state` up to date with the source; returns how many files changed."""
        listing = await source.scan(since_ns=state.clock - MARGIN_NS)
        stats = {p: (size, mtime) for p, size, mtime, _ in listing["files"]}
        changed = [p for p, st in stats.items() if state.stats.get(p) != st]
        removed = [p for p in state.stats if p not in stats]
        if changed or removed:
            texts = {p: listing["texts"][p] for p in changed if p in listing["texts"]}
            missing = [p for p in changed if p not in texts]
            if missing:
                texts |= await source.read(missing)
            changes = {p: texts.get(p) for p in changed} | dict.fromkeys(removed)
            await asyncio.to_thread(state.view.apply, changes)
        state.stats, state.clock = stats, listing["clock"]
        return len(changed) + len(removed)
