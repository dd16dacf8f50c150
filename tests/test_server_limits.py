"""The environment server's limits: how fast it stops (a container's stop grace), how large a
request body it reads, how long a command may run and how much of a file a read holds. Over real
HTTP; the stop through the real `vivace sandbox serve`."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest

from conftest import ISOLATION_PROBLEM, make_backend
from test_server import _running
from vivace.config import PoolConfig
from vivace.sandbox import NotAFileError, SandboxError, WorkspaceClosedError
from vivace.sandbox.background import BackgroundServer
from vivace.sandbox.client import EnvClient
from vivace.sandbox.paths import MAX_READ_BYTES
from vivace.sandbox.server import create_app


async def _start_serve(tmp_path, kind: str) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    argv = [sys.executable, "-m", "vivace.cli", "sandbox", "serve", "--port", str(port), "--token", "tok"]
    argv += ["--state-dir", str(tmp_path / "state"), "--backend", kind]
    with (tmp_path / "server.log").open("w") as log:
        proc = subprocess.Popen(argv, stderr=log, stdout=log)
    url = f"http://127.0.0.1:{port}"
    async with httpx.AsyncClient() as http:
        for _ in range(600):
            try:
                (await http.get(f"{url}/v1/health", timeout=1)).raise_for_status()
                return proc, url
            except httpx.TransportError:
                assert proc.poll() is None, (tmp_path / "server.log").read_text()
                await asyncio.sleep(0.1)
    raise AssertionError("the server did not start")


async def _until_running(marker: str) -> None:
    for _ in range(100):
        if _running(marker):
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"{marker!r} never started")


async def test_sigterm_kills_running_commands_and_exits_within_a_container_grace(tmp_path, repo):
    """`docker stop` sends SIGTERM and SIGKILLs 10 s later; uvicorn used to wait 30 s for a running
    command, so the kill left mounts, cgroups and workspace state behind."""
    from vivace.sandbox.linux import Cgroups

    kind = "plain" if ISOLATION_PROBLEM else "isolated"
    proc, url = await _start_serve(tmp_path, kind)
    long = f"sleep {60 + os.getpid() % 1000 / 1000:.3f}"  # unique on this machine
    short = f"sleep {0.4 + os.getpid() % 1000 / 1e6:.6f}"
    try:
        async with EnvClient(url, "tok") as client:
            busy, finishing = await client.create(str(repo)), await client.create(str(repo))
            killed = asyncio.create_task(busy.exec(long))
            await _until_running(long)
            finished = asyncio.create_task(finishing.exec(f"{short} && echo finished"))
            await _until_running(short)
            t0 = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            code = await asyncio.to_thread(proc.wait, 20)
            elapsed = time.monotonic() - t0
            print(f"\nSIGTERM to exit with a command running: {elapsed:.2f}s")
            with pytest.raises(SandboxError, match="shutting down: the command was killed"):
                await killed
            # A command about to end when the signal came is let finish (the grace).
            assert (await finished).stdout == "finished\n"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    log = (tmp_path / "server.log").read_text()
    assert code in (0, -signal.SIGTERM), log
    assert elapsed < 5, log  # the 1 s grace, then killing and closing: ~1.2 s here; was 30 s
    assert not _running(long)
    assert not any((tmp_path / "state" / "owners").iterdir()), "every workspace must be closed"
    if kind == "isolated":
        assert not [n for n in Cgroups().names() if n.startswith(f"{proc.pid}-")]


async def test_sigterm_drops_clients_still_sending_a_body_and_logs_no_traceback(tmp_path, repo):
    """Uploads whose clients send a few bytes of a declared body and then nothing held the stop to
    uvicorn's backstop (6.7 s) and each logged a ClientDisconnect traceback as an ERROR. They are dropped
    once the drain is over, and a client that hangs up mid-body is answered quietly."""
    proc, url = await _start_serve(tmp_path, "plain")
    socks = []
    try:
        async with EnvClient(url, "tok") as client:
            ws = await client.create(str(repo))
            for i in range(4):
                sock = socket.create_connection(("127.0.0.1", int(url.rsplit(":", 1)[1])))
                head = f"PUT /v1/workspaces/{ws.id}/file?path=up{i} HTTP/1.1\r\nHost: x\r\n"
                sock.sendall(f"{head}Authorization: Bearer tok\r\nContent-Length: 100000\r\n\r\nabc".encode())
                socks.append(sock)
            await asyncio.sleep(0.5)
            t0 = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            code = await asyncio.to_thread(proc.wait, 20)
            elapsed = time.monotonic() - t0
    finally:
        for sock in socks:
            sock.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    log = (tmp_path / "server.log").read_text()
    assert code in (0, -signal.SIGTERM), log
    assert elapsed < 4, log  # the 1 s grace and 0.5 s for stalled clients; uvicorn's backstop was 5 s more
    assert "Traceback" not in log and "ERROR" not in log, log


async def test_an_in_process_server_stops_as_promptly_as_serve(tmp_path, repo):
    """The Ray actor's environment servers run in a thread (BackgroundServer): with ClosingServer, stopping
    one with a command running kills it and returns in seconds, where plain uvicorn waited up to 30 s."""
    from vivace.sandbox.background import ClosingServer
    from vivace.sandbox.server import GRACEFUL_BACKSTOP_S

    app = create_app(make_backend("plain", tmp_path / "state"), PoolConfig(), "t", own_backend=True)
    server = BackgroundServer(app, server_class=ClosingServer, graceful_s=GRACEFUL_BACKSTOP_S).start()
    async with EnvClient(server.url, "t") as client:
        ws = await client.create(str(repo))
        running = asyncio.create_task(ws.exec("sleep 30"))
        await asyncio.sleep(0.5)
        t0 = time.monotonic()
        await asyncio.to_thread(server.stop)
        took = time.monotonic() - t0
        with pytest.raises(SandboxError, match="shutting down: the command was killed"):
            await running
    assert took < 5, took
    assert not any((tmp_path / "state" / "owners").iterdir()), "every workspace must be closed"


async def test_a_stopping_server_refuses_new_work(tmp_path, repo):
    backend = make_backend("plain", tmp_path / "state")
    app = create_app(backend, PoolConfig(), "t", own_backend=True)
    client = EnvClient("http://env", "t")
    await client.aclose()
    transport = httpx.ASGITransport(app=app)  # in-process: the drain is called in this loop
    client._http = httpx.AsyncClient(base_url="http://env", headers={"Authorization": "Bearer t"}, transport=transport)
    async with client:
        ws = await client.create(str(repo))
        await app.state.drain()  # what ClosingServer does on SIGTERM
        for call in (client.create(str(repo)), ws.exec("echo too late")):
            with pytest.raises(SandboxError, match="shutting down and takes no new work"):
                await call
        await ws.close()  # quick calls still run until the server stops
    await app.state.close_all()


@pytest.fixture
def small_limits_server(tmp_path):
    backend = make_backend("plain", tmp_path / "state")
    app = create_app(backend, PoolConfig(), "t", own_backend=True, max_json_bytes=64 << 10, max_upload_bytes=1 << 20)
    server = BackgroundServer(app).start()
    yield server
    server.stop()


def _chunks(total: int, size: int = 16 << 10):
    """A body of `total` bytes sent chunked (no Content-Length), as a streaming client would."""

    async def gen():
        for start in range(0, total, size):
            yield b"x" * min(size, total - start)

    return gen()


async def test_request_bodies_over_the_limit_are_refused_with_413(small_limits_server, repo):
    url = small_limits_server.url
    async with EnvClient(url, "t") as client:
        ws = await client.create(str(repo))
        await ws.write_bytes("at-limit.bin", b"x" * (1 << 20))  # up to the limit, uploads pass
        assert (await ws.stat("at-limit.bin")).size == 1 << 20
        with pytest.raises(SandboxError, match=r"upload over 1048576 bytes \(the environment server's limit\)"):
            await ws.write_bytes("too-big.bin", b"x" * (1 << 20) + b"y")
        assert (await ws.exec("echo " + "a" * 60_000)).stdout == "a" * 60_000 + "\n"  # JSON under 64 KiB
        with pytest.raises(SandboxError, match=r"request body over 65536 bytes"):
            await ws.exec("echo " + "a" * 70_000)
        assert "too-big.bin" not in {e.name for e in await ws.list(".")}
    # Raw: the error's shape, chunked bodies (capped while streaming), and the token checked first.
    headers = {"Authorization": "Bearer t"}
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=30) as http:
        sends = {
            "declared JSON": ("POST", f"/v1/workspaces/{ws.id}/exec", b"{" + b" " * (1 << 20) + b"}"),
            "chunked JSON": ("POST", f"/v1/workspaces/{ws.id}/exec", _chunks(1 << 20)),
            "chunked upload": ("PUT", f"/v1/workspaces/{ws.id}/file?path=c.bin", _chunks(8 << 20)),
        }
        for what, (method, path, body) in sends.items():
            r = await http.request(method, path, content=body, headers={"Content-Type": "application/json"})
            assert r.status_code == 413, (what, r.text)
            assert r.json()["error"]["kind"] == "too_large", what
        r = await http.post("/v1/workspaces", content=b" " * (1 << 20), headers={"Authorization": "Bearer wrong"})
        assert r.status_code == 401
        await http.delete(f"/v1/workspaces/{ws.id}")


async def test_default_json_limit_applies(env_server, repo):
    """The session's server has the default limits (16 MiB of JSON): a larger body used to be read
    and parsed whole, however large."""
    async with EnvClient(env_server.url, env_server.token) as client:
        ws = await client.create(str(repo))
        try:
            with pytest.raises(SandboxError, match=r"request body over 16777216 bytes"):
                await ws.exec(["true", "a" * (17 << 20)])
        finally:
            await ws.close()  # the server is the session's: leave nothing behind


async def test_a_proxys_413_is_named(repo):
    """A proxy's own body limit (nginx: 1 MiB by default) answers 413 with an HTML page, not ours."""
    client = EnvClient("http://env.invalid", "t")
    await client.aclose()
    page = b"<html><center><h1>413 Request Entity Too Large</h1></center></html>"
    transport = httpx.MockTransport(lambda _: httpx.Response(413, content=page, headers={"content-type": "text/html"}))
    client._http = httpx.AsyncClient(base_url="http://env.invalid", transport=transport)
    async with client:
        with pytest.raises(SandboxError, match=r"HTTP 413 \(request body too large for a proxy before the server\)"):
            await client.create(str(repo))


