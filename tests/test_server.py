"""The environment server over real HTTP: authentication, error mapping, bursts, serve(), Ray.

The Workspace contract itself runs over HTTP through conftest's `make_workspace["http"]`.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from fastapi.routing import APIRoute

from conftest import ISOLATION_PROBLEM, make_backend
from vivace.config import PoolConfig, ServerConfig, VivaceConfig
from vivace.sandbox import (
    NotAFileError,
    PathEscapeError,
    SandboxError,
    SnapshotSource,
    TooLarge,
    UnknownWorkspace,
    WorkspaceClosedError,
    WorkspaceFileNotFound,
)
from vivace.sandbox.background import BackgroundServer
from vivace.sandbox.client import EnvClient, RemoteWorkspace
from vivace.sandbox.isolated import probe
from vivace.sandbox.server import create_app


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
    with pytest.raises(WorkspaceClosedError):
        await RemoteWorkspace(client, ws.id, 60, {}).exec("true")
    with pytest.raises(UnknownWorkspace):
        await RemoteWorkspace(client, "w999-deadbeef", 60, {}).read_bytes("README.md")


async def test_file_reads_stay_inside_the_workspace(client, repo):
    """A read streams from a file opened as every file operation opens it: `..` and symlinks out of
    the workspace are refused, also a symlink swapped in while the read resolves the path."""
    ws = await client.create(str(repo))
    links = "ln -s /etc/passwd abs && ln -s ../../../../../../etc/passwd rel && ln -s /workspace/README.md inside"
    await ws.exec(f"{links} && mkdir d && ln -s .. d/up && ln -s pkg dirlink")
    for path in ("abs", "rel", "../README.md", "/etc/passwd", "d/up/../..", "d/up/../README.md"):
        with pytest.raises(PathEscapeError):
            await ws.read_bytes(path)
    assert await ws.read_bytes("inside") == await ws.read_bytes("d/up/README.md") == b"# demo\n"
    with pytest.raises(NotAFileError):
        await ws.read_bytes("dirlink")
    swap = "for i in $(seq 1500); do ln -sfn README.md x; ln -sfn /etc/passwd x; done"
    swapping = asyncio.create_task(ws.exec(swap, timeout=120))
    outcomes: dict[str, int] = {}
    while not swapping.done():
        try:
            outcome = (await ws.read_bytes("x")).decode(errors="replace")
        except (PathEscapeError, WorkspaceFileNotFound) as e:  # not found: between unlink and symlink
            outcome = type(e).__name__
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    assert (await swapping).exit_code == 0
    print(f"\nreads while a symlink was swapped in and out: {outcomes}")
    assert set(outcomes) <= {"# demo\n", "PathEscapeError", "WorkspaceFileNotFound"}, outcomes
    await ws.close()


async def test_binary_files(client, repo):
    """Request body limits: test_server_limits.py."""
    ws = await client.create(str(repo))
    blob = os.urandom(1 << 20)
    await ws.write_bytes("big.bin", blob)
    assert await ws.read_bytes("big.bin") == blob
    assert (await ws.stat("big.bin")).size == len(blob)
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


async def test_os_errors_and_bad_requests_come_back_as_json_errors(env_server, client, repo):
    ws = await client.create(str(repo))
    # The in-process backend raises these OSErrors; over HTTP they were a bare 500 page.
    with pytest.raises(OSError, match="File name too long") as e:
        await ws.write_bytes("a" * 300, b"x")
    assert e.value.errno == errno.ENAMETOOLONG and not isinstance(e.value, SandboxError)
    with pytest.raises(OSError, match="Argument list too long") as e:
        await ws.exec("echo " + "a" * 200_000)  # over the kernel's 128 KiB per argument
    assert e.value.errno == errno.E2BIG
    async with _raw(env_server, env_server.token) as http:
        r = await http.put(f"/v1/workspaces/{ws.id}/file", params={"path": "b" * 300}, content=b"x")
        assert (r.status_code, r.json()["error"]["kind"], r.json()["error"]["errno"]) == (400, "os_error", 36)
        # An infinite timeout failed on the plain backend (int(inf)) with a 500.
        r = await http.post(f"/v1/workspaces/{ws.id}/exec", content=b'{"cmd": "true", "timeout": 1e999}')
        assert (r.status_code, r.json()["error"]["kind"]) == (422, "invalid_request")
        for method in ("GET", "PATCH"):  # no such route, no such method: the same error body
            r = await http.request(method, "/v1/no-such-route" if method == "GET" else f"/v1/workspaces/{ws.id}")
            assert (r.status_code, r.json()["error"]["kind"]) == ((404, 405)[method == "PATCH"], "unknown_route")
    await ws.close()


async def test_names_that_are_not_utf8_round_trip(env_server, client, repo):
    """The in-process API names such a file with surrogate escapes (os.fsdecode); so must HTTP."""
    ws = await client.create(str(repo))
    await ws.exec(["/bin/sh", "-c", "printf x > \"$(printf 'caf\\351')\""])
    made = "caf\udce9"
    assert made in {e.name for e in await ws.list(".")}  # was a 400 for the whole directory
    assert await ws.read_bytes(made) == b"x"
    assert (await ws.stat(made)).path == made
    blob = bytes(range(256))
    await ws.write_bytes("bin\udcff/\udcfe.dat", blob)
    assert await ws.read_bytes("bin\udcff/\udcfe.dat") == blob
    # On disk the name is the escaped bytes (\377/\376), not U+FFFD.
    assert (await ws.exec("wc -c < \"$(printf 'bin\\377/\\376.dat')\"")).stdout.strip() == "256"
    assert "caf\\351" in await ws.diff()  # git's quoting of the name, as in-process
    await ws.remove("bin\udcff", recursive=True)
    await ws.remove(made)
    # Plain UTF-8 and query-special characters still mean themselves.
    for name in ("ü ß+&=%#?.txt", "a b/c+d.txt"):
        await ws.write_bytes(name, name.encode())
        assert await ws.read_bytes(name) == name.encode()
    await ws.close()


def _running(marker: str) -> bool:
    """Whether any process on this machine has `marker` in its command line."""
    for p in Path("/proc").iterdir():
        try:
            if p.name.isdigit() and marker.encode() in (p / "cmdline").read_bytes():
                return True
        except OSError:
            pass
    return False


async def test_client_hanging_up_kills_its_command(env_server, client, repo):
    """As cancelling `exec` in-process kills the command, so does a client that hangs up."""
    ws = await client.create(str(repo))
    marker = f"sleep {30 + os.getpid() % 1000 / 1000:.3f}"  # unique on this machine
    async with _raw(env_server, env_server.token) as http:
        with pytest.raises(httpx.ReadTimeout):
            await http.post(f"/v1/workspaces/{ws.id}/exec", json={"cmd": marker}, timeout=1.5)
    deadline = time.monotonic() + 10
    while _running(marker) and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    assert not _running(marker), "the command outlived its client"
    # The same through the client: cancelling the call cancels the command.
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(ws.exec(marker), 1.5)
    deadline = time.monotonic() + 10
    while _running(marker) and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    assert not _running(marker)
    assert (await ws.exec("echo still usable")).stdout == "still usable\n"
    await ws.close()


async def test_client_hanging_up_while_queued_frees_its_place(repo, tmp_path):
    """A create abandoned while the pool is full used to make a workspace for nobody, holding a
    slot until the server stopped; with max_live=1 the next create then waited forever."""
    backend = make_backend("plain" if ISOLATION_PROBLEM else "isolated", tmp_path / "state")
    server = BackgroundServer(create_app(backend, PoolConfig(max_live=1), "t", own_backend=True)).start()
    try:
        async with EnvClient(server.url, "t") as c:
            first = await c.create(str(repo))
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(c.create(str(repo)), 1.0)  # queued behind `first`, then abandoned
            await first.close()
            second = await asyncio.wait_for(c.create(str(repo)), 20)
            assert (await second.exec("echo ok")).stdout == "ok\n"
            metrics = await c.metrics()
            assert metrics["live"] == 1 and metrics["pools"][0]["live"] == 1
            assert metrics["pools"][0]["backend"]["created"] <= 3  # the abandoned one at most made and closed
            await second.close()
            assert (await c.metrics())["pools"][0]["live"] == 0
    finally:
        server.stop()


async def test_a_diff_over_the_servers_limit_is_refused_as_too_large(repo, tmp_path):
    """A diff is built, escaped and sent whole: 232 MB of changes took the server's memory from 0.2 to
    1.1 GB per request and held /health up for seconds. Over `max_diff_chars` it is refused (413)."""
    backend = make_backend("plain" if ISOLATION_PROBLEM else "isolated", tmp_path / "state")
    app = create_app(backend, PoolConfig(), "t", own_backend=True, max_diff_chars=5000)
    server = BackgroundServer(app).start()
    try:
        async with EnvClient(server.url, "t") as c:
            ws = await c.create(str(repo))
            await ws.write_text("small.txt", "x\n" * 100)
            assert "+x" in await ws.diff()
            await ws.write_text("big.txt", "y\n" * 5000)
            with pytest.raises(TooLarge, match="over the limit of 5,000 characters") as refused:
                await ws.diff()
            assert "big.txt" in str(refused.value)
            response = httpx.get(f"{server.url}/v1/workspaces/{ws.id}/diff", headers={"Authorization": "Bearer t"})
            assert (response.status_code, response.json()["error"]["kind"]) == (413, "too_large")
            await ws.remove("big.txt")
            assert "+x" in await ws.diff()  # the workspace is as it was: nothing was done
    finally:
        server.stop()


async def test_max_live_holds_for_the_whole_server_however_the_source_is_spelled(repo, tmp_path):
    """Pools are per snapshot and source, and each had its own cap: a client asking for the same
    repository as "repo/", "./repo" or with `kind` set got a new pool, and max_live=3 let 11 live."""
    backend = make_backend("plain" if ISOLATION_PROBLEM else "isolated", tmp_path / "state")
    server = BackgroundServer(create_app(backend, PoolConfig(max_live=1), "t", own_backend=True)).start()
    try:
        async with EnvClient(server.url, "t") as c:
            first = await c.create(str(repo))
            other = asyncio.ensure_future(c.create(SnapshotSource(path=f"{repo}/", kind="dir")))
            for _ in range(100):
                if (await c.metrics())["waiting"] == 1:
                    break
                await asyncio.sleep(0.05)
            metrics = await c.metrics()
            assert (metrics["live"], metrics["max_live"], metrics["waiting"], other.done()) == (1, 1, 1, False)
            await first.close()
            second = await asyncio.wait_for(other, 20)
            assert (await second.exec("echo ok")).stdout == "ok\n"
            assert (await c.metrics())["live"] == 1
            await second.close()
    finally:
        server.stop()


async def test_a_server_fed_many_repositories_keeps_only_the_snapshots_in_use(tmp_path, monkeypatch):
    """Every source a server ever saw kept a pool (with its warm workspaces) and a claim on its snapshot
    for the server's life, so the cache could evict none of them: a server for RL over many
    repositories filled the disk. Idle pools past the few kept now go, and their claims with them."""
    from vivace.sandbox import server as server_mod

    monkeypatch.setattr(server_mod, "IDLE_POOLS_KEPT", 1)
    repos = []
    for name in "abc":
        (tmp_path / name).mkdir()
        (tmp_path / name / "f.txt").write_text(name)
        repos.append(str(tmp_path / name))
    backend = make_backend("plain" if ISOLATION_PROBLEM else "isolated", tmp_path / "state")
    server = BackgroundServer(create_app(backend, PoolConfig(warm=1), "t", own_backend=True)).start()

    def claimed() -> int:  # snapshots claimed (the isolated backend's claim on its /etc aside)
        return sum(not p.name.startswith("uses-etc-") for p in backend.owner_dir.glob("uses-*"))

    try:
        async with EnvClient(server.url, "t") as c:
            for repo in repos:
                # A burst shares one snapshot being made (single flight): each create takes its own claim.
                made = await asyncio.gather(*(c.create(repo) for _ in range(3)))
                assert [await w.read_text("f.txt") for w in made] == [Path(repo).name] * 3
                for w in made:
                    await w.close()
            metrics = await c.metrics()
            assert (len(metrics["pools"]), metrics["live"], claimed()) == (1, 0, 1)  # the last pool, kept warm
            assert metrics["pools"][0]["warm"] <= 1
    finally:
        server.stop()
    assert not backend.owner_dir.exists()


async def test_client_rejects_a_success_that_is_not_the_servers(tmp_path):
    """Another service on the port, or a proxy's login page, answers 200: a SandboxError, not a KeyError."""
    bodies = {"html": (b"<html>login</html>", "text/html"), "json": (b'{"hello": 1}', "application/json")}
    for body, ctype in bodies.values():
        client = EnvClient("http://env.invalid", "t")
        await client.aclose()
        transport = httpx.MockTransport(
            lambda _, b=body, t=ctype: httpx.Response(200, content=b, headers={"content-type": t})
        )
        client._http = httpx.AsyncClient(base_url="http://env.invalid", transport=transport)
        with pytest.raises(SandboxError, match="unexpected response from http://env.invalid/v1/workspaces"):
            await client.create("/repo")
        ws = RemoteWorkspace(client, "w0-x", 60, {})
        for call in (ws.exec("true"), ws.list("."), ws.stat("a"), ws.diff(), ws.read_bytes("a")):
            with pytest.raises(SandboxError, match="unexpected response"):
                await call
        await client.aclose()


