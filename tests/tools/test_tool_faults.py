"""Faults, hostile input and load (issue 10): no tool freezes the host or starves other calls.

* grep's regex work and find's walk run in killable worker processes: a catastrophic regex
  cannot stall the event loop, a script's timeout fires on time, an overrun is killed with a
  clear ToolError, a cancelled call kills its worker, and nothing is left running.
* webfetch's deadline is total, so a server that drips one byte a second cannot stretch it,
  and stuck fetches never starve other tools.

The drip server is a real HTTP server on 127.0.0.1; the end-to-end tests run real kernels.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import itertools
import pathlib
import select
import socket
import threading
import time
from collections.abc import Awaitable, Iterator
from typing import Any, TypeVar

import pytest
from support import wait_until

from lemon_exec import ExecuteCode, ExecuteCodeConfig, SessionScope
from lemon_exec.errors import ToolFailure
from lemon_exec.tools import ToolCall, ToolHost, default_registry

from .conftest import run_call

pytestmark = pytest.mark.timeout(60)

T = TypeVar("T")

#: `(a+)+$` against this line backtracks ~2**28 times: many seconds with the GIL held.
CATASTROPHIC_LINE = "a" * 28 + "b\n"
CATASTROPHIC = r"(a+)+$"


def _process_gone(pid: int) -> bool:
    try:
        state = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return state == "Z"


async def _with_ticker(work: Awaitable[T]) -> tuple[T | BaseException, float]:
    """Run ``work`` while a task ticks every 50 ms; return its outcome and the largest gap."""
    ticks: list[float] = []

    async def tick() -> None:
        while True:
            ticks.append(time.monotonic())
            await asyncio.sleep(0.05)

    ticker = asyncio.create_task(tick())
    await asyncio.sleep(0)
    try:
        outcome: T | BaseException = await work
    except Exception as e:
        outcome = e
    ticks.append(time.monotonic())
    ticker.cancel()
    gaps = [b - a for a, b in itertools.pairwise(ticks)]
    return outcome, max(gaps)


@pytest.fixture
def bad_file(tmp_path: pathlib.Path) -> pathlib.Path:
    path = tmp_path / "f.txt"
    path.write_text(CATASTROPHIC_LINE)
    return path


def _grep_call(cwd: pathlib.Path, pattern: str = CATASTROPHIC) -> ToolCall:
    return ToolCall("grep", {"pattern": pattern, "path": "f.txt"}, cwd, 1)


# -- grep and find: bounded, killable, never on the event loop ---------------------------------


@pytest.mark.slow
@pytest.mark.kernel
def test_script_timeout_fires_on_time_during_a_catastrophic_grep(
    tmp_path: pathlib.Path, bad_file: pathlib.Path
) -> None:
    config = ExecuteCodeConfig(enabled=True, warm_kernels=0, kernel_mode="session")
    scope = SessionScope("tool-faults-grep", "agent", cwd=str(tmp_path))

    async def main() -> tuple[Any, float, float, set[int]]:
        async with ExecuteCode(config) as ec:
            warm = await ec.run("x = 1", scope=scope)  # the kernel is up before we time
            assert warm.details.get("timed_out") is not True, warm.content
            started = time.monotonic()
            result, gap = await _with_ticker(
                ec.run(f"grep({CATASTROPHIC!r}, 'f.txt')", scope=scope, timeout_ms=3000)
            )
            elapsed = time.monotonic() - started
            pids = set(ec.diagnostics.tool_worker_pids)
        return result, elapsed, gap, pids

    result, elapsed, gap, pids = asyncio.run(main())
    assert not isinstance(result, BaseException), result
    assert result.content.startswith("Script timed out after 3000ms."), result.content
    # Reported at the 3 s deadline, not when the unbounded regex would end.
    assert elapsed < 10, f"the timeout was reported {elapsed:.2f} s after the call started"
    assert gap < 1.5, f"the event loop stalled for {gap:.2f} s"
    # The cancelled grep's worker was killed; closing the facade stopped its replacement.
    assert all(wait_until(functools.partial(_process_gone, pid), 3) for pid in pids)


def test_grep_overrunning_its_time_limit_is_killed_and_replaced(
    tmp_path: pathlib.Path, bad_file: pathlib.Path
) -> None:
    async def main() -> None:
        async with ToolHost(default_registry()) as host:
            # Warm a worker first: its start-up (slow on a loaded machine) counts in the limit.
            assert await host.invoke(_grep_call(tmp_path, "a+b")) == "f.txt:1:" + "a" * 28 + "b"
            host.set_time_limit("grep", 1.0)
            first = host.worker_pids()
            assert len(first) == 1
            started = time.monotonic()
            outcome, gap = await _with_ticker(host.invoke(_grep_call(tmp_path)))
            elapsed = time.monotonic() - started
            assert isinstance(outcome, ToolFailure)
            assert str(outcome).startswith("grep exceeded its time limit (1 s) and was stopped")
            assert 0.9 < elapsed < 10  # stopped at its limit; the regex alone never ends
            assert gap < 0.9  # the loop never waited for the 1 s grep
            (old,) = first
            assert wait_until(lambda: _process_gone(old), 3)
            # A fresh worker serves the next call.
            assert await host.invoke(_grep_call(tmp_path, "a+b")) != ""
            assert host.worker_pids() and old not in host.worker_pids()
            pids = host.worker_pids()
        assert all(wait_until(functools.partial(_process_gone, pid), 3) for pid in pids)

    asyncio.run(main())


def test_cancelled_grep_kills_its_worker(tmp_path: pathlib.Path, bad_file: pathlib.Path) -> None:
    async def main() -> None:
        async with ToolHost(default_registry()) as host:
            task = asyncio.create_task(host.invoke(_grep_call(tmp_path)))
            while not host.worker_pids():
                await asyncio.sleep(0.01)
            (pid,) = host.worker_pids()
            await asyncio.sleep(0.3)  # the worker is deep in the regex now
            started = time.monotonic()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert time.monotonic() - started < 5  # the regex alone never ends
            assert wait_until(lambda: _process_gone(pid), 3)
            assert await host.invoke(_grep_call(tmp_path, "b$")) == "f.txt:1:" + "a" * 28 + "b"

    asyncio.run(main())


def test_concurrent_catastrophic_greps_do_not_block_other_tools(
    tmp_path: pathlib.Path, bad_file: pathlib.Path
) -> None:
    async def main() -> None:
        async with ToolHost(default_registry(), time_limits={"grep": 2.0}, max_workers=2) as host:
            stuck = [asyncio.create_task(host.invoke(_grep_call(tmp_path))) for _ in range(4)]
            await asyncio.sleep(0.3)
            started = time.monotonic()
            assert await host.invoke(ToolCall("ls", {}, tmp_path, 9)) == "f.txt"
            assert await host.invoke(ToolCall("read", {"path": "f.txt"}, tmp_path, 10))
            assert time.monotonic() - started < 1.5  # not behind the greps' 2 s limit
            # Two ran and overran; two waited for a worker until their deadline: all four fail.
            outcomes = await asyncio.gather(*stuck, return_exceptions=True)
            assert all(isinstance(o, ToolFailure) for o in outcomes), outcomes
            assert len(host.worker_pids()) <= 2

    asyncio.run(main())


def test_quick_literal_grep_runs_inline_without_a_worker(tmp_path: pathlib.Path) -> None:
    (tmp_path / "f.txt").write_text("hello\nworld\n")
    with_regex = tmp_path / "g.txt"
    with_regex.write_text("x\n")

    async def main() -> None:
        async with ToolHost(default_registry()) as host:
            assert await host.invoke(_grep_call(tmp_path, "world")) == "f.txt:2:world"
            assert host.worker_pids() == set()  # literal, small file: no process hop
            assert await host.invoke(_grep_call(tmp_path, "wor.d")) == "f.txt:2:world"
            assert len(host.worker_pids()) == 1

    asyncio.run(main())


def test_find_with_many_doublestar_segments_stays_cheap(tmp_path: pathlib.Path) -> None:
    level = tmp_path
    for depth in range(50):
        level = level / f"d{depth}"
        level.mkdir()
        for i in range(10):
            (level / f"f{i}.txt").write_text("")
    (level / "target.txt").write_text("")
    pattern = "/".join(["**", "d*"] * 30 + ["target.txt"])

    async def main() -> None:
        async with ToolHost(default_registry()) as host:
            started = time.monotonic()
            outcome, gap = await _with_ticker(
                host.invoke(ToolCall("find", {"pattern": pattern}, tmp_path, 1))
            )
            elapsed = time.monotonic() - started
            assert isinstance(outcome, str) and outcome.endswith("/d49/target.txt"), outcome
            assert elapsed < 20, f"find took {elapsed:.1f} s"  # exponential would be hours
            assert gap < 0.5
            with pytest.raises(ToolFailure, match="pattern has more than 64 path segments"):
                await host.invoke(ToolCall("find", {"pattern": "/".join(["a*"] * 65)}, tmp_path, 2))

    asyncio.run(main())


def test_closing_the_host_stops_its_workers_and_refuses_calls(
    tmp_path: pathlib.Path, bad_file: pathlib.Path
) -> None:
    host = ToolHost(default_registry())
    assert run_call(host, "grep", tmp_path, pattern="a+b", path="f.txt")
    (pid,) = host.worker_pids()
    host.close()
    assert wait_until(lambda: _process_gone(pid), 3)
    with pytest.raises(ToolFailure, match="grep failed: the tool host is closed"):
        run_call(host, "grep", tmp_path, pattern="a+b", path="f.txt")


def test_isolated_tools_must_be_importable_functions() -> None:
    from lemon_exec.tools import ToolRegistry, ToolSpec

    def local(params: dict[str, Any], call: ToolCall) -> str:
        return ""

    with pytest.raises(ValueError, match="module-level function"):
        ToolRegistry().register(ToolSpec(name="x", func=local, isolated=True))
    grep = default_registry().get("grep")
    assert grep is not None and grep.isolated
    with pytest.raises(ValueError, match="time_limit_s must be positive"):
        ToolRegistry().register(dataclasses.replace(grep, time_limit_s=0))
    with pytest.raises(ValueError, match="time_limits"):
        ToolHost(default_registry(), time_limits={"grep": -1})


# -- webfetch: a total deadline, and stuck fetches starve nothing ------------------------------


class DripServer:
    """HTTP on 127.0.0.1 that drips one byte a second (in the body, or in the headers)."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.lock = threading.Lock()
        self.open = 0
        self.accepted = 0
        self.closed_at: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def url(self, where: str = "body") -> str:
        return f"http://127.0.0.1:{self.port}/{where}"

    def _accept(self) -> None:
        self.sock.settimeout(0.1)
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with self.lock:
                self.accepted += 1
                self.open += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            request = conn.recv(65536)
            if b"GET /headers" in request:
                drip = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nnever"
            else:
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n")
                conn.sendall(b"Content-Length: 1000\r\n\r\n")
                drip = b"x" * 1000
            for byte in drip:
                try:
                    conn.sendall(bytes([byte]))
                except OSError:
                    break
                # Wait a second, or less if the client hangs up (EOF is readable).
                readable, _, _ = select.select([conn], [], [], 1.0)
                if (readable and not _recv(conn)) or self._stop.is_set():
                    break
        with self.lock:
            self.open -= 1
            self.closed_at.append(time.monotonic())

    def close(self) -> None:
        self._stop.set()
        self.sock.close()


