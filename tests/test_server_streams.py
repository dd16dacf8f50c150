"""File reads streamed by the environment server, and their ends: a reader that stops reading
without hanging up, one that hangs up, reads cut short by the server, and what the client holds
while it reads. Over real HTTP; the logs and the stop through the real `vivace sandbox serve`."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import hashlib
import logging
import os
import re
import signal
import socket
import time

import httpx
import pytest

import vivace.sandbox.client as client_module
from conftest import make_backend
from test_server_limits import _open_files_named, _peak_rss, _reset_peak_rss, _start_serve, _until_closed
from vivace.config import PoolConfig
from vivace.sandbox import BackendUnavailable, NotAFileError, SandboxError
from vivace.sandbox.background import BackgroundServer, ClosingServer
from vivace.sandbox.client import EnvClient, RemoteWorkspace
from vivace.sandbox.server import GRACEFUL_BACKSTOP_S, create_app

STREAMED = 16 << 20  # over a chunk (256 KiB), so streamed; over what the socket buffers hold, so it stalls


def _stalled_reader(url: str, token: str, ws_id: str, path: str) -> socket.socket:
    """A raw client that asks for `path`, reads the response's head and then nothing more, without
    hanging up (a small receive buffer, set before connecting, keeps its window small)."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect((host, int(port)))
    request = f"GET /v1/workspaces/{ws_id}/file?path={path} HTTP/1.1\r\nHost: env\r\nAuthorization: Bearer {token}\r\n"
    sock.sendall(request.encode() + b"\r\n")
    head = sock.recv(4096)
    assert head.startswith(b"HTTP/1.1 200 "), head
    return sock


def _rest_of(sock: socket.socket) -> bytes:
    """Everything the server still sends, until it closes the connection."""
    sock.settimeout(30)
    data = bytearray()
    while chunk := sock.recv(1 << 20):
        data += chunk
    sock.close()
    return bytes(data)


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


async def test_a_reader_that_stops_reading_is_let_go(tmp_path, repo):
    """A client that started a read and took nothing more kept the server's file open for as long as
    it liked (20 such readers: 20 descriptors, still open 10 s later), so a token holder could run the
    server out of descriptors. Now the stream is cut short after server.file_stream_stall_s, and
    beyond server.max_file_streams at once a read is refused, saying what to do."""
    backend = make_backend("plain", tmp_path / "state")
    app = create_app(backend, PoolConfig(), "t", own_backend=True, max_file_streams=2, file_stream_stall_s=1.0)
    server = BackgroundServer(app).start()
    seen = _Records()
    for name in ("uvicorn.error", "vivace.sandbox.server"):
        logging.getLogger(name).addHandler(seen)
    vivace_level = logging.getLogger("vivace.sandbox.server").level
    logging.getLogger("vivace.sandbox.server").setLevel(logging.DEBUG)
    try:
        async with EnvClient(server.url, "t", busy_retry_s=0) as client:  # 0: refused at once, not repeated
            ws = await client.create(str(repo))
            await ws.exec(
                f"truncate -s {STREAMED} a.bin && truncate -s {STREAMED} b.bin && truncate -s {STREAMED} c.bin"
            )
            t0 = time.monotonic()
            stalled = [_stalled_reader(server.url, "t", ws.id, name) for name in ("a.bin", "b.bin")]
            assert _open_files_named("a.bin") and _open_files_named("b.bin")
            assert (await client.metrics())["file_streams"] == 2
            # A third stream would pass the limit: refused, its file closed at once; small files still read.
            with pytest.raises(SandboxError, match=r"2 file reads are streaming .*\(server.max_file_streams\): retry"):
                await ws.read_bytes("c.bin")
            r = await client._http.get(f"/v1/workspaces/{ws.id}/file", params={"path": "c.bin"})
            assert (r.status_code, r.json()["error"]["kind"], r.headers["retry-after"]) == (503, "busy", "1")
            assert await ws.read_bytes("README.md") == b"# demo\n"
            assert not _open_files_named("c.bin")
            # The stall: both cut short, their files closed, their slots free again.
            await _until_closed("a.bin")
            await _until_closed("b.bin")
            took = time.monotonic() - t0
            assert (await client.metrics())["file_streams"] == 0
            assert await ws.read_bytes("c.bin") == bytes(STREAMED)
            # What a stalled reader gets when it reads on: an incomplete body, never a shorter file.
            for sock in stalled:
                rest = await asyncio.to_thread(_rest_of, sock)
                assert len(rest) < STREAMED and not rest.endswith(b"\r\n0\r\n\r\n")
            await ws.close()
    finally:
        server.stop()
        for name in ("uvicorn.error", "vivace.sandbox.server"):
            logging.getLogger(name).removeHandler(seen)
        logging.getLogger("vivace.sandbox.server").setLevel(vivace_level)
    print(f"\ntwo stalled readers let go after {took:.2f}s (file_stream_stall_s=1)")
    assert 1.0 <= took < 4
    messages = [(r.levelname, r.getMessage()) for r in seen.records]
    assert sorted(m for m in messages if "took nothing" in m[1]) == [
        ("WARNING", f"a read of {name!r} from workspace {ws.id} cut short: its client took nothing for 1 s "
                    "(server.file_stream_stall_s)") for name in ("a.bin", "b.bin")]  # fmt: skip
    assert not [m for m in messages if m[0] in ("ERROR", "CRITICAL")], messages


