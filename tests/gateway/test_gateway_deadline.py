"""The call's deadline and abort hold through a gateway kernel's start (issue 26.1, 26.2):
the call returns at once, the script never runs, and the gateway is left no kernel."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from lemon_exec import ExecuteCode

from .eg import SLOW_KERNEL_NAME, SLOW_START_S, EnterpriseGateway
from .support_gw import with_facade

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120), pytest.mark.kernel]

TIMEOUT_MS = 2000
#: Deadline (or abort) to return: the escalation's grace and more, for a loaded machine.
SLACK_S = 2.5


@pytest.mark.parametrize("how", ["deadline", "abort"])
def test_a_slow_gateway_start_is_cut_by_the_deadline_or_abort(
    gateway: EnterpriseGateway, tmp_path: Path, how: str
) -> None:
    marker = tmp_path / "ran"
    script = f"open({str(marker)!r}, 'w').write('ran')\n"

    async def body(ec: ExecuteCode) -> tuple[float, str, dict[str, object]]:
        abort = asyncio.Event()
        if how == "abort":
            asyncio.get_running_loop().call_later(0.5, abort.set)
        started = time.monotonic()
        result = await ec.run(
            script, timeout_ms=TIMEOUT_MS if how == "deadline" else 60_000, abort=abort
        )
        took = time.monotonic() - started
        await asyncio.sleep(max(0.0, started + SLOW_START_S + 3 - time.monotonic()))
        return took, result.content, dict(result.details)

    took, content, details = asyncio.run(
        with_facade(gateway, body, gateway_kernel_name=SLOW_KERNEL_NAME)
    )
    bound = (TIMEOUT_MS / 1000 if how == "deadline" else 0.5) + SLACK_S
    assert took < bound, (took, content)
    if how == "deadline":
        assert content.startswith(
            f"Script timed out after {TIMEOUT_MS}ms. Its kernel was still starting"
        ), content
        assert details["timed_out"] is True
    else:
        assert content.startswith("Script cancelled. Its kernel was still starting"), content
        assert details["cancelled"] is True
    assert details["left_during"] == "kernel_start"
    assert not marker.exists(), "the script ran after the call ended"
    assert gateway.wait_no_kernels() == set()