def _in_process_client(app, token: str = "t") -> EnvClient:
    """An EnvClient calling `app` in this event loop (no server thread)."""
    client = EnvClient("http://env", token)
    client._http = httpx.AsyncClient(
        base_url="http://env", headers={"Authorization": f"Bearer {token}"}, transport=httpx.ASGITransport(app=app)
    )
    return client


async def test_exec_timeouts_over_the_servers_limit_are_refused(tmp_path, repo):
    """A token holder could ask for timeout=1e9 and keep a workspace, and its pool slot, for ever."""
    app = create_app(make_backend("plain", tmp_path / "state"), PoolConfig(), "t", own_backend=True)
    async with _in_process_client(app) as client:
        ws = await client.create(str(repo))
        with pytest.raises(ValueError, match=r"timeout 1e\+09 s is over this environment server's limit of 3600 s"):
            await ws.exec("echo never", timeout=1e9)
        assert (await ws.exec("echo ok", timeout=3600)).stdout == "ok\n"  # up to the limit
        assert ws.info["max_timeout_s"] == 3600
        r = await client._http.post(f"/v1/workspaces/{ws.id}/exec", json={"cmd": "true", "timeout": 3600.5})
        assert (r.status_code, r.json()["error"]["kind"]) == (400, "invalid_argument")
    await app.state.close_all()
    # Configured lower; a limit under the backend's default timeout (120 s) is raised to it, so a
    # command without a timeout of its own always runs.
    for limit, effective in ((600, 600), (1, 120)):
        backend = make_backend("plain", tmp_path / f"state-{limit}")
        app = create_app(backend, PoolConfig(), "t", own_backend=True, max_exec_timeout_s=limit)
        async with _in_process_client(app) as client:
            ws = await client.create(str(repo))
            assert ws.info["max_timeout_s"] == effective
            assert (await ws.exec("true", timeout=effective)).exit_code == 0
            with pytest.raises(ValueError, match=f"limit of {effective} s per command"):
                await ws.exec("true", timeout=effective + 1)
        await app.state.close_all()


