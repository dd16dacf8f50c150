"""Episodes over many distinct repositories through one backend, as an RL rollout worker runs them:
how many snapshots are still claimed, and still cached, after the last one. The cache's eviction is
made eager (max_bytes 0, min_idle_s 0) so that only claims keep a snapshot.

    .venv/bin/python scripts/probe_snapshot_claims.py [EPISODES] [isolated|plain]
"""

from __future__ import annotations

import asyncio
import functools
import json
import sys
import tempfile
import time
from pathlib import Path

from vivace.bench.runner import run_task
from vivace.config import load_preset
from vivace.harness.policies import NullPolicy
from vivace.sandbox import local as local_mod
from vivace.sandbox import open_backend
from vivace.sandbox.snapshot import evict
from vivace.tasks.format import Task

HIDDEN = {"tests/test_n.py": "def test_n():\n    assert False\n"}


def tasks(root: Path, n: int) -> list[Task]:
    made = []
    for i in range(n):
        repo = root / f"repo{i}"
        (repo / "pkg").mkdir(parents=True)
        (repo / "pkg" / "calc.py").write_text(f"N = {i}\n" + "x = 1\n" * 2000)
        tests = {"fail_to_pass": ["tests/test_n.py::test_n"], "files": HIDDEN}
        made.append(Task.model_validate({"id": f"t{i}", "request": "fix", "repo": {"path": str(repo)}, "tests": tests}))
    return made


async def main(n: int, kind: str) -> dict:
    local_mod.evict = functools.partial(evict, max_bytes=0, min_idle_s=0)
    root = Path(tempfile.mkdtemp())
    cfg = load_preset("default", sandbox={"backend": kind, "state_dir": str(root / "state")})
    backend = open_backend(cfg.sandbox)
    t0 = time.perf_counter()
    try:
        for task in tasks(root, n):
            await run_task(NullPolicy(), task, cfg, backend)
        took = time.perf_counter() - t0
        claimed = sum(not p.name.startswith("uses-etc-") for p in backend.owner_dir.glob("uses-*"))
        snapshots = root / "state" / "snapshots"
        cached = sum(p.is_dir() and not p.name.startswith((".", "etc-")) for p in snapshots.iterdir())
    finally:
        await backend.aclose()
    return {"episodes": n, "claimed_at_end": claimed, "cached_at_end": cached, "s_per_episode": round(took / n, 3)}


if __name__ == "__main__":
    args = sys.argv[1:]
    print(json.dumps(asyncio.run(main(int(args[0]) if args else 30, args[1] if len(args) > 1 else "isolated"))))
