"""gc_freeze: after the host's first call, its heap is out of the collector's reach.

Each case runs in a fresh interpreter (the freeze is once per process), with a real kernel.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.timeout(120), pytest.mark.kernel]

PROBE = """
import asyncio, gc, json, sys
from lemon_exec import ExecuteCode, ExecuteCodeConfig

async def main():
    config = ExecuteCodeConfig(enabled=True, gc_freeze=sys.argv[1] == "on", warm_kernels=0)
    async with ExecuteCode(config) as ec:
        before = gc.get_freeze_count()
        first = await ec.run("print(1)")
        after_first = gc.get_freeze_count()
        await ec.run("print(2)")
        after_second = gc.get_freeze_count()
    print(json.dumps([before, first.content, after_first, after_second]))

asyncio.run(main())
"""


@pytest.mark.parametrize("setting", ["on", "off"])
def test_the_heap_is_frozen_once_after_the_first_call(setting: str) -> None:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, setting], capture_output=True, text=True, timeout=100
    )
    assert out.returncode == 0, out.stderr
    before, content, after_first, after_second = json.loads(out.stdout.splitlines()[-1])
    assert before == 0 and content == "1\n"
    if setting == "on":
        # everything alive after the first call, host and imports; not frozen again after
        # the second (frozen objects freed by their reference counts leave the count)
        assert after_first > 10_000 and after_second <= after_first
    else:
        assert after_first == after_second == 0
