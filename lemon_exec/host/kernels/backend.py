"""The kernel-backend seam: where kernels run, behind one interface.

A backend starts a kernel and hands back a :class:`KernelHandle`, which carries the
kernel's channels (execute a cell, route its messages to a sink, send bridge replies) and
its signals (interrupt, terminate). The engine supervises handles (tracking, telemetry,
the index); the per-call and session runs and the comm bridge only ever see handles. There
are two:
:class:`lemon_exec.host.kernels.local.backend.LocalBackend` (local processes over zmq ipc,
forked from a per-interpreter fork server when one is ready) and
:class:`lemon_exec.host.kernels.gateway.backend.GatewayBackend` (kernels a Jupyter Enterprise
Gateway runs); nothing above the engine knows which one it has.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from lemon_exec._constants import GRACE_S
from lemon_exec._sizes import format_size
from lemon_exec.host.disk.index import KernelStatus
from lemon_exec.host.kernels.resource_limits import KernelCgroup
from lemon_exec.wire.limits import MAX_MESSAGE_BYTES


class MessageSink(Protocol):
    """Receives the messages whose parent is one request of ours."""

    def on_iopub(self, msg: dict[str, Any]) -> None: ...

    def on_reply(self, msg: dict[str, Any]) -> None: ...

    def on_dropped(self, channel: str, note: str) -> None:
        """A message on ``channel`` was refused (too large), perhaps with others around it."""
        ...

    def on_protocol_fault(self, channel: str, reason: str) -> None:
        """A message on ``channel`` failed its signature check or was malformed."""
        ...


class KernelHandle(Protocol):
    """One running kernel and the host's channels to it."""

    kernel_id: str
    started_at: float  # time.monotonic() at start
    status: KernelStatus  # what the kernel index records for it
    #: When the host last interrupted it (stopping honours the grace period from then).
    interrupted_at: float | None
    #: Its resource-limit cgroup (lemon_exec.host.kernels.resource_limits), or None.
    cgroup: KernelCgroup | None

    @property
    def fault(self) -> str | None:
        """Why the kernel is no longer trusted (its first protocol fault), or None."""
        ...

    @property
    def invalid_messages(self) -> int:
        """How many messages failed their signature check or were malformed."""
        ...

    @property
    def pid(self) -> int | None: ...

    @property
    def disposed(self) -> bool: ...

    @property
    def link_ended(self) -> bool:
        """The kernel closed its host link (it died, or broke the link); False without one."""
        ...

    # -- channels ------------------------------------------------------------------------

    def execute(self, code: str, metadata: dict[str, Any], sink: MessageSink) -> str:
        """Send an execute_request whose messages go to ``sink``; returns its msg_id."""
        ...

    def release(self, msg_id: str) -> None:
        """Stop routing messages of ``msg_id``."""
        ...

    def send_bridge_reply(self, content: dict[str, Any]) -> None:
        """Answer a helper call (on the control channel: see docs/comm-protocol.md)."""
        ...

    # -- process -------------------------------------------------------------------------

    async def is_alive(self) -> bool: ...

    async def exit_status(self) -> int | None: ...

    async def signal_group(self, signum: int) -> None:
        """Signal the kernel and everything it started (SIGINT interrupts a cell)."""
        ...

    async def kill(self) -> None:
        """Kill at once and release every resource (idempotent)."""
        ...

    def kill_sync(self) -> None:
        """Kill without awaiting (exit-time cleanup)."""
        ...

    def publish(self) -> None:
        """Make the kernel visible to people's tools (e.g. Jupyter Server), if configured."""
        ...


class KernelBackend(Protocol):
    """Starts, interrupts and stops kernels somewhere; the engine's only way to make one."""

    async def start(
        self, interpreter: str, cwd: str, *, env: dict[str, str], timeout: float
    ) -> KernelHandle:
        """A ready kernel, or ``KernelStartError``/``InterpreterError``/``TimeoutError``.

        Never leaves anything running on failure.
        """
        ...

    async def interrupt(self, kernel: KernelHandle) -> None:
        """Interrupt the running cell (the kernel is discarded afterwards)."""
        ...

    async def stop(self, kernel: KernelHandle) -> None:
        """Stop ``kernel``: terminate, one grace period, then kill; files removed."""
        ...

    def warm_up(self, interpreter: str, env: dict[str, str]) -> None:
        """Prepare fast starts for ``interpreter`` in the background (may do nothing)."""
        ...

    def emergency_cleanup(self) -> None:
        """Exit-time cleanup without a loop: kill whatever the backend itself runs."""
        ...

    async def aclose(self) -> None:
        """Stop whatever the backend itself runs (kernels are the engine's to stop)."""
        ...


def drop_note(size: int | None, *, lost_around: bool = False) -> str:
    """The line a cell's output gets when the host refused a message from the kernel.

    ``size`` is the refused message's (None: unknown); ``lost_around`` says that messages
    around it may be missing too (the channel had to reconnect).
    """
    what = f"a {format_size(size)} message" if size is not None else "a message"
    note = (
        f"[{what} from the kernel was dropped: over the "
        f"{MAX_MESSAGE_BYTES // 2**20} MiB per-message limit"
    )
    if lost_around:
        note += "; output sent while the host reconnected (a few ms) may be missing too"
    return note + "]"


#: Waits up to the given seconds for a kernel's process to exit; True once it has.
ExitWait = Callable[[float], Awaitable[bool]]


async def dispose(
    kernel: KernelHandle,
    *,
    hurry: asyncio.Event | None = None,
    wait_exit: ExitWait | None = None,
) -> None:
    """Discard a kernel: SIGTERM its group, one grace period, then SIGKILL and clean up.

    An interrupted kernel first gets what is left of its SIGINT grace period. Once ``hurry``
    is set (the host is closing and kills it anyway), no grace period is waited for, and one
    under way ends at once. ``wait_exit`` waits for the process's exit as an event (a pidfd);
    without it the process is polled.
    """
    if kernel.disposed:
        return
    if kernel.interrupted_at is not None:
        await _wait_exit(kernel, kernel.interrupted_at + GRACE_S, hurry, wait_exit)
    await kernel.signal_group(signal.SIGTERM)  # always: the script's children may be left
    await _wait_exit(kernel, time.monotonic() + GRACE_S, hurry, wait_exit)
    await kernel.kill()


async def _wait_exit(
    kernel: KernelHandle,
    deadline: float,
    hurry: asyncio.Event | None,
    wait_exit: ExitWait | None,
) -> None:
    """Until the kernel exits, ``deadline`` passes or ``hurry`` is set, whichever is first."""
    remaining = deadline - time.monotonic()
    if remaining <= 0 or (hurry is not None and hurry.is_set()):
        return
    waits: list[asyncio.Future[Any]] = []
    if wait_exit is not None:
        waits.append(asyncio.ensure_future(wait_exit(remaining)))
    else:
        waits.append(asyncio.ensure_future(_poll_exit(kernel, deadline)))
    if hurry is not None:
        waits.append(asyncio.ensure_future(hurry.wait()))
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiting in waits:
            waiting.cancel()
        await asyncio.gather(*waits, return_exceptions=True)


async def _poll_exit(kernel: KernelHandle, deadline: float) -> None:
    while time.monotonic() < deadline and await kernel.is_alive():
        await asyncio.sleep(0.02)


def execute_request_content(code: str) -> dict[str, Any]:
    """The content of a script cell's ``execute_request``, the same on every backend."""
    return {
        "code": code,
        "silent": False,
        "store_history": False,
        "user_expressions": {},
        "allow_stdin": False,
        "stop_on_error": False,
    }
