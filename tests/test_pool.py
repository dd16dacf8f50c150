"""WorkspacePool: bursts with bounded concurrency, a cap with back-pressure, warm pool, metrics."""

from __future__ import annotations

import asyncio
import warnings

import pytest

from conftest import ISOLATION_PROBLEM, make_backend
from vivace.config import PoolConfig, SandboxConfig
from vivace.sandbox import BackendUnavailable, WorkspacePool, open_backend
from vivace.sandbox.plain import PlainBackend


@pytest.fixture(params=["isolated", "plain"])
async def backend(request, state_dir):
    b = make_backend(request.param, state_dir)
    yield b
    await b.aclose()


async def test_cap_applies_back_pressure_without_failures(backend, repo):
    pool = WorkspacePool(backend, str(repo), PoolConfig(max_live=3, create_concurrency=2))
    peak = 0

    async def episode(i: int) -> str:
        nonlocal peak
        ws = await pool.acquire()
        peak = max(peak, pool.live)
        try:
            await ws.write_text("id.txt", str(i))
            return (await ws.exec("cat id.txt")).stdout
        finally:
            await ws.close()

    outputs = await asyncio.gather(*(episode(i) for i in range(12)))
    assert outputs == [str(i) for i in range(12)]
    assert peak <= 3
    m = pool.metrics()
    assert m["live"] == 0 and m["waiting"] == 0
    assert m["backend"]["created"] >= 12 and m["backend"]["live"] == 0
    assert m["acquire_wait"]["count"] == 12
    for key in ("create_latency", "exec_latency", "destroy_latency"):
        assert m["backend"][key]["count"] >= 12 and m["backend"][key]["p99_ms"] >= m["backend"][key]["p50_ms"]


async def test_waiter_proceeds_when_a_slot_frees(backend, repo):
    pool = WorkspacePool(backend, str(repo), PoolConfig(max_live=1))
    first = await pool.acquire()
    second = asyncio.create_task(pool.acquire())
    await asyncio.sleep(0.05)
    assert not second.done() and pool.waiting == 1
    await first.close()
    ws = await asyncio.wait_for(second, 10)
    assert (await ws.exec("echo ok")).stdout == "ok\n"
    await ws.close()


async def test_warm_pool_is_ready_and_refills(backend, repo):
    pool = WorkspacePool(backend, str(repo), PoolConfig(warm=2, max_live=4))
    await pool.start()
    assert pool.metrics()["warm"] == 2
    created_before = backend.metrics.created
    ws = await pool.acquire()
    assert backend.metrics.created == created_before  # served from the warm pool
    await asyncio.sleep(0.2)
    assert pool.metrics()["warm"] == 2  # refilled in the background
    await ws.close()
    await pool.close()
    assert backend.metrics.created == backend.metrics.destroyed


async def test_cancelled_acquire_releases_its_slot(backend, repo):
    pool = WorkspacePool(backend, str(repo), PoolConfig(max_live=1))
    held = await pool.acquire()
    waiter = asyncio.create_task(pool.acquire())
    await asyncio.sleep(0.02)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    await held.close()
    ws = await asyncio.wait_for(pool.acquire(), 5)  # the slot was not leaked
    await ws.close()


def test_open_backend_explicit_plain_is_silent(state_dir):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        b = open_backend(SandboxConfig(backend="plain", state_dir=state_dir))
    assert isinstance(b, PlainBackend) and not b.isolated


def test_open_backend_auto(state_dir, monkeypatch, capsys):
    import vivace.sandbox.isolated as iso

    monkeypatch.setattr(iso, "probe", lambda: "simulated: no bubblewrap")
    with pytest.warns(RuntimeWarning, match="NOT isolated"):
        b = open_backend(SandboxConfig(backend="auto", state_dir=state_dir))
    assert isinstance(b, PlainBackend)
    assert "NOT isolated" in capsys.readouterr().err
    with pytest.raises(BackendUnavailable, match="simulated: no bubblewrap"):
        open_backend(SandboxConfig(backend="isolated", state_dir=state_dir))


@pytest.mark.skipif(ISOLATION_PROBLEM is not None, reason=f"isolated backend: {ISOLATION_PROBLEM}")
def test_open_backend_auto_prefers_isolation(state_dir):
    b = open_backend(SandboxConfig(backend="auto", state_dir=state_dir))
    assert b.isolated and b.name == "isolated"