def _recv(conn: socket.socket) -> bytes:
    try:
        return conn.recv(1024)
    except OSError:  # reset by the client: it hung up
        return b""


@pytest.fixture
def drip() -> Iterator[DripServer]:
    server = DripServer()
    yield server
    server.close()


@pytest.mark.parametrize("where", ["body", "headers"])
def test_webfetch_deadline_is_total_against_a_dripping_server(
    tmp_path: pathlib.Path, drip: DripServer, where: str
) -> None:
    host = ToolHost(default_registry(), time_limits={"webfetch": 2.0})
    started = time.monotonic()
    with pytest.raises(ToolFailure, match=r"webfetch: timed out after 2 s fetching"):
        run_call(host, "webfetch", tmp_path, url=drip.url(where))
    assert time.monotonic() - started < 10  # the dripping server never ends
    # The fetch's socket was shut down: the server sees the hang-up at once.
    assert wait_until(lambda: drip.open == 0, 10)
    host.close()


def test_stuck_fetches_do_not_starve_other_tools(tmp_path: pathlib.Path, drip: DripServer) -> None:
    (tmp_path / "a.txt").write_text("a\n")

    async def main() -> None:
        async with ToolHost(default_registry()) as host:  # the default 20 s fetch deadline
            fetches = [
                asyncio.create_task(
                    host.invoke(ToolCall("webfetch", {"url": drip.url()}, tmp_path, i))
                )
                for i in range(6)
            ]
            while drip.accepted < 6:
                await asyncio.sleep(0.02)
            started = time.monotonic()
            assert await host.invoke(ToolCall("ls", {}, tmp_path, 7)) == "a.txt"
            assert time.monotonic() - started < 10  # not behind the 20 s fetch deadline
            # Cancelling the fetches releases their threads and closes their sockets.
            cancelled = time.monotonic()
            for task in fetches:
                task.cancel()
            await asyncio.gather(*fetches, return_exceptions=True)
            assert await asyncio.to_thread(wait_until, lambda: drip.open == 0, 10)
            assert max(drip.closed_at) - cancelled < 10  # not at the 20 s deadline

    asyncio.run(main())


