"""Per-call mode on kernels behind a real Enterprise Gateway (issue 16).

Every run starts a throwaway kernel through the gateway's REST API and drives it over one
websocket; helpers, budgets, ``text()`` and ``notify()`` run on this host across it.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest
from support import wait_until

from lemon_exec import ExecuteCode, SessionScope

from .eg import EnterpriseGateway
from .support_gw import with_facade

pytestmark = [pytest.mark.timeout(90), pytest.mark.kernel]


def test_a_script_runs_in_a_gateway_kernel_that_is_gone_afterwards(
    gateway: EnterpriseGateway,
) -> None:
    async def body(ec: ExecuteCode) -> list[str]:
        first = await ec.run(
            "import os\nx = 41\nprint('launched by the gateway:', os.environ['KERNEL_GATEWAY'])"
        )
        assert first.details["exit_code"] == 0, first.content
        assert first.details["mode"] == "per_call"
        assert first.details["state_retained"] is False
        second = await ec.run("print(x)")  # a fresh kernel: nothing survives
        return [first.content, second.content]

    first, second = asyncio.run(with_facade(gateway, body))
    assert first == "launched by the gateway: 1\n"
    assert second.startswith("Script raised NameError: name 'x' is not defined"), second
    assert gateway.wait_no_kernels() == set()


def test_helpers_batch_text_and_notify_cross_the_websocket(
    gateway: EnterpriseGateway, tmp_path: Path
) -> None:
    (tmp_path / "notes.txt").write_text("host side\n")
    updates: list[str] = []
    script = (
        "import os\n"
        "notes = read('notes.txt')\n"
        "listing, again = batch([('ls', {'path': '.'}), ('read', {'path': 'notes.txt'})])\n"
        "notify('halfway')\n"
        "print('kernel sees notes.txt:', os.path.exists('notes.txt'))\n"
        "text(f\"{'host side' in notes} {'notes.txt' in listing} {again == notes}\")\n"
    )

    async def body(ec: ExecuteCode) -> tuple[str, dict[str, object]]:
        result = await ec.run(
            script, scope=SessionScope("s", "a", cwd=str(tmp_path)), on_update=updates.append
        )
        return result.content, dict(result.details)

    content, details = asyncio.run(with_facade(gateway, body))
    # Helpers read the host's files; the script's own open() sees where the kernel runs.
    assert content.splitlines()[:2] == ["Script result (text()):", "True True True"], content
    assert "kernel sees notes.txt: False" in content
    assert updates == ["notify: halfway"]
    assert details["rpc_calls"] == 3
    assert details["text_blocks"] == 1 and details["notifications"] == 1


def test_budgets_are_enforced_by_the_host(gateway: EnterpriseGateway) -> None:
    script = (
        "for i in range(3):\n"
        "    try:\n"
        "        ls('.')\n"
        "        print('call', i, 'ok')\n"
        "    except ToolError as exc:\n"
        "        print('call', i, exc)\n"
        "try:\n"
        "    text('x' * 200)\n"
        "except ToolError as exc:\n"
        "    print('text', str(exc).split(':')[0])\n"
    )

    async def body(ec: ExecuteCode) -> str:
        return (await ec.run(script)).content

    content = asyncio.run(with_facade(gateway, body, max_rpc_calls=2, max_text_bytes=100))
    assert content.splitlines() == [
        "call 0 ok",
        "call 1 ok",
        "call 2 rpc call limit exceeded (max 2 calls per script)",
        "text text() budget exceeded",
    ], content


def test_a_timeout_interrupts_through_the_gateway_then_shuts_the_kernel_down(
    gateway: EnterpriseGateway,
) -> None:
    script = (
        "import os, time\n"
        "print('sleeping in', os.environ['KERNEL_ID'], flush=True)\n"
        "time.sleep(30)\n"
    )

    async def body(ec: ExecuteCode) -> tuple[str, dict[str, object], float]:
        started = time.monotonic()
        result = await ec.run(script, timeout_ms=3000)
        return result.content, dict(result.details), time.monotonic() - started

    content, details, took = asyncio.run(with_facade(gateway, body))
    assert content.startswith("Script timed out after 3000ms."), content
    assert details["timed_out"] is True
    assert took < 15, took  # 3 s, then at most 0.5 s to report (slack for a loaded CI)
    assert gateway.wait_no_kernels() == set()
    # The gateway's access log: first the interrupt, then the shutdown, of that kernel.
    kernel_id = content.split("sleeping in ")[1].split()[0]
    log = gateway.log_path.read_text(errors="replace")
    interrupt = log.find(f"204 POST /api/kernels/{kernel_id}/interrupt")
    shutdown = log.find(f"204 DELETE /api/kernels/{kernel_id} ")
    assert 0 <= interrupt < shutdown, (interrupt, shutdown)


@pytest.mark.slow
def test_a_script_that_ignores_the_interrupt_is_shut_down(
    gateway: EnterpriseGateway, tmp_path: Path
) -> None:
    marker = tmp_path / "ignored"
    script = (
        "import time\n"
        "while True:\n"
        "    try:\n"
        "        time.sleep(10)\n"
        "    except KeyboardInterrupt:\n"
        f"        open({str(marker)!r}, 'w').close()\n"
    )

    async def body(ec: ExecuteCode) -> str:
        return (await ec.run(script, timeout_ms=3000)).content

    content = asyncio.run(with_facade(gateway, body))
    assert content.startswith("Script timed out after 3000ms."), content
    assert wait_until(marker.exists, 10)
    # Still running after the interrupt: the shutdown request (then a kill) ends it.
    assert gateway.wait_no_kernels() == set()


@pytest.mark.slow
def test_several_megabytes_of_output_arrive_whole_before_text(
    gateway: EnterpriseGateway,
) -> None:
    mib = 6
    script = (
        "import sys\n"
        "line = 'y' * 1023 + '\\n'\n"
        f"for _ in range({mib} * 1024):\n"
        "    sys.stdout.write(line)\n"
        "text('after the flood')\n"
    )

    async def body(ec: ExecuteCode) -> tuple[str, dict[str, object], int, bool]:
        result = await ec.run(script)
        spill = Path(str(result.details["full_output_path"]))
        data = spill.read_bytes()
        return result.content, dict(result.details), len(data), set(data) == {ord("y"), 10}

    content, details, size, only_ys = asyncio.run(with_facade(gateway, body))
    assert content.startswith("Script result (text()):\nafter the flood\n"), content[:200]
    assert details["truncated"] is True
    assert size == mib * 2**20 and only_ys  # nothing dropped on the way


def test_warm_spares_are_remote_kernels_too(gateway: EnterpriseGateway) -> None:
    async def body(ec: ExecuteCode) -> tuple[str, str, str]:
        await ec.warm_up()
        deadline = time.monotonic() + 20
        while ec.snapshot()["spares"] < 1 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        first = await ec.run("import os\nprint(os.environ['KERNEL_ID'])")
        assert first.details["kernel_source"] == "spare", first.details
        second = await ec.run("import os\nprint(os.environ['KERNEL_ID'])")
        return first.content.strip(), second.content.strip(), str(second.details["kernel_source"])

    first, second, source = asyncio.run(with_facade(gateway, body, warm_kernels=1))
    assert first != second  # each run had its own kernel
    assert source in ("spare", "cold")
    assert gateway.wait_no_kernels() == set()


def test_the_kernel_runs_where_the_gateway_put_it(gateway: EnterpriseGateway) -> None:
    # The host's working directory is not sent: the kernel works in its own (the gateway's).
    async def body(ec: ExecuteCode) -> str:
        return (await ec.run("import os\nprint(os.getcwd())")).content.strip()

    cwd = asyncio.run(with_facade(gateway, body))
    assert cwd != os.getcwd()
    assert Path(cwd).name == "kernels", cwd