@pytest.fixture(params=["plain", "isolated"])
def file_server(request, tmp_path):
    app = create_app(make_backend(request.param, tmp_path / "state"), PoolConfig(), "t", own_backend=True)
    server = BackgroundServer(app).start()
    yield server
    server.stop()


def _reset_peak_rss() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # sets VmHWM, the peak resident set, back to the current one


def _peak_rss() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) << 10 for line in f if line.startswith("VmHWM:"))


async def test_file_reads_are_streamed_not_held_in_memory(file_server, repo):
    """A read was read whole, joined and sent as one body: the server held the file about three
    times over (a 64 MiB read raised this process's peak RSS by ~190 MB). Now a chunk at a time."""
    async with EnvClient(file_server.url, "t") as client:
        ws = await client.create(str(repo))
        # Sparse: the isolated backend's 64 MiB tmpfs holds them.
        await ws.exec(f"truncate -s {MAX_READ_BYTES} big && truncate -s {MAX_READ_BYTES + 1} too-big")
        async with httpx.AsyncClient(base_url=file_server.url, headers={"Authorization": "Bearer t"}) as http:
            received = zeros = 0
            _reset_peak_rss()  # the server runs in this process (a thread)
            before = _peak_rss()
            async with http.stream("GET", f"/v1/workspaces/{ws.id}/file", params={"path": "big"}) as r:
                assert (r.status_code, r.headers["content-type"]) == (200, "application/octet-stream")
                async for chunk in r.aiter_bytes():  # not kept: what grows is the server
                    received += len(chunk)
                    zeros += chunk.count(0)
            grown = _peak_rss() - before
        print(f"\npeak RSS growth while streaming a {MAX_READ_BYTES >> 20} MiB file: {grown / 2**20:.1f} MiB")
        assert received == zeros == MAX_READ_BYTES
        assert grown < 32 << 20
        # Over the read limit, refused as in-process; the client's whole reads are unchanged.
        with pytest.raises(NotAFileError, match=f"over the {MAX_READ_BYTES}-byte read limit"):
            await ws.read_bytes("too-big")
        assert await ws.read_bytes("README.md") == b"# demo\n"
        await ws.close()