@pytest.mark.slow
@pytest.mark.kernel
def test_dripping_fetches_in_one_script_leave_another_script_responsive(
    tmp_path: pathlib.Path, drip: DripServer
) -> None:
    (tmp_path / "a.txt").write_text("a\n")
    config = ExecuteCodeConfig(
        enabled=True, warm_kernels=0, kernel_mode="session", max_parallel_rpc=6
    )
    fetcher = SessionScope("tool-faults-fetcher", "agent", cwd=str(tmp_path))
    lister = SessionScope("tool-faults-lister", "agent", cwd=str(tmp_path))
    fetch_all = f"batch([('webfetch', {{'url': {drip.url()!r}}})] * 6)"
    list_dir = (
        "import time\nt0 = time.perf_counter()\nls('.')\n"
        "text(f'ls took {time.perf_counter() - t0:.3f}')\n"
    )

    async def main() -> None:
        async with ExecuteCode(config) as ec:
            await asyncio.gather(ec.run("1", scope=fetcher), ec.run("1", scope=lister))
            stuck = asyncio.create_task(ec.run(fetch_all, scope=fetcher, timeout_ms=6000))
            while drip.accepted < 6:
                await asyncio.sleep(0.02)
            listed = await ec.run(list_dir, scope=lister, timeout_ms=5000)
            took = float(listed.content.rsplit("ls took ", 1)[1].split()[0])
            assert took < 4, listed.content  # not behind the stuck fetches' 6 s timeout
            result = await stuck
            ended = time.monotonic()
            assert result.details["timed_out"] is True
            # The timed-out script's fetches were cancelled: their sockets closed promptly.
            assert await asyncio.to_thread(wait_until, lambda: drip.open == 0, 10)
            assert max(drip.closed_at) - ended < 10  # not at the 20 s fetch deadline

    asyncio.run(main())
