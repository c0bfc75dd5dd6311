"""Jupyter Server support for viewing live lemon_exec session kernels (docs/inspection.md).

Jupyter Server lists session kernels as *external kernels* (connection files a host links
into ``external_connection_dir``, see :mod:`lemon_exec.host.disk.external`), but it does not own
them, and its stock handling of such kernels fails: Interrupt and Restart answer HTTP 500,
and once a kernel was shut down from the UI, ``GET /api/kernels`` answers 500 for good as
soon as its connection file goes. This module makes every command safe and clear:

- :class:`LemonMappingKernelManager` (``ServerApp.kernel_manager_class``): the kernel list
  survives kernels that were shut down and then went away; *Interrupt* sends an
  ``interrupt_request`` on the control channel (the server has no process to signal) and
  reports the kernel's refusal as HTTP 409; *Shut Down* forgets the kernel in this server
  only (it keeps running for the agent); an external kernel's model carries
  ``"lemon_exec": {"restart_refused": <reason>}``, so a client can refuse before it asks.
- the server extension (``ServerApp.jpserver_extensions``): *Restart* of an external kernel
  answers HTTP 409 with the reason, where stock Jupyter Server turns every failure into 500.

JupyterLab shows a 409's reason through the lemon-exec-jupyterlab extension
(``lemon_exec/labextension``), whose notifications cut messages at 140 characters: keep the
refusal texts short.
"""

from __future__ import annotations

import time
from typing import Any

from jupyter_core.utils import ensure_async
from jupyter_server.services.kernels.handlers import KernelActionHandler, _kernel_id_regex
from jupyter_server.services.kernels.kernelmanager import AsyncMappingKernelManager
from tornado import web

#: How long Interrupt waits for the kernel's interrupt_reply.
INTERRUPT_REPLY_TIMEOUT_S = 5.0

#: The kernel model's entry (``GET /api/kernels``) for a kernel this server does not own.
MODEL_KEY = "lemon_exec"

#: Short enough for JupyterLab's notification (lemon_exec/labextension), which cuts at 140.
RESTART_REFUSED = (
    "an external kernel (a lemon_exec agent's session) cannot be restarted from here: "
    "that would destroy its state"
)


class LemonMappingKernelManager(AsyncMappingKernelManager):
    """Jupyter Server's kernel manager, safe with external (lemon_exec) kernels."""

    # jupyter_client types this class's methods as its synchronous base's (run_sync wrappers
    # returning None); the overrides and awaits below follow the real, asynchronous ones.

    def _forget_gone(self) -> None:
        # jupyter_client drops an external kernel when its file goes by deleting it from
        # _kernels, which raises KeyError (HTTP 500 on every later listing) when the kernel
        # was already shut down here. Drop such entries first.
        files = getattr(self, "kernel_id_to_connection_file", {})
        for kernel_id, path in list(files.items()):
            if kernel_id not in self._kernels and not path.is_file():
                del files[kernel_id]

    def list_kernel_ids(self) -> list[str]:
        self._forget_gone()
        return super().list_kernel_ids()

    def list_kernels(self) -> list[dict[str, Any]]:
        self._forget_gone()
        kernels: list[dict[str, Any]] = super().list_kernels()  # type: ignore[no-untyped-call]
        return kernels

    def kernel_model(self, kernel_id: str) -> dict[str, Any]:
        # Tells a client, before it asks, that Restart would be refused and why: JupyterLab
        # drops its running cells' outputs as soon as it sends a restart request.
        model: dict[str, Any] = super().kernel_model(kernel_id)  # type: ignore[no-untyped-call]
        if not self._kernels[kernel_id].owns_kernel:
            model[MODEL_KEY] = {"restart_refused": RESTART_REFUSED}
        return model

    async def interrupt_kernel(self, kernel_id: str) -> None:  # type: ignore[override]
        km = self.get_kernel(kernel_id)
        if km.owns_kernel:
            await super().interrupt_kernel(kernel_id)  # type: ignore[misc]  # a coroutine
            return
        reply = await _control_request(km, "interrupt_request")
        if reply is None:
            raise web.HTTPError(
                504,
                f"the kernel did not answer the interrupt request within "
                f"{INTERRUPT_REPLY_TIMEOUT_S:g} s",
            )
        content = reply.get("content") or {}
        if content.get("status") != "ok":
            why = str(content.get("evalue") or content.get("ename") or "no reason given")
            raise web.HTTPError(409, "interrupt refused: " + why.replace("%", "%%"))
        self.log.info("Kernel interrupted (interrupt_request): %s", kernel_id)

    async def restart_kernel(self, kernel_id: str, now: bool = False) -> None:  # type: ignore[override]
        if not self.get_kernel(kernel_id).owns_kernel:
            raise web.HTTPError(409, RESTART_REFUSED)
        await super().restart_kernel(kernel_id, now=now)  # type: ignore[no-untyped-call]

    async def shutdown_kernel(self, kernel_id: str, *args: Any, **kwargs: Any) -> None:  # type: ignore[override]
        km = self._kernels.get(kernel_id)
        if km is not None and not km.owns_kernel:
            # Forget it here; it is not ours to stop (and a managed kernel would refuse).
            self.remove_kernel(kernel_id)
            self._kernel_connections.pop(kernel_id, None)
            self.log.info("External kernel forgotten (it keeps running): %s", kernel_id)
            return
        await super().shutdown_kernel(kernel_id, *args, **kwargs)  # type: ignore[no-untyped-call]


async def _control_request(km: Any, msg_type: str) -> dict[str, Any] | None:
    """Send ``msg_type`` on the kernel's control channel; its reply, or None on timeout."""
    kc = km.client()
    kc.start_channels(shell=False, iopub=False, stdin=False, hb=False, control=True)
    try:
        msg = kc.session.msg(msg_type, {})
        kc.control_channel.send(msg)
        deadline = time.monotonic() + INTERRUPT_REPLY_TIMEOUT_S
        while (remaining := deadline - time.monotonic()) > 0:
            try:
                reply = await ensure_async(kc.control_channel.get_msg(timeout=remaining))
            except Exception:  # queue.Empty or TimeoutError on timeout, whichever client
                return None
            if reply.get("parent_header", {}).get("msg_id") == msg["header"]["msg_id"]:
                return dict(reply)
        return None
    finally:
        kc.stop_channels()


class _ActionHandler(KernelActionHandler):
    """Interrupt and restart, with a refusal reported as itself instead of HTTP 500."""

    @web.authenticated
    async def post(self, kernel_id: str, action: str) -> None:
        km = self.kernel_manager
        if action == "restart" and kernel_id in km and not km.get_kernel(kernel_id).owns_kernel:
            raise web.HTTPError(409, RESTART_REFUSED)
        # tornado types an @authenticated method as returning an awaitable or None.
        await ensure_async(super().post(kernel_id, action))


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    return [{"module": "lemon_exec.viewer"}]


def _load_jupyter_server_extension(serverapp: Any) -> None:
    # Handlers added by an extension take precedence over the server's own.
    serverapp.web_app.add_handlers(
        ".*$",
        [
            (
                serverapp.base_url.rstrip("/") + rf"/api/kernels/{_kernel_id_regex}/"
                r"(?P<action>restart|interrupt)",
                _ActionHandler,
            )
        ],
    )
    if not isinstance(serverapp.kernel_manager, LemonMappingKernelManager):
        serverapp.log.warning(
            "lemon_exec.viewer: set ServerApp.kernel_manager_class="
            "lemon_exec.viewer.LemonMappingKernelManager too (docs/inspection.md)"
        )


__all__ = ["LemonMappingKernelManager"]
