"""Session mode on kernels behind a real Enterprise Gateway (issue 16): the state-retention
table, reset, the queue, and a timeout's lost state, as locally."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from lemon_exec import ExecuteCode, SessionScope
from lemon_exec.host.run.results import lost_line

from .eg import EnterpriseGateway
from .support_gw import with_facade

pytestmark = [pytest.mark.timeout(90), pytest.mark.kernel]


def test_state_is_kept_reset_discards_it_and_calls_queue(
    gateway: EnterpriseGateway, tmp_path: Path
) -> None:
    scope = SessionScope("gw-session", "agent", cwd=str(tmp_path))

    async def body(ec: ExecuteCode) -> None:
        first = await ec.run("import os\nx = 41\nkid = os.environ['KERNEL_ID']", scope=scope)
        assert first.details["persistent"] is True, first.content
        second = await ec.run("x += 1\nprint(x, kid == os.environ['KERNEL_ID'])", scope=scope)
        assert second.content == "42 True\n"
        assert second.details["state_retained"] is True
        assert second.details["kernel_reused"] is True

        # Two calls at once: the second waits for the first, in order, on the same kernel.
        slow = ec.run("import time\ntime.sleep(1)\norder = ['slow']", scope=scope)
        quick = ec.run("order.append('quick')\nprint(order)", scope=scope)
        slow_result, quick_result = await asyncio.gather(slow, quick)
        assert slow_result.details["exit_code"] == 0, slow_result.content
        assert quick_result.content == "['slow', 'quick']\n"
        assert int(quick_result.details["queue_wait_ms"]) >= 500

        reset = await ec.run("print(x)", scope=scope, reset=True)
        assert reset.content.startswith("Script raised NameError"), reset.content
        assert reset.details["reset_performed"] is True

    asyncio.run(with_facade(gateway, body, kernel_mode="session"))
    assert gateway.wait_no_kernels() == set()


def test_a_timeout_discards_the_session_kernel(gateway: EnterpriseGateway, tmp_path: Path) -> None:
    scope = SessionScope("gw-timeout", "agent", cwd=str(tmp_path))

    async def body(ec: ExecuteCode) -> None:
        await ec.run("x = 1", scope=scope)
        timed_out = await ec.run("import time\ntime.sleep(30)", scope=scope, timeout_ms=1200)
        assert timed_out.content.startswith("Script timed out after 1200ms."), timed_out.content
        assert timed_out.details["state_retained"] is False
        after = await ec.run("print(x)", scope=scope)
        assert after.content.startswith(lost_line("timeout")), after.content
        assert "NameError" in after.content

    asyncio.run(with_facade(gateway, body, kernel_mode="session"))
    assert gateway.wait_no_kernels() == set()


def test_a_session_cell_waits_for_no_delayed_ack(
    gateway: EnterpriseGateway, tmp_path: Path
) -> None:
    # Jupyter Server's websocket leaves Nagle's algorithm on: unless the host ACKs at once,
    # every cell stalls for a delayed ACK (at least 40 ms on Linux) between its busy status
    # and its reply. The fastest of a few cells (about 6 ms on loopback) shows that none
    # has to wait for one; the fastest, not the median, so that a loaded machine's slow
    # cells do not matter.
    scope = SessionScope("gw-rtt", "agent", cwd=str(tmp_path))

    async def body(ec: ExecuteCode) -> float:
        await ec.run("pass", scope=scope)
        times = []
        for _ in range(15):
            started = time.perf_counter()
            result = await ec.run("pass", scope=scope)
            times.append(time.perf_counter() - started)
            assert result.details["exit_code"] == 0, result.content
        return min(times)

    fastest = asyncio.run(with_facade(gateway, body, kernel_mode="session"))
    assert fastest < 0.035, f"{fastest * 1000:.1f} ms"


@pytest.mark.slow
def test_eviction_and_reaping_stop_the_remote_kernels(
    gateway: EnterpriseGateway, tmp_path: Path
) -> None:
    first = SessionScope("gw-lru-a", "agent", cwd=str(tmp_path))
    second = SessionScope("gw-lru-b", "agent", cwd=str(tmp_path))

    async def body(ec: ExecuteCode) -> None:
        await ec.run("x = 'a'", scope=first)
        await ec.run("x = 'b'", scope=second)  # max_live_kernels=1: evicts the first's kernel
        assert len(await asyncio.to_thread(gateway.kernel_ids)) == 1
        again = await ec.run("print(x)", scope=first)
        assert again.content.startswith(lost_line("evicted")), again.content
        # Left idle beyond kernel_idle_timeout_ms, the kernel is reaped on the gateway too.
        ec.config.kernel_idle_timeout_ms = 500
        deadline = time.monotonic() + 15
        while await asyncio.to_thread(gateway.kernel_ids) and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        assert await asyncio.to_thread(gateway.kernel_ids) == set()
        assert ec.snapshot()["reaped_total"] >= 1

    asyncio.run(
        with_facade(
            gateway, body, kernel_mode="session", max_live_kernels=1, kernel_idle_timeout_ms=4000
        )
    )
