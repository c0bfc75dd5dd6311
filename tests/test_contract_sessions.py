"""Session-mode contract (issue 11, items 7, 8 and 12), with real kernels.

- 7: ``max_live_kernels`` is strict while kernels are stopping: a kernel being stopped counts
  against the cap until its process is gone, and ``snapshot()`` shows it as stopping.
- 8: a call that times out (or is aborted) while queued behind a running cell reports
  ``state_retained: false`` as the spec's table says, ``never_started: true``, a note that
  nothing ran, and the kernel's state is in fact untouched.
- 12: after the session's kernel was replaced (timeout, abort, crash, kill while idle,
  eviction, idle reaping), the next result starts with one line saying so and why.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, Literal, TypeVar

import pytest
from support import LoopThread, await_until, pid_gone

from lemon_exec import ExecuteCode, ExecuteCodeConfig, SessionScope
from lemon_exec.host.run.results import LOST_LINE, LOST_WHY

pytestmark = [pytest.mark.timeout(90), pytest.mark.kernel]


#: Ignores SIGINT, so only the SIGTERM / SIGKILL steps of the stop can end the kernel.
STUBBORN = "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True:\n    pass"


@pytest.fixture(scope="module")
def lt() -> Iterator[LoopThread]:
    loop_thread = LoopThread(timeout=80)
    yield loop_thread
    loop_thread.close()


T = TypeVar("T")


@pytest.fixture
def go(lt: LoopThread) -> Callable[[Awaitable[T]], T]:
    return lt.run


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("contract-sessions")


def make_facade(**settings: Any) -> ExecuteCode:
    values: dict[str, Any] = {
        "enabled": True,
        "warm_kernels": 0,
        "kernel_mode": "session",
        **settings,
    }
    return ExecuteCode(ExecuteCodeConfig(**values))


@pytest.fixture(scope="module")
def ec(lt: LoopThread) -> Iterator[ExecuteCode]:
    facade = make_facade(max_live_kernels=3)
    yield facade
    lt.run(facade.aclose())


def scope_in(work: Path, name: str) -> SessionScope:
    return SessionScope(name, "agent", cwd=str(work))


async def pid_of(facade: ExecuteCode, scope: SessionScope) -> int:
    result = await facade.run("import os\nprint(os.getpid())", scope=scope)
    assert result.details["exit_code"] == 0, result.content
    return int(result.content.splitlines()[-1])


class KernelSampler:
    """Samples this process's kernel pids on a thread; remembers every set it saw."""

    def __init__(self, sample: Callable[[], set[int]]) -> None:
        self._sample = sample
        self._baseline = sample()  # other tests' kernels are not this test's business
        self.max_alive = 0
        self.samples = 0
        self.seen: set[int] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            alive = self._sample() - self._baseline
            self.seen |= alive
            self.max_alive = max(self.max_alive, len(alive))
            self.samples += 1
            time.sleep(0.005)

    def __enter__(self) -> KernelSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)


# -- 7: a stopping kernel counts against max_live_kernels --------------------------------------


@pytest.mark.slow
def test_stopping_kernel_counts_against_the_cap(
    work: Path, go: Any, session_kernels: Callable[..., set[int]]
) -> None:
    async def body() -> None:
        capped = make_facade(max_live_kernels=1)
        a, b = scope_in(work, "cap-stop-a"), scope_in(work, "cap-stop-b")
        try:
            with KernelSampler(lambda: session_kernels(host=os.getpid())) as sampler:
                pid_a = await pid_of(capped, a)
                timed_out = await capped.run(STUBBORN, scope=a, timeout_ms=1000)
                assert timed_out.details["timed_out"] is True
                # The kernel ignores SIGINT: it is still alive, being stopped.
                stopping = capped.snapshot()
                assert not pid_gone(pid_a)
                assert stopping["phases"]["stopping"] == 1, stopping
                assert stopping["live"] == 0
                b_call = asyncio.ensure_future(pid_of(capped, b))
                await asyncio.sleep(0.1)
                if not b_call.done():  # B waits for A's kernel to go, in the open
                    assert capped.snapshot()["phases"]["stopping"] == 1
                pid_b = await b_call
                assert pid_gone(pid_a)  # gone before B's kernel could start
                after = capped.snapshot()
                assert after["phases"]["stopping"] == 0 and after["live"] == 1, after
            assert sampler.samples > 20
            assert {pid_a, pid_b} <= sampler.seen
            assert sampler.max_alive == 1, "two session kernels were alive at once"
            again = await capped.run("print('still here')", scope=b)
            assert again.details["kernel_reused"] is True
        finally:
            await capped.aclose()

    go(body())


