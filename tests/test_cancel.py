"""A cancelled exec (Ctrl-C or SIGTERM to a command running episodes) leaves nothing behind.

Each test runs its own asyncio.run, as the CLI does, so that the loop's normal teardown is part of
what is checked: a process still unreaped, or a transport still open, when the loop closes shows up
as "Event loop is closed" printed from a finaliser or a child-watcher warning after the command's
own message.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import sys
import threading
import time
import warnings

import pytest

from conftest import make_backend
from vivace.sandbox import process


def marked_pids(mark: str) -> list[int]:
    """Live (not zombie) processes running `sleep <mark>`."""
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if mark.encode() in argv:
            pids.append(int(pid))
    return pids


@pytest.mark.parametrize("mid_spawn", [False, True], ids=["running", "mid-spawn"])
@pytest.mark.parametrize("kind", ["plain", "isolated"])
def test_cancelled_exec_reaps_its_process_before_the_cancellation_propagates(
    kind, mid_spawn, repo, state_dir, monkeypatch, caplog
):
    """Cancelled while its command runs, or while create_subprocess_exec has started the process but
    not yet returned it (asyncio's own handling then kills only that process and waits for pipes its
    children hold), an exec ends the whole tree and reaps it before its CancelledError propagates."""
    backend = make_backend(kind, state_dir)
    mark = f"31.{time.time_ns()}"  # `sleep <mark>`: this test's processes, told apart from all others
    spawned: list[asyncio.subprocess.Process] = []
    real_spawn = asyncio.create_subprocess_exec

    async def spawn(*args, **kw):
        spawned.append(await real_spawn(*args, **kw))
        if mid_spawn:
            await asyncio.sleep(1.0)  # a spawn still connecting the pipes when the cancellation comes
        return spawned[-1]

    monkeypatch.setattr(process.asyncio, "create_subprocess_exec", spawn)
    seen_at_cancel: list[tuple[int | None, bool]] = []

    async def main() -> None:
        ws = await backend.create(backend.snapshot(str(repo)))
        # A child in the background and one in the foreground: the whole tree must go.
        task = asyncio.create_task(ws.exec(f"sleep {mark} & sleep {mark}; wait"))
        deadline = time.monotonic() + 20
        while not spawned if mid_spawn else len(marked_pids(mark)) < 2:
            assert time.monotonic() < deadline and not task.done(), "the command did not start"
            await asyncio.sleep(0.02)
        if mid_spawn:
            await asyncio.sleep(0.2)  # the plain backend's command is running by now
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # Checked the moment the cancellation arrives: nothing may be left for the loop's teardown.
        seen_at_cancel.extend((p.returncode, p._transport.is_closing()) for p in spawned)
        # Returning now: asyncio.run cancels what is left and closes the loop at once.

    unraisable: list[str] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: unraisable.append(f"{u.exc_value!r} in {u.object!r}"))
    caplog.set_level(logging.WARNING, "asyncio")
    gc.collect()  # garbage of earlier tests (an unclosed socket transport) is not this test's
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            asyncio.run(main())
            time.sleep(0.2)  # a child watcher reporting a late exit to the closed loop does so by now
            gc.collect()
    finally:
        asyncio.run(backend.aclose())
    assert seen_at_cancel and all(rc is not None and closed for rc, closed in seen_at_cancel), seen_at_cancel
    assert not unraisable, unraisable
    assert not caplog.messages, caplog.messages  # e.g. "Loop ... that handles pid ... is closed"
    assert not [w for w in caught if issubclass(w.category, ResourceWarning)], [str(w.message) for w in caught]
    deadline = time.monotonic() + 5  # killed, reaped by init: gone within moments
    while marked_pids(mark) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not marked_pids(mark)


@pytest.mark.parametrize("kind", ["plain", "isolated"])
async def test_close_waits_for_an_exec_ending_its_cancellation(kind, repo, state_dir):
    """A cancelled `gather` of episodes raises when its first task ends, and the caller then closes
    every workspace while the other episodes' execs are still killing and reaping their commands (and,
    isolated, unmounting their attach points): close waits for them, so nothing is left behind."""
    backend = make_backend(kind, state_dir)
    ws = await backend.create(backend.snapshot(str(repo)))
    task = asyncio.create_task(ws.exec("sleep 30"))
    await asyncio.sleep(0.5)
    done_at_destroy = []
    destroy = backend.destroy

    async def recording_destroy(w):
        done_at_destroy.append(task.done())
        await destroy(w)

    backend.destroy = recording_destroy
    task.cancel()
    await backend.aclose()
    assert done_at_destroy == [True]
    assert task.cancelled()
    assert not backend.owner_dir.exists()


@pytest.mark.parametrize("kind", ["plain", "isolated"])
def test_killing_a_command_never_reaps_it_from_under_the_child_watcher(kind, repo, state_dir, monkeypatch, caplog):
    """`proc.kill()` polls first (Popen.send_signal: waitpid WNOHANG). The isolated backend kills the
    sandbox's init, so bwrap has just exited when it is killed in turn: that poll reaped it before
    asyncio's child watcher, which logged "Unknown child process pid N, will report returncode 255"
    (a rare `make test` failure; a message on the console of a Ctrl-C'd run). Here the watcher is
    held back until the cancelled exec has killed everything, so the poll always wins the race."""
    backend = make_backend(kind, state_dir)
    gate = threading.Event()
    real_waitpid = os.waitpid

    def held_waitpid(pid, options):  # asyncio's watcher threads wait here; other callers do not
        if threading.current_thread() is not threading.main_thread() and options == 0:
            gate.wait(10)
        return real_waitpid(pid, options)

    async def main() -> None:
        ws = await backend.create(backend.snapshot(str(repo)))
        monkeypatch.setattr(os, "waitpid", held_waitpid)
        mark = f"32.{time.time_ns()}"
        task = asyncio.create_task(ws.exec(f"sleep {mark}"))
        deadline = time.monotonic() + 20
        while not marked_pids(mark):
            assert time.monotonic() < deadline and not task.done(), "the command did not start"
            await asyncio.sleep(0.02)
        task.cancel()
        await asyncio.sleep(0.5)  # the kill has run; the launcher is a zombie the watcher has not reaped
        gate.set()
        with pytest.raises(asyncio.CancelledError):
            await task
        monkeypatch.setattr(os, "waitpid", real_waitpid)
        await ws.close()

    caplog.set_level(logging.WARNING, "asyncio")
    try:
        asyncio.run(main())
    finally:
        gate.set()
        asyncio.run(backend.aclose())
    assert not [m for m in caplog.messages if "Unknown child process" in m], caplog.messages
