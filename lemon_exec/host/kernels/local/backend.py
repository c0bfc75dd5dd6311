"""The local kernel backend: kernel processes on this machine, over zmq ipc.

Kernels are launched through jupyter_client
(:class:`~lemon_exec.host.kernels.local.kernel.ManagedKernel`)
with their connection files in the host's private runtime directory. Once an
interpreter's fork server is ready (it imports the kernel's modules once, ~0.4 s), kernels
are forked from it instead of started cold. A start that finds it still starting waits for
it (that costs about what a cold launch racing the template for the CPU costs), up to
``START_WAIT_S``; a template that fails or stalls means an ordinary, cold start.

Under a sandbox (:mod:`lemon_exec.host.kernels.sandbox`) the template runs inside bubblewrap too,
and every kernel it forks builds its own sandbox before any of its code runs
(:mod:`lemon_exec.template.isolate`): the same view, PID, mount, IPC and network namespaces
as a kernel started cold under bwrap, which is what kernels do until the template is ready
(or where it cannot confine its children).
"""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from lemon_exec.errors import RefusedError
from lemon_exec.host.disk import external
from lemon_exec.host.disk.staging import StagingRoot
from lemon_exec.host.kernels import sandbox as sandboxes
from lemon_exec.host.kernels.backend import KernelHandle, dispose
from lemon_exec.host.kernels.local.kernel import ManagedKernel
from lemon_exec.host.kernels.resource_limits import KernelCgroup, Limiter, LimitSpec
from lemon_exec.template.client import START_WAIT_S, ForkServer

#: A fork server that died (e.g. the interpreter lacks ipykernel) is retried this rarely.
_FORK_SERVER_RETRY_S = 60.0
#: Fork-server ids are keys of a process-wide registry: unique across backends.
_SERVER_IDS = itertools.count(1)
#: Most fork-server templates kept after an environment change made them stale.
_MAX_RETIRED_FORK_SERVERS = 2
#: Variables an interpreter reads when it starts, so a forked kernel keeps its template's.
_STARTUP_PREFIXES = ("PYTHON", "LD_", "LC_", "LANG")

Spawn = Callable[[Coroutine[Any, Any, Any]], object]


