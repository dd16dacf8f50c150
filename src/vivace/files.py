"""Files that a crash cannot leave half-written. No heavy imports: every command may use it."""

from __future__ import annotations

import contextlib
import os
import secrets
import time
from pathlib import Path


def write_atomic(path: Path, data: str | bytes) -> None:
    """`path` holds `data` whole or keeps what it held: written and flushed to disk beside it, then renamed
    over it, so a kill or power loss mid-write leaves no truncated file (a state.json that
    `latest_checkpoint` would take, half a run.json that `--resume` cannot read). The name beside it is
    unique, so writers in several processes never share one."""
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")
    try:
        with tmp.open("wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def remove_stale(directory: Path, pattern: str, age_s: float) -> None:
    """Remove the files in `directory` matching `pattern` untouched for `age_s`: temporary files a writer killed
    midway left (no live writer's is that old), which nothing else would ever remove."""
    cutoff = time.time() - age_s
    for path in directory.glob(pattern):
        with contextlib.suppress(OSError):  # removed meanwhile, or not a file
            if path.stat().st_mtime < cutoff:
                path.unlink()


def sync_tree(root: Path) -> None:
    """Flush every file under `root`, and the directories holding them, to disk: what a marker written after
    it (a checkpoint's state.json) vouches for must survive a power loss too, not only a kill."""
    for here, _, names in os.walk(root):
        for name in names:
            fd = os.open(os.path.join(here, name), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fd = os.open(here, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
