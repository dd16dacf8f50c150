"""gather_all: many things at once, and none still running when it returns or raises."""

from __future__ import annotations

import asyncio

import pytest

from vivace.aio import gather_all


async def _cleans_up_slowly(ended: list[str], name: str) -> None:
    try:
        await asyncio.sleep(30)
    finally:
        await asyncio.sleep(0.2)  # as a cancelled exec does: kill, reap, close (sandbox/process.py)
        ended.append(name)


async def test_the_first_error_ends_the_others_before_it_is_raised():
    """asyncio.gather raises at the first error with the others still running, so the caller's cleanup
    (closing the results file, the sandbox backend) ran under them."""
    ended: list[str] = []

    async def fails():
        await asyncio.sleep(0.05)
        raise ValueError("a bug in one episode")

    with pytest.raises(ValueError, match="a bug in one episode"):
        await gather_all(fails(), _cleans_up_slowly(ended, "a"), _cleans_up_slowly(ended, "b"))
    assert sorted(ended) == ["a", "b"]


async def test_a_cancelled_caller_waits_for_every_cleanup():
    """Ctrl-C cancels the caller: gather's CancelledError came once the first child had ended."""
    ended: list[str] = []
    task = asyncio.create_task(gather_all(*(_cleans_up_slowly(ended, str(i)) for i in range(3))))
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert sorted(ended) == ["0", "1", "2"]


async def test_results_in_order():
    async def after(delay: float, value: int) -> int:
        await asyncio.sleep(delay)
        return value

    assert await gather_all(after(0.03, 1), after(0.01, 2), after(0.0, 3)) == [1, 2, 3]
