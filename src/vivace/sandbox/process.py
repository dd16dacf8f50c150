"""Run one command with a wall-clock timeout and capped output (shared by every backend).

Output beyond the cap is still read (so the command never blocks on a full pipe) but only
the first and last halves of the cap are kept, with a marker saying how much was dropped:
the end of a test run's output usually matters as much as its start.

A command is done when its main process exits: what it started in the background may hold
its output open, but is not waited for (`reap` ends it; the isolated backend's sandbox ends
it by itself), and what it still writes in the next DRAIN_S seconds is kept.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

CHUNK = 64 * 1024
# How long output is still read once the main process has exited, from what it left holding the pipes.
DRAIN_S = 1.0


@dataclass
class RawResult:
    stdout: str
    stderr: str
    exit_code: int
    duration_s: float
    timed_out: bool
    stdout_dropped: int
    stderr_dropped: int


class _CappedBuffer:
    """Keeps the first and last `limit // 2` bytes of a stream and counts the rest."""

    def __init__(self, limit: int):
        self.half = limit // 2
        self.head = bytearray()
        self.tail = bytearray()
        self.dropped = 0

    def feed(self, data: bytes) -> None:
        room = self.half - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if not data:
            return
        self.tail += data
        if len(self.tail) > self.half:
            excess = len(self.tail) - self.half
            self.dropped += excess
            del self.tail[:excess]

    def text(self) -> str:
        if not self.dropped:
            return (self.head + self.tail).decode("utf-8", errors="replace")
        marker = f"\n[... {self.dropped} bytes of output dropped ...]\n"
        return self.head.decode("utf-8", errors="replace") + marker + self.tail.decode("utf-8", errors="replace")


async def _drain(stream: asyncio.StreamReader, buf: _CappedBuffer) -> None:
    while chunk := await stream.read(CHUNK):
        buf.feed(chunk)


KILLED = 128 + signal.SIGKILL  # the shell's exit status of a command killed by SIGKILL


def exit_status(returncode: int) -> int:
    """Shell convention: a process killed by signal N reports 128+N."""
    return 128 - returncode if returncode < 0 else returncode


@functools.cache
def default_signals() -> tuple[str, ...]:
    """The argv prefix that starts a command with every signal at its default action and none blocked
    (GNU env 8.31+; empty where env lacks the option). A process inherits the signals its launcher
    ignores or blocks: under `vivace train` SIGINT and SIGTERM are blocked in Ray's processes (so a
    terminal's Ctrl-C reaches only the driver), under nohup SIGHUP is ignored. A task's tests must
    behave as they would in a shell."""
    env = shutil.which("env")
    if env and subprocess.run([env, "--default-signal", "true"], capture_output=True).returncode == 0:
        return (env, "--default-signal")
    return ()


def _default_signals_here() -> None:
    """In a child between fork and exec: no signal blocked, and the ones a launcher commonly ignores
    (Ctrl-C, SIGTERM, a terminal hang-up, a closed pipe) at their default action."""
    signal.pthread_sigmask(signal.SIG_SETMASK, [])
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGPIPE, signal.SIGQUIT):
        signal.signal(s, signal.SIG_DFL)


async def run_capped(
    argv: Sequence[str],
    *,
    cwd: str,
    env: dict[str, str],
    timeout: float,
    output_limit: int,
    kill: Callable[[asyncio.subprocess.Process], None],
    reap: Callable[[asyncio.subprocess.Process], None] | None = None,
    pass_fds: Sequence[int] = (),
    on_spawn: Callable[[asyncio.subprocess.Process], Awaitable[None]] | None = None,
) -> RawResult:
    """Run `argv`; on timeout call `kill(proc)`, which must end the whole process tree.

    The result comes once the main process has exited (its exit status, not a timeout, even
    when a background child still holds the output pipes): `reap(proc)` is called then to end
    what it left running, and the output is read for at most DRAIN_S seconds more.
    `on_spawn(proc)` runs right after the process starts (before its output is read); if it
    fails, the process is killed and the error propagates.
    """
    start = time.monotonic()
    prefix = default_signals()
    # Shielded: cancelled itself, create_subprocess_exec kills only the process it started (not its
    # children) and then waits for the pipes, which those children hold open.
    spawn = asyncio.ensure_future(
        asyncio.create_subprocess_exec(
            *prefix,  # env execs the command: same process, so on_spawn and kill see it
            *argv,
            # Without env's option, the child resets them itself before exec (slower: no vfork then).
            preexec_fn=None if prefix else _default_signals_here,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=cwd,
            env=env,
            start_new_session=True,
            pass_fds=tuple(pass_fds),
        )
    )
    try:
        proc = await asyncio.shield(spawn)
    except asyncio.CancelledError:
        await _settle(spawn)
        if not spawn.cancelled() and spawn.exception() is None:
            await _kill_and_reap(spawn.result(), kill)
        raise
    if on_spawn is not None:
        try:
            await on_spawn(proc)
        except BaseException:
            await _kill_and_reap(proc, kill)
            raise
    out, err = _CappedBuffer(output_limit), _CappedBuffer(output_limit)
    assert proc.stdout is not None and proc.stderr is not None
    readers = asyncio.gather(_drain(proc.stdout, out), _drain(proc.stderr, err))
    # Awaited only through shields, whose waiter may be gone (timeout, cancellation): mark the readers'
    # outcome retrieved so asyncio does not print an error of theirs as unhandled.
    readers.add_done_callback(lambda f: f.cancelled() or f.exception())
    # Python 3.11's proc.wait() also waits for the pipes to close, which a background child may hold.
    exited = asyncio.ensure_future(_exited(proc))
    timed_out = False
    try:
        done, _ = await asyncio.wait([readers, exited], timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        if done == {readers}:  # output closed first: the process exits next (or is stopped, hung)
            await asyncio.wait_for(asyncio.shield(exited), max(0.0, timeout - (time.monotonic() - start)) + 0.5)
        elif not done:
            raise TimeoutError
    except TimeoutError:
        timed_out = True
        kill(proc)
    except BaseException:  # cancelled by the caller (Ctrl-C, SIGTERM, a shutting-down loop)
        exited.cancel()
        await _kill_and_reap(proc, kill, readers)
        raise
    finally:
        exited.cancel()
    try:
        if not timed_out and reap is not None:
            reap(proc)
        try:  # pipes close once every process holding them is dead
            await asyncio.wait_for(asyncio.shield(readers), 5.0 if timed_out else DRAIN_S)
        except TimeoutError:  # a process that left the tree holds them: stop reading
            await _kill_and_reap(proc, None, readers)
        await proc.wait()
    except BaseException:  # cancelled: `kill` again could end more than this command (the isolated one's cgroup)
        await _kill_and_reap(proc, None, readers)
        raise
    return RawResult(
        stdout=out.text(),
        stderr=err.text(),
        # A timed-out command was killed (SIGKILL) whatever its launcher reports: bwrap, seeing the
        # sandbox's init die before its own kill lands, exits 255 (seen under load).
        exit_code=KILLED if timed_out else exit_status(proc.returncode if proc.returncode is not None else -9),
        duration_s=time.monotonic() - start,
        timed_out=timed_out,
        stdout_dropped=out.dropped,
        stderr_dropped=err.dropped,
    )


async def _kill_and_reap(
    proc: asyncio.subprocess.Process,
    kill: Callable[[asyncio.subprocess.Process], None] | None,
    readers: asyncio.Future | None = None,
) -> None:
    """`kill(proc)` (unless None: already killed), stop reading its output, close its pipes and wait
    until the process is reaped, through any further cancellation. A cancelled exec that returned
    earlier left a live transport for asyncio.run's teardown to close the loop under: its finaliser
    then printed "Event loop is closed", the child watcher "Loop ... that handles pid ... is closed"."""
    try:
        if kill is not None:
            kill(proc)
    finally:
        if readers is not None:
            readers.cancel()
        # First the child watcher must report the exit: closing the transport polls the pid itself and
        # would race the watcher for it ("Unknown child process pid ..., will report returncode 255").
        deadline = time.monotonic() + 5.0
        while proc.returncode is None:
            if time.monotonic() > deadline:  # `kill` failed to end it: end the process itself
                deadline = float("inf")
                kill_process(proc)
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(0.01)
        # Closes the pipes, which a process that escaped the kill may hold: wait() waits for them.
        transport = getattr(proc, "_transport", None)
        if transport is not None:
            transport.close()
        while True:
            try:
                await proc.wait()
                break
            except asyncio.CancelledError:
                continue  # the caller re-raises its own cancellation once the process is gone


async def _settle(fut: asyncio.Future) -> None:
    """Wait until `fut` is done, through any cancellation of the caller (which then re-raises its own)."""
    while not fut.done():
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait([fut])


async def _exited(proc: asyncio.subprocess.Process) -> None:
    """Return once the process itself has exited, whoever still holds its pipes: a pidfd turns
    readable then (Linux 5.3+); elsewhere its return code is polled."""
    try:
        fd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):  # no pidfd here, or already reaped
        while proc.returncode is None:
            await asyncio.sleep(0.05)
        return
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    loop.add_reader(fd, lambda: done.done() or done.set_result(None))
    try:
        await done
    finally:
        loop.remove_reader(fd)
        os.close(fd)


def kill_process(proc: asyncio.subprocess.Process) -> None:
    """SIGKILL the process unless it is known to have ended. Not `proc.kill()`: Python's
    Popen.send_signal first polls (waitpid WNOHANG), which reaps a process that has just exited from
    under asyncio's child watcher; the watcher then logs "Unknown child process pid N, will report
    returncode 255". Until the watcher reaps it, the pid stays this process's, zombie or not."""
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGKILL)


