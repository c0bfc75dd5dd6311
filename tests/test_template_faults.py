"""A fork-server template that a script stops or kills costs no call its kernel.

A stopped (SIGSTOP) or wedged template is retired at once: the start goes cold, the backend
starts a replacement, and kernels the template forked keep running (it is resumed, not
killed). A killed template's kernels die with it: none of them is handed out as a spare.
Real templates, real kernels; the bounds are generous (well under the 5 s a request may wait
for a template that is merely slow).
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from support import await_until
from test_forkserver_races import cwd_of, kernel_request

from lemon_exec import ExecuteCode, ExecuteCodeConfig
from lemon_exec.proc import supervise
from lemon_exec.template import client as forkserver
from lemon_exec.template.client import ForkServer

pytestmark = [pytest.mark.timeout(120), pytest.mark.kernel]

#: Prints the kernel's template PID, or COLD for a kernel started without one.
WHO = """
import os
parent = open(f"/proc/{os.getppid()}/cmdline", "rb").read()
print(os.getppid() if b"lemon_exec.template.server" in parent else "COLD")
"""


def facade(base: Path, warm: int) -> ExecuteCode:
    config = ExecuteCodeConfig(
        enabled=True,
        kernel_mode="per_call",
        warm_kernels=warm,
        python_path=sys.executable,
        timeout_ms=20_000,
    )
    return ExecuteCode(config, staging_base=base)


async def forked_template(ec: ExecuteCode) -> int:
    """The PID of the template once it forks the kernels."""
    for _ in range(100):
        result = await ec.run(WHO)
        assert result.details["exit_code"] == 0, result.content
        if result.content.strip() != "COLD":
            return int(result.content)
        await asyncio.sleep(0.2)
    raise AssertionError("the fork server never served a kernel")


def state(pid: int) -> str | None:
    found = supervise.state(pid)
    return None if found is None else found[0]


# -- the template on its own --------------------------------------------------------------------


@pytest.mark.parametrize("reads_as", ["stopped", "idle"])
def test_a_template_that_cannot_answer_is_retired_and_its_kernels_live(
    short_tmp: Path, monkeypatch: pytest.MonkeyPatch, reads_as: str
) -> None:
    """``stopped``: its /proc state says T. ``idle``: the same stopped template read as an
    idle sleeper (no CPU used, not runnable), which is how a wedged one looks."""
    if reads_as == "idle":
        monkeypatch.setattr(forkserver, "_process_state", lambda pid: ("S", 0))
    template_cwd = short_tmp / "template"
    template_cwd.mkdir()

    async def main() -> None:
        server = ForkServer(f"stop-{reads_as}", sys.executable, dict(os.environ), str(template_cwd))
        await server.start()
        try:
            assert await server.wait_ready(30), "the template did not start"
            template = server.template_pid
            assert template is not None
            argv, cwd = kernel_request(short_tmp, "first")
            kernel = await server.fork(argv, dict(os.environ), cwd, None)
            cwd_of(kernel, str(template_cwd))

            os.kill(template, signal.SIGSTOP)
            argv, cwd = kernel_request(short_tmp, "second")
            started = time.monotonic()
            with pytest.raises(OSError):
                await server.fork(argv, dict(os.environ), cwd, None)
            took = time.monotonic() - started
            assert took < 3.0, f"a stopped template held the start for {took:.1f} s"
            assert server.retired and not server.ready
            if reads_as == "stopped":  # resumed, so that it reaps and reports its kernels
                await await_until(lambda: state(template) != "T", 5)
                assert state(template) not in ("T", None)
            else:
                os.kill(template, signal.SIGCONT)
            assert supervise.running(kernel), "retiring the template killed its kernel"
            with pytest.raises(OSError):  # never used again
                await server.fork(argv, dict(os.environ), cwd, None)
        finally:
            await server.aclose()

    asyncio.run(main())


# -- through the facade ---------------------------------------------------------------------------


@pytest.mark.slow
def test_calls_after_a_script_stopped_its_template_are_prompt(short_tmp: Path) -> None:
    async def main() -> list[tuple[float, str]]:
        ec = facade(short_tmp, warm=0)  # every start asks the template
        try:
            stopped = await forked_template(ec)
            stop = await ec.run("import os, signal\nos.kill(os.getppid(), signal.SIGSTOP)")
            assert stop.details["exit_code"] == 0, stop.content
            after = []
            for _ in range(5):
                started = time.monotonic()
                result = await ec.run(WHO)
                assert result.details["exit_code"] == 0, result.content
                after.append((time.monotonic() - started, result.content.strip()))
            assert str(stopped) not in [who for _took, who in after]
            return after
        finally:
            await ec.aclose()

    after = asyncio.run(main())
    slow = [took for took, _who in after if took >= 3.0]
    assert not slow, f"calls after the stop took {after}"
    # The replacement template serves again.
    assert any(who != "COLD" for _took, who in after), after


@pytest.mark.slow
def test_a_running_script_outlives_the_retirement_of_its_stopped_template(
    short_tmp: Path,
) -> None:
    async def main() -> None:
        ec = facade(short_tmp, warm=2)
        try:
            await forked_template(ec)
            assert await await_until(lambda: ec.snapshot()["spares"] == 2)  # forked spares
            running = asyncio.create_task(ec.run("import time\ntime.sleep(3)\nprint('survived')"))
            await asyncio.sleep(0.5)
            stop = await ec.run("import os, signal\nos.kill(os.getppid(), signal.SIGSTOP)")
            assert stop.details["exit_code"] == 0, stop.content
            for _ in range(3):  # spares run out, starts ask the stopped template
                result = await ec.run("print('ok')")
                assert result.content == "ok\n", result.content
            done = await running
            assert done.content == "survived\n", done.content
        finally:
            await ec.aclose()

    asyncio.run(main())


@pytest.mark.slow
def test_every_call_after_a_script_killed_its_template_gets_a_kernel(short_tmp: Path) -> None:
    """Three rounds: a script kills its template, then four calls at once. Once in a few
    rounds under load, a kernel still starting when its template died wrote its removed
    connection file back, and the sticky bit jupyter_client then set on runtime/ made the
    host refuse every later call; or a spare about to die with the template was handed out."""

    async def main() -> list[list[str]]:
        ec = facade(short_tmp, warm=2)
        rounds = []
        try:
            for _ in range(3):
                await forked_template(ec)
                # Both spares forked (more after a round: four calls at once are a burst).
                assert await await_until(lambda: ec.snapshot()["spares"] >= 2)
                await ec.run("import os, signal\nos.kill(os.getppid(), signal.SIGKILL)")
                results = await asyncio.gather(*(ec.run("print('ok')") for _ in range(4)))
                rounds.append([r.content for r in results])
        finally:
            await ec.aclose()
        return rounds

    rounds = asyncio.run(main())
    assert rounds == [["ok\n"] * 4] * 3, rounds


@pytest.mark.slow
def test_a_spare_of_a_dead_template_is_never_handed_out(short_tmp: Path) -> None:
    """The spares of a killed template die with it, by their own parent watch: on a busy
    host a moment later. Here that moment is made long (the spares are stopped before the
    template is killed); a claim must take none of them."""

    async def main() -> list[Any]:
        ec = facade(short_tmp, warm=2)
        try:
            template = await forked_template(ec)
            # Both spares ready, and the used kernel gone: the template's children are spares.
            assert await await_until(
                lambda: ec.snapshot().get("spares") == 2 and len(supervise.children(template)) == 2
            ), f"no spares were forked: {ec.snapshot()}"
            spares = supervise.children(template)
            for pid in spares:
                os.kill(pid, signal.SIGSTOP)
            os.kill(template, signal.SIGKILL)
            while supervise.running(template):
                await asyncio.sleep(0.01)
            calls = [ec.run("print('ok')", timeout_ms=10_000) for _ in range(4)]
            return list(await asyncio.gather(*calls))
        finally:
            await ec.aclose()

    results = asyncio.run(main())
    assert [r.content for r in results] == ["ok\n"] * 4, [r.content for r in results]