@pytest.mark.slow
def test_eviction_waits_for_the_victim_to_be_gone(
    work: Path, go: Any, session_kernels: Callable[..., set[int]]
) -> None:
    async def body() -> None:
        capped = make_facade(max_live_kernels=1)
        a, b = scope_in(work, "evict-wait-a"), scope_in(work, "evict-wait-b")
        try:
            with KernelSampler(lambda: session_kernels(host=os.getpid())) as sampler:
                pid_a = await pid_of(capped, a)
                await capped.run(
                    "import signal\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)", scope=a
                )
                pid_b = await pid_of(capped, b)  # evicts idle A, which ignores SIGTERM
                assert pid_gone(pid_a)
                assert capped.snapshot()["evicted_total"] == 1
            assert {pid_a, pid_b} <= sampler.seen
            assert sampler.max_alive == 1, "the evicted kernel outlived the new one's start"
        finally:
            await capped.aclose()

    go(body())


@pytest.mark.slow
def test_a_pending_stop_frees_the_slot_without_evicting_more(
    work: Path, go: Any, session_kernels: Callable[..., set[int]]
) -> None:
    async def body() -> None:
        capped = make_facade(max_live_kernels=2)
        a, b, c = (scope_in(work, f"pending-stop-{n}") for n in "abc")
        try:
            with KernelSampler(lambda: session_kernels(host=os.getpid())) as sampler:
                await capped.run("kept = 'b'", scope=b)
                assert (await capped.run("pass", scope=a)).ok  # up: 1 s must not go on its start
                await capped.run(STUBBORN, scope=a, timeout_ms=1000)  # A is now stopping
                assert capped.snapshot()["phases"]["stopping"] == 1
                await capped.run("print(1)", scope=c)  # waits for A's slot, evicts nobody
                assert capped.snapshot()["evicted_total"] == 0
                kept = await capped.run("print(kept)", scope=b)
                assert kept.content == "b\n" and kept.details["kernel_reused"] is True
            assert sampler.max_alive == 2, "more kernels than max_live_kernels were alive"
        finally:
            await capped.aclose()

    go(body())


@pytest.mark.slow
def test_deadline_while_waiting_for_a_stopping_kernel(work: Path, go: Any) -> None:
    async def body() -> None:
        capped = make_facade(max_live_kernels=1)
        a, b = scope_in(work, "slot-wait-a"), scope_in(work, "slot-wait-b")
        # Ignores SIGINT and SIGTERM too: only SIGKILL, ~2 s after the interrupt, ends it.
        deaf = STUBBORN.replace("while", "signal.signal(signal.SIGTERM, signal.SIG_IGN)\nwhile", 1)
        try:
            # Its kernel started first: a 1 s call's deadline counts the start (issue 26.1),
            # and a start slower than that would leave nothing running to stop.
            assert (await capped.run("pass", scope=a)).ok
            await capped.run(deaf, scope=a, timeout_ms=1000)
            assert capped.snapshot()["phases"]["stopping"] == 1
            waited = await capped.run("b_ran = True", scope=b, timeout_ms=1000)
            assert waited.details["timed_out"] is True
            assert waited.details["never_started"] is True
            assert waited.details["state_retained"] is False
            assert "fallback_reason" not in waited.details
            assert waited.content.startswith(
                "Script timed out after 1000ms while waiting for a session kernel slot "
                "(max_live_kernels); it never started."
            )
            fine = await capped.run("print('b_ran' in globals())", scope=b)
            assert fine.content == "False\n" and fine.details["persistent"] is True
        finally:
            await capped.aclose()

    go(body())


# -- 8: a caller that leaves the queue --------------------------------------------------------


@pytest.mark.parametrize("how", ["timeout", "abort"])
def test_queued_caller_leaving_reports_state_retained_false(
    ec: ExecuteCode, work: Path, go: Any, how: str
) -> None:
    scope = scope_in(work, f"queued-{how}")

    async def body() -> None:
        pid = await pid_of(ec, scope)
        await ec.run("before = 1", scope=scope)
        active = asyncio.ensure_future(
            ec.run("import time\ntime.sleep(2.5)\na_done = True", scope=scope)
        )
        assert await await_until(lambda: ec.snapshot()["phases"]["running"] >= 1)
        flag: Literal["timed_out", "cancelled"]
        if how == "timeout":
            queued = await ec.run("b_ran = True", scope=scope, timeout_ms=1000)
            flag = "timed_out"
            head = (
                "Script timed out after 1000ms while waiting in the session queue; "
                "it never started."
            )
        else:
            abort = asyncio.Event()
            asyncio.get_running_loop().call_later(0.5, abort.set)
            queued = await ec.run("b_ran = True", scope=scope, abort=abort)
            flag = "cancelled"
            head = "Script cancelled while waiting in the session queue; it never started."
        assert not active.done()  # it left the queue while the active cell still ran
        assert queued.details[flag] is True
        assert queued.details["state_retained"] is False  # the spec's row, queue wait included
        assert queued.details["never_started"] is True
        assert queued.details["exit_code"] is None
        assert queued.content == (
            f"{head}\n\nNothing of it ran. The session's state from earlier calls is unchanged."
        )
        done = await active  # undisturbed
        assert done.details["exit_code"] == 0 and done.details["state_retained"] is True
        check = await ec.run(
            "import os\nprint(before, a_done, 'b_ran' in globals(), os.getpid() == PID)".replace(
                "PID", str(pid)
            ),
            scope=scope,
        )
        assert check.content == "1 True False True\n"  # the state was in fact retained
        assert check.details["kernel_reused"] is True
        assert "kernel_lost_reason" not in check.details

    go(body())