@contextlib.asynccontextmanager
async def _one_stream_held(tmp_path, repo, **client_kw):
    """A server that streams one file at a time, that one held by a reader taking nothing (the socket,
    to hang up); a workspace with a streamed file of random bytes, its digest; the statuses answered."""
    app = create_app(make_backend("plain", tmp_path / "state"), PoolConfig(), "t", own_backend=True, max_file_streams=1)
    server = BackgroundServer(app).start()
    statuses: list[int] = []

    async def seen(response: httpx.Response) -> None:
        statuses.append(response.status_code)

    try:
        async with EnvClient(server.url, "t", **client_kw) as client:
            ws = await client.create(str(repo))
            made = await ws.exec(f"head -c {STREAMED} /dev/urandom > wanted.bin && sha256sum wanted.bin")
            await ws.exec(f"truncate -s {STREAMED} held.bin")
            client._http.event_hooks["response"].append(seen)
            held = _stalled_reader(server.url, "t", ws.id, "held.bin")
            try:
                yield ws, made.stdout.split()[0], held, statuses
            finally:
                held.close()
    finally:
        server.stop()


async def test_a_read_refused_as_busy_is_repeated_until_a_stream_frees(tmp_path, repo):
    """A read refused as "busy" (server.max_file_streams) failed at once: in training, an episode lost
    as an environment error. Now it is repeated after the server's Retry-After, and gets the file."""
    async with _one_stream_held(tmp_path, repo) as (ws, digest, held, statuses):
        reading = asyncio.ensure_future(ws.read_bytes("wanted.bin"))
        for _ in range(200):
            if statuses or reading.done():
                break
            await asyncio.sleep(0.01)
        held.close()  # its stream ends as its reader hangs up: the slot is free again
        data = await asyncio.wait_for(reading, 10)
    assert hashlib.sha256(data).hexdigest() == digest
    assert statuses[0] == 503 and statuses[-1] == 200 and set(statuses[:-1]) == {503}, statuses


async def test_a_read_busy_past_its_budget_fails_naming_the_tries(tmp_path, repo, monkeypatch):
    """Repeated for `busy_retry_s` at most, then the server's busy error, saying how often it was tried."""
    monkeypatch.setattr(client_module, "BUSY_WAIT_CAP_S", 0.1, raising=False)  # the server asks for 1 s
    async with _one_stream_held(tmp_path, repo, busy_retry_s=1.0) as (ws, _, _, statuses):
        t0 = time.monotonic()
        with pytest.raises(SandboxError, match=r"1 file reads are streaming .* \(still busy after (\d+) tries in") as e:
            await ws.read_bytes("wanted.bin")
        took = time.monotonic() - t0
    tries = int(re.search(r"after (\d+) tries", str(e.value))[1])
    assert 0.8 < took < 3 and tries >= 3 and statuses == [503] * tries, (took, tries, statuses)


