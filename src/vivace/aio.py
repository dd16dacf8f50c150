"""asyncio helpers for running many things at once and ending every one of them."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterable
from typing import TypeVar

T = TypeVar("T")


async def cancel_and_wait(tasks: Iterable[asyncio.Future]) -> None:
    """Cancel `tasks` (a no-op for those done) and wait until every one has ended, whatever it raises."""
    tasks = list(tasks)
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def gather_all(*aws: Awaitable[T]) -> list[T]:
    """`asyncio.gather`, but it returns or raises only once every awaitable has ended. On the first error,
    or when the caller is cancelled (Ctrl-C), the others are cancelled and waited for: gather alone raises
    at the first, with the rest still running under the caller's cleanup (a results file closed under
    them, the sandbox backend closed under their commands)."""
    tasks = [asyncio.ensure_future(a) for a in aws]
    try:
        return await asyncio.gather(*tasks)
    finally:
        await cancel_and_wait(tasks)  # after success: all done, nothing to wait for