# -- 12: the model is told when its session state was lost -------------------------------------


def lost(reason: str) -> str:
    return LOST_LINE.format(why=LOST_WHY[reason])


async def assert_told(facade: ExecuteCode, scope: SessionScope, reason: str) -> None:
    """The next call starts with the lost-state line; the one after it does not."""
    after = await facade.run("print('x' in globals())", scope=scope)
    assert after.details.get("kernel_lost_reason") == reason, (after.content, after.details)
    assert after.details["kernel_reused"] is False
    assert after.content == f"{lost(reason)}\n\nFalse\n"
    assert after.content.splitlines()[0].startswith("[Session state was lost before this call: ")
    again = await facade.run("print('x' in globals())", scope=scope)
    assert again.content == "False\n"
    assert "kernel_lost_reason" not in again.details


LOSSES: dict[str, tuple[str, dict[str, Any]]] = {
    "timeout": (STUBBORN, {"timeout_ms": 1000}),
    "os_exit": ("import os\nos._exit(3)", {}),
}


@pytest.mark.parametrize("how", list(LOSSES))
def test_lost_line_after_timeout_and_crash(ec: ExecuteCode, work: Path, go: Any, how: str) -> None:
    scope = scope_in(work, f"lost-{how}")
    script, kwargs = LOSSES[how]

    async def body() -> None:
        await ec.run("x = 1", scope=scope)
        ended = await ec.run(script, scope=scope, **kwargs)
        assert ended.details["state_retained"] is False
        assert not ended.content.startswith("[Session state was lost")  # this call ran on it
        await assert_told(ec, scope, "timeout" if how == "timeout" else "crashed")

    go(body())


def test_lost_line_after_abort_with_text_blocks(ec: ExecuteCode, work: Path, go: Any) -> None:
    scope = scope_in(work, "lost-abort")

    async def body() -> None:
        await ec.run("x = 1", scope=scope)
        abort = asyncio.Event()
        asyncio.get_running_loop().call_later(0.5, abort.set)
        cancelled = await ec.run("import time\ntime.sleep(30)", scope=scope, abort=abort)
        assert cancelled.details["cancelled"] is True
        # The line comes first, before the text() result and the diagnostics.
        result = await ec.run("text(str('x' in globals()))\nprint('diag')", scope=scope)
        assert result.details["kernel_lost_reason"] == "cancelled"
        assert result.content == (
            f"{lost('cancelled')}\n\nScript result (text()):\nFalse\n\n"
            "Diagnostics (stdout/stderr, not the result):\ndiag\n"
        )

    go(body())


def test_lost_line_after_a_kill_while_idle(ec: ExecuteCode, work: Path, go: Any) -> None:
    scope = scope_in(work, "lost-killed-idle")

    async def body() -> None:
        pid = await pid_of(ec, scope)
        await ec.run("x = 1", scope=scope)
        os.kill(pid, signal.SIGKILL)
        # Reaped (not just a zombie) and reported: the host can tell before the next call.
        assert await await_until(lambda: not Path(f"/proc/{pid}").exists(), 5)
        await asyncio.sleep(0.2)
        await assert_told(ec, scope, "crashed")

    go(body())


@pytest.mark.slow
def test_lost_line_after_eviction_and_reaping(work: Path, go: Any) -> None:
    async def body() -> None:
        capped = make_facade(max_live_kernels=1)
        a, b = scope_in(work, "lost-evict-a"), scope_in(work, "lost-evict-b")
        reaping = make_facade(kernel_idle_timeout_ms=300)
        r = scope_in(work, "lost-reaped")
        try:
            await capped.run("x = 1", scope=a)
            await capped.run("y = 1", scope=b)  # evicts A (cap 1)
            await assert_told(capped, a, "evicted")
            assert capped.snapshot()["evicted_total"] == 2  # A's return evicted B
            await reaping.run("x = 1", scope=r)
            assert await await_until(lambda: reaping.snapshot()["reaped_total"] == 1, 5)
            await assert_told(reaping, r, "reaped")
        finally:
            await capped.aclose()
            await reaping.aclose()

    go(body())
