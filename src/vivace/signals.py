"""Signal handlers scoped to a block, for the CLI's graceful stops and for starting Ray's local cluster
out of a terminal's or a job's reach (rl/workers.py). No heavy imports: every command may use it."""

from __future__ import annotations

import contextlib
import signal
import threading


@contextlib.contextmanager
def signal_handler(handler, signums: tuple[int, ...] = (signal.SIGINT,)):
    """`handler` takes these signals for the block (SIG_IGN: ignored here and in processes started
    then); afterwards each has the handler it had before, whatever the block installed (ray.init puts
    its own on SIGTERM). Nothing changes off the main thread, where Python cannot set handlers, and a
    signal the process was started with ignored (nohup, `&` in a script) stays ignored."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.getsignal(s) for s in signums}
    for s, h in previous.items():
        if h != signal.SIG_IGN:
            signal.signal(s, handler)
    try:
        yield
    finally:
        _restore(previous)


@contextlib.contextmanager
def deferred_signals(signums: tuple[int, ...] = (signal.SIGINT, signal.SIGTERM)):
    """These signals wait until the block ends, then reach the handlers they would have reached (each
    once): for work that must not stop halfway, such as an optimizer step. Recorded, not blocked with
    the signal mask, which other threads (torch's) would not share. Off the main thread nothing changes."""
    caught: list[int] = []
    try:
        with signal_handler(lambda signum, frame: caught.append(signum), signums):
            yield
    finally:
        for s in dict.fromkeys(caught):
            signal.raise_signal(s)


@contextlib.contextmanager
def blocked_in_children(signums: tuple[int, ...] = (signal.SIGINT, signal.SIGTERM)):
    """Processes started in the block (from this thread, or from threads it starts) begin with these
    signals blocked, which survives exec, so a terminal's Ctrl-C to the foreground process group or a
    job-wide SIGTERM (`timeout`, Slurm, systemd) never reaches them, even where they install their own
    handlers (Ray's daemons and actors catch SIGTERM, so an ignored disposition is not enough).

    This process loses none of them: a signal that arrives meanwhile runs the handler it had before
    the block, at the latest when the block ends. Handlers installed inside the block are undone first
    (ray.init puts its own on SIGTERM). Off the main thread only the mask changes."""
    main = threading.current_thread() is threading.main_thread()
    previous = {s: signal.getsignal(s) for s in signums} if main else {}
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, signums)
    try:
        yield
    finally:
        _restore(previous)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)  # pending signals are delivered here


def _restore(handlers: dict) -> None:
    """Put back handlers read with signal.getsignal (None: one not set from Python, taken as the default)."""
    for s, h in handlers.items():
        signal.signal(s, h if h is not None else signal.SIG_DFL)
