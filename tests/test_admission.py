"""Admission control for per-call runs: a cap on kernels at once, a bounded queue, busy results.

The queue logic is tested on its own (pure asyncio, no kernels); the cap is then checked
end to end with real kernels, sampling the live kernel processes in /proc during the burst.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from support import await_until, enabled_config, wait_until

from lemon_exec import ExecuteCode, ExecuteCodeConfig, ExecuteCodeResult
from lemon_exec.host.percall.admission import Admission, Denied, Slot, default_limit

pytestmark = pytest.mark.timeout(120)

GiB = 2**30


def make_config(**overrides: Any) -> ExecuteCodeConfig:
    """An enabled config (see support.enabled_config)."""
    return enabled_config(**overrides)


# --- the default cap ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cores", "available", "expected"),
    [
        (2, 21 * GiB, 8),  # cores decide: 4 x 2
        (16, 1 * GiB, 8),  # memory decides: 8 x 1 GiB
        (1, GiB // 10, 2),  # never below 2
        (3, None, 12),  # memory unknown: cores alone
    ],
)
def test_default_limit_formula(cores: int, available: int | None, expected: int) -> None:
    assert default_limit(cores, available) == expected


def test_default_limit_of_this_machine_is_at_least_two() -> None:
    assert default_limit() >= 2


def test_zero_means_automatic() -> None:
    config = make_config()
    assert config.max_concurrent_per_call == 0
    assert config.max_queued_per_call == 64
    env = {
        "LEMON_EXECUTE_CODE_MAX_CONCURRENT_PER_CALL": "3",
        "LEMON_EXECUTE_CODE_MAX_QUEUED_PER_CALL": "-1",
    }
    loaded = ExecuteCodeConfig.load(environ=env)
    assert loaded.max_concurrent_per_call == 3
    assert loaded.max_queued_per_call == 0  # clamped: no queue


# --- the queue, without kernels -----------------------------------------------------------------


def test_fifo_handoff_queue_full_and_timeout() -> None:
    async def scenario() -> None:
        gate = Admission(limit=1, queue=2)
        far = time.monotonic() + 10
        first = await gate.acquire(far)
        assert isinstance(first, Slot) and gate.running == 1
        second = asyncio.ensure_future(gate.acquire(far))
        third = asyncio.ensure_future(gate.acquire(far))
        assert await await_until(lambda: gate.waiting == 2)
        full = await gate.acquire(far)
        assert isinstance(full, Denied) and full.reason == "queue_full"
        assert (full.running, full.waiting) == (1, 2)
        timed_out = await Admission(1, 1).acquire(time.monotonic() - 1)  # free: no wait
        assert isinstance(timed_out, Slot)
        first.release()
        first.release()  # idempotent
        granted = await second
        assert isinstance(granted, Slot) and not third.done()  # FIFO: second before third
        assert gate.running == 1
        granted.release()
        last = await third
        assert isinstance(last, Slot)
        short = await gate.acquire(time.monotonic() + 0.1)
        assert isinstance(short, Denied) and short.reason == "queue_timeout"
        assert short.waited_ms >= 90
        last.release()
        assert gate.running == 0 and gate.waiting == 0

    asyncio.run(scenario())


def test_abort_and_cancellation_leave_the_queue() -> None:
    async def scenario() -> None:
        gate = Admission(limit=1, queue=4)
        far = time.monotonic() + 10
        held = await gate.acquire(far)
        assert isinstance(held, Slot)
        aborted = asyncio.Event()
        threaded = threading.Event()
        by_event = asyncio.ensure_future(gate.acquire(far, aborted))
        by_thread = asyncio.ensure_future(gate.acquire(far, threaded))
        killed = asyncio.ensure_future(gate.acquire(far))
        assert await await_until(lambda: gate.waiting == 3)
        aborted.set()
        threaded.set()
        killed.cancel()
        assert (await by_event).reason == "cancelled"  # type: ignore[union-attr]
        assert (await by_thread).reason == "cancelled"  # type: ignore[union-attr]
        with pytest.raises(asyncio.CancelledError):
            await killed
        assert gate.waiting == 0
        held.release()
        assert gate.running == 0  # nobody was left waiting for the slot

    asyncio.run(scenario())


def test_close_turns_waiters_away() -> None:
    async def scenario() -> None:
        gate = Admission(limit=1, queue=4)
        held = await gate.acquire(time.monotonic() + 10)
        waiter = asyncio.ensure_future(gate.acquire(time.monotonic() + 10))
        assert await await_until(lambda: gate.waiting == 1)
        gate.close()
        denied = await waiter
        assert isinstance(denied, Denied) and denied.reason == "closed"
        assert isinstance(held, Slot)
        held.release()

    asyncio.run(scenario())


# --- real kernels -------------------------------------------------------------------------------


class KernelSampler:
    """Counts this process's running kernels (/proc) and the engine's live set, in a thread."""

    def __init__(self, facade: ExecuteCode, count: Callable[[], int]) -> None:
        self._facade = facade
        self._count = count
        self.max_proc = 0
        self.max_engine = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.max_proc = max(self.max_proc, self._count())
            live = self._facade.diagnostics.live_kernels
            self.max_engine = max(self.max_engine, live)
            time.sleep(0.01)

    def __enter__(self) -> KernelSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def idle(facade: ExecuteCode) -> None:
    """Wait until the previous call's kernel is stopped and its slot free again."""
    diagnostics = facade.diagnostics
    assert diagnostics.started
    assert wait_until(lambda: diagnostics.per_call_running == 0, 5)


