"""The codebase_search backend: a hybrid index per workspace over bases shared by all of them.

One HybridSearch serves a whole process (`default_backend`): every episode's workspace gets a
TreeState whose view shares the base of its snapshot, so a thousand rollouts of one
repository embed it once, and each query first refreshes the workspace's overlay, so an edit
is searchable at once. Without an embedding model (not installed, or failing to load) it
still works, as BM25 over the same chunks, and says so once in the log.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time
import weakref
from typing import Any

from vivace.harness.tools.search import IndexNotReady, rel_path
from vivace.sandbox.base import Workspace
from vivace.search.config import SearchConfig
from vivace.search.embed import EmbedderUnavailable, EmbeddingCache, shared
from vivace.search.tree import Indexer, TreeState, WorkspaceSource
from vivace.search.types import SearchHit
from vivace.search.view import EMPTY_QUERY

log = logging.getLogger(__name__)
_AUTO: Any = object()
# How long a search waits for a workspace's index to be built before IndexNotReady (codebase_search then
# answers by terms): every file embedded on CPU took 66-212 s on repositories of 342 to 20,000 files.
FIRST_BUILD_WAIT_S = 30.0


def open_cache(config: SearchConfig) -> EmbeddingCache | None:
    """The shared embedding cache for `config`, or None (BM25 only) when no model can be had."""
    try:
        return shared(config.model, config.cache_dir / "embeddings" if config.cache_dir else None)
    except EmbedderUnavailable as e:
        log.warning("codebase_search without embeddings (BM25 only): %s", e)
        return None


class _PerWorkspace:
    """Values keyed by workspace: weakly where the workspace allows it, so closed ones drop out."""

    def __init__(self) -> None:
        self.weak: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self.strong: dict[int, Any] = {}

    def get_for(self, ws: Any) -> Any:
        try:
            return self.weak.get(ws)
        except TypeError:
            return self.strong.get(id(ws))

    def set_for(self, ws: Any, value: Any) -> None:
        try:
            self.weak[ws] = value
        except TypeError:
            self.strong[id(ws)] = value

    def pop_for(self, ws: Any) -> None:
        try:
            self.weak.pop(ws, None)
        except TypeError:
            self.strong.pop(id(ws), None)


class HybridSearch:
    """SearchBackend (harness.tools.search) over the semantic index."""

    def __init__(
        self, config: SearchConfig | None = None, cache: EmbeddingCache | None = _AUTO, indexer: Indexer | None = None
    ):
        """`cache`: the embedding cache (default: the process-wide one for config.model; None: BM25
        only); `indexer`: share another backend's bases and cache (config and cache then come from it)."""
        if indexer is None:
            config = config or SearchConfig()
            indexer = Indexer(config, open_cache(config) if cache is _AUTO else cache)
        self.config, self.indexer = indexer.config, indexer
        self._indexes = _PerWorkspace()  # workspace -> TreeState
        # workspace -> (the task building its index (its first scan), when it started)
        self._opening = _PerWorkspace()

    async def state(self, workspace: Workspace) -> TreeState:
        """The workspace's index, opened on first use and refreshed on every later call; IndexNotReady
        once the opening has taken FIRST_BUILD_WAIT_S (it goes on, for a later call)."""
        state = self._indexes.get_for(workspace)
        if state is None:
            opening, started = self._opening.get_for(workspace) or (None, 0.0)
            if opening is None or (opening.done() and (opening.cancelled() or opening.exception())):  # try again
                opening, started = asyncio.ensure_future(self._open(workspace)), time.monotonic()
                opening.add_done_callback(functools.partial(self._settled, workspace))
                self._opening.set_for(workspace, (opening, started))
            try:  # from the build's start: a search after one that got term matches does not wait again
                return await asyncio.wait_for(asyncio.shield(opening), started + FIRST_BUILD_WAIT_S - time.monotonic())
            except TimeoutError:
                built_for = time.monotonic() - started
                raise IndexNotReady(
                    f"the index of this workspace is still being built ({built_for:.0f} s so far)"
                ) from None
        async with state.lock:  # two searches in one turn: the second reuses the first's refresh
            await self.indexer.refresh(WorkspaceSource(workspace, self.config), state)
        return state

    def _settled(self, workspace: Workspace, opening: asyncio.Task) -> None:
        """A failed or cancelled opening is dropped (the next search tries again; its error was raised to
        whoever waited): kept, its traceback's frames held the workspace, which never left the weak map,
        and with it every closed workspace whose search an episode's timeout cut short."""
        if opening.cancelled() or opening.exception() is not None:
            self._opening.pop_for(workspace)

    async def _open(self, workspace: Workspace) -> TreeState:
        state = await self.indexer.open(WorkspaceSource(workspace, self.config))
        self._indexes.set_for(workspace, state)
        return state

    async def search(
        self, workspace: Workspace, query: str, target_directories: list[str] | None, k: int
    ) -> list[SearchHit]:
        if not query.strip():  # refused before the workspace is scanned
            raise ValueError(EMPTY_QUERY)
        state = await self.state(workspace)
        dirs = [d for d in (rel_path(t) for t in target_directories or []) if d is not None]
        if target_directories and not dirs:
            return []  # every directory named lies outside the workspace
        return await asyncio.to_thread(state.view.search, query, k, self.config.mode, dirs or None)


_default: HybridSearch | None = None
_default_lock = threading.Lock()


def default_backend() -> HybridSearch:
    """The process-wide backend (default SearchConfig): shared by every episode in the process."""
    global _default
    with _default_lock:
        if _default is None:
            _default = HybridSearch()
        return _default
