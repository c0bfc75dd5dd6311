"""Session mode with real kernels (issue 4): the state-retention table, the queue, owners and
reset-forks, LRU eviction, capacity fallback, idle reaping, fallbacks, snapshot, telemetry.

Every test body is a coroutine run on one module-wide event loop (a thread), so that one
shared facade serves most tests with different session ids; tests that need their own
bounds (cap, reaping) build a small facade on the same loop.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, Literal, TypeVar

import pytest
from support import LoopThread, await_until, configured, pid_gone, wait_until

from lemon_exec import ExecuteCode, ExecuteCodeConfig, SessionScope
from lemon_exec.host.kernels.engine import Engine
from lemon_exec.host.run.results import FALLBACK_NOTE, fallback_failed_note, lost_line
from lemon_exec.host.sessions.registry import SessionRegistry
from lemon_exec.tools import PolicyDecision, ToolCall

pytestmark = [pytest.mark.timeout(60), pytest.mark.kernel]


def policy(call: ToolCall) -> PolicyDecision:
    if "secret" in str(call.params.get("path", "")):
        return PolicyDecision.deny("no secrets")
    return PolicyDecision.allow()


EVENTS: list[tuple[str, dict[str, Any], dict[str, Any]]] = []


def record(event: str, measurements: Any, metadata: Any) -> None:
    EVENTS.append((event, dict(measurements), dict(metadata)))


def make_facade(**settings: Any) -> ExecuteCode:
    values: dict[str, Any] = {
        "enabled": True,
        "warm_kernels": 0,
        "kernel_mode": "session",
        **settings,
    }
    return ExecuteCode(ExecuteCodeConfig(**values), policy=policy, on_event=record)


@pytest.fixture(scope="module")
def lt() -> Iterator[LoopThread]:
    loop_thread = LoopThread()
    yield loop_thread
    loop_thread.close()


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("sessions")
    (root / "a.txt").write_text("hello\n")
    (root / "secret.txt").write_text("s3cr3t\n")
    (root / "other").mkdir()
    return root


#: Every kernel pid the tests saw; all must be gone once the facades are closed.
PIDS: set[int] = set()


@pytest.fixture(scope="module")
def ec(lt: LoopThread) -> Iterator[ExecuteCode]:
    # A low cap keeps the machine light: older tests' idle kernels are evicted (LRU).
    facade = make_facade(max_queued_cells_per_kernel=2, max_live_kernels=6)
    yield facade
    lt.run(facade.aclose())
    assert PIDS, "the tests saw no kernel"
    wait_until(lambda: all(pid_gone(pid) for pid in PIDS), 5)
    assert [pid for pid in PIDS if not pid_gone(pid)] == [], "kernel processes left behind"


T = TypeVar("T")


@pytest.fixture
def go(lt: LoopThread) -> Callable[[Awaitable[T]], T]:
    return lt.run


async def wait_running(ec: ExecuteCode, count: int = 1) -> None:
    assert await await_until(lambda: ec.snapshot()["phases"]["running"] >= count, 10)


async def pid_of(run: Callable[..., Awaitable[Any]], **kwargs: Any) -> int:
    result = await run("import os\nprint(os.getpid())", **kwargs)
    assert result.details["exit_code"] == 0, result.content
    pid = int(result.content.strip())
    PIDS.add(pid)
    return pid


def scope_in(work: Path, name: str, **kw: Any) -> SessionScope:
    return SessionScope(name, kw.pop("agent", "agent"), cwd=str(kw.pop("cwd", work)))


# -- the state-retention table -------------------------------------------------------------------


KEPT_ROWS = {
    "success": ("mark = 'success'\nprint('fine')", 0, "fine\n"),
    "exception": (
        "mark = 'partial'\nlst = [1]\nlst.append(2)\nraise ValueError('boom')",
        1,
        "Script raised ValueError: boom",
    ),
    "system_exit": ("mark = 'exit'\nraise SystemExit(3)", 3, "Script raised SystemExit: 3"),
    "input": ("mark = 'input'\ninput('name? ')", 1, "input() is not supported"),
    "helper_denial": (
        "mark = 'denied'\nread('secret.txt')",
        1,
        "read denied by policy: no secrets",
    ),
    "helper_error": ("mark = 'error'\nread('missing.txt')", 1, "no such file"),
    "helper_budget": (
        "mark = 'budget'\nfor i in range(5):\n    read('a.txt')",
        1,
        "rpc call limit exceeded (max 2 calls per script)",
    ),
}


@pytest.mark.parametrize("row", list(KEPT_ROWS))
def test_state_kept(ec: ExecuteCode, work: Path, go: Any, row: str) -> None:
    script, exit_code, shown = KEPT_ROWS[row]
    scope = scope_in(work, "kept")

    async def body() -> None:
        await ec.run("before = 41", scope=scope)
        with configured(ec, max_rpc_calls=2):
            result = await ec.run(script, scope=scope)
        assert result.details["exit_code"] == exit_code, result.content
        assert shown in result.content
        assert result.details["state_retained"] is True
        assert result.details["persistent"] is True
        after = await ec.run("print(before + 1, mark, globals().get('lst'))", scope=scope)
        assert after.details["kernel_reused"] is True
        assert after.content.split()[0] == "42"
        if row == "exception":
            assert after.content == "42 partial [1, 2]\n"  # partial mutations kept

    go(body())


LostFlag = Literal["timed_out", "cancelled", "crashed"]
LOST_ROWS: dict[str, tuple[str, dict[str, Any], LostFlag, str]] = {
    # row: (script, extra run kwargs, flag, lost reason)
    "timeout": ("import time\ntime.sleep(60)", {"timeout_ms": 1500}, "timed_out", "timeout"),
    "abort": ("import time\ntime.sleep(60)", {"abort": "later"}, "cancelled", "cancelled"),
    "os_exit": ("import os\nos._exit(7)", {}, "crashed", "crashed"),
}


@pytest.mark.parametrize("row", list(LOST_ROWS))
def test_state_lost(ec: ExecuteCode, work: Path, go: Any, row: str) -> None:
    script, kwargs, flag, reason = LOST_ROWS[row]
    scope = scope_in(work, f"lost-{row}")

    async def body() -> None:
        pid = await pid_of(ec.run, scope=scope)
        await ec.run("kept = 1", scope=scope)
        extra = dict(kwargs)
        if extra.get("abort") == "later":
            abort = asyncio.Event()
            extra["abort"] = abort
            asyncio.get_running_loop().call_later(0.7, abort.set)
        started = time.monotonic()
        result = await ec.run(script, scope=scope, **extra)
        assert time.monotonic() - started < 6
        assert result.details[flag] is True
        assert result.details["state_retained"] is False
        if row == "os_exit":
            assert result.details["exit_code"] == 7
            assert "ended abruptly" in result.content
        assert await await_until(lambda: pid_gone(pid), 5)  # the kernel was discarded
        after = await ec.run("print('kept' in globals())", scope=scope)
        assert after.content == lost_line(reason) + "\n\nFalse\n"
        assert after.details["kernel_reused"] is False
        assert after.details["kernel_lost_reason"] == reason
        assert after.details["state_retained"] is True
        again = await ec.run("print(1)", scope=scope)
        assert again.details["kernel_reused"] is True
        assert "kernel_lost_reason" not in again.details

    go(body())


def test_caller_death_while_active_discards_the_kernel(
    ec: ExecuteCode, work: Path, go: Any
) -> None:
    scope = scope_in(work, "caller-death")

    async def body() -> None:
        pid = await pid_of(ec.run, scope=scope)
        task = asyncio.ensure_future(ec.run("import time\ntime.sleep(60)", scope=scope))
        await wait_running(ec)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert await await_until(lambda: pid_gone(pid), 5)
        after = await ec.run("print(1)", scope=scope)
        assert after.details["kernel_reused"] is False
        assert after.details["kernel_lost_reason"] == "cancelled"

    go(body())


def test_reset_single_owner_and_per_call_reset(ec: ExecuteCode, work: Path, go: Any) -> None:
    scope = scope_in(work, "reset-single")

    async def body() -> None:
        await ec.run("x = 1", scope=scope)
        result = await ec.run("print('x' in globals())", scope=scope, reset=True)
        assert result.content == "False\n"
        assert result.details["reset_performed"] is True
        assert result.details["kernel_reused"] is False
        assert "kernel_lost_reason" not in result.details  # asked for: no surprise to report
        with configured(ec, kernel_mode="per_call"):
            per_call = await ec.run("print(1)", scope=scope, reset=True)
        assert per_call.details["reset_performed"] is False
        assert per_call.details["persistent"] is False

    go(body())


def test_every_spelling_of_the_cwd_reaches_one_kernel(
    ec: ExecuteCode, work: Path, go: Any, tmp_path: Path
) -> None:
    """Session keys are canonical: ``/d``, ``/d/``, a relative path, a symlink and a path
    with ``..`` are one session; a reset through one spelling is seen through all."""
    link = tmp_path / "link"
    link.symlink_to(work, target_is_directory=True)
    spellings = [
        str(work),
        str(work) + "/",
        os.path.relpath(work),
        str(link),
        str(work / "other" / ".."),
        str(work) + "/./",
    ]
    scopes = [SessionScope("spellings", "agent", cwd=cwd) for cwd in spellings]

    async def body() -> None:
        first = await ec.run("x = 1\nimport os\nprint(os.getpid())", scope=scopes[0])
        pid = first.content.strip()
        PIDS.add(int(pid))
        for scope in scopes[1:]:
            seen = await ec.run("print(x, os.getpid())", scope=scope)
            assert seen.content == f"1 {pid}\n", (scope.cwd, seen.content)
            assert seen.details["kernel_id"] == first.details["kernel_id"]
        reset = await ec.run("import os\nprint(os.getpid())", scope=scopes[1], reset=True)
        assert reset.details["reset_performed"] is True, reset.content
        assert reset.details["kernel_id"] == first.details["kernel_id"]  # reset, not a fork
        new_pid = reset.content.strip()
        PIDS.add(int(new_pid))
        for scope in scopes:
            after = await ec.run("print('x' in globals(), os.getpid())", scope=scope)
            assert after.content == f"False {new_pid}\n", (scope.cwd, after.content)

    go(body())


# -- queueing ---------------------------------------------------------------------------------


def test_queue_full_is_busy_and_fifo(ec: ExecuteCode, work: Path, go: Any) -> None:
    scope = scope_in(work, "queue")

    async def body() -> None:
        await ec.run("order = []", scope=scope)
        a = asyncio.ensure_future(
            ec.run("import time\ntime.sleep(1.2)\norder.append('A')", scope=scope)
        )
        await wait_running(ec)
        b = asyncio.ensure_future(ec.run("order.append('B')", scope=scope))
        assert await await_until(lambda: ec.snapshot()["queued"] == 1)
        c = asyncio.ensure_future(ec.run("order.append('C')", scope=scope))
        assert await await_until(lambda: ec.snapshot()["queued"] == 2)
        d = await ec.run("order.append('D')", scope=scope)  # max_queued_cells_per_kernel = 2
        assert not a.done()  # refused at once, not queued behind A
        assert d.details["busy"] is True
        assert d.details["state_retained"] is True
        assert d.details["persistent"] is True
        assert "fallback_reason" not in d.details  # never a fallback
        assert "busy" in d.content and "max_queued_cells_per_kernel = 2" in d.content
        results = await asyncio.gather(a, b, c)
        assert [r.details["exit_code"] for r in results] == [0, 0, 0]
        assert results[1].details["queue_wait_ms"] > 500
        final = await ec.run("print(order)", scope=scope)
        assert final.content == "['A', 'B', 'C']\n"

    go(body())


@pytest.mark.parametrize("kind", ["asyncio", "threading", "task_cancelled"])
def test_queued_caller_aborting_leaves_the_queue(
    ec: ExecuteCode, work: Path, go: Any, kind: str
) -> None:
    scope = scope_in(work, f"queue-abort-{kind}")

    async def body() -> None:
        await ec.run("a_done = False", scope=scope)
        a = asyncio.ensure_future(
            ec.run("import time\ntime.sleep(1.2)\na_done = True", scope=scope)
        )
        await wait_running(ec)
        abort: Any = asyncio.Event() if kind == "asyncio" else threading.Event()
        b = asyncio.ensure_future(ec.run("b_ran = True", scope=scope, abort=abort))
        assert await await_until(lambda: ec.snapshot()["queued"] == 1)
        if kind == "task_cancelled":  # the caller died while queued
            b.cancel()
            with pytest.raises(asyncio.CancelledError):
                await b
        else:
            abort.set()
            rb = await b
            assert rb.details["cancelled"] is True
            assert rb.details["state_retained"] is False  # the spec's row; nothing ran
            assert rb.details["never_started"] is True
            assert "it never started" in rb.content
        assert not a.done()  # B left the queue when aborted, not when A ended
        assert ec.snapshot()["queued"] == 0
        ra = await a  # the active cell was undisturbed
        assert ra.details["exit_code"] == 0
        assert ra.details["state_retained"] is True
        check = await ec.run("print('b_ran' in globals(), a_done)", scope=scope)
        assert check.content == "False True\n"
        assert check.details["kernel_reused"] is True

    go(body())


def test_timeout_is_end_to_end_including_queue_wait(ec: ExecuteCode, work: Path, go: Any) -> None:
    scope = scope_in(work, "queue-timeout")

    async def body() -> None:
        await ec.run("pass", scope=scope)
        t0 = time.monotonic()
        a = asyncio.ensure_future(ec.run("import time\ntime.sleep(2)\nprint('A')", scope=scope))
        await wait_running(ec)
        # Leaves the queue at its deadline, while A still runs.
        b = asyncio.ensure_future(ec.run("b_ran = 1", scope=scope, timeout_ms=1000))
        # Waits ~2 s in the queue, then runs with what is left of its 3 s.
        c = asyncio.ensure_future(
            ec.run("import time\ntime.sleep(30)", scope=scope, timeout_ms=3000)
        )
        rb = await b
        b_at = time.monotonic() - t0
        assert b_at > 0.9 and not a.done()  # at its deadline, before A ended
        assert rb.details["timed_out"] is True
        assert rb.details["state_retained"] is False  # the spec's row; nothing ran
        assert rb.details["never_started"] is True
        assert "it never started" in rb.content
        ra = await a
        assert ra.content == "A\n" and ra.details["state_retained"] is True
        rc = await c
        c_at = time.monotonic() - t0
        assert rc.details["timed_out"] is True
        assert rc.details["state_retained"] is False
        assert 2.9 < c_at < 4.6, c_at  # 3 s from entry (+ interrupt grace), not 2 s + 3 s
        assert rc.details["duration_ms"] < 4600

    go(body())


# -- owners ------------------------------------------------------------------------------------


def test_co_owner_fork_on_reset(ec: ExecuteCode, work: Path, go: Any) -> None:
    scope = scope_in(work, "co-owners")

    async def body() -> None:
        forks_before = ec.snapshot()["forks"]
        a = await ec.attach(scope)
        b = await ec.attach(scope)
        try:
            first = await a.run("x = 'shared'\nimport os\nprint(os.getpid())")
            shared_pid = int(first.content)
            seen = await b.run("import os\nprint(x, os.getpid())")
            assert seen.content == f"shared {shared_pid}\n"
            assert seen.details["kernel_reused"] is True
            fork = await a.run("import os\nprint('x' in globals(), os.getpid())", reset=True)
            assert fork.details["reset_performed"] is True
            assert fork.details["kernel_reused"] is False
            fresh, fork_pid = fork.content.split()
            assert fresh == "False" and int(fork_pid) != shared_pid
            assert ec.snapshot()["forks"] == forks_before + 1
            still = await b.run("import os\nprint(x, os.getpid())")
            assert still.content == f"shared {shared_pid}\n"  # the sibling keeps its kernel
            assert still.details["reset_performed"] is False
            stay = await a.run("import os\nprint('x' in globals(), os.getpid())")
            assert stay.content == f"False {fork_pid}\n"  # A stays on its fork
        finally:
            await a.aclose()
            await b.aclose()
        assert await await_until(lambda: pid_gone(shared_pid) and pid_gone(int(fork_pid)), 5)

    go(body())


def test_owner_death_while_queued(ec: ExecuteCode, work: Path, go: Any) -> None:
    scope = scope_in(work, "owner-queued")
    marker = work / "queued-marker"

    async def body() -> None:
        a = await ec.attach(scope)
        b = await ec.attach(scope)
        await a.run("count = 0")
        active = asyncio.ensure_future(a.run("import time\ntime.sleep(1)\ncount += 1"))
        await wait_running(ec)
        queued = asyncio.ensure_future(b.run(f"open({str(marker)!r}, 'w').close()"))
        assert await await_until(lambda: ec.snapshot()["queued"] == 1)
        await b.aclose()
        rb = await asyncio.wait_for(queued, 1)
        assert "nothing ran" in rb.content
        assert rb.details["state_retained"] is False  # the spec's "caller death" row
        assert rb.details["never_started"] is True
        ra = await active
        assert ra.details["exit_code"] == 0 and ra.details["state_retained"] is True
        check = await a.run("print(count)")
        assert check.content == "1\n" and check.details["kernel_reused"] is True
        assert not marker.exists()
        closed = await b.run("print(1)")
        assert "closed" in closed.content and closed.details["exit_code"] is None
        await a.aclose()

    go(body())


def test_owner_death_while_active(ec: ExecuteCode, work: Path, go: Any) -> None:
    scope = scope_in(work, "owner-active")

    async def body() -> None:
        a = await ec.attach(scope)
        b = await ec.attach(scope)
        pid = await pid_of(b.run)
        await b.run("y = 1")
        active = asyncio.ensure_future(a.run("import time\ntime.sleep(60)"))
        await wait_running(ec)
        await a.aclose()
        ra = await asyncio.wait_for(active, 5)
        assert ra.details["cancelled"] is True
        assert ra.details["state_retained"] is False
        assert await await_until(lambda: pid_gone(pid), 5)  # its kernel was discarded
        rb = await b.run("print('y' in globals())")
        assert rb.content == lost_line("cancelled") + "\n\nFalse\n"
        assert rb.details["kernel_reused"] is False
        assert rb.details["kernel_lost_reason"]
        await b.aclose()

    go(body())


@pytest.mark.parametrize("how", ["aclose", "close", "gc"])
def test_kernel_without_owners_stops_at_once(
    ec: ExecuteCode, work: Path, go: Any, how: str
) -> None:
    scope = scope_in(work, f"ownerless-{how}")

    async def body() -> None:
        owner = await ec.attach(scope)
        pid = await pid_of(owner.run)
        before = ec.snapshot()
        if how == "aclose":
            await owner.aclose()
        elif how == "close":
            owner.close()  # synchronous detach while idle
        else:
            del owner
            gc.collect()
            await asyncio.sleep(0)  # the finalizer hands the detach to the loop
            await asyncio.sleep(0)
        after = ec.snapshot()
        assert after["live"] == before["live"] - 1
        assert after["owners"] == before["owners"] - 1
        assert await await_until(lambda: pid_gone(pid), 3)

    go(body())


# -- keys -------------------------------------------------------------------------------------


def test_subagents_cwd_agent_and_helpers_select_other_kernels(
    ec: ExecuteCode, work: Path, go: Any
) -> None:
    parent = scope_in(work, "parent")
    child = scope_in(work, "parent-subagent")
    other_cwd = scope_in(work, "parent", cwd=work / "other")
    other_agent = scope_in(work, "parent", agent="reviewer")

    async def body() -> None:
        await ec.run("who = 'parent'", scope=parent)
        pids = {"parent": await pid_of(ec.run, scope=parent)}
        for name, scope in (("child", child), ("cwd", other_cwd), ("agent", other_agent)):
            result = await ec.run(
                "import os\nprint(globals().get('who'), os.getpid())", scope=scope
            )
            who, pid = result.content.split()
            assert who == "None", name  # state never migrates between keys
            pids[name] = int(pid)
        with configured(ec, tools=["read"]):
            pids["helpers"] = await pid_of(ec.run, scope=parent)
        assert len(set(pids.values())) == len(pids), pids
        back = await ec.run("import os\nprint(who, os.getpid())", scope=parent)
        assert back.content == f"parent {pids['parent']}\n"
        cwd = await ec.run("import os\nprint(os.getcwd())", scope=other_cwd)
        assert cwd.content == f"{(work / 'other').resolve()}\n"

    go(body())


def test_kernel_id_reveals_nothing(ec: ExecuteCode, work: Path, go: Any) -> None:
    scope = scope_in(work, "identity-secret-session")
    result = go(ec.run("print(1)", scope=scope))
    kernel_id = result.details["kernel_id"]
    assert re.fullmatch(r"[0-9a-f]{16,64}", kernel_id)
    assert "identity" not in kernel_id


def test_config_switch_takes_effect_on_next_call(ec: ExecuteCode, work: Path, go: Any) -> None:
    scope = scope_in(work, "switch")

    async def body() -> None:
        await ec.run("kept = 'yes'", scope=scope)
        with configured(ec, kernel_mode="per_call"):
            per_call = await ec.run("print(globals().get('kept'))", scope=scope)
        assert per_call.content == "None\n"
        assert per_call.details["mode"] == "per_call"
        with configured(ec, enabled=False):
            off = await ec.run("print(1)", scope=scope)
        assert off.details["error"] is True and "disabled" in off.content
        back = await ec.run("print(kept)", scope=scope)
        assert back.content == "yes\n" and back.details["kernel_reused"] is True

    go(body())


# -- bounds: LRU eviction, capacity, reaping ------------------------------------------------------


def test_lru_eviction_at_the_cap_never_evicts_busy(work: Path, go: Any) -> None:
    async def body() -> None:
        capped = make_facade(max_live_kernels=2)
        s1, s2, s3 = (scope_in(work, f"lru-{i}") for i in (1, 2, 3))
        try:
            p1 = await pid_of(capped.run, scope=s1)
            p2 = await pid_of(capped.run, scope=s2)
            await capped.run("v = 1", scope=s1)  # s1 used last: s2 is least recently used
            await pid_of(capped.run, scope=s3)
            snap = capped.snapshot()
            assert (snap["live"], snap["evicted_total"]) == (2, 1)
            assert await await_until(lambda: pid_gone(p2), 5)
            assert not pid_gone(p1)
            r2 = await capped.run("print(1)", scope=s2)  # evicts s1 (LRU now)
            assert r2.details["kernel_reused"] is False
            assert r2.details["kernel_lost_reason"] == "evicted"
            assert capped.snapshot()["live"] == 2

            # Now s2 and s3 are live, s3 least recently used... make s3 busy instead.
            p3 = await pid_of(capped.run, scope=s3)
            await capped.run("w = 1", scope=s2)
            busy = asyncio.ensure_future(
                capped.run("import time\ntime.sleep(1.5)\nw = 2", scope=s3)
            )
            await wait_running(capped)
            r1 = await capped.run("print(1)", scope=s1)  # must evict idle s2, not busy s3
            assert r1.details["kernel_reused"] is False
            assert capped.snapshot()["live"] == 2
            done = await busy
            assert done.details["state_retained"] is True
            assert not pid_gone(p3)
            again = await capped.run("print(w)", scope=s3)
            assert again.content == "2\n" and again.details["kernel_reused"] is True
            lost = await capped.run("print(globals().get('w'))", scope=s2)
            assert lost.details["kernel_lost_reason"] == "evicted"
            assert lost.content == lost_line("evicted") + "\n\nNone\n"
        finally:
            await capped.aclose()

    go(body())


def test_capacity_exhausted_runs_isolated(work: Path, go: Any) -> None:
    async def body() -> None:
        capped = make_facade(max_live_kernels=1)
        s1, s2 = scope_in(work, "cap-1"), scope_in(work, "cap-2")
        try:
            await capped.run("x = 1", scope=s1)
            busy = asyncio.ensure_future(
                capped.run("import time\ntime.sleep(1.5)\nx = 2", scope=s1)
            )
            await wait_running(capped)
            result = await capped.run("y = 5\nprint(y)", scope=s2)
            assert result.details["fallback_reason"] == "capacity_exhausted"
            assert result.details["persistent"] is False
            assert result.details["exit_code"] == 0
            assert result.content == (FALLBACK_NOTE.format(reason="capacity_exhausted") + "\n\n5\n")
            assert capped.snapshot()["live"] == 1
            done = await busy
            assert done.details["state_retained"] is True
            again = await capped.run("print(x)", scope=s1)
            assert again.content == "2\n" and again.details["kernel_reused"] is True
        finally:
            await capped.aclose()

    go(body())


def test_idle_kernels_are_reaped_running_never(work: Path, go: Any) -> None:
    async def body() -> None:
        reaping = make_facade(kernel_idle_timeout_ms=400)
        scope = scope_in(work, "reap")
        try:
            pid = await pid_of(reaping.run, scope=scope)
            running = await reaping.run("import time\ntime.sleep(1.0)\nz = 1", scope=scope)
            assert running.details["state_retained"] is True  # not reaped while it ran
            soon = await reaping.run("print(z)", scope=scope)
            assert soon.content == "1\n" and soon.details["kernel_reused"] is True
            assert await await_until(lambda: reaping.snapshot()["live"] == 0, 3)
            assert reaping.snapshot()["reaped_total"] == 1
            assert await await_until(lambda: pid_gone(pid), 3)
            later = await reaping.run("print(globals().get('z'))", scope=scope)
            assert later.content == lost_line("reaped") + "\n\nNone\n"
            assert later.details["kernel_reused"] is False
            assert later.details["kernel_lost_reason"] == "reaped"
        finally:
            await reaping.aclose()

    go(body())


# -- fallbacks ------------------------------------------------------------------------------------


def _assert_fallback(result: Any, reason: str) -> None:
    assert result.details["fallback_reason"] == reason
    assert result.details["persistent"] is False
    assert result.details["mode"] == "session"


def test_missing_session_scope_falls_back(ec: ExecuteCode, work: Path, go: Any) -> None:
    async def body() -> None:
        result = await ec.run("print('isolated')", scope=None)
        _assert_fallback(result, "missing_session_scope")
        assert result.content == (
            FALLBACK_NOTE.format(reason="missing_session_scope") + "\n\nisolated\n"
        )
        assert not SessionScope("", "agent").complete  # an empty id is no scope either

    go(body())


@pytest.fixture(scope="module")
def broken_pythons(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("pythons")
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(root / "venv")], check=True, timeout=60
    )
    exits = root / "exits"
    exits.write_text("#!/bin/sh\necho 'no kernel here' >&2\nexit 3\n")
    exits.chmod(0o755)
    return {"venv": root / "venv" / "bin" / "python", "exits": exits}


@pytest.mark.parametrize("which", ["venv", "exits"])
def test_startup_failed_falls_back(
    ec: ExecuteCode, work: Path, go: Any, broken_pythons: dict[str, Path], which: str
) -> None:
    scope = scope_in(work, f"startup-{which}")

    async def body() -> None:
        before = ec.snapshot()["kernels_total"]
        with configured(ec, python_path=str(broken_pythons[which])):
            result = await ec.run("print(1)", scope=scope)
        _assert_fallback(result, "startup_failed")
        # The isolated run cannot start with that interpreter either: a clear error, no hang,
        # whose first line says that the session's fallback failed too.
        assert result.details["exit_code"] is None
        assert result.content.startswith(fallback_failed_note("startup_failed") + "\n\n")
        if which == "venv":
            assert "has no ipykernel" in result.content
        snap = ec.snapshot()  # nothing left starting, no stray kernel
        assert snap["phases"]["starting"] == 0 and snap["kernels_total"] <= before
        fine = await ec.run("print(2)", scope=scope)
        assert fine.content == "2\n" and fine.details["persistent"] is True

    go(body())


def test_registry_unavailable_falls_back(
    work: Path, go: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    registries: list[SessionRegistry] = []
    make_registry = SessionRegistry.__init__

    def recorded(self: SessionRegistry, *args: Any, **kwargs: Any) -> None:
        make_registry(self, *args, **kwargs)
        registries.append(self)

    monkeypatch.setattr(SessionRegistry, "__init__", recorded)

    async def body() -> None:
        facade = make_facade()
        scope = scope_in(work, "registry")
        try:
            await facade.run("print(1)", scope=scope)
            [registry] = registries
            await registry.aclose()  # fault injection: the registry is gone
            result = await facade.run("print('still works')", scope=scope)
            _assert_fallback(result, "registry_unavailable")
            assert result.details["exit_code"] == 0
            assert result.content.endswith("\n\nstill works\n")
        finally:
            await facade.aclose()

    go(body())


@pytest.mark.parametrize("fault", ["raises", "survives"])
def test_stop_failed_on_reset_falls_back(
    work: Path, go: Any, fault: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def body() -> None:
        facade = make_facade()
        scope = scope_in(work, f"stop-failed-{fault}")
        try:
            await facade.run("x = 1", scope=scope)

            async def broken_stop(self: Engine, kernel: Any, **kwargs: Any) -> None:
                if fault == "raises":
                    raise RuntimeError("cannot stop")
                # "survives": returns, but the kernel is still alive

            with monkeypatch.context() as patch:  # every stop of the facade's engine fails
                patch.setattr(Engine, "stop", broken_stop)
                result = await facade.run("print('x' in globals())", scope=scope, reset=True)
            _assert_fallback(result, "stop_failed")
            assert result.content.endswith("\n\nFalse\n")  # ran isolated, nothing replayed
            nxt = await facade.run("print('x' in globals())", scope=scope)
            assert nxt.content == "False\n" and nxt.details["persistent"] is True
        finally:
            await facade.aclose()

    go(body())


# -- snapshot and telemetry ------------------------------------------------------------------------


SNAPSHOT_KEYS = {
    "live",
    "capacity",
    "phases",
    "owners",
    "forks",
    "queued",
    "evicted_total",
    "reaped_total",
    "idle_timeout_ms",
    "max_queued_cells_per_kernel",
    "spares",
    "kernels_total",
}


def test_snapshot_counts_without_identities(work: Path, go: Any) -> None:
    async def body() -> None:
        facade = make_facade(max_live_kernels=3, max_queued_cells_per_kernel=4)
        s1, s2 = scope_in(work, "snap-session-one"), scope_in(work, "snap-session-two")
        try:
            empty = facade.snapshot()
            assert set(empty) == SNAPSHOT_KEYS and empty["live"] == 0
            await facade.run("pass", scope=s1)
            owner = await facade.attach(s2)
            await owner.run("pass")
            busy = asyncio.ensure_future(owner.run("import time\ntime.sleep(0.8)"))
            await wait_running(facade)
            queued = asyncio.ensure_future(owner.run("pass"))
            assert await await_until(lambda: facade.snapshot()["queued"] == 1)
            snap = facade.snapshot()
            assert set(snap) == SNAPSHOT_KEYS
            assert snap["live"] == 2 and snap["kernels_total"] == 2
            assert snap["capacity"] == 3
            assert snap["phases"] == {"starting": 0, "idle": 1, "running": 1, "stopping": 0}
            assert snap["owners"] == 2 and snap["queued"] == 1 and snap["forks"] == 0
            assert snap["max_queued_cells_per_kernel"] == 4
            assert snap["idle_timeout_ms"] == facade.config.kernel_idle_timeout_ms
            values = [v for k, v in snap.items() if k != "phases"] + list(snap["phases"].values())
            assert all(type(v) is int for v in values), snap  # counts only, no identities
            assert "snap-session" not in json.dumps(snap) and str(work) not in json.dumps(snap)
            await asyncio.gather(busy, queued)
            await owner.aclose()
            assert facade.snapshot()["live"] == 1
        finally:
            await facade.aclose()

    go(body())


def test_telemetry_has_no_code_paths_or_tokens(work: Path, go: Any) -> None:
    marker = "CODE_MARKER_1234"
    secret_session = "telemetry-secret-session"

    async def body() -> tuple[list[Any], str]:
        start = len(EVENTS)
        facade = make_facade(
            max_live_kernels=1, max_queued_cells_per_kernel=1, kernel_idle_timeout_ms=500
        )
        s1 = scope_in(work, secret_session)
        s2 = scope_in(work, secret_session + "-2")
        try:
            first = await facade.run(
                f"# {marker}\nimport os\nfrom lemon_exec.kernel import cells\n"
                "print(cells.STATE.bridge._token, os.getpid())\nread('a.txt')",
                scope=s1,
            )
            token = first.content.split()[0]
            busy = asyncio.ensure_future(facade.run("import time\ntime.sleep(0.8)", scope=s1))
            await wait_running(facade)
            queued = asyncio.ensure_future(facade.run("pass", scope=s1))
            assert await await_until(lambda: facade.snapshot()["queued"] == 1)
            refused = await facade.run("pass", scope=s1)  # busy
            assert refused.details["busy"] is True
            fallback = await facade.run("pass", scope=s2)  # capacity_exhausted
            assert fallback.details["fallback_reason"] == "capacity_exhausted"
            await asyncio.gather(busy, queued)
            assert await await_until(lambda: facade.snapshot()["reaped_total"] == 1, 3)
            await facade.run("pass", scope=s2)
            await facade.run("pass", scope=s1)  # evicts s2
            await facade.run("raise ValueError('" + marker + "')", scope=s1)
        finally:
            await facade.aclose()
        return EVENTS[start:], token

    events, token = go(body())
    names = {name for name, _, _ in events}
    assert {
        "kernel.start",
        "kernel.stop",
        "session.fallback",
        "session.busy",
        "execute_code.stop",
    } <= names
    stop_reasons = {meta.get("reason") for name, _, meta in events if name == "kernel.stop"}
    assert {"reaped", "evicted"} <= stop_reasons
    forbidden = (marker, secret_session, str(work), token, "a.txt", "ValueError")
    for name, measurements, metadata in events:
        assert all(
            isinstance(v, int | float) and not isinstance(v, bool) for v in measurements.values()
        ), (name, measurements)
        for value in metadata.values():
            assert (
                value is None
                or isinstance(value, bool | int)
                or (isinstance(value, str) and re.fullmatch(r"[a-z_]{1,32}", value))
            ), (name, value)
        blob = json.dumps([name, measurements, metadata])
        for item in forbidden:
            assert item not in blob, (name, item)
