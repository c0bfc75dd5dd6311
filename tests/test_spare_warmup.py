"""A spare's warm-up cell leaves no trace a run can see: the same names, the same output,
the same execution state as a kernel that starts inside the call.

The warm-up writes to stdout and stderr (their first use is what costs in a fresh kernel,
most in a sandboxed one), so its output must stay its own.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from support import await_until, enabled_config

from lemon_exec import ExecuteCode, SessionScope

pytestmark = [pytest.mark.timeout(90), pytest.mark.kernel]

PROBE = (
    "import sys\n"
    "names = sorted(n for n in globals() if not n.startswith('__'))\n"
    "print(names, sys.stdout.isatty(), sep='|')\n"
)


async def _run(warm_kernels: int, cwd: Path) -> tuple[str, str | None]:
    async with ExecuteCode(enabled_config(warm_kernels=warm_kernels)) as ec:
        scope = SessionScope("warm", "agent", cwd=str(cwd))
        if warm_kernels:
            await ec.run("pass", scope=scope)  # fills the pool
            assert await await_until(lambda: ec.snapshot()["spares"] >= 1), "no spare"
        result = await ec.run(PROBE, scope=scope)
        return result.content, result.details.get("kernel_source")


def test_a_run_on_a_warmed_spare_sees_what_a_cold_kernel_sees(tmp_path: Path) -> None:
    on_spare, source = asyncio.run(_run(1, tmp_path))
    cold, cold_source = asyncio.run(_run(0, tmp_path))
    assert (source, cold_source) == ("spare", "cold")
    assert on_spare == cold, (on_spare, cold)
    assert not on_spare.startswith(" "), repr(on_spare)  # the warm-up's output is not here