def kill_process_group(proc: asyncio.subprocess.Process) -> None:
    """Kill the process group a command was started in, its own session (the plain backend's best
    effort: what left it with setsid or setpgid is not in it)."""
    try:
        os.killpg(proc.pid, 9)
    except (ProcessLookupError, PermissionError):  # none left (EPERM: only zombies, on some kernels)
        pass


def kill_processes_in(directory: Path) -> int:
    """SIGKILL every process of this machine (that this user may see) whose working directory is
    `directory` or under it; how many. Catches most of what a command started with setsid in the
    plain backend's workspace, at any depth (a daemon that changed directory elsewhere is not found)."""
    inside = os.fspath(directory).rstrip("/")
    try:
        top = os.stat(directory)
    except OSError:
        return 0
    killed = 0
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            try:
                cwd = os.readlink(f"/proc/{entry}/cwd")
                found = cwd == inside or cwd.startswith(inside + "/")
            except OSError as e:
                if e.errno != errno.ENAMETOOLONG:
                    raise
                # A directory deeper than PATH_MAX has no path to read (a daemon escaped close so):
                # climb from the directory itself instead.
                found = _below(f"/proc/{entry}/cwd", (top.st_dev, top.st_ino))
            if found:
                os.kill(int(entry), signal.SIGKILL)
                killed += 1
        except OSError:  # gone, or another user's
            continue
    return killed


def _below(path: str, top: tuple[int, int]) -> bool:
    """Whether the directory `path` is the directory `top` (dev, inode) or under it, found by opening
    `..` from it up to the root: no path is spelled, so any depth works."""
    fd = os.open(path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        while True:
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino) == top:
                return True
            parent = os.open("..", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=fd)
            above = os.fstat(parent)
            os.close(fd)
            fd = parent
            if (above.st_dev, above.st_ino) == (st.st_dev, st.st_ino):  # the root: `..` is itself
                return False
    finally:
        os.close(fd)
