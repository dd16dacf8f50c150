"""The environment server over real HTTP: authentication, error mapping, bursts, serve(), Ray.

The Workspace contract itself runs over HTTP through conftest's `make_workspace["http"]`.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from fastapi.routing import APIRoute

from vivace.config import ServerConfig, VivaceConfig
from vivace.sandbox import (
    NotAFileError,
    PathEscapeError,
    SandboxError,
    UnknownWorkspace,
    WorkspaceClosedError,
    WorkspaceFileNotFound,
)
from vivace.sandbox import server as server_mod
from vivace.sandbox.background import BackgroundServer
from vivace.sandbox.client import EnvClient
from vivace.sandbox.isolated import probe


@pytest.fixture
async def client(env_server):
    async with EnvClient(env_server.url, env_server.token) as c:
        yield c


def _raw(env_server, token: str | None) -> httpx.AsyncClient:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.AsyncClient(base_url=env_server.url, headers=headers, timeout=30)


async def test_health_needs_no_token(env_server):
    async with _raw(env_server, None) as http:
        body = (await http.get("/v1/health")).raise_for_status().json()
    assert body["ok"] is True and body["backend"] in ("isolated", "plain")


@pytest.mark.parametrize("auth", [None, "Bearer wrong-token", "Bearer", "Basic dGVzdDp0ZXN0", "token-without-scheme"])
async def test_every_route_refuses_missing_or_wrong_token(env_server, client, repo, auth):
    ws = await client.create(str(repo))
    before = (await client.metrics())["pools"]
    attempts = {
        ("POST", "/v1/workspaces"): {"json": {"source": {"path": str(repo)}}},
        ("POST", "/v1/workspaces/{ws_id}/exec"): {"json": {"cmd": "touch pwned"}},
        ("GET", "/v1/workspaces/{ws_id}/file"): {"params": {"path": "README.md"}},
        ("PUT", "/v1/workspaces/{ws_id}/file"): {"params": {"path": "pwned2"}, "content": b"x"},
        ("DELETE", "/v1/workspaces/{ws_id}/file"): {"params": {"path": "README.md"}},
        ("GET", "/v1/workspaces/{ws_id}/list"): {"params": {"path": "."}},
        ("GET", "/v1/workspaces/{ws_id}/stat"): {"params": {"path": "README.md"}},
        ("GET", "/v1/workspaces/{ws_id}/diff"): {},
        ("DELETE", "/v1/workspaces/{ws_id}"): {},
        ("GET", "/v1/metrics"): {},
        ("GET", "/v1/no-such-route"): {},
    }
    routes = {(m, r.path) for r in env_server.app.routes if isinstance(r, APIRoute) for m in r.methods}
    routes.discard(("GET", "/v1/health"))
    assert routes <= set(attempts), f"add the new routes to this test: {routes - set(attempts)}"
    async with httpx.AsyncClient(base_url=env_server.url, timeout=30) as http:
        for (method, path), kw in attempts.items():
            headers = {"Authorization": auth} if auth else {}
            r = await http.request(method, path.format(ws_id=ws.id), headers=headers, **kw)
            assert r.status_code == 401, (method, path, r.text)
            assert r.json()["error"]["kind"] == "unauthorized"
            assert r.headers["www-authenticate"] == "Bearer"
    # Nothing was executed, written, removed, created or closed.
    assert await ws.read_text("README.md") == "# demo\n"
    names = {e.name for e in await ws.list(".")}
    assert "pwned" not in names and "pwned2" not in names
    assert await ws.diff() == ""
    after = (await client.metrics())["pools"]
    assert [p["backend"]["created"] for p in after] == [p["backend"]["created"] for p in before]
    await ws.close()


async def test_errors_round_trip_as_the_same_classes(env_server, client, repo):
    ws = await client.create(str(repo))
    with pytest.raises(PathEscapeError):
        await ws.read_text("../../etc/passwd")
    with pytest.raises(WorkspaceFileNotFound):
        await ws.stat("missing.txt")
    with pytest.raises(NotAFileError):
        await ws.read_bytes("pkg")
    with pytest.raises(ValueError, match="invalid environment variable"):
        await ws.exec("true", env={"BAD NAME": "x"})
    with pytest.raises(SandboxError, match="does not exist"):
        await client.create("/no/such/repo")
    # The same mapping seen as raw HTTP: status codes and the stable `kind`.
    async with _raw(env_server, env_server.token) as http:
        r = await http.get(f"/v1/workspaces/{ws.id}/file", params={"path": "../x"})
        assert (r.status_code, r.json()["error"]["kind"]) == (403, "path_escape")
        r = await http.get(f"/v1/workspaces/{ws.id}/file", params={"path": "nope"})
        assert (r.status_code, r.json()["error"]["kind"]) == (404, "not_found")
        r = await http.post(f"/v1/workspaces/{ws.id}/exec", json={"cmd": "true", "timeout": -1})
        assert (r.status_code, r.json()["error"]["kind"]) == (422, "invalid_request")
        r = await http.get("/v1/workspaces/w999-deadbeef/diff")
        assert (r.status_code, r.json()["error"]["kind"]) == (404, "unknown_workspace")
        await ws.close()
        r = await http.get(f"/v1/workspaces/{ws.id}/diff")
        assert (r.status_code, r.json()["error"]["kind"]) == (410, "closed")
        assert (await http.delete(f"/v1/workspaces/{ws.id}")).status_code == 204  # idempotent
    # A second handle on the closed workspace hears it from the server, not from its own flag.
    from vivace.sandbox.client import RemoteWorkspace

    with pytest.raises(WorkspaceClosedError):
        await RemoteWorkspace(client, ws.id, 60, {}).exec("true")
    with pytest.raises(UnknownWorkspace):
        await RemoteWorkspace(client, "w999-deadbeef", 60, {}).read_bytes("README.md")


async def test_binary_files_and_upload_limit(client, repo, monkeypatch):
    ws = await client.create(str(repo))
    blob = os.urandom(1 << 20)
    await ws.write_bytes("big.bin", blob)
    assert await ws.read_bytes("big.bin") == blob
    assert (await ws.stat("big.bin")).size == len(blob)
    monkeypatch.setattr(server_mod, "MAX_UPLOAD_BYTES", 1000)
    with pytest.raises(SandboxError, match="upload over 1000 bytes"):
        await ws.write_bytes("too-big.bin", b"x" * 1001)
    await ws.close()


async def test_200_concurrent_clients(env_server, client, repo):
    """200 independent clients at once, each a full workspace life: all succeed, nothing leaks."""

    async def one(i: int) -> str:
        async with EnvClient(env_server.url, env_server.token) as c:
            ws = await c.create(str(repo))
            r = await ws.exec(f"echo {i} && cat README.md")
            await ws.write_text("mine.txt", f"client {i}")
            assert await ws.read_text("mine.txt") == f"client {i}"
            await ws.close()
            return r.stdout

    t0 = time.perf_counter()
    # A bound, so that a hung command fails the test instead of hanging the session.
    results = await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(200)), return_exceptions=True), 120)
    elapsed = time.perf_counter() - t0
    print(f"\n200 concurrent clients: {elapsed:.2f}s")
    failures = [r for r in results if isinstance(r, BaseException)]
    assert not failures, failures[:3]
    assert results == [f"{i}\n# demo\n" for i in range(200)]
    assert elapsed < 60
    metrics = await client.metrics()
    assert metrics["live"] == 0
    assert all(p["live"] == 0 and p["backend"]["live"] == 0 for p in metrics["pools"])


def test_binds_loopback_by_default():
    assert ServerConfig().host == "127.0.0.1"
    assert BackgroundServer.__init__.__defaults__ == ("127.0.0.1", 0)


def _listening(port: int) -> set[str]:
    """Local addresses (hex, as /proc/net/tcp writes them) listening on `port`."""
    out = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            addr, _, hex_port = fields[1].partition(":")
            if int(hex_port, 16) == port and fields[3] == "0A":
                out.add(addr)
    return out


def test_serve_prints_token_binds_loopback_and_cleans_up(tmp_path, repo):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    state = tmp_path / "state"
    config = VivaceConfig.model_validate(
        {"sandbox": {"backend": "plain", "state_dir": str(state)}, "server": {"port": port}}
    )
    code = (
        "import sys; from vivace.config import VivaceConfig; from vivace.sandbox.server import serve; "
        "serve(VivaceConfig.model_validate_json(sys.argv[1]))"
    )
    env = {k: v for k, v in os.environ.items() if k != "VIVACE_SANDBOX_TOKEN"}
    log = tmp_path / "server.log"
    with log.open("w") as err:
        proc = subprocess.Popen([sys.executable, "-c", code, config.model_dump_json()], stderr=err, env=env)
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(300):
            try:
                httpx.get(f"{url}/v1/health", timeout=1).raise_for_status()
                break
            except httpx.TransportError:
                time.sleep(0.1)
        assert _listening(port) == {"0100007F"}  # 127.0.0.1 only
        token_lines = [line for line in log.read_text().splitlines() if "token" in line]
        assert len(token_lines) == 1, log.read_text()
        token = token_lines[0].rsplit(" ", 1)[1]
        headers = {"Authorization": f"Bearer {token}"}
        r = httpx.post(f"{url}/v1/workspaces", json={"source": {"path": str(repo)}}, headers=headers, timeout=30)
        ws_id = r.raise_for_status().json()["id"]
        assert any((state / "owners").iterdir())
        r = httpx.post(f"{url}/v1/workspaces/{ws_id}/exec", json={"cmd": "echo ok"}, headers=headers, timeout=30)
        assert r.json()["stdout"] == "ok\n"
    finally:
        proc.send_signal(signal.SIGTERM)
        # uvicorn shuts down gracefully, then re-raises the signal: -SIGTERM is a clean exit.
        assert proc.wait(30) in (0, -signal.SIGTERM), log.read_text()
    assert "Application shutdown complete" in log.read_text()
    assert not any((state / "owners").iterdir()), "shutdown must close the workspaces it handed out"


@pytest.mark.slow
async def test_ray_actor_serves_on_each_node(tmp_path, repo):
    ray = pytest.importorskip("ray")
    from vivace.sandbox.ray_actor import start_env_servers, stop_env_servers

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray.shutdown()  # a Ray run earlier in the session (RayWorkers) leaves its cluster up
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        config = VivaceConfig.model_validate({
            "sandbox": {"backend": "plain" if probe() else "isolated", "state_dir": str(tmp_path / "ray")},
            "server": {"port": 0, "token": "ray-test-token"},
        })  # fmt: skip
        servers = start_env_servers(config)
        assert [node for node, _, _ in servers] == [ray.get_runtime_context().get_node_id()]
        _, actor, url = servers[0]
        assert url.startswith("http://127.0.0.1:")
        assert ray.get(actor.token.remote()) == "ray-test-token"
        async with EnvClient(url, "ray-test-token") as c:
            ws = await c.create(str(repo))
            assert (await ws.exec("cat README.md")).stdout == "# demo\n"
            await ws.close()
        metrics = ray.get(actor.metrics.remote())
        assert metrics["live"] == 0 and metrics["pools"][0]["backend"]["created"] == 1
        stop_env_servers(servers)
    finally:
        ray.shutdown()
