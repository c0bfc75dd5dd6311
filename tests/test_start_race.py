"""Pure logic of host/kernels/start_race.py (real-kernel cases: test_start_deadline.py)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Coroutine
from typing import Any

import pytest

from lemon_exec.host.kernels.start_race import StartLeft, start_within

pytestmark = pytest.mark.timeout(20)


class Harness:
    def __init__(self) -> None:
        self.discarded: list[str] = []
        self.settled = 0
        self.background: list[asyncio.Task[Any]] = []

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        self.background.append(asyncio.get_running_loop().create_task(coro))

    async def discard(self, kernel: str) -> None:
        self.discarded.append(kernel)

    def on_settled(self) -> None:
        self.settled += 1

    async def within(self, start: Any, deadline: float, abort: Any = None) -> str:
        result: str = await start_within(
            start,
            deadline,
            abort,
            spawn=self.spawn,
            discard=self.discard,
            settled=self.on_settled,
        )
        return result

    async def drain(self) -> None:
        await asyncio.gather(*self.background)


async def slow_start(
    seconds: float, *, shielded: bool = False, cleaned: list[str] | None = None
) -> str:
    try:
        await asyncio.sleep(seconds)
    except asyncio.CancelledError:
        if cleaned is not None:
            cleaned.append("cleaned")
        if shielded:  # finishes all the same, as a start that was ready in that instant
            return "kernel"
        raise
    return "kernel"


def test_a_start_in_time_is_used() -> None:
    async def body() -> None:
        h = Harness()
        assert await h.within(slow_start(0.01), time.monotonic() + 5) == "kernel"
        await h.drain()
        assert (h.discarded, h.settled) == ([], 0)

    asyncio.run(body())


def test_the_deadline_cancels_the_start_and_returns_at_once() -> None:
    async def body() -> None:
        h = Harness()
        cleaned: list[str] = []
        started = time.monotonic()
        with pytest.raises(StartLeft) as left:
            await h.within(slow_start(10, cleaned=cleaned), time.monotonic() + 0.2)
        assert left.value.why == "timeout"
        assert time.monotonic() - started < 5  # long before the 10 s start ends
        await h.drain()
        assert cleaned == ["cleaned"]  # the start's own cleanup ran
        assert (h.discarded, h.settled) == ([], 1)

    asyncio.run(body())


def test_a_kernel_ready_as_the_call_leaves_is_discarded() -> None:
    async def body() -> None:
        h = Harness()
        with pytest.raises(StartLeft):
            await h.within(slow_start(10, shielded=True), time.monotonic() + 0.1)
        await h.drain()
        assert (h.discarded, h.settled) == (["kernel"], 1)

    asyncio.run(body())


def test_a_failed_start_is_the_start_s_error() -> None:
    async def failing() -> str:
        raise RuntimeError("no interpreter")

    async def body() -> None:
        h = Harness()
        with pytest.raises(RuntimeError, match="no interpreter"):
            await h.within(failing(), time.monotonic() + 5)
        assert h.settled == 0

    asyncio.run(body())


@pytest.mark.parametrize("kind", ["asyncio", "threading"])
def test_an_abort_ends_the_wait(kind: str) -> None:
    async def body() -> None:
        h = Harness()
        abort: asyncio.Event | threading.Event = (
            asyncio.Event() if kind == "asyncio" else threading.Event()
        )
        asyncio.get_running_loop().call_later(0.1, abort.set)
        started = time.monotonic()
        with pytest.raises(StartLeft) as left:
            await h.within(slow_start(10), time.monotonic() + 30, abort)
        assert left.value.why == "cancelled"
        assert time.monotonic() - started < 5  # long before the 10 s start ends
        await h.drain()
        assert h.settled == 1

    asyncio.run(body())


def test_the_caller_going_away_takes_the_start_with_it() -> None:
    async def body() -> None:
        h = Harness()
        cleaned: list[str] = []
        task = asyncio.ensure_future(
            h.within(slow_start(10, cleaned=cleaned), time.monotonic() + 30)
        )
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await h.drain()
        assert cleaned == ["cleaned"]
        assert h.settled == 1

    asyncio.run(body())