def _open_files_named(name: str) -> list[str]:
    found = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # closed since the listing
            if os.readlink(f"/proc/self/fd/{fd}").endswith("/" + name):
                found.append(fd)
    return found


async def _until_closed(name: str) -> None:
    for _ in range(100):
        if not _open_files_named(name):
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"the server still holds {name} open")


async def test_a_file_read_cut_short_closes_the_file(file_server, repo):
    async with EnvClient(file_server.url, "t") as client:
        ws = await client.create(str(repo))
        await ws.exec(f"truncate -s {MAX_READ_BYTES} streamed.bin")
        url = f"/v1/workspaces/{ws.id}/file"
        async with httpx.AsyncClient(base_url=file_server.url, headers={"Authorization": "Bearer t"}) as http:
            async with http.stream("GET", url, params={"path": "streamed.bin"}) as r:
                async for _ in r.aiter_raw():
                    assert _open_files_named("streamed.bin"), "the server reads from the open file"
                    break  # the client hangs up after the first chunk
            await _until_closed("streamed.bin")
            # The workspace closed under a read: the body is cut short, not passed off as a shorter file.
            with pytest.raises(httpx.RemoteProtocolError):
                async with http.stream("GET", url, params={"path": "streamed.bin"}) as r:
                    async for _ in r.aiter_raw():
                        if not ws.closed:
                            await ws.close()
            await _until_closed("streamed.bin")


def _raw(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=10)
    return sock


def _closed_within(sock: socket.socket, seconds: float) -> bool:
    """Whether the server closes `sock` within `seconds` (what it sent first is read and dropped)."""
    sock.settimeout(seconds)
    try:
        while sock.recv(65536):
            pass
        return True
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True


