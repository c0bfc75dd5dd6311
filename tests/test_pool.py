"""Warm spares and the fork server (issue 5): fresh process per run, dead spares replaced,
spares stopped on close. Behaviour only; timings live in bench/."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import pytest
from support import await_until, pid_gone

from lemon_exec import ExecuteCode, ExecuteCodeConfig, SessionScope
from lemon_exec.host.percall.pool import KernelPool
from lemon_exec.host.run.diagnostics import TemplateInfo
from lemon_exec.template.client import START_WAIT_S

pytestmark = [pytest.mark.timeout(120), pytest.mark.kernel]

PROBE = """
import json, os
print(json.dumps({"pid": os.getpid(), "ppid": os.getppid(), "cwd": os.getcwd(),
                  "names": sorted(n for n in globals() if not n.startswith("_"))}))
globals()["leftover"] = 1
"""


def _probe(result_content: str) -> dict:
    return json.loads(result_content.strip().splitlines()[-1])


async def _wait_spares(ec: ExecuteCode, count: int = 1, timeout: float = 20.0) -> None:
    assert await await_until(lambda: ec.snapshot()["spares"] >= count, timeout), "no spare"


async def _wait_fork_server(ec: ExecuteCode, timeout: float = 20.0) -> TemplateInfo:
    template = await ec.diagnostics.wait_template(timeout)
    assert template is not None, "no fork server got ready"
    return template


@pytest.fixture
def pools(monkeypatch: pytest.MonkeyPatch) -> list[KernelPool]:
    """Every spare pool made while the test runs (to change how long a burst is held)."""
    made: list[KernelPool] = []
    make_pool = KernelPool.__init__

    def recorded(self: KernelPool, *args: Any, **kwargs: Any) -> None:
        make_pool(self, *args, **kwargs)
        made.append(self)

    monkeypatch.setattr(KernelPool, "__init__", recorded)
    return made


@pytest.mark.parametrize("fork_server", [True, False], ids=["fork", "popen"])
def test_every_run_gets_a_fresh_kernel(tmp_path: Path, fork_server: bool) -> None:
    async def main() -> None:
        config = ExecuteCodeConfig(enabled=True, warm_kernels=1, fork_server=fork_server)
        async with ExecuteCode(config) as ec:
            await ec.run("pass")  # spares are started for an interpreter once it is known
            seen: list[dict] = []
            workspaces: list[set[str]] = []
            for i in range(3):
                await _wait_spares(ec)
                cwd = tmp_path / f"run{i}"
                cwd.mkdir()
                work = ec.diagnostics.work_dir
                assert work is not None
                before = set(os.listdir(work))
                result = await ec.run(PROBE, scope=SessionScope("unused", "a", str(cwd)))
                assert result.details["kernel_source"] == "spare", result.details
                seen.append(_probe(result.content))
                workspaces.append(set(os.listdir(work)) - before)
                assert Path(seen[-1]["cwd"]) == cwd
                # The namespace holds only the pre-imported names: nothing of earlier runs.
                assert "leftover" not in seen[-1]["names"]
                assert {"text", "notify", "batch", "read", "ToolError"} <= set(seen[-1]["names"])
            assert len({s["pid"] for s in seen}) == 3, "a kernel was reused"
            # Each run's private workspace is gone after the run.
            assert not os.listdir(work)

    asyncio.run(main())


def test_fork_server_forks_kernels_and_stops_them() -> None:
    async def main() -> None:
        config = ExecuteCodeConfig(enabled=True, warm_kernels=0, fork_server=True)
        async with ExecuteCode(config) as ec:
            await ec.run("pass")  # starts the fork server in the background
            template = await _wait_fork_server(ec)
            assert template.pid is not None
            info = _probe((await ec.run(PROBE)).content)
            # Forked by the template, not launched by this process.
            assert info["ppid"] == template.pid
            assert info["ppid"] != os.getpid()
            template_pid = template.pid
        # Closing the facade stops the template too.
        gone = Path(f"/proc/{template_pid}")
        assert await await_until(lambda: not gone.exists(), 5), "fork server still running"

    asyncio.run(main())


def test_the_first_start_waits_for_the_starting_template_and_is_forked() -> None:
    async def main() -> None:
        config = ExecuteCodeConfig(
            enabled=True, kernel_mode="session", warm_kernels=0, fork_server=True
        )
        async with ExecuteCode(config) as ec:
            # The very first call starts the template and finds it starting: it waits for
            # it rather than launching a kernel of its own next to it.
            info = _probe((await ec.run(PROBE, scope=SessionScope("first", "a"))).content)
            [template] = ec.diagnostics.templates
            assert template.pid is not None
            assert info["ppid"] == template.pid != os.getpid()

    asyncio.run(main())


def test_a_template_that_never_gets_ready_holds_a_start_up_at_most_a_while(
    tmp_path: Path,
) -> None:
    # An interpreter whose fork-server template hangs before it says "ready".
    wrapper = tmp_path / "python"
    wrapper.write_text(
        "#!/bin/sh\n"
        'if [ "$2" = lemon_exec.template.server ]; then exec sleep 60; fi\n'
        f'exec {sys.executable} "$@"\n'
    )
    wrapper.chmod(0o755)

    async def main() -> None:
        config = ExecuteCodeConfig(
            enabled=True,
            kernel_mode="session",
            warm_kernels=0,
            fork_server=True,
            python_path=str(wrapper),
        )
        async with ExecuteCode(config) as ec:
            loop = asyncio.get_running_loop()
            started = loop.time()
            result = await ec.run(PROBE, scope=SessionScope("stalled", "a"))
            waited = loop.time() - started
            info = _probe(result.content)
            assert info["ppid"] == os.getpid()  # launched cold, by this process
            assert START_WAIT_S <= waited < START_WAIT_S + 10  # not the 15 s ready timeout

    asyncio.run(main())


def _wholly_dead(pid: int) -> bool:
    """``pid`` has ended and none of its threads is still exiting."""
    try:
        return pid_gone(pid) and len(os.listdir(f"/proc/{pid}/task")) <= 1
    except FileNotFoundError:
        return True


def test_dead_spare_is_never_handed_out() -> None:
    async def main() -> None:
        config = ExecuteCodeConfig(enabled=True, warm_kernels=1, fork_server=False)
        async with ExecuteCode(config) as ec:
            await ec.run("pass")
            await _wait_spares(ec)
            spare = ec.diagnostics.spare_pids[0]
            os.kill(spare, signal.SIGKILL)
            # Dead before the claim (a loaded machine can take seconds to end a process), and
            # wholly: a killed kernel's main thread shows as a zombie while its other threads
            # still exit, and until they have it cannot be reaped (nor its link seen closed).
            assert await await_until(lambda: _wholly_dead(spare), 30), "the spare did not die"
            result = await ec.run(PROBE)
            assert result.ok, result.content
            assert _probe(result.content)["pid"] != spare
            assert result.details["kernel_source"] == "cold"

    asyncio.run(main())


def test_closing_the_facade_stops_every_spare() -> None:
    async def main() -> list[int]:
        config = ExecuteCodeConfig(enabled=True, warm_kernels=2, fork_server=False)
        ec = ExecuteCode(config)
        await ec.run("pass")
        await _wait_spares(ec, 2)
        pids = list(ec.diagnostics.spare_pids)
        await ec.aclose()
        return pids

    pids = asyncio.run(main())
    assert len(pids) == 2
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_warm_kernels_zero_starts_cold_every_time() -> None:
    config = ExecuteCodeConfig(enabled=True, warm_kernels=0, fork_server=False)
    with ExecuteCode(config) as ec:
        sources = [ec.run_sync("pass").details["kernel_source"] for _ in range(2)]
        assert sources == ["cold", "cold"]
        assert ec.snapshot()["spares"] == 0


def test_warm_up_makes_the_first_call_warm() -> None:
    async def main() -> None:
        config = ExecuteCodeConfig(enabled=True, warm_kernels=1, fork_server=False)
        async with ExecuteCode(config) as ec:
            await ec.warm_up()
            await _wait_spares(ec)
            result = await ec.run("print('warm')")
            assert result.content == "warm\n"
            assert result.details["kernel_source"] == "spare"

    asyncio.run(main())


def test_kernels_skip_debugger_and_jedi_but_scripts_can_import_them() -> None:
    script = (
        "import sys\n"
        "print(sorted(m for m in ('debugpy', 'jedi') if m in sys.modules))\n"
        "import jedi, debugpy\n"
        "print(jedi.__name__, debugpy.__name__)\n"
    )
    with ExecuteCode(ExecuteCodeConfig(enabled=True, warm_kernels=0)) as ec:
        result = ec.run_sync(script)
    assert result.content == "[]\njedi debugpy\n", result.content


def test_a_burst_waits_for_starting_spares_and_grows_the_pool(pools: list[KernelPool]) -> None:
    """Back-to-back calls: one that finds no spare ready takes the one already starting
    (it ends sooner than a start of its own) and the pool keeps one more spare for a
    while (issue 17: sustained and concurrent per-call runs)."""

    async def main() -> None:
        config = ExecuteCodeConfig(enabled=True, warm_kernels=1)
        async with ExecuteCode(config) as ec:
            await ec.run("pass")
            await _wait_spares(ec)
            [pool] = pools
            sources = []
            pids = set()
            for _ in range(3):
                result = await ec.run(PROBE)
                assert result.ok, result.content
                sources.append(result.details["kernel_source"])
                pids.add(_probe(result.content)["pid"])
            assert len(pids) == 3  # still a fresh kernel per run
            assert sources == ["spare", "spare", "spare"]
            await _wait_spares(ec, 2)  # the burst grew the target past warm_kernels
            pool.burst_hold_s = 0.0
            pool._trim()
            assert pool.spare_count == 1

    asyncio.run(main())


def test_the_replacement_spare_starts_after_the_run() -> None:
    """Outside a burst a claimed spare is replaced once its run ends, so the new kernel's
    start does not compete with the run for the CPU (issue 17: per-call latency)."""

    async def main() -> None:
        config = ExecuteCodeConfig(enabled=True, warm_kernels=1)
        async with ExecuteCode(config) as ec:
            await ec.run("pass")
            await _wait_spares(ec)
            diagnostics = ec.diagnostics
            run = asyncio.ensure_future(ec.run("import time; time.sleep(1.5)"))
            await asyncio.sleep(0.7)
            assert not run.done()
            assert (diagnostics.spares, diagnostics.spares_starting) == (0, 0)
            assert (await run).ok
            await _wait_spares(ec)

    asyncio.run(main())


def test_a_failed_spare_start_is_tried_again_without_a_claim() -> None:
    """A start that fails (a template killed mid-fork, say) does not leave the pool short
    until the next claim: the key tries again after a backoff. Pure pool logic."""

    class Spare:
        async def kill(self) -> None:
            pass

    calls: list[float] = []

    async def start(interpreter: str) -> Any:
        calls.append(asyncio.get_running_loop().time())
        if len(calls) <= 2:
            raise RuntimeError("the kernel process exited during startup")
        return Spare()

    async def main() -> tuple[int, list[float]]:
        pool = KernelPool(start, 1, parallel=1)
        try:
            pool.refill("python")
            assert await await_until(lambda: pool.spare_count == 1, timeout=5)
            return pool.spare_count, calls
        finally:
            await pool.aclose()

    count, times = asyncio.run(main())
    assert count == 1 and len(times) == 3
    assert times[2] - times[1] > times[1] - times[0] >= 0.2  # backoff doubles