async def test_only_busy_is_repeated():
    """A 503 for another reason (the server stopping, a backend missing, a proxy's page) may come after
    work began, or says nothing of when to come back: raised at once, as before."""
    others = [
        (BackendUnavailable, "^no bwrap$", httpx.Response(503, json={"error": {"kind": "backend_unavailable", "message": "no bwrap"}})),
        (SandboxError, r"^the server is stopping$", httpx.Response(503, json={"error": {"kind": "shutting_down", "message": "the server is stopping"}}, headers={"Retry-After": "0"})),
        (SandboxError, "HTTP 503: <html>busy", httpx.Response(503, text="<html>busy", headers={"Retry-After": "0"})),
    ]  # fmt: skip
    for error, said, other in others:
        busy = httpx.Response(503, json={"error": {"kind": "busy", "message": "busy"}}, headers={"Retry-After": "0"})
        answers = [busy, other, httpx.Response(200, content=b"never asked for")]
        asked = []

        def answer(request: httpx.Request, answers=answers, asked=asked) -> httpx.Response:
            asked.append(request.method)
            return answers.pop(0)

        ws = _workspace_answering(answer)
        try:
            with pytest.raises(error, match=said):
                await ws.read_bytes("f")
        finally:
            await ws.client.aclose()
        assert asked == ["GET", "GET"]  # busy repeated once, then the other answer raised


def _server_end_open(server_port: int, client_port: int) -> bool:
    """Whether this process holds a descriptor of the server's end of the connection from `client_port`."""
    inodes = set()
    for line in open("/proc/net/tcp").read().splitlines()[1:]:
        local, remote, inode = (line.split()[i] for i in (1, 2, 9))
        if int(local.split(":")[1], 16) == server_port and int(remote.split(":")[1], 16) == client_port:
            inodes.add(f"socket:[{inode}]")
    found = False
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # closed since the listing
            found |= os.readlink(f"/proc/self/fd/{fd}") in inodes
    return found


async def test_a_stalled_reader_s_connection_is_dropped(tmp_path, repo):
    """A stream cut short for stalling left its connection open (uvicorn closes it only once its buffered
    bytes are sent, which a client taking nothing never lets it): a descriptor held until the client
    left. Under ClosingServer (`serve`, the Ray actor) the connection is now dropped with the stream."""
    app = create_app(make_backend("plain", tmp_path / "state"), PoolConfig(), "t", own_backend=True,
                     file_stream_stall_s=0.5)  # fmt: skip
    server = BackgroundServer(app, server_class=ClosingServer, graceful_s=GRACEFUL_BACKSTOP_S).start()
    try:
        async with EnvClient(server.url, "t") as client:
            ws = await client.create(str(repo))
            await ws.exec(f"truncate -s {STREAMED} held.bin")
            sock = _stalled_reader(server.url, "t", ws.id, "held.bin")
            assert _server_end_open(server.port, sock.getsockname()[1])
            await _until_closed("held.bin")  # cut short for stalling
            for _ in range(40):
                if not _server_end_open(server.port, sock.getsockname()[1]):
                    break
                await asyncio.sleep(0.05)
            held = _server_end_open(server.port, sock.getsockname()[1])
            rest = await asyncio.to_thread(_rest_of, sock)  # what it had sent already, then the end
            await ws.close()
    finally:
        server.stop()
    assert not held, "the server still holds the connection of the reader it cut short"
    assert len(rest) < STREAMED and not rest.endswith(b"\r\n0\r\n\r\n")  # incomplete, as before


def _server_files(pid: int, name: str) -> int:
    found = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            found += os.readlink(f"/proc/{pid}/fd/{fd}").endswith("/" + name)
        except OSError:  # closed since the listing
            pass
    return found


async def _until_server_closes(pid: int, name: str) -> None:
    for _ in range(100):
        if not _server_files(pid, name):
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"the server still holds {name} open")


