"""A fork request given up on never hands its kernel to the next request, and never leaks it.

A real fork-server template forks real kernels. The template is SIGSTOPped so one request
goes unanswered (timeout, or the caller cancels); after SIGCONT its late reply arrives. The
host would retire a stopped template (test_template_faults.py): here it is made to read the
template as runnable, as on a loaded host, where a late answer is what happens. The
next request must get its own kernel (told apart by its working directory, which the child
sets itself), and the kernel of the abandoned request must be killed.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from pathlib import Path

import pytest
from jupyter_client.connect import write_connection_file
from support import pid_gone, wait_until

from lemon_exec.proc import supervise
from lemon_exec.template import client as forkserver
from lemon_exec.template.client import ForkServer
from lemon_exec.template.provisioner import ForkedProcess

pytestmark = [pytest.mark.timeout(60), pytest.mark.kernel]


def kernel_request(base: Path, name: str) -> tuple[list[str], str]:
    """Kernel arguments (an ipc connection file) and a working directory of its own."""
    cwd = base / name
    cwd.mkdir()
    connection = base / f"{name}.json"
    write_connection_file(str(connection), ip=str(base / f"{name}-ipc"), transport="ipc")
    return ["-f", str(connection)], str(cwd)


def cwd_of(pid: int, not_: str, within: float = 10.0) -> str:
    """The child's working directory once it has left the template's (``not_``)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except OSError as exc:
            raise AssertionError(f"kernel {pid} is gone") from exc
        if cwd != not_:
            return cwd
        time.sleep(0.01)
    raise AssertionError(f"kernel {pid} never changed directory")


def running_children(pid: int) -> set[int]:
    return {c for c in supervise.children(pid) if supervise.running(c)}


def wait_children(template: int, expected: set[int], within: float = 5.0) -> set[int]:
    wait_until(lambda: running_children(template) == expected, within, interval=0.02)
    return running_children(template)


@pytest.mark.parametrize("give_up", ["timeout", "cancel"])
def test_late_reply_never_answers_the_next_request(
    short_tmp: Path, monkeypatch: pytest.MonkeyPatch, give_up: str
) -> None:
    monkeypatch.setattr(forkserver, "_REQUEST_TIMEOUT_S", 0.3)
    monkeypatch.setattr(forkserver, "_process_state", lambda pid: ("R", 0))  # just slow
    template_cwd = short_tmp / "template"
    template_cwd.mkdir()

    async def main() -> None:
        server = ForkServer(f"race-{give_up}", sys.executable, dict(os.environ), str(template_cwd))
        await server.start()
        try:
            assert await server.wait_ready(30), "the template did not start"
            template = server.pid
            assert template is not None
            first_argv, first_cwd = kernel_request(short_tmp, "first")
            second_argv, second_cwd = kernel_request(short_tmp, "second")

            os.kill(template, signal.SIGSTOP)
            try:
                if give_up == "timeout":
                    with pytest.raises(TimeoutError):
                        await server.fork(first_argv, dict(os.environ), first_cwd, None)
                else:
                    task = asyncio.create_task(
                        server.fork(first_argv, dict(os.environ), first_cwd, None)
                    )
                    await asyncio.sleep(0.1)
                    task.cancel()
                    with pytest.raises(asyncio.CancelledError):
                        await task
            finally:
                os.kill(template, signal.SIGCONT)
            # The template now forks the first kernel and answers late.
            await asyncio.sleep(0.2)

            pid = await server.fork(second_argv, dict(os.environ), second_cwd, None)
            assert cwd_of(pid, str(template_cwd)) == second_cwd, (
                "the second request was handed the first (abandoned) request's kernel"
            )
            left = await asyncio.to_thread(wait_children, template, {pid})
            assert left == {pid}, f"the abandoned request's kernel was not killed: {left}"
        finally:
            await server.aclose()

    asyncio.run(main())


def test_concurrent_requests_each_get_their_own_kernel(short_tmp: Path) -> None:
    template_cwd = short_tmp / "template"
    template_cwd.mkdir()

    async def main() -> None:
        server = ForkServer("race-concurrent", sys.executable, dict(os.environ), str(template_cwd))
        await server.start()
        try:
            assert await server.wait_ready(30), "the template did not start"
            requests = [kernel_request(short_tmp, f"k{i}") for i in range(3)]
            pids = await asyncio.gather(
                *(server.fork(argv, dict(os.environ), cwd, None) for argv, cwd in requests)
            )
            assert [cwd_of(pid, str(template_cwd)) for pid in pids] == [c for _a, c in requests]
        finally:
            await server.aclose()

    asyncio.run(main())


def test_exit_status_is_the_templates_report_not_a_guess(short_tmp: Path) -> None:
    """A kernel reaped by the template, its report not yet read, still gets its real status.

    The host sees the pid gone before it reads the template's exit report; reading that as
    "killed" (-9) would turn ``os._exit(7)`` into "Script exited with code -9".
    """
    template_cwd = short_tmp / "template"
    template_cwd.mkdir()

    async def main() -> None:
        server = ForkServer("race-exit", sys.executable, dict(os.environ), str(template_cwd))
        await server.start()
        try:
            assert await server.wait_ready(30), "the template did not start"
            argv, cwd = kernel_request(short_tmp, "k")
            pid = await server.fork(argv, dict(os.environ), cwd, None)
            cwd_of(pid, str(template_cwd))
            process = ForkedProcess(server, pid)
            # Without yielding to the loop, so the template's report stays unread.
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + 10
            while not pid_gone(pid):
                assert time.monotonic() < deadline, "the kernel did not end"
                time.sleep(0.002)
            assert process.poll() is not None, "a reaped kernel must read as ended"
            status = await process.settle()
            assert status == server.exit_status(pid), "the template's report was not used"
            assert status != -signal.SIGKILL
        finally:
            await server.aclose()

    asyncio.run(main())