class LocalBackend:
    """Local kernel processes, forked from a per-interpreter template when one is ready."""

    def __init__(
        self,
        staging: StagingRoot,
        *,
        fork_server: bool,
        spawn: Spawn,
        limits: LimitSpec | None = None,
        sandbox: sandboxes.SandboxSpec | None = None,
        hurry: asyncio.Event | None = None,
    ) -> None:
        self._staging = staging
        #: Set when the host closes: stops kill at once, without a grace period.
        self._hurry = hurry
        #: Resource limits of every kernel (host/kernels/resource_limits.py); each kernel's cgroup.
        self._limiter = Limiter(limits or LimitSpec())
        self._cgroups: dict[KernelHandle, KernelCgroup | None] = {}
        self._sandbox = sandbox if sandbox is not None and sandbox.enabled else None
        self._use_fork_server = fork_server and (
            self._sandbox is None or sandboxes.forked_kernels_supported()
        )
        self._spawn = spawn  # background work the engine waits for on close
        self._forkservers: dict[str, ForkServer] = {}
        #: The startup variables (see _startup_env) each fork server was started with.
        self._forkserver_env: dict[str, dict[str, str]] = {}
        #: Templates replaced after the environment changed: kernels they forked (spares,
        #: session kernels) still run under them, so they stay until the backend closes.
        self._retired: list[ForkServer] = []

    @property
    def sandboxed(self) -> bool:
        """Whether kernels start in a sandbox, whose view of the filesystem is fixed at start."""
        return self._sandbox is not None

    def templates(self) -> dict[str, ForkServer]:
        """The current fork-server template of each interpreter (retired ones left out)."""
        return dict(self._forkservers)

    async def start(
        self, interpreter: str, cwd: str, *, env: dict[str, str], timeout: float
    ) -> ManagedKernel:
        prefix = self._sandbox_prefix(interpreter, cwd)  # RefusedError: cannot start
        server = self._fork_server(interpreter, env)
        if server is not None and server.starting:
            # This interpreter's first starts: waiting for the template is about as fast as
            # a cold launch racing it for the CPU, and the kernel is then forked (less CPU,
            # ~25 MiB less memory). A template that fails or stalls means a cold start.
            await server.wait_ready(START_WAIT_S)
        group = self._limiter.prepare()  # LimitsUnavailable: a limit nothing here enforces
        try:
            kernel = await ManagedKernel.start(
                interpreter=interpreter,
                cwd=cwd,
                runtime_dir=self._staging.runtime_dir,
                env=env,
                fork_server_id=server.server_id if server is not None and server.ready else "",
                timeout=timeout,
                sandbox=prefix,
            )
        except BaseException:
            self._limiter.release(group)
            raise
        try:  # before any script runs: the kernel and its descendants go under the limits
            self._limiter.place(kernel.pid, group)
        except BaseException:
            await kernel.kill()
            self._limiter.release(group)
            raise
        kernel.cgroup = group
        self._cgroups[kernel] = group
        return kernel

    def _sandbox_prefix(self, interpreter: str, cwd: str) -> Callable[[Path], list[str]] | None:
        """The sandbox launcher for a kernel starting in ``cwd`` (None: no sandbox).

        Raises ``RefusedError`` naming the fix when the sandbox cannot start.
        """
        spec = self._sandbox
        if spec is None:
            return None
        bwrap = sandboxes.require(spec)
        # Per-call kernels start in the staging root (hidden inside): their view's working
        # directory is the host's, where a per-call run's cwd normally is.
        view = Path(cwd)
        if view == self._staging.work_dir:
            view = Path.cwd()
        staging = self._staging
        runtime = sandboxes.runtime_paths(interpreter)

        def prefix(kernel_dir: Path) -> list[str]:
            return sandboxes.kernel_argv_prefix(
                spec,
                bwrap=bwrap,
                cwd=view,
                kernel_dir=kernel_dir,
                staging_root=staging.path,
                pypath=staging.path / "pypath",
                runtime=runtime,
            )

        return prefix

    async def interrupt(self, kernel: KernelHandle) -> None:
        kernel.interrupted_at = time.monotonic()
        await kernel.signal_group(signal.SIGINT)

    async def stop(self, kernel: KernelHandle) -> None:
        exited = kernel.wait_exit if isinstance(kernel, ManagedKernel) else None
        await dispose(kernel, hurry=self._hurry, wait_exit=exited)
        if kernel in self._cgroups:
            self._limiter.release(self._cgroups.pop(kernel))

    def warm_up(self, interpreter: str, env: dict[str, str]) -> None:
        self._fork_server(interpreter, env)

    def _fork_server(self, interpreter: str, kernel_env: dict[str, str]) -> ForkServer | None:
        """The interpreter's fork server, started in the background on first use."""
        if not self._use_fork_server:
            return None
        env = {**os.environ, **kernel_env}
        if self._sandbox is not None:  # every kernel forked from it would inherit them
            hidden = set(sandboxes.hidden_env(self._sandbox, env))
            env = {k: v for k, v in env.items() if k not in hidden}
        server = self._forkservers.get(interpreter)
        if server is not None and self._forkserver_env.get(interpreter) != _startup_env(env):
            # A forked kernel gets the current environment, but what the interpreter read at
            # startup (sys.path from PYTHONPATH, the loader's LD_*, the locale) is the
            # template's: a template started under other values is retired, never used.
            # Closing it would kill the kernels it forked, so it waits for the backend's
            # close; after a few such changes kernels simply start the ordinary way.
            if len(self._retired) >= _MAX_RETIRED_FORK_SERVERS:
                return None
            self._forkservers.pop(interpreter)
            self._retired.append(server)
            server = None
        if server is not None and (server.alive or not server.started):
            return server
        if server is not None and server.retired and server.running:
            # It stopped answering (template/client.py): replaced at once. Kernels it forked
            # still run under it, so it is kept like a stale one, while there is room.
            self._forkservers.pop(interpreter)
            if len(self._retired) < _MAX_RETIRED_FORK_SERVERS:
                self._retired.append(server)
            else:
                self._spawn(server.aclose())
        elif server is not None:
            # It died. One that never became ready (the interpreter lacks ipykernel, ...) is
            # retried at most once a minute; one that served (a script killed it) at once.
            self._spawn(server.aclose())
            if not server.was_ready and time.monotonic() - server.created < _FORK_SERVER_RETRY_S:
                return None
        sandbox = self._template_sandbox(interpreter)
        if self._sandbox is not None and sandbox is None:
            return None  # no bwrap: start() refuses with the fix
        server = ForkServer(
            f"{os.getpid()}-{next(_SERVER_IDS)}",
            interpreter,
            env,
            str(self._staging.work_dir),
            sandbox=sandbox,
            runtime_dir=self._staging.runtime_dir,
            links_dir=external.external_dir(),
        )
        self._forkserver_env[interpreter] = _startup_env(env)
        self._forkservers[interpreter] = server
        self._spawn(server.start())
        return server

    def _template_sandbox(
        self, interpreter: str
    ) -> tuple[list[str], list[str], Callable[[list[str]], Any]] | None:
        """A sandboxed template's launcher, probe-kernel options and argv splitter (None:
        no sandbox, or bwrap is missing)."""
        spec = self._sandbox
        if spec is None:
            return None
        try:
            bwrap = sandboxes.require(spec)
        except RefusedError:
            return None
        runtime = self._staging.runtime_dir
        # The probe: a kernel view like any other (its own directory: the runtime one).
        probe = sandboxes.kernel_argv_prefix(
            spec,
            bwrap=bwrap,
            cwd=runtime,
            kernel_dir=runtime,
            staging_root=self._staging.path,
            pypath=self._staging.path / "pypath",
            runtime=sandboxes.runtime_paths(interpreter),
        )
        split = sandboxes.split_kernel_argv([*probe, interpreter])
        if split is None:
            return None
        launcher = sandboxes.template_argv_prefix(spec, bwrap=bwrap)
        return launcher, split[0], sandboxes.split_kernel_argv

    def emergency_cleanup(self) -> None:
        for server in [*self._forkservers.values(), *self._retired]:
            server.kill_sync()
        self._limiter.close()

    async def close_templates(self) -> None:
        """Stop every fork-server template (each kills what it forked), all at once."""
        await asyncio.gather(
            *(s.aclose() for s in [*self._forkservers.values(), *self._retired]),
            return_exceptions=True,
        )

    async def aclose(self) -> None:
        await self.close_templates()
        self._forkservers.clear()
        self._retired.clear()
        self._cgroups.clear()
        self._limiter.close()  # after the engine killed every kernel: their cgroups go


def _startup_env(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith(_STARTUP_PREFIXES)}