async def test_reads_ended_early_close_the_file_and_log_no_error(tmp_path, repo):
    """A client hanging up in the middle of a read is normal: the file is closed, and nothing above a
    debug line is logged. A read the server cuts short on purpose said so with uvicorn's ERROR
    "returned without completing response" (the workspace closed under it); with a reader that
    took nothing, the stop waited for it GRACEFUL_BACKSTOP_S (~5 s), then logged an ERROR and a
    traceback (the stream cancelled)."""
    proc, url = await _start_serve(tmp_path, "plain")
    name = "big.bin"
    try:
        async with (
            EnvClient(url, "tok") as client,
            httpx.AsyncClient(base_url=url, headers={"Authorization": "Bearer tok"}) as http,
        ):
            ws = await client.create(str(repo))
            await ws.exec(f"truncate -s {STREAMED} {name}")
            path = f"/v1/workspaces/{ws.id}/file"
            # Hanging up: after a chunk, after the head (FIN), and with a reset (RST).
            async with http.stream("GET", path, params={"path": name}) as r:
                async for _ in r.aiter_raw():
                    assert _server_files(proc.pid, name) == 1
                    break
            await _until_server_closes(proc.pid, name)
            for reset in (False, True):
                sock = _stalled_reader(url, "tok", ws.id, name)
                await asyncio.sleep(0.2)  # the server waiting for the client to take more
                if reset:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\1\0\0\0\0\0\0\0")
                sock.close()
                await _until_server_closes(proc.pid, name)
            # The workspace closed under a read: cut short, the client told by an incomplete body.
            other = await client.create(str(repo))
            await other.exec(f"truncate -s {STREAMED} {name}")
            with pytest.raises(httpx.RemoteProtocolError):
                async with http.stream("GET", f"/v1/workspaces/{other.id}/file", params={"path": name}) as r:
                    async for _ in r.aiter_raw():
                        if not other.closed:
                            await other.close()
            await _until_server_closes(proc.pid, name)
            # Told to stop while a reader takes nothing: cut short, and the stop as prompt as without it.
            sock = _stalled_reader(url, "tok", ws.id, name)
            await asyncio.sleep(0.2)
            t0 = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            code = await asyncio.to_thread(proc.wait, 20)
            took = time.monotonic() - t0
            sock.close()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    log = (tmp_path / "server.log").read_text()
    print(f"\nSIGTERM to exit with a stalled reader: {took:.2f}s")
    assert code in (0, -signal.SIGTERM), log
    assert "ERROR" not in log and "Traceback" not in log, log
    assert took < 3, log  # the stream cut short and its connection dropped: ~0.6 s here; was ~5.3 s
    assert not any((tmp_path / "state" / "owners").iterdir()), "every workspace must be closed"


async def test_a_send_that_fails_after_a_hangup_ends_the_read(tmp_path, repo):
    """ASGI 2.4: a server may raise an OSError from `send` once the client has left (uvicorn returns
    quietly instead). That is a hang-up too: the file is closed and the app returns normally, where it
    raised (which a server logs as an ERROR with a traceback)."""
    app = create_app(make_backend("plain", tmp_path / "state"), PoolConfig(), "t", own_backend=True)
    client = EnvClient("http://env", "t")
    await client.aclose()
    client._http = httpx.AsyncClient(
        base_url="http://env", headers={"Authorization": "Bearer t"}, transport=httpx.ASGITransport(app=app)
    )
    async with client:
        ws = await client.create(str(repo))
        await ws.exec(f"truncate -s {STREAMED} gone.bin")
        path = f"/v1/workspaces/{ws.id}/file"
        scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.4"}, "http_version": "1.1",
                 "method": "GET", "scheme": "http", "path": path, "raw_path": path.encode(), "root_path": "",
                 "query_string": b"path=gone.bin", "headers": [(b"host", b"env"), (b"authorization", b"Bearer t")],
                 "client": ("127.0.0.1", 50000), "server": ("env", 80)}  # fmt: skip
        requests = [{"type": "http.request", "body": b"", "more_body": False}]
        sent: list[dict] = []

        async def receive() -> dict:
            if requests:
                return requests.pop()
            await asyncio.Event().wait()  # the client's leaving shows only as `send` failing
            raise AssertionError("unreachable")

        async def send(message: dict) -> None:
            if message["type"] == "http.response.body" and sent[1:]:
                raise OSError("the client closed the connection")
            sent.append(message)

        await asyncio.wait_for(app(scope, receive, send), 10)
        assert sent[0]["status"] == 200 and len(sent) == 2
        assert not _open_files_named("gone.bin")
        assert (await client.metrics())["file_streams"] == 0
        await ws.close()
    await app.state.close_all()


