"""`vivace sandbox bench`: workspace creation measured side by side, isolated vs full copy.

For each backend, N workspaces are created with bounded concurrency over one generated
repository; each runs a first command as soon as it exists; all stay alive until the last
one is up (so N live at once is part of the test), then all are destroyed. Reported per
backend: create-to-first-command latency (p50, p99) under that concurrency and alone
(serial), throughput, create/exec/destroy latency, and the disk the N workspaces cost.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from vivace.config import SandboxConfig
from vivace.sandbox.base import percentile
from vivace.sandbox.local import LocalBackend

_MODULE = '''"""Module {i} of the generated benchmark package."""


def value_{i}(x):
    return x * {i} + {j}


class Thing{i}:
    def __init__(self, n):
        self.n = n

    def scaled(self):
        return value_{i}(self.n)
'''


def generate_repo(root: Path, n_files: int = 2000) -> Path:
    """A deterministic Python project with `n_files` files in nested packages."""
    if root.exists() and sum(1 for _ in root.rglob("*") if _.is_file()) >= n_files:
        return root
    shutil.rmtree(root, ignore_errors=True)
    (root / "tests").mkdir(parents=True)
    (root / "README.md").write_text("# generated benchmark repository\n")
    (root / "tests" / "test_smoke.py").write_text(
        "from pkg0.mod0 import value_0\n\n\ndef test_value():\n    assert value_0(1) == 0\n"
    )
    made = 2
    i = 0
    while made < n_files:
        pkg = root / f"pkg{i // 50}"
        if not pkg.exists():
            pkg.mkdir()
            (pkg / "__init__.py").write_text("")
            made += 1
        (pkg / f"mod{i}.py").write_text(_MODULE.format(i=i, j=i % 7))
        made += 1
        i += 1
    return root


def _dir_bytes(path: Path) -> int:
    total = 0
    for dirpath, _, filenames in os.walk(path):
        for f in filenames:
            try:
                total += os.lstat(os.path.join(dirpath, f)).st_blocks * 512
            except FileNotFoundError:
                pass
    return total


async def bench_backend(
    backend: LocalBackend, repo: Path, n: int, concurrency: int, serial: int = 20,
    progress: Callable[[int], None] | None = None, command: str = "true",
) -> dict[str, Any]:  # fmt: skip
    snapshot = backend.snapshot(str(repo))

    # Uncontended latency: one workspace at a time.
    alone = []
    for _ in range(serial):
        t0 = time.perf_counter()
        ws = await backend.create(snapshot)
        await ws.exec(command)
        alone.append(time.perf_counter() - t0)
        await ws.close()

    sem = asyncio.Semaphore(concurrency)
    latencies: list[float] = []
    failures = 0

    async def one():
        nonlocal failures
        async with sem:
            t0 = time.perf_counter()
            ws = await backend.create(snapshot)
            r = await ws.exec(command)
            latencies.append(time.perf_counter() - t0)
            failures += r.exit_code != 0
            if progress:
                progress(1)
            return ws

    mem_before = _mem_available()
    t0 = time.perf_counter()
    workspaces = await asyncio.gather(*(one() for _ in range(n)))
    wall = time.perf_counter() - t0
    live = backend.metrics.created - backend.metrics.destroyed
    mem_used = mem_before - _mem_available()
    if backend.isolated:
        disk = sum(_dir_bytes(backend.upper_dir(ws)) for ws in workspaces)  # type: ignore[attr-defined]
    else:
        disk = _dir_bytes(backend.owner_dir)
    t1 = time.perf_counter()
    await asyncio.gather(*(ws.close() for ws in workspaces))
    destroy_wall = time.perf_counter() - t1
    lat, alone = sorted(latencies), sorted(alone)
    return {
        "backend": backend.name,
        "isolated": backend.isolated,
        "n": n,
        "concurrency": concurrency,
        "failures": failures,
        "live_at_peak": live,
        "first_command_ms": {"p50": percentile(lat, 50) * 1e3, "p99": percentile(lat, 99) * 1e3},
        "first_command_alone_ms": {"p50": percentile(alone, 50) * 1e3, "p99": percentile(alone, 99) * 1e3},
        "throughput_per_s": n / wall,
        "wall_s": wall,
        "destroy_wall_s": destroy_wall,
        "disk_bytes_per_workspace": disk / max(1, n),
        "host_memory_bytes_at_peak": mem_used,  # MemAvailable drop with all n alive (noisy)
        "metrics": backend.metrics.to_dict(),
    }


def _mem_available() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


async def bench_scaling(backend: LocalBackend, repo: Path, steps: list[int], samples: int = 15) -> dict[str, Any]:
    """Exec latency (one at a time) while N other workspaces are alive, for each N in `steps`."""
    snapshot = backend.snapshot(str(repo))
    live: list = []
    out: dict[str, Any] = {}
    try:
        for n in sorted(steps):
            while len(live) < n:
                live.append(await backend.create(snapshot))
            ws = await backend.create(snapshot)
            times = []
            for _ in range(samples):
                t0 = time.perf_counter()
                await ws.exec(["true"])
                times.append(time.perf_counter() - t0)
            await ws.close()
            times.sort()
            out[str(n)] = {"exec_p50_ms": percentile(times, 50) * 1e3, "exec_p90_ms": percentile(times, 90) * 1e3}
    finally:
        await asyncio.gather(*(ws.close() for ws in live))
    return out


async def run_bench(
    config: SandboxConfig, n: int, concurrency: int, files: int, repo_dir: Path,
    backends: tuple[str, ...] = ("isolated", "plain"), progress_factory=None, baseline_n: int | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Bench each backend; the plain (full-copy) one may use fewer workspaces (`baseline_n`)."""
    from vivace.sandbox.isolated import IsolatedBackend
    from vivace.sandbox.plain import PlainBackend

    repo = generate_repo(repo_dir, files)
    results: dict[str, Any] = {"files": files, "n": n, "concurrency": concurrency, "cpus": os.cpu_count()}
    for name in backends:
        cls = IsolatedBackend if name == "isolated" else PlainBackend
        backend = cls(config.model_copy(update={"backend": name}))
        count = n if name == "isolated" or baseline_n is None else min(n, baseline_n)
        progress = progress_factory(name, count) if progress_factory else None
        try:
            results[name] = await bench_backend(backend, repo, count, concurrency, progress=progress)
        finally:
            await backend.aclose()
    if "isolated" in results and "plain" in results:
        iso, plain = results["isolated"], results["plain"]
        results["ratio_plain_over_isolated"] = {
            "first_command_p50": plain["first_command_ms"]["p50"] / iso["first_command_ms"]["p50"],
            "first_command_alone_p50": plain["first_command_alone_ms"]["p50"] / iso["first_command_alone_ms"]["p50"],
            "throughput": iso["throughput_per_s"] / plain["throughput_per_s"],
        }
    return results
