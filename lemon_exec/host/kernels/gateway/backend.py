"""The gateway kernel backend: kernels behind Jupyter Enterprise Gateway (``gateway_url``).

Implements :class:`lemon_exec.host.kernels.backend.KernelBackend` over the gateway's REST API and
kernel websocket (:mod:`lemon_exec.host.kernels.gateway.client`), with
:class:`~lemon_exec.host.kernels.gateway.kernel.GatewayKernel` as the handle. Everything above the
engine (both modes, the warm spares, the session registry, the comm bridge and its helpers,
policy, budgets) is unchanged and runs on this host; only the kernels run elsewhere.

What lemon_exec enforces on its own machine does not reach a kernel it cannot see: the
sandbox and the resource limits are refused with a gateway (they are the cluster's job:
the kernel image, the pod's limits), never silently dropped. See docs/scale-out.md.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
import uuid
from collections.abc import Callable, Coroutine
from typing import Any

from lemon_exec.config import ExecuteCodeConfig
from lemon_exec.errors import RefusedError
from lemon_exec.host.kernels.backend import KernelHandle
from lemon_exec.host.kernels.gateway import client
from lemon_exec.host.kernels.gateway.client import Gateway
from lemon_exec.host.kernels.gateway.kernel import (
    REST_TIMEOUT_S,
    SYNC_DELETE_TIMEOUT_S,
    GatewayKernel,
)
from lemon_exec.host.kernels.kernelspec import KERNEL_NAME

log = logging.getLogger(__name__)

Spawn = Callable[[Coroutine[Any, Any, Any]], object]

#: Settings whose non-default value the gateway backend refuses, and the refusal's reason.
_LOCAL_ONLY = (
    ("kernel_memory_mb", "a memory limit"),
    ("kernel_max_processes", "a process limit"),
    ("kernel_max_open_files", "an open-files limit"),
)


class GatewayBackend:
    """Kernels started, interrupted and stopped through an Enterprise Gateway."""

    def __init__(self, config: ExecuteCodeConfig, *, spawn: Spawn) -> None:
        self._config = config
        self._spawn = spawn  # background work the engine waits for on close
        self.gateway = Gateway(config.gateway_url, config.gateway_auth_token)
        self.kernel_name = config.gateway_kernel_name or KERNEL_NAME
        #: Kernels asked for but not yet handed to the engine: deleted if the host exits.
        self._starting: set[str] = set()

    @property
    def sandboxed(self) -> bool:
        return False  # a sandbox is refused with a gateway (see check_settings)

    def check_settings(self) -> None:
        """Refuse the settings only a local kernel can honour (``RefusedError``)."""
        config = self._config
        if config.sandbox != "none":
            raise RefusedError(
                f"execute_code: sandbox = {config.sandbox!r} cannot apply to kernels behind "
                f"the Enterprise Gateway at {self.gateway.url} (gateway_url): confine them "
                "where they run (the kernel image and pod; docs/scale-out.md) and set sandbox "
                'to "none"; nothing ran'
            )
        for key, what in _LOCAL_ONLY:
            if getattr(config, key):
                raise RefusedError(
                    f"execute_code: {key} = {getattr(config, key)} asks for {what}, which "
                    "lemon_exec cannot enforce on kernels behind the Enterprise Gateway "
                    f"(gateway_url): set it on the kernels' pods or containers "
                    f"(docs/scale-out.md) and set {key} to 0; nothing ran"
                )

    async def start(
        self, interpreter: str, cwd: str, *, env: dict[str, str], timeout: float
    ) -> GatewayKernel:
        """A ready remote kernel. ``interpreter``, ``cwd`` and ``env`` are the host's and
        do not apply: the kernelspec and the gateway decide how and where it runs."""
        self.check_settings()
        kernel_id = str(uuid.uuid4())  # ours, so a start that fails midway can be deleted
        self._starting.add(kernel_id)
        deadline = time.monotonic() + timeout
        # Its own task: a start given up (the call's deadline or abort) leaves the request
        # running, since the gateway starts the kernel all the same; it is deleted after.
        request = asyncio.ensure_future(
            client.start_kernel(
                self.gateway, self.kernel_name, kernel_id, client.request_env(), timeout
            )
        )
        try:
            await asyncio.shield(request)
            remaining = max(0.1, deadline - time.monotonic())
            kernel = await GatewayKernel.open(self.gateway, kernel_id, remaining)
        except BaseException:
            # Never leave a kernel behind: it may have started although the answer was lost.
            # In the background, so the failure is reported at once.
            self._spawn(self._delete(kernel_id, request))
            raise
        self._starting.discard(kernel_id)
        return kernel

    async def _delete(self, kernel_id: str, request: asyncio.Future[None]) -> None:
        try:
            # A delete before the gateway has the kernel finds nothing (404) and the kernel
            # would start afterwards: wait for the start request to end first (its timeout).
            await asyncio.wait({request})
            if not request.cancelled():
                request.exception()  # retrieved: its failure was reported, or is moot
            await client.delete_kernel(self.gateway, kernel_id, REST_TIMEOUT_S)
        finally:
            self._starting.discard(kernel_id)

    async def interrupt(self, kernel: KernelHandle) -> None:
        kernel.interrupted_at = time.monotonic()
        await kernel.signal_group(signal.SIGINT)

    async def stop(self, kernel: KernelHandle) -> None:
        """Shut the kernel down (the gateway asks it to exit, then kills it)."""
        await kernel.kill()

    def warm_up(self, interpreter: str, env: dict[str, str]) -> None:
        """Nothing to prepare here (the per-call runs keep the spares)."""

    def emergency_cleanup(self) -> None:
        for kernel_id in list(self._starting):
            client.delete_kernel_sync(self.gateway, kernel_id, SYNC_DELETE_TIMEOUT_S)
        self._starting.clear()

    async def aclose(self) -> None:
        """Nothing of its own runs (kernels are the engine's to stop)."""
        await asyncio.sleep(0)
