"""What goes wrong with a gateway ends as a clear result, never a hang or a leftover kernel:
a killed kernel, a dropped websocket, a wrong token, a wrong URL or kernelspec, and the
settings only a local kernel can honour (issue 16)."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from lemon_exec import ExecuteCode, SessionScope
from lemon_exec.host.run.results import lost_line

from .eg import CuttableProxy, EnterpriseGateway, free_port, running_gateway
from .support_gw import with_facade

pytestmark = [pytest.mark.timeout(90), pytest.mark.kernel]


def _run(gateway: EnterpriseGateway, script: str, **settings: Any) -> tuple[str, dict[str, Any]]:
    async def body(ec: ExecuteCode) -> tuple[str, dict[str, Any]]:
        result = await ec.run(script)
        return result.content, dict(result.details)

    return asyncio.run(with_facade(gateway, body, **settings))


def test_a_killed_kernel_is_a_crash_and_the_session_starts_over(
    gateway: EnterpriseGateway, tmp_path: Path
) -> None:
    scope = SessionScope("gw-crash", "agent", cwd=str(tmp_path))

    async def body(ec: ExecuteCode) -> float:
        await ec.run("x = 1", scope=scope)
        started = time.monotonic()
        crashed = await ec.run(
            "import os, signal, time\nprint('bye', flush=True)\ntime.sleep(0.3)\n"
            "os.kill(os.getpid(), signal.SIGKILL)",
            scope=scope,
        )
        took = time.monotonic() - started
        assert crashed.content.startswith("Script exited with code -1"), crashed.content
        assert "bye" in crashed.content
        assert crashed.details["state_retained"] is False
        after = await ec.run("print(x)", scope=scope)
        assert after.content.startswith(lost_line("crashed")), after.content
        return took

    took = asyncio.run(with_facade(gateway, body, kernel_mode="session"))
    assert took < 10, took  # noticed through the gateway's restarter, not the call's timeout
    assert gateway.wait_no_kernels() == set()


@pytest.mark.slow
def test_a_dropped_websocket_ends_the_call_as_a_crash(gateway: EnterpriseGateway) -> None:
    proxy = CuttableProxy(int(gateway.url.rsplit(":", 1)[1]))

    async def body(ec: ExecuteCode) -> tuple[str, dict[str, Any], float]:
        running = asyncio.Event()
        run = asyncio.ensure_future(
            ec.run(
                "import time\nprint('running', flush=True)\ntime.sleep(60)",
                timeout_ms=60_000,
                on_output=lambda _chunk: running.set(),
            )
        )
        await asyncio.wait_for(running.wait(), 30)  # the script runs: cut its websocket
        assert proxy.cut() >= 1
        started = time.monotonic()
        result = await asyncio.wait_for(run, 30)
        return result.content, dict(result.details), time.monotonic() - started

    try:
        content, details, took = asyncio.run(
            with_facade(gateway, body, gateway_url=f"http://127.0.0.1:{proxy.port}")
        )
    finally:
        proxy.close()
    assert content.startswith("Script exited with code -1"), content
    assert "the websocket to the gateway closed" in content
    assert details["state_retained"] is False
    assert took < 10, took  # at once, not the 60 s timeout (slack for a loaded CI)
    # The shutdown request still went through (a new connection): nothing is left running.
    assert gateway.wait_no_kernels() == set()


def test_a_wrong_token_is_a_clear_start_failure(gateway: EnterpriseGateway) -> None:
    content, details = _run(gateway, "print('never')", gateway_auth_token="not-the-token")
    assert "refused the request (HTTP 401" in content, content
    assert "gateway_auth_token" in content
    assert details["startup_failed"] is True
    assert gateway.kernel_ids() == set()


def test_a_refused_kernel_user_names_the_setting_that_fixes_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """EG's 403s for the kernel's user (root is refused by default) name unauthorized_users,
    authorized_users and KERNEL_USERNAME, never the token, which was right."""
    users = [
        "--EnterpriseGatewayApp.unauthorized_users={'mallory'}",
        "--EnterpriseGatewayApp.authorized_users={'alice'}",
    ]
    with running_gateway(tmp_path, *users) as gateway:
        monkeypatch.setenv("KERNEL_USERNAME", "mallory")
        content, details = _run(gateway, "print('never')")
        assert "User 'mallory' is not authorized to start kernel" in content, content
        assert "unauthorized_users" in content and "KERNEL_USERNAME" in content
        assert "gateway_auth_token" not in content
        assert details["startup_failed"] is True

        monkeypatch.delenv("KERNEL_USERNAME")  # the gateway's own user: not in the set
        content, _ = _run(gateway, "print('never')")
        assert "is not in the set of users authorized" in content, content
        assert "authorized_users" in content and "KERNEL_USERNAME" in content
        assert "gateway_auth_token" not in content

        monkeypatch.setenv("KERNEL_USERNAME", "alice")
        content, details = _run(gateway, "import os; print(os.environ['KERNEL_USERNAME'])")
        assert content.strip() == "alice", content
        assert gateway.kernel_ids() == set()


def test_an_unreachable_gateway_is_a_clear_start_failure(gateway: EnterpriseGateway) -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    content, details = _run(gateway, "print('never')", gateway_url=url)
    assert f"cannot reach the Enterprise Gateway at {url}" in content, content
    assert "gateway_url" in content
    assert details["startup_failed"] is True


def test_an_unknown_kernelspec_is_a_clear_start_failure(gateway: EnterpriseGateway) -> None:
    content, details = _run(gateway, "print('never')", gateway_kernel_name="no-such-kernel")
    assert "has no kernelspec 'no-such-kernel'" in content, content
    assert details["startup_failed"] is True
    assert gateway.kernel_ids() == set()


@pytest.mark.parametrize(
    ("setting", "value", "words"),
    [
        ("sandbox", "bwrap", "sandbox = 'bwrap' cannot apply to kernels behind"),
        ("kernel_memory_mb", 256, "kernel_memory_mb = 256 asks for a memory limit"),
        ("kernel_max_processes", 64, "kernel_max_processes = 64 asks for a process limit"),
    ],
)
def test_local_only_settings_are_refused_with_a_gateway(
    gateway: EnterpriseGateway, setting: str, value: object, words: str
) -> None:
    content, _details = _run(gateway, "print('never')", **{setting: value})
    assert content.startswith(f"execute_code: {words}"), content
    assert "nothing ran" in content and "never" not in content
    assert gateway.kernel_ids() == set()


HOST_SCRIPT = """
import asyncio, sys
from lemon_exec import ExecuteCode, ExecuteCodeConfig, SessionScope

async def main() -> None:
    config = ExecuteCodeConfig(
        enabled=True, kernel_mode="session", warm_kernels=0, python_path=sys.executable,
        gateway_url=sys.argv[1], gateway_auth_token=sys.argv[2],
    )
    ec = ExecuteCode(config)
    result = await ec.run("x = 1", scope=SessionScope("host-exit", "agent"))
    print("ready" if result.details.get("exit_code") == 0 else result.content, flush=True)
    await asyncio.sleep(120)

asyncio.run(main())
"""


@pytest.mark.slow
def test_a_host_stopped_by_sigterm_deletes_its_gateway_kernels(gateway: EnterpriseGateway) -> None:
    host = subprocess.Popen(
        [sys.executable, "-c", HOST_SCRIPT, gateway.url, gateway.token],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert host.stdout is not None
        assert host.stdout.readline().strip() == "ready"
        assert len(gateway.kernel_ids()) == 1  # its session kernel
        host.send_signal(signal.SIGTERM)
        assert host.wait(20) == -signal.SIGTERM
    finally:
        if host.poll() is None:
            host.kill()
            host.wait()
    # The exit hook asked the gateway to delete the kernel before the host died.
    assert gateway.wait_no_kernels(timeout=5) == set()
