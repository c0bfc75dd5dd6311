"""jupyter_client's way to the fork server: a provisioner, and a forked kernel's process.

:class:`ForkServerProvisioner` (entry point ``lemon-forkserver``) launches a kernel by a fork
request to the :class:`~lemon_exec.template.client.ForkServer` whose id it is configured
with, instead of Popen, and otherwise behaves like the LocalProvisioner: same
process-group signalling, same cleanup. When no fork server is ready, or the one it has
fails, it falls back to a normal launch, so it can never make a start fail. Under the
sandbox only a kernel whose sandbox the child can build itself is forked; the rest start
cold under bwrap, never unconfined in the template's view.

A forked kernel is the template's child, not ours: :class:`ForkedProcess` gives it the
Popen surface LocalProvisioner uses, its exit status taken from the template's report.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import time
from typing import Any

from jupyter_client.provisioning.local_provisioner import LocalProvisioner
from traitlets import Unicode

from lemon_exec.template.client import CHECK_S, ForkServer, find_server

log = logging.getLogger(__name__)


class ForkedProcess:
    """The Popen surface LocalProvisioner uses, for a kernel forked by the template."""

    def __init__(self, server: ForkServer, pid: int) -> None:
        self._server = server
        self.pid = pid
        self.returncode: int | None = None
        self.stdin = self.stdout = self.stderr = None

    def poll(self) -> int | None:
        if self.returncode is None:
            status = self._server.exit_status(self.pid)
            if status is not None:
                self.returncode = status
            elif not _exists(self.pid):
                if self._server.running:
                    # Reaped, its report still in flight: ended, but the status is not final.
                    return -signal.SIGKILL
                self.returncode = -signal.SIGKILL  # gone without a report: the template died
        return self.returncode

    async def settle(self, timeout: float = 5.0) -> int | None:
        """The exit status once the template's report is in (``poll()`` may answer first).

        The template reaps and reports at once; the bound is for a template too loaded to
        (its death ends the wait sooner: ``poll()`` then settles on -SIGKILL itself). A
        stopped template never reports: it is retired, which ends the wait too.
        """
        deadline = time.monotonic() + timeout
        checked = time.monotonic()
        while self.returncode is None and self.poll() is not None:
            if time.monotonic() > deadline:
                self.returncode = -signal.SIGKILL
                break
            if time.monotonic() - checked >= CHECK_S:
                checked = time.monotonic()
                if self._server.stopped:
                    self._server.retire("was stopped")
            await asyncio.sleep(0.002)
        return self.poll()

    @property
    def orphaned(self) -> bool:
        """Whether its template is gone, or killed and about to be: the kernel dies with it,
        if it has not yet (its parent watch kills it), so it must not be handed out."""
        return not self._server.running or self._server.killed

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (status := self.poll()) is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(str(self.pid), timeout or 0)
            time.sleep(0.005)
        return status

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, signum)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def _exists(pid: int) -> bool:
    """Whether ``pid`` still runs: a zombie does not (a kernel whose template died is
    reparented and stays a zombie until its new parent reaps it)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            state = stat.read().rpartition(b")")[2].split()[:1]
    except OSError:
        return True  # no /proc: kill() said it exists
    return state != [b"Z"]


class ForkServerProvisioner(LocalProvisioner):
    """Launches kernels through a ready :class:`ForkServer`, else like LocalProvisioner."""

    server_id = Unicode("", config=True, help="Id of the ForkServer to launch kernels with.")

    async def launch_kernel(self, cmd: list[str], **kwargs: Any) -> Any:
        server = find_server(self.server_id)
        isolate: list[str] | None = None
        argv = cmd
        if server is not None and server.sandboxed:
            # Only a kernel whose sandbox the child can build itself is forked: the rest
            # start cold under bwrap, never unconfined in the template's view.
            split = server.split_sandbox(cmd)
            isolate, argv = split if split is not None else (None, [])
        if (
            server is None
            or not server.ready
            or len(argv) < 3
            or argv[1:3] != ["-m", "lemon_exec.kernel"]
        ):
            return await super().launch_kernel(cmd, **kwargs)
        env = kwargs.get("env") or dict(os.environ)
        cwd = str(kwargs.get("cwd") or os.getcwd())
        stderr = kwargs.get("stderr")
        try:
            pid = await server.fork(
                argv[3:], env, cwd, stderr if isinstance(stderr, int) else None, isolate
            )
        except OSError as exc:  # no answer in time, or no fork: an ordinary launch instead
            log.warning("execute_code: fork server failed (%s); starting the kernel cold", exc)
            return await super().launch_kernel(cmd, **kwargs)
        # Duck-typed: LocalProvisioner only polls, waits for and signals its process.
        self.process = ForkedProcess(server, pid)  # type: ignore[assignment]
        self.pid = pid
        self.pgid = pid  # the child called setsid(): it leads its own process group
        self.cwd = cwd
        return self.connection_info