async def test_a_file_read_holds_the_file_once(tmp_path, repo):
    """read_bytes kept the chunks and then joined them: a 60 MB read peaked at ~2x the file in the
    client. Now one buffer, sized from what the server declares, holds it."""
    proc, url = await _start_serve(tmp_path, "plain")  # another process: this one's memory is the client's
    size = 60_000_000
    try:
        async with EnvClient(url, "tok") as client:
            ws = await client.create(str(repo))
            made = await ws.exec(f"head -c {size} /dev/urandom > big.bin && sha256sum big.bin")
            gc.collect()
            _reset_peak_rss()
            before = _peak_rss()
            data = await ws.read_bytes("big.bin")
            grown = _peak_rss() - before
            assert len(data) == size and hashlib.sha256(data).hexdigest() == made.stdout.split()[0]
            del data
            await ws.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        await asyncio.to_thread(proc.wait, 20)
    print(f"\nclient peak RSS growth reading a {size / 1e6:.0f} MB file: {grown / 1e6:.1f} MB")
    assert grown < 1.3 * size


def _workspace_answering(answer) -> RemoteWorkspace:
    client = EnvClient("http://env.invalid", "t")
    client._http = httpx.AsyncClient(base_url="http://env.invalid", transport=httpx.MockTransport(answer))
    return RemoteWorkspace(client, "w0-x", 60, {})


async def test_a_read_holds_no_more_than_the_read_limit(monkeypatch):
    """The client trusted the server for the size of a read: whatever came was held (twice). Now a
    declared size over the read limit is refused unread, and what arrives is counted against it."""
    limit, piece = 1 << 20, 64 << 10
    monkeypatch.setattr(client_module, "MAX_READ_BYTES", limit, raising=False)  # without it too: fails on what it does
    pulled = 0

    class Body(httpx.AsyncByteStream):
        def __init__(self, total: int) -> None:
            self.total = total

        async def __aiter__(self):
            nonlocal pulled
            for start in range(0, self.total, piece):
                pulled += min(piece, self.total - start)
                yield b"x" * min(piece, self.total - start)

    async def read(sent: int, **declared: str) -> bytes:
        headers = {"content-type": "application/octet-stream", **declared}
        ws = _workspace_answering(lambda _: httpx.Response(200, headers=headers, stream=Body(sent)))
        try:
            return await ws.read_bytes("f")
        finally:
            await ws.client.aclose()

    for declared in ({"content-length": str(1 << 40)}, {"x-file-size": str(limit + 1)}):
        with pytest.raises(
            NotAFileError, match=rf"'f' is {int(next(iter(declared.values())))} bytes, over the {limit}-byte read limit"
        ):
            await read(4 << 20, **declared)
        assert pulled == 0  # refused unread
    with pytest.raises(NotAFileError, match=f"'f': the server sent more than the {limit}-byte read limit"):
        await read(64 << 20)
    assert pulled <= limit + piece  # stopped at the first piece past the limit
    # The declared size only sizes the buffer: what arrives is the file (truncated meanwhile, or not ours).
    assert await read(300_000, **{"x-file-size": str(limit)}) == b"x" * 300_000
    assert await read(limit, **{"x-file-size": "1000"}) == b"x" * limit
    assert await read(0, **{"x-file-size": "0"}) == b""