def burst(facade: ExecuteCode, script: str, n: int) -> tuple[list[ExecuteCodeResult], list[str]]:
    """Run ``n`` calls at once from ``n`` threads; return results and any exceptions."""
    results: list[ExecuteCodeResult] = []
    errors: list[str] = []
    barrier = threading.Barrier(n)
    lock = threading.Lock()

    def call() -> None:
        barrier.wait()
        try:
            result = facade.run_sync(script)
        except BaseException as exc:  # the point of the test: there must be none
            with lock:
                errors.append(repr(exc))
            return
        with lock:
            results.append(result)

    threads = [threading.Thread(target=call) for _ in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results, errors


@pytest.mark.kernel
def test_cap_two_queue_three_ten_calls(session_kernels: Callable[..., set[int]]) -> None:
    facade = ExecuteCode(make_config(max_concurrent_per_call=2, max_queued_per_call=3))
    try:
        assert facade.run_sync("text('warm')").ok  # the engine exists before the burst
        idle(facade)
        script = "import time\ntime.sleep(0.5)\ntext('ok')"
        with KernelSampler(facade, lambda: len(session_kernels(host=os.getpid()))) as sampler:
            results, errors = burst(facade, script, 10)
    finally:
        facade.close()
    assert errors == []
    ok = [r for r in results if r.ok]
    busy = [r for r in results if r.details.get("busy")]
    assert len(ok) == 5, [r.content for r in results]
    assert all("Script result (text()):\nok" in r.content for r in ok)
    assert len(busy) == 5
    for result in busy:
        assert result.content == (
            "execute_code is busy: 2 per-call runs already running and 3 waiting; "
            "try again shortly."
        )
        assert result.details["error"] is True
        assert result.details["exit_code"] is None
        assert result.details["busy_reason"] == "queue_full"
        assert result.details["max_concurrent_per_call"] == 2
    assert max(r.details["queue_wait_ms"] for r in ok) > 400  # three of them had to wait
    assert sampler.max_proc <= 2, f"{sampler.max_proc} kernels were alive at once"
    assert sampler.max_engine <= 2


@pytest.mark.kernel
def test_queued_past_its_timeout_is_busy() -> None:
    facade = ExecuteCode(make_config(max_concurrent_per_call=1, max_queued_per_call=4))
    try:
        assert facade.run_sync("text('warm')").ok
        idle(facade)
        holder = threading.Thread(
            target=facade.run_sync, args=("import time\ntime.sleep(3)",), daemon=True
        )
        holder.start()
        time.sleep(0.5)  # the holder has the only slot
        started = time.monotonic()
        result = facade.run_sync("text('must not run')", timeout_ms=1000)
        elapsed = time.monotonic() - started
        holder_still_ran = holder.is_alive()
        holder.join()
    finally:
        facade.close()
    assert result.details["busy"] is True
    assert result.details["busy_reason"] == "queue_timeout"
    assert result.content.startswith("execute_code is busy: this call waited ")
    assert "nothing ran" in result.content
    assert "must not run" not in result.content
    assert elapsed > 0.9 and holder_still_ran  # left at its deadline, not when the slot freed


@pytest.mark.slow
@pytest.mark.kernel
def test_forty_concurrent_default_calls_all_return(
    session_kernels: Callable[..., set[int]],
) -> None:
    config = make_config(warm_kernels=1)  # every other setting at its default
    facade = ExecuteCode(config)
    try:
        assert facade.run_sync("text('warm')").ok
        limit = facade.diagnostics.per_call_limit
        burst_allowance = facade.diagnostics.spare_burst
        started = time.monotonic()
        with KernelSampler(facade, lambda: len(session_kernels(host=os.getpid()))) as sampler:
            results, errors = burst(facade, "text('ok')", 40)
        elapsed = time.monotonic() - started
    finally:
        facade.close()
    assert errors == []
    assert len(results) == 40
    assert all(r.ok for r in results), [r.content for r in results if not r.ok]
    # Runs hold at most `limit` kernels; the pool keeps its spares besides, and under a
    # burst up to `max_burst` more (docs/modes.md: "up to warm_kernels + 3").
    bound = limit + config.warm_kernels + burst_allowance
    assert sampler.max_proc <= bound, (sampler.max_proc, limit, bound)
    print(f"40 calls, limit {limit}: {elapsed:.1f} s, at most {sampler.max_proc} kernels")