def test_connections_that_never_send_a_whole_request_head_are_closed(monkeypatch):
    """uvicorn keeps a connection that sends nothing, or half a request head, for good: 20,000 such
    took a server's every descriptor. GuardedH11 closes one that has no whole head after head_timeout_s,
    whether new or after a response; a slow request in progress is not one of them."""
    from fastapi import FastAPI

    from vivace.sandbox.background import GuardedH11

    monkeypatch.setattr(GuardedH11, "head_timeout_s", 0.5)
    app = FastAPI()

    @app.get("/slow")
    async def slow() -> dict:
        await asyncio.sleep(1.5)  # longer than the head timeout: a request in progress is not closed
        return {"ok": True}

    server = BackgroundServer(app).start()
    try:
        silent, half = _raw(server.url), _raw(server.url)
        half.sendall(b"GET /slow HTTP/1.1\r\nHost: x\r\n")
        assert _closed_within(silent, 5) and _closed_within(half, 5)
        after_one = _raw(server.url)
        after_one.sendall(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
        after_one.settimeout(5)
        answer = b""
        while b'{"ok":true}' not in answer:  # answered after 1.5 s, past the 0.5 s timeout
            answer += after_one.recv(65536) or pytest.fail(f"closed with a request in progress: {answer!r}")
        after_one.sendall(b"GET /slow HTTP/1.1\r\n")  # the next request's head, never finished
        assert _closed_within(after_one, 5)
        assert httpx.get(f"{server.url}/slow", timeout=10).json() == {"ok": True}
    finally:
        server.stop()


def test_a_connection_past_the_servers_limit_is_answered_busy_at_once(monkeypatch):
    """Past max_connections a new connection gets 503 "busy" with Retry-After and is closed, instead of
    the server running out of descriptors; once connections close, requests are served again."""
    from fastapi import FastAPI

    from vivace.sandbox.background import GuardedH11

    monkeypatch.setattr(GuardedH11, "max_connections", 3)
    app = FastAPI()

    @app.get("/ok")
    async def ok() -> dict:
        return {"ok": True}

    server = BackgroundServer(app).start()
    try:
        held = [_raw(server.url) for _ in range(3)]
        time.sleep(0.2)
        refused = httpx.get(f"{server.url}/ok", timeout=5)
        assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
        assert refused.json()["error"]["kind"] == "busy"
        for sock in held:
            sock.close()
        for _ in range(50):
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{server.url}/ok", timeout=5).status_code == 200:
                    break
            time.sleep(0.1)
        else:
            raise AssertionError("requests were not served again once the held connections closed")
    finally:
        server.stop()


async def test_workspaces_nobody_touches_are_closed_after_the_idle_limit(tmp_path, repo):
    """A client killed with workspaces out, or one that gave up on a create the server completed as it
    hung up, left them (and their pool slots) live until the server stopped: with max_live reached,
    every later create waited for ever. Now one untouched for `server.workspace_idle_s` is closed."""
    backend = make_backend("plain", tmp_path / "state")
    app = create_app(backend, PoolConfig(max_live=3), "t", own_backend=True, workspace_idle_s=0.5)
    async with _in_process_client(app) as client:
        # Abandoned: made, and its id never used again (a client that hung up just as it was answered).
        r = await client._http.post("/v1/workspaces", json={"source": {"path": str(repo)}})
        abandoned = r.json()["id"]
        kept, working = await client.create(str(repo)), await client.create(str(repo))
        # A command running past the limit keeps its workspace; so do requests closer together than it.
        running = asyncio.create_task(working.exec("sleep 1.2 && echo done"))
        for _ in range(6):
            await asyncio.sleep(0.2)
            await kept.stat(".")
        assert (await running).stdout == "done\n"
        assert (await kept.exec("echo alive")).stdout == "alive\n"
        # The abandoned one is gone, and says why.
        r = await client._http.get(f"/v1/workspaces/{abandoned}/stat", params={"path": "."})
        assert (r.status_code, r.json()["error"]["kind"]) == (410, "closed")
        assert "without a request (server.workspace_idle_s)" in r.json()["error"]["message"]
        # Both others idle past the limit (and the reaper's interval): closed, their slots free again.
        await asyncio.sleep(0.8)
        with pytest.raises(WorkspaceClosedError, match="make a new one"):
            await kept.exec("true")
        assert (await client._http.get("/v1/metrics")).json()["live"] == 0
        fresh = [await asyncio.wait_for(client.create(str(repo)), 10) for _ in range(3)]  # max_live of them
        assert [(await ws.exec("echo new")).stdout for ws in fresh] == ["new\n"] * 3
    await app.state.close_all()


async def test_an_idle_limit_of_zero_never_closes_a_workspace(tmp_path, repo):
    backend = make_backend("plain", tmp_path / "state")
    app = create_app(backend, PoolConfig(), "t", own_backend=True, workspace_idle_s=0)
    async with _in_process_client(app) as client:
        ws = await client.create(str(repo))
        await asyncio.sleep(0.3)
        assert (await ws.exec("echo still")).stdout == "still\n"
    await app.state.close_all()


async def test_a_file_streaming_keeps_its_workspace_from_being_closed_as_idle(tmp_path, repo):
    app = create_app(make_backend("plain", tmp_path / "state"), PoolConfig(), "t", own_backend=True,
                     workspace_idle_s=0.3)  # fmt: skip
    server = BackgroundServer(app).start()
    try:
        async with EnvClient(server.url, "t") as client:
            ws = await client.create(str(repo))
            await ws.exec(f"truncate -s {MAX_READ_BYTES} big")
            async with httpx.AsyncClient(base_url=server.url, headers={"Authorization": "Bearer t"}) as http:
                async with http.stream("GET", f"/v1/workspaces/{ws.id}/file", params={"path": "big"}) as r:
                    received, t0 = 0, time.monotonic()
                    async for chunk in r.aiter_raw(256 << 10):  # a slow reader: 1.2 s for a few MB
                        received += len(chunk)
                        if time.monotonic() - t0 > 1.2:
                            break
                        await asyncio.sleep(0.05)
            assert 0 < received < MAX_READ_BYTES
            assert (await ws.exec("echo alive")).stdout == "alive\n"
    finally:
        server.stop()
