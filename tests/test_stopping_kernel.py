"""A kernel the host is stopping closes its sockets before it is reaped: that is its exit,
not a dropped connection (no warning, no "messages were lost" note, no reconnect).

A forked kernel counts as alive until its template reports its exit status; a template
that is slow to do so (a loaded machine; here: stopped with SIGSTOP) used to make the host
log "connection dropped; reconnected" for every kernel it stopped in that window.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from pathlib import Path

import pytest
from support import enabled_config

from lemon_exec import ExecuteCode, SessionScope

pytestmark = [pytest.mark.timeout(90), pytest.mark.kernel]


async def _template_pid(ec: ExecuteCode) -> int:
    template = await ec.diagnostics.wait_template(20)
    assert template is not None and template.pid is not None
    return template.pid


def test_a_stopped_kernel_is_not_reported_as_a_dropped_connection(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    scope = SessionScope("stopping", "agent", cwd=str(tmp_path))
    caplog.set_level(logging.WARNING, logger="lemon_exec")

    async def body() -> None:
        async with ExecuteCode(enabled_config(kernel_mode="session")) as ec:
            await ec.run("pass", scope=scope)  # starts the template
            template = await _template_pid(ec)
            await ec.run("x = 1", scope=scope, reset=True)  # a kernel forked from it
            first = await ec.run("import os\nprint(os.getppid())", scope=scope)
            assert first.content.strip() == str(template), first.content
            os.kill(template, signal.SIGSTOP)  # it cannot report the kernel's exit
            try:
                # A timeout discards the session kernel: SIGINT, then SIGTERM; the kernel
                # exits (its sockets close) but stays "alive" until the template reaps it.
                timed_out = await ec.run("import time\ntime.sleep(30)", scope=scope,
                                         timeout_ms=500)  # fmt: skip
                assert timed_out.content.startswith("Script timed out"), timed_out.content
                await asyncio.sleep(1.5)
            finally:
                os.kill(template, signal.SIGCONT)

    asyncio.run(body())
    dropped = [r.getMessage() for r in caplog.records if "connection dropped" in r.getMessage()]
    assert dropped == []
