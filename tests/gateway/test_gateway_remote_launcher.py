"""Kernels started the way a Kubernetes pod of the kernel image starts them (issue 16).

The gateway's remote process proxies (Kubernetes, distributed) do not start the kernel
themselves: a launcher reports the kernel's ports back to the gateway, encrypted with its
public key, and takes interrupts and shutdowns on a comm socket. The kernel image's command
is lemon_exec's launcher (lemon_exec/kernel/gateway_launcher.py); here the gateway's
distributed proxy runs it on loopback (no ssh for a local host), which is the same protocol
the Kubernetes proxy uses, minus the pod.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from lemon_exec import ExecuteCode, SessionScope
from lemon_exec.host.run.results import lost_line

from .eg import REMOTE_KERNEL_NAME, EnterpriseGateway
from .support_gw import with_facade

pytestmark = [pytest.mark.timeout(120), pytest.mark.kernel]


def test_remote_launched_session_kernel_runs_helpers_keeps_state_and_times_out(
    gateway: EnterpriseGateway, tmp_path: Path
) -> None:
    (tmp_path / "marker.txt").write_text("from the host\n")
    scope = SessionScope("gw-remote", "agent", cwd=str(tmp_path))

    async def body(ec: ExecuteCode) -> None:
        first = await ec.run(
            "x = read('marker.txt').strip()\ntext(x + ' via the launcher')",
            scope=scope,
        )
        assert first.content.endswith("\nfrom the host via the launcher"), first.content
        assert first.details["persistent"] is True
        second = await ec.run("print(x)", scope=scope)
        assert second.content == "from the host\n", second.content
        assert second.details["state_retained"] is True
        timed_out = await ec.run("import time\ntime.sleep(60)", scope=scope, timeout_ms=1500)
        assert timed_out.content.startswith("Script timed out after 1500ms."), timed_out.content
        after = await ec.run("print(x)", scope=scope)
        assert after.content.startswith(lost_line("timeout")), after.content

    asyncio.run(
        with_facade(gateway, body, kernel_mode="session", gateway_kernel_name=REMOTE_KERNEL_NAME)
    )
    assert gateway.wait_no_kernels() == set()
