"""Exclusive locks on a directory's `.lock` file, held for the life of a run: two processes writing one run
directory (`vivace train`, `vivace bench`) would interleave their files. flock: released when the file is
closed or the process ends, however it ends, so a killed run never leaves its directory locked."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import IO


class Locked(Exception):
    """Another process holds the lock; `holder` is its pid as it wrote it ("unknown" when unreadable)."""

    def __init__(self, holder: str):
        super().__init__(holder)
        self.holder = holder


def try_lock(f: IO | int) -> bool:
    """An exclusive flock on the open file or descriptor `f`, without waiting: False when another holds it."""
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def lock_exclusively(path: Path) -> IO[str]:
    """The open file `path`, exclusively locked and holding this process's pid; Locked when another holds it."""
    f = path.open("a+")
    if not try_lock(f):
        f.seek(0)
        holder = f.read().strip() or "unknown"
        f.close()
        raise Locked(holder) from None
    f.truncate(0)
    f.write(str(os.getpid()))
    f.flush()
    return f
