"""ManagedKernel: one lemon-python kernel process, its start, signals and end.

Started through jupyter_client's AsyncKernelManager (with KernelSockets in place of its
client), with the ipc transport and its connection file in the host's private 0700 runtime
directory (or forked from a template, :mod:`lemon_exec.template.client`). Its messages go through
:class:`~lemon_exec.host.kernels.local.channels.KernelChannels`, which routes them to the cell
that sent the request and keeps host memory independent of the kernel's good behaviour (no
frame over :data:`~lemon_exec.wire.limits.MAX_MESSAGE_BYTES` is buffered; the kernel keeps to
the same limit itself, so that is only a backstop).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import zmq
import zmq.asyncio
from jupyter_client.manager import AsyncKernelManager

from lemon_exec._constants import STARTUP_TIMEOUT_S
from lemon_exec.errors import InterpreterError, KernelStartError
from lemon_exec.host.disk import external, hygiene
from lemon_exec.host.disk.index import KernelStatus
from lemon_exec.host.kernels.backend import MessageSink
from lemon_exec.host.kernels.kernelspec import KERNEL_NAME, LemonKernelSpecManager
from lemon_exec.host.kernels.local.channels import KernelChannels
from lemon_exec.host.kernels.local.connfile import PrivateKernelManager
from lemon_exec.host.kernels.local.link_end import LinkEnd
from lemon_exec.host.kernels.local.sockets import KernelSockets
from lemon_exec.host.kernels.resource_limits import KernelCgroup
from lemon_exec.proc.exit_wait import wait_exit
from lemon_exec.proc.tree_removal import remove_tree
from lemon_exec.template.provisioner import ForkedProcess
from lemon_exec.wire import protocol
from lemon_exec.wire.limits import MAX_MESSAGE_BYTES

log = logging.getLogger(__name__)

_LIVENESS_POLL_S = 0.1
#: How long a SIGKILLed kernel may take to exit before jupyter_client's own wait takes over.
_EXIT_WAIT_S = 5.0


class ManagedKernel:
    """A running lemon-python kernel: the local backend's kernel handle.

    Create with :meth:`start`; dispose with :meth:`kill`. Implements
    :class:`lemon_exec.host.kernels.backend.KernelHandle`.
    """

    def __init__(
        self,
        km: AsyncKernelManager,
        sockets: KernelSockets,
        *,
        kernel_id: str,
        interpreter: str,
        log_path: Path,
        link: LinkEnd,
        sandbox_dir: Path | None = None,
    ) -> None:
        self.kernel_id = kernel_id
        #: A sandboxed kernel's own runtime directory (the only part of it the kernel sees).
        self._sandbox_dir = sandbox_dir
        self.interpreter = interpreter
        self.started_at = time.monotonic()
        self._km = km
        self._log_path = log_path
        self._channels = KernelChannels(sockets, link, kernel_id=kernel_id, is_alive=self.is_alive)
        #: The link that publishes the connection file to Jupyter Server (see publish()).
        self._published: Path | None = None
        self._disposed = False
        #: When the host last sent SIGINT (backend.dispose honours the grace period from then).
        self.interrupted_at: float | None = None
        #: Its resource-limit cgroup, set by the backend once it is placed there.
        self.cgroup: KernelCgroup | None = None
        self.status = KernelStatus(kernel_id, "per_call", "starting", km.connection_file)

    # -- lifecycle ------------------------------------------------------------------------

    @classmethod
    async def start(
        cls,
        *,
        interpreter: str,
        cwd: str,
        runtime_dir: Path,
        env: dict[str, str] | None = None,
        fork_server_id: str = "",
        timeout: float = STARTUP_TIMEOUT_S,
        sandbox: Callable[[Path], list[str]] | None = None,
    ) -> ManagedKernel:
        """Start a kernel and wait until it is ready; never leaves a process behind on failure.

        ``sandbox`` maps the kernel's own runtime directory to the argv prefix that confines
        it (see :mod:`lemon_exec.host.kernels.sandbox`). A sandboxed kernel's sockets and connection
        file live in that directory, the only part of the runtime directory it can see.
        """
        kernel_id = secrets.token_hex(8)
        sandbox_dir: Path | None = None
        socket_base = runtime_dir / f"k-{kernel_id}-ipc"
        connection_file = runtime_dir / f"kernel-{kernel_id}.json"
        prefix: list[str] = []
        if sandbox is not None:
            sandbox_dir = runtime_dir / kernel_id
            prefix = sandbox(sandbox_dir)  # may refuse: before anything exists
            sandbox_dir.mkdir(mode=0o700)
            # Shorter than the unsandboxed names, so check_socket_room's bound still holds.
            socket_base = sandbox_dir / "ipc"
            connection_file = sandbox_dir / f"kernel-{kernel_id}.json"
        # The host reads IOPub and sends bridge replies on a link of its own (link_end.py),
        # listening before the kernel starts: the kernel connects while it initialises.
        link_path = Path(f"{socket_base}-host")
        env = {**(env or {}), protocol.HOST_LINK_ENV: str(link_path)}
        spec_manager = LemonKernelSpecManager(
            interpreter=interpreter, env=env, fork_server_id=fork_server_id, argv_prefix=prefix
        )
        km = PrivateKernelManager(
            context=shared_context(),
            kernel_name=KERNEL_NAME,
            kernel_spec_manager=spec_manager,
            transport="ipc",
            ip=str(socket_base),
            connection_file=str(connection_file),
        )
        log_path = runtime_dir / f"kernel-{kernel_id}.log"
        log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        kernel: ManagedKernel | None = None
        link: LinkEnd | None = None
        sockets: KernelSockets | None = None
        try:
            link = LinkEnd(link_path)
            try:
                # Not wait_for: on 3.11 it drops a cancellation that lands as the launch
                # completes, and a closing host then waits for a whole start.
                async with asyncio.timeout(timeout):
                    await km.start_kernel(cwd=cwd, stdout=subprocess.DEVNULL, stderr=log_fd)
            except FileNotFoundError as exc:
                raise InterpreterError(
                    f"execute_code: python_path not found: {interpreter}; set python_path "
                    "(or LEMON_EXECUTE_CODE_PYTHON_PATH) to an existing Python interpreter"
                ) from exc
            except PermissionError as exc:
                raise InterpreterError(
                    f"execute_code: python_path is not executable: {interpreter}; set "
                    "python_path (or LEMON_EXECUTE_CODE_PYTHON_PATH) to a Python interpreter"
                ) from exc
            # Shell and control only: no heartbeat (liveness is polled on the process), no
            # stdin (scripts have none), and IOPub comes on the host link.
            sockets = KernelSockets(km, shared_context())
            kernel = cls(
                km,
                sockets,
                kernel_id=kernel_id,
                interpreter=interpreter,
                log_path=log_path,
                link=link,
                sandbox_dir=sandbox_dir,
            )
            kernel._channels.start()
            await kernel._wait_ready(timeout)
            return kernel
        except BaseException:
            if kernel is not None:
                await kernel.kill()
            else:
                if link is not None:
                    link.close()
                if sockets is not None:
                    sockets.close()
                await _kill_manager(km)
                _remove_dir(sandbox_dir)
            _unlink(log_path)
            raise
        finally:
            os.close(log_fd)

    async def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        waiting = self._channels.ready()
        try:
            while True:
                done, _ = await asyncio.wait({waiting}, timeout=_LIVENESS_POLL_S)
                if done:
                    waiting.result()
                    return
                if not await self.is_alive():
                    raise self._start_failure("the kernel process exited during startup")
                if time.monotonic() > deadline:
                    raise KernelStartError(
                        f"execute_code: the kernel did not become ready within "
                        f"{timeout:.0f} s; check that {self.interpreter} runs and has "
                        "ipykernel installed"
                    )
        finally:
            waiting.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await waiting

    def _start_failure(self, what: str) -> KernelStartError:
        tail = _read_tail(self._log_path)
        if "No module named" in tail and ("ipykernel" in tail or "lemon_exec" in tail):
            return InterpreterError(
                f"execute_code: {self.interpreter} has no ipykernel; install it with "
                f"`{self.interpreter} -m pip install ipykernel` or set python_path to an "
                "interpreter that has it"
            )
        detail = tail.strip().splitlines()[-1] if tail.strip() else "no error output"
        return KernelStartError(f"execute_code: {what} ({detail})")

    async def kill(self) -> None:
        """Kill the kernel's whole process group and remove its files (idempotent)."""
        if self._disposed:
            return
        self._disposed = True
        await self._channels.close()
        self._unpublish()
        await _kill_manager(self._km)
        _unlink(self._log_path)
        _remove_dir(self._sandbox_dir)

    def kill_sync(self) -> None:
        """SIGKILL the process group and remove files without awaiting (exit-time cleanup)."""
        if self._disposed:
            return
        self._disposed = True
        pgid = getattr(self._km.provisioner, "pgid", None)
        pid = self.pid
        hygiene.kill_kernel_tree(getattr(self._km.provisioner, "process", None))
        with contextlib.suppress(OSError, TypeError):
            if pgid:
                os.killpg(pgid, signal.SIGKILL)
            elif pid:
                os.kill(pid, signal.SIGKILL)
        self._channels.close_sync()
        self._unpublish()
        for path in (Path(self.connection_file), self._log_path):
            _unlink(path)
        _remove_dir(self._sandbox_dir)

    @property
    def disposed(self) -> bool:
        return self._disposed

    @property
    def link_ended(self) -> bool:
        return self._channels.link_ended

    def publish(self) -> None:
        """Link the connection file into the Jupyter external-kernels directory, if set.

        Only when ``LEMON_EXEC_JUPYTER_EXTERNAL_DIR`` names one (see docs/inspection.md):
        Jupyter Server started with ``allow_external_kernels`` then lists the kernel. A
        symlink, so that it dangles (and Jupyter drops the kernel) as soon as the
        connection file is gone, even when this host dies without unpublishing. Never
        fails the caller: a directory that cannot be used is logged and skipped.
        """
        if self._published is not None or self._disposed:
            return
        self._published = external.publish(self.kernel_id, Path(self.connection_file))

    def _unpublish(self) -> None:
        if self._published is not None:
            _unlink(self._published)
            self._published = None

    async def is_alive(self) -> bool:
        process = getattr(self._km.provisioner, "process", None)
        if isinstance(process, ForkedProcess) and process.orphaned:
            return False  # its template died: so does it, in a moment if not yet
        return not self._disposed and await self._km.is_alive()

    async def wait_exit(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the process to exit (its pidfd, not a poll);
        True once it has."""
        process = getattr(self._km.provisioner, "process", None)
        if process is None:
            return True
        return await wait_exit(process.pid, lambda: process.poll() is None, timeout)

    async def exit_status(self) -> int | None:
        """The process's exit status once it has ended (negative: killed by that signal)."""
        provisioner = self._km.provisioner
        process = getattr(provisioner, "process", None)
        if isinstance(process, ForkedProcess):
            # A forked kernel's status comes in the template's report, just after the reap.
            await process.settle()
        status = None if provisioner is None else await provisioner.poll()
        if self._sandbox_dir is not None and status is not None and 128 < status <= 128 + 64:
            # bwrap reports a kernel killed by signal N as exit status 128 + N.
            return -(status - 128)
        return status

    async def signal_group(self, signum: int) -> None:
        """Send ``signum`` to the kernel's process group (the script's children included)."""
        if signum in (signal.SIGTERM, signal.SIGKILL):
            self._channels.stopping = True
        with contextlib.suppress(ProcessLookupError, OSError, RuntimeError):
            await self._km.signal_kernel(signum)

    @property
    def pid(self) -> int | None:
        provisioner = self._km.provisioner
        return getattr(provisioner, "pid", None)

    @property
    def connection_file(self) -> str:
        return self._km.connection_file

    # -- messages (KernelChannels) --------------------------------------------------------

    @property
    def fault(self) -> str | None:
        """Why the kernel is no longer trusted (its first protocol fault), or None."""
        return self._channels.fault

    @property
    def invalid_messages(self) -> int:
        """How many messages failed their signature check or were malformed."""
        return self._channels.invalid_messages

    def execute(self, code: str, metadata: dict[str, Any], sink: MessageSink) -> str:
        """Send an execute_request whose outputs go to ``sink``; returns its msg_id."""
        return self._channels.execute(code, metadata, sink)

    def release(self, msg_id: str) -> None:
        """Stop routing messages of ``msg_id``; later ones are dropped."""
        self._channels.release(msg_id)

    def send_bridge_reply(self, content: dict[str, Any]) -> None:
        """Send a bridge reply on the host link, else on control (docs/comm-protocol.md)."""
        self._channels.send_bridge_reply(content)


_CONTEXT: zmq.asyncio.Context | None = None
#: First retry of a connection the kernel has not bound yet, and the backoff's ceiling.
_RECONNECT_IVL_MS = 2
_RECONNECT_IVL_MAX_MS = 100


def shared_context() -> zmq.asyncio.Context:
    """One zmq context (one IO thread) for every kernel connection of this process.

    jupyter_client would otherwise create two per kernel (IOPub comes on the host link,
    host/kernels/local/link_end.py). Receive queues are bounded (64 messages). No frame over
    MAX_MESSAGE_BYTES is accepted at all (MAXMSGSIZE), whatever the kernel sends.
    """
    global _CONTEXT
    if _CONTEXT is None or _CONTEXT.closed:
        _CONTEXT = zmq.asyncio.Context()
        _CONTEXT.setsockopt(zmq.RCVHWM, 64)
        _CONTEXT.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
        # The host connects before a new kernel has bound its sockets (ipc: refused until
        # then); zmq's default 100 ms retry interval was most of a kernel start's latency.
        # Retry soon, backing off to the default for a kernel that is gone.
        _CONTEXT.setsockopt(zmq.RECONNECT_IVL, _RECONNECT_IVL_MS)
        _CONTEXT.setsockopt(zmq.RECONNECT_IVL_MAX, _RECONNECT_IVL_MAX_MS)
    return _CONTEXT


async def _kill_manager(km: AsyncKernelManager) -> None:
    """SIGKILL the kernel's tree and group, wait for its exit on a pidfd, release its files.

    Not ``shutdown_kernel(now=True)``: that polls the process every 0.1 s and ends with a
    fixed 10 ms sleep (jupyter_client's ``in_pending_state``); it remains the fallback for a
    process that outlives the wait.
    """
    with contextlib.suppress(Exception):
        if km.has_kernel:
            provisioner = km.provisioner
            assert provisioner is not None
            process = getattr(provisioner, "process", None)
            if isinstance(process, subprocess.Popen) and process.poll() is None:
                # A cold-started kernel's tree (forked ones are their template's to kill):
                # read from /proc and killed in rounds, off the event loop.
                await asyncio.to_thread(hygiene.kill_kernel_tree, process)
            await km.signal_kernel(signal.SIGKILL)
            if process is not None and await wait_exit(
                process.pid, lambda: process.poll() is None, _EXIT_WAIT_S
            ):
                await provisioner.wait()  # reaps and forgets it: it has exited, no poll runs
            else:
                await km.shutdown_kernel(now=True)
    with contextlib.suppress(Exception):
        await km.cleanup_resources()


def _remove_dir(path: Path | None) -> None:
    """Remove a sandboxed kernel's runtime directory (bounded: the script could write there)."""
    if path is not None:
        with contextlib.suppress(OSError):
            remove_tree(path)


def _unlink(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


def _read_tail(path: Path, limit: int = 4096) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - limit))
            return fh.read().decode("utf-8", "replace")
    except OSError:
        return ""
