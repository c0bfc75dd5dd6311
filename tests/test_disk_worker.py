"""The disk worker's ``begin`` (work queued at once, awaited later), and the call path that
uses it: a call's staging-root check runs on the worker while the call's arguments are
checked on the loop, and is awaited before anything starts."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from support import enabled_config

from lemon_exec import ExecuteCode
from lemon_exec.host.disk.worker import DiskWorker
from lemon_exec.host.kernels.engine import Engine
from lemon_exec.host.run import runner

pytestmark = pytest.mark.timeout(120)


def test_begin_starts_the_work_before_the_caller_yields() -> None:
    async def body() -> None:
        worker = DiskWorker()
        started = threading.Event()

        def work() -> int:
            started.set()
            return 42

        try:
            future = worker.begin(work)
            # No await yet: the event loop has not run since begin() returned.
            assert started.wait(5), "begin() did not start the work at once"
            assert await future == 42
        finally:
            worker.close()

    asyncio.run(body())


def test_begin_after_close_runs_inline_and_keeps_the_error() -> None:
    async def body() -> None:
        worker = DiskWorker()
        worker.close()
        assert await worker.begin(lambda: "inline") == "inline"

        def fails() -> None:
            raise OSError("disk gone")

        with pytest.raises(OSError, match="disk gone"):
            await worker.begin(fails)

    asyncio.run(body())


def test_a_calls_staging_check_runs_while_its_arguments_are_checked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """From the second call on (the first makes the host), the staging root's check is on
    the disk worker before the arguments' checks end; a refused call still returns its
    refusal, and the check it started is retrieved (no unretrieved-exception warning)."""
    checking = threading.Event()
    overlapped: list[bool] = []
    ensure = Engine.ensure_staging
    prepare = runner.prepare

    def spy_ensure(self: Engine) -> None:
        checking.set()
        ensure(self)

    def spy_prepare(*args: Any) -> Any:
        overlapped.append(checking.wait(2))  # blocks the loop: only the worker can set it
        return prepare(*args)

    monkeypatch.setattr(Engine, "ensure_staging", spy_ensure)
    monkeypatch.setattr(runner, "prepare", spy_prepare)

    async def body() -> None:
        async with ExecuteCode(enabled_config(kernel_mode="per_call", warm_kernels=0)) as tool:
            for _ in range(2):
                checking.clear()
                assert (await tool.run("print(1)")).content == "1\n"
            checking.clear()
            refused = await tool.run("   ")
            assert refused.details.get("error") and "script" in refused.content

    asyncio.run(body())
    # The first call made the host and checked after; the next two overlapped.
    assert overlapped == [False, True, True]
