"""A client SIGKILLed while it holds `pool.max_live` workspaces of a `vivace sandbox serve`; how long
until a new client's create gets one (`server.workspace_idle_s` closes the killed client's).

    .venv/bin/python scripts/probe_idle_workspaces.py IDLE_S [isolated|plain]
"""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from vivace.sandbox.client import EnvClient

MAX_LIVE = 4
WAIT_S = 15.0

HOLDER = """
import asyncio, sys
from vivace.sandbox.client import EnvClient
async def main():
    async with EnvClient(sys.argv[1], "t") as client:
        for _ in range(int(sys.argv[3])):
            await client.create(sys.argv[2])
        print("held", flush=True)
        await asyncio.sleep(3600)
asyncio.run(main())
"""


async def first_create(url: str, repo: Path, t0: float) -> dict:
    async with EnvClient(url, "t") as client:
        try:
            ws = await asyncio.wait_for(client.create(str(repo)), WAIT_S)
        except TimeoutError:
            return {"create_after_kill_s": None, "still_waiting_after_s": WAIT_S}
        elapsed = time.monotonic() - t0
        return {"create_after_kill_s": round(elapsed, 2), "works": (await ws.exec("cat a.py")).stdout == "x = 1\n"}


def main() -> None:
    idle_s, backend = float(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else "isolated"
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "repo").mkdir()
        (root / "repo" / "a.py").write_text("x = 1\n")
        config = root / "config.json"
        config.write_text(json.dumps({"pool": {"max_live": MAX_LIVE}, "server": {"workspace_idle_s": idle_s}}))
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        url = f"http://127.0.0.1:{port}"
        argv = [sys.executable, "-m", "vivace.cli", "sandbox", "serve", "--port", str(port), "--token", "t",
                "--state-dir", str(root / "state"), "--backend", backend, "--config", str(config)]  # fmt: skip
        log = root / "server.log"
        server = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=log.open("w"))
        try:
            for _ in range(300):
                try:
                    httpx.get(f"{url}/v1/health", timeout=1).raise_for_status()
                    break
                except httpx.HTTPError:
                    time.sleep(0.1)
            holder = subprocess.Popen(
                [sys.executable, "-c", HOLDER, url, str(root / "repo"), str(MAX_LIVE)],
                stdout=subprocess.PIPE,
                text=True,
            )
            assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
            holder.kill()
            holder.wait()
            result = asyncio.run(first_create(url, root / "repo", time.monotonic()))
        finally:
            server.send_signal(signal.SIGINT)
            server.wait(30)
        warnings = [line for line in log.read_text().splitlines() if "workspace_idle_s" in line]
        print(json.dumps({"workspace_idle_s": idle_s, "backend": backend, **result, "server_warnings": warnings}))


if __name__ == "__main__":
    main()
