"""Choosing a backend, and the burst-friendly pool that hands out workspaces.

RL starts many rollouts of one task at once. The pool bounds how many workspaces are being
created at the same time (creation is mount- and CPU-bound), caps how many are alive
(callers beyond the cap wait; nothing fails), and can keep a few ready in advance.
"""

from __future__ import annotations

import asyncio
import sys
import time
import warnings
from typing import Any

from vivace.config import PoolConfig, SandboxConfig
from vivace.sandbox.base import BackendUnavailable, LatencyStats
from vivace.sandbox.local import LocalBackend, LocalWorkspace
from vivace.sandbox.snapshot import Snapshot, SnapshotSource


def open_backend(config: SandboxConfig | None = None) -> LocalBackend:
    """The backend `config.backend` names; `auto` falls back to plain with a loud warning."""
    from vivace.sandbox.isolated import IsolatedBackend
    from vivace.sandbox.plain import UNISOLATED_WARNING, PlainBackend

    config = config or SandboxConfig()
    if config.backend == "plain":
        return PlainBackend(config)
    try:
        return IsolatedBackend(config)
    except BackendUnavailable as e:
        if config.backend == "isolated":
            raise
        message = f"{e}\n{UNISOLATED_WARNING}"
        warnings.warn(message, RuntimeWarning, stacklevel=2)
        print(f"WARNING: {message}", file=sys.stderr)
        return PlainBackend(config, fallback=str(e))


class WorkspacePool:
    """Workspaces of one snapshot, created in bounded bursts, with a cap on live ones."""

    def __init__(
        self, backend: LocalBackend, snapshot: Snapshot | SnapshotSource | str, config: PoolConfig | None = None
    ):
        self.backend = backend
        # Given a source, the pool claims its snapshot itself and releases it when closed.
        self._claimed = not isinstance(snapshot, Snapshot)
        self.snapshot = backend.snapshot(snapshot) if self._claimed else snapshot
        self.config = config or PoolConfig()
        self._live = asyncio.Semaphore(self.config.max_live)
        self._creating = asyncio.Semaphore(self.config.create_concurrency)
        self._warm: asyncio.Queue[LocalWorkspace] = asyncio.Queue()
        self._refills: set[asyncio.Task] = set()
        self.waiting = 0
        self.live = 0
        self.acquire_wait = LatencyStats()
        self._closed = False

    async def start(self) -> None:
        """Fill the warm pool (if configured) before the first burst arrives."""
        for _ in range(self.config.warm):
            self._refill()
        await asyncio.gather(*self._refills, return_exceptions=True)

    async def acquire(self) -> LocalWorkspace:
        """A fresh workspace; waits while `max_live` are alive. Close it to free the slot."""
        if self._closed:
            raise RuntimeError("pool is closed")
        t0 = time.perf_counter()
        self.waiting += 1
        try:
            await self._live.acquire()
        finally:
            self.waiting -= 1
        try:
            ws = self._warm.get_nowait() if not self._warm.empty() else await self._create()
        except BaseException:
            self._live.release()
            raise
        self.live += 1
        self.acquire_wait.add(time.perf_counter() - t0)
        self._wrap_close(ws)
        if self.config.warm and not self._closed:
            self._refill()
        return ws

    def _wrap_close(self, ws: LocalWorkspace) -> None:
        original = ws.close
        released = False

        async def close() -> None:
            nonlocal released
            try:
                await original()
            finally:
                if not released:
                    released = True
                    self.live -= 1
                    self._live.release()

        ws.close = close  # type: ignore[method-assign]

    async def _create(self) -> LocalWorkspace:
        async with self._creating:
            return await self.backend.create(self.snapshot)

    def _refill(self) -> None:
        if self._warm.qsize() + len(self._refills) >= self.config.warm:
            return

        async def make() -> None:
            self._warm.put_nowait(await self._create())

        task = asyncio.create_task(make())
        self._refills.add(task)
        task.add_done_callback(self._refills.discard)

    def metrics(self) -> dict[str, Any]:
        return {
            "snapshot": self.snapshot.key,
            "live": self.live,
            "warm": self._warm.qsize(),
            "waiting": self.waiting,
            "max_live": self.config.max_live,
            "acquire_wait": self.acquire_wait.summary(),
            "backend": self.backend.metrics.to_dict(),
        }

    async def close(self) -> None:
        """Destroy the warm workspaces; workspaces handed out are closed by their holders."""
        if self._closed:
            return
        self._closed = True
        try:
            for task in list(self._refills):
                task.cancel()
            await asyncio.gather(*self._refills, return_exceptions=True)
            while not self._warm.empty():
                await self._warm.get_nowait().close()
        finally:
            if self._claimed:
                self.backend.release(self.snapshot)
