"""Issue 31 item 4: closing waits for nothing but the ends themselves, and leaks nothing.

What is checked is the path a close takes, never how long it took (the benchmark's
``aclose_ms`` does that): a kernel that would take its grace period is killed without it,
a fork-server template leaves on its own after ``bye`` (it is not killed), a killed kernel's
exit is awaited on its pidfd, and a run's file work happens on the disk worker, off the
event loop, all of it done (and every process, thread and file gone) when ``aclose``
returns.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from support import enabled_config

from lemon_exec import ExecuteCode, SessionScope
from lemon_exec.host.disk.staging import StagingRoot
from lemon_exec.host.kernels import backend as backends
from lemon_exec.proc.exit_wait import wait_exit
from lemon_exec.template import client as template_client

pytestmark = [pytest.mark.timeout(60), pytest.mark.kernel]

#: A grace period no close may wait for: the test's own timeout is shorter.
_FOREVER_S = 600.0


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rpartition(b")")[2].split()[:1] in ([b"Z"], [b"X"])
    except OSError:
        return True


def test_wait_exit_wakes_on_the_exit_and_bounds_the_wait() -> None:
    async def body() -> None:
        proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        try:
            assert not await wait_exit(proc.pid, lambda: proc.poll() is None, 0.05)
            proc.kill()
            assert await wait_exit(proc.pid, lambda: proc.poll() is None, _FOREVER_S)
            assert proc.returncode is not None  # reaped through alive()
            assert await wait_exit(proc.pid, lambda: proc.poll() is None, 0.0)  # gone already
        finally:
            proc.kill()
            proc.wait()

    asyncio.run(body())


@pytest.mark.parametrize("fork_server", [True, False], ids=["forked", "cold"])
def test_close_kills_a_stopping_kernel_without_its_grace_period(
    monkeypatch: pytest.MonkeyPatch, fork_server: bool
) -> None:
    """A used per-call kernel that ignores SIGTERM is killed only after its grace period,
    in the background: closing kills it at once (the grace period outlasts the test)."""
    monkeypatch.setattr(backends, "GRACE_S", _FOREVER_S)

    async def body() -> None:
        tool = ExecuteCode(enabled_config(kernel_mode="per_call", fork_server=fork_server))
        try:
            script = "import signal\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint(1)"
            assert (await tool.run(script)).content == "1\n"
            stopping = [k.pid for k in tool.diagnostics.kernels]  # SIGTERMed, still there
        finally:
            await tool.aclose()
        assert stopping and all(pid is not None and _gone(pid) for pid in stopping)
        assert tool.diagnostics.kernels == ()

    asyncio.run(body())


def test_a_template_leaves_after_bye_and_is_not_killed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    killed: list[str] = []
    kill_template = template_client.ForkServer._kill_template

    def spy(self: template_client.ForkServer) -> None:
        killed.append(self.server_id)
        kill_template(self)

    monkeypatch.setattr(template_client.ForkServer, "_kill_template", spy)
    popen_kill = subprocess.Popen.kill

    def spy_kill(self: subprocess.Popen[bytes]) -> None:
        killed.append(str(self.pid))
        popen_kill(self)

    monkeypatch.setattr(subprocess.Popen, "kill", spy_kill)
    scope = SessionScope("close-template", "agent", cwd=str(tmp_path))

    async def body() -> None:
        async with ExecuteCode(enabled_config(kernel_mode="session")) as tool:
            await tool.run("pass", scope=scope)  # starts the template
            template = await tool.diagnostics.wait_template(30)
            assert template is not None and template.pid is not None
            await tool.run("pass", scope=scope, reset=True)  # a kernel forked from it
            kernels = [k.pid for k in tool.diagnostics.kernels]
            assert kernels
        assert killed == []  # it went by itself: bye, then its socket closed
        assert _gone(template.pid)
        assert all(pid is not None and _gone(pid) for pid in kernels)

    asyncio.run(body())


def test_a_runs_file_work_is_on_the_disk_worker_and_done_by_close(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Making a workspace and removing the root are on the disk worker; a bare workspace
    (its script alone) goes on the loop, two system calls; one the run wrote into, on the
    worker. Each is gone when its result returns."""
    threads: dict[str, list[str]] = {"made": [], "bare": [], "removed": [], "closed": []}

    def on_thread(name: str, method: Any) -> Any:
        def spy(*args: Any, **kwargs: Any) -> Any:
            threads[name].append(threading.current_thread().name)
            return method(*args, **kwargs)

        return spy

    monkeypatch.setattr(StagingRoot, "new_workspace", on_thread("made", StagingRoot.new_workspace))
    monkeypatch.setattr(
        StagingRoot, "remove_bare_workspace", on_thread("bare", StagingRoot.remove_bare_workspace)
    )
    monkeypatch.setattr(
        StagingRoot, "remove_workspace", on_thread("removed", StagingRoot.remove_workspace)
    )
    monkeypatch.setattr(StagingRoot, "close", on_thread("closed", StagingRoot.close))

    async def body() -> Path:
        tool = ExecuteCode(enabled_config(kernel_mode="per_call", fork_server=False))
        try:
            assert (await tool.run("print(1)")).content == "1\n"
            work = tool.diagnostics.work_dir
            assert work is not None and os.listdir(work) == []
            # The run's own workspace is the only one there: it leaves a file in it.
            leave = f"import glob\nfor d in glob.glob({str(work)!r} + '/run-*'):\n"
            leave += "    open(d + '/left.txt', 'w').write('x')\nprint(2)"
            assert (await tool.run(leave)).content == "2\n"
            assert os.listdir(work) == []
            root = tool.diagnostics.staging_root
            assert root is not None
        finally:
            await tool.aclose()
        return root

    root = asyncio.run(body())
    on_loop = threading.main_thread().name
    assert threads["bare"] == [on_loop, on_loop]  # the second found more than its script
    for name in ("made", "removed", "closed"):
        where = threads[name]
        assert where and all(t.startswith("lemon-exec-disk") for t in where), (name, where)
    assert len(threads["removed"]) == 1  # the workspace the run wrote into
    assert not root.exists()
    assert not [t for t in threading.enumerate() if t.name.startswith("lemon-exec-disk")]


def test_a_closed_hosts_kernels_and_files_are_gone_with_spares(tmp_path: Path) -> None:
    """Per-call with the template and a spare, closed right after runs: the spare being
    refilled, the used kernels stopping, the template: all gone when aclose returns."""

    async def body() -> None:
        tool = ExecuteCode(enabled_config(kernel_mode="per_call", warm_kernels=1))
        try:
            for _ in range(3):
                assert (await tool.run("print(1)")).content == "1\n"
            pids = {k.pid for k in tool.diagnostics.kernels} | set(tool.diagnostics.spare_pids)
            templates = {t.pid for t in tool.diagnostics.templates}
            root, runtime = tool.diagnostics.staging_root, tool.diagnostics.runtime_dir
        finally:
            await tool.aclose()
        for pid in pids | templates:
            assert pid is None or _gone(pid), pid
        assert root is not None and not root.exists()
        assert runtime is not None and not runtime.exists()
        assert os.getpid() not in {p for p in pids if p}

    asyncio.run(body())