def test_binds_loopback_by_default():
    assert ServerConfig().host == "127.0.0.1"
    assert BackgroundServer.__init__.__defaults__[:2] == ("127.0.0.1", 0)


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


def test_sandbox_serve_command_reads_config_and_cleans_up_when_forced(tmp_path, repo):
    """The real command with --config, stopped by Ctrl-C twice while a command runs (uvicorn's "force
    quit"): uvicorn then skips the app's shutdown, which left every workspace behind."""
    from vivace.sandbox.linux import Cgroups

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    state, config = tmp_path / "state", tmp_path / "serve.json"
    config.write_text(json.dumps({"pool": {"max_live": 3}, "sandbox": {"timeout_s": 77}}))
    kind = "plain" if ISOLATION_PROBLEM else "isolated"
    argv = [sys.executable, "-m", "vivace.cli", "sandbox", "serve", "--port", str(port), "--token", "tok"]
    argv += ["--state-dir", str(state), "--backend", kind, "--config", str(config)]
    log = tmp_path / "server.log"
    with log.open("w") as err:
        proc = subprocess.Popen(argv, stderr=err, stdout=err)
    url, headers = f"http://127.0.0.1:{port}", {"Authorization": "Bearer tok"}
    marker = f"sleep {60 + os.getpid() % 1000 / 1000:.3f}"
    try:
        for _ in range(600):
            try:
                httpx.get(f"{url}/v1/health", timeout=1).raise_for_status()
                break
            except httpx.TransportError:
                assert proc.poll() is None, log.read_text()
                time.sleep(0.1)
        r = httpx.post(f"{url}/v1/workspaces", json={"source": {"path": str(repo)}}, headers=headers, timeout=30)
        ws_id, timeout_s = r.raise_for_status().json()["id"], r.json()["timeout_s"]
        assert timeout_s == 77  # the config file's, not the preset's
        assert httpx.get(f"{url}/v1/metrics", headers=headers).json()["pools"][0]["max_live"] == 3

        def run_command() -> None:
            with contextlib.suppress(httpx.HTTPError):  # the server goes away under it
                httpx.post(f"{url}/v1/workspaces/{ws_id}/exec", json={"cmd": marker}, headers=headers, timeout=90)

        threading.Thread(target=run_command, daemon=True).start()
        for _ in range(100):
            if _running(marker):
                break
            time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        for _ in range(100):
            if "force quit" in log.read_text():
                break
            time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert not _running(marker)
    assert not any((state / "owners").iterdir()), "a forced shutdown must still close every workspace"
    if kind == "isolated":
        assert not [n for n in Cgroups().names() if n.startswith(f"{proc.pid}-")]


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


def test_urls_put_an_ipv6_address_in_brackets():
    """The URL a server is reached at (a Ray node's address among them): http://::1:80 is no URL."""
    from vivace.sandbox.background import http_url

    assert http_url("::1", 8000) == "http://[::1]:8000"
    assert http_url("fd00::2", 80) == "http://[fd00::2]:80"
    assert http_url("10.0.0.7", 80) == "http://10.0.0.7:80"
