"""LemonKernel: an IPython kernel that also runs lemon scripts with a per-cell bridge.

An execute_request whose metadata carries a ``lemon`` entry is a script run: it gets a fresh
bridge (comm id, token, text budget), runs as one unit (see :mod:`script`), and its reply
carries the outcome under ``lemon``. Every other request is ordinary IPython, so JupyterLab,
jupyter console and nbclient work with this kernel as with ipykernel.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sys
import threading
from typing import Any

from ipykernel.ipkernel import IPythonKernel
from ipykernel.zmqshell import ZMQInteractiveShell
from IPython.core.autocall import ZMQExitAutocall  # where it is defined and exported
from traitlets import Float, Type, default

from lemon_exec.kernel import cells, helpers, images, ipykernel_patches, prebuilt, script
from lemon_exec.kernel.bridge import CellBridge
from lemon_exec.kernel.streams import BoundedOutStream, ChunkedStream
from lemon_exec.wire import cell_setup, jupyter_messages, protocol, script_outcome

#: What a person attached to a managed kernel reads when they type ``exit`` or ``quit``.
MANAGED_EXIT_NOTE = (
    "This kernel belongs to a lemon_exec session and keeps running (state kept); "
    "your console detaches."
)


#: The interrupt_reply error a viewer gets while the agent's script runs (docs/inspection.md).
AGENT_CELL_NOT_INTERRUPTIBLE = (
    "the running cell is the lemon_exec agent's script: a viewer can interrupt only its own cells"
)


def _managed() -> bool:
    return os.environ.get(protocol.MANAGED_ENV) == "1"


class ScriptAwareExit(ZMQExitAutocall):
    """``exit``/``quit`` in the namespace: end a script, or leave a console.

    In a lemon script, ``exit(n)`` raises SystemExit(n) like Python's own ``exit``, so the
    script ends with ``Script exited with code n`` and the kernel stays. In an ordinary cell
    (a console) it keeps IPython's meaning: ``exit(keep_kernel=False)`` asks to end the
    console, and the kernel too unless it is managed (see :meth:`LemonShell.ask_exit`).
    """

    # IPython leaves its autocall classes unannotated: calls into them are untyped calls.
    def __call__(self, code: object = None, keep_kernel: bool = False) -> None:  # type: ignore[override]
        if script.in_script():
            raise SystemExit(code)
        # IPython's console signature: the first positional argument is keep_kernel.
        super().__call__(keep_kernel=bool(keep_kernel or code))  # type: ignore[no-untyped-call]


class LemonShell(ZMQInteractiveShell):
    # ipykernel leaves ZMQInteractiveShell's methods unannotated: calls into them are untyped.
    @classmethod
    def instance(cls, *args: Any, **kwargs: Any) -> LemonShell:
        # In a forked kernel: the shell the template built, if it fits (kernel/prebuilt.py).
        prebuilt.adopt(cls, kwargs)
        shell = super().instance(*args, **kwargs)
        assert isinstance(shell, LemonShell)
        return shell

    @default("exiter")
    def _default_exiter(self) -> ScriptAwareExit:
        return ScriptAwareExit(self)  # type: ignore[no-untyped-call]

    def ask_exit(self) -> None:
        # IPython stops the kernel's event loop here (exit_now) unless keep_kernel was given,
        # before any shutdown_request arrives, so refusing that request is not enough: a
        # managed kernel always keeps running and tells the console to detach only.
        if _managed():
            # ipykernel declares it ``= None`` yet stores a bool there (ZMQExitAutocall).
            self.keepkernel_on_exit = True  # type: ignore[assignment]
            print(MANAGED_EXIT_NOTE)
        super().ask_exit()  # type: ignore[no-untyped-call]


class LemonKernel(IPythonKernel):
    # ipykernel leaves the kernel's methods unannotated: calls into them (super(), self) are
    # untyped calls, each marked. ``session`` is Optional in the traits but always set by the
    # kernel app before any request arrives.
    shell_class = Type(LemonShell)
    implementation = "lemon-python"
    implementation_version = str(protocol.PROTOCOL_VERSION)
    banner = "lemon-python: IPython kernel for lemon_exec (helpers need a lemon_exec host)"
    # ipykernel sleeps 0.5 ms after every cell, before its reply, so that output would reach
    # clients first (an old workaround). Clients wait for the idle status, which IOPub sends
    # after the cell's output anyway; the host does (host/cell/execute.py). Half a millisecond of
    # every cell's round trip, for nothing. (A private trait: see ipykernel_patches.)
    _execute_sleep = Float(0.0).tag(config=True)

    def __init__(self, **kwargs: Any) -> None:
        with ipykernel_patches.kernel_init_without_module_list():
            super().__init__(**kwargs)  # type: ignore[no-untyped-call]
        # What runs on the main thread, for interrupt_request (control thread): "idle", the
        # agent's "script", or a viewer's ordinary "cell". Changed and read under the lock.
        self._running = "idle"
        self._running_lock = threading.Lock()
        cells.install_thread_tagging()
        # Scripts never read stdin; ordinary cells keep ipykernel's input() forwarding.
        sys.stdin = script.NoStdin()
        script.detach_fd0()
        if self.shell is not None:
            helpers.install(self.shell.user_ns)
            images.route_displays(self.shell)

    @property
    def kernel_info(self) -> dict[str, Any]:
        info = dict(super().kernel_info)
        info["lemon_protocol"] = protocol.PROTOCOL_VERSION
        return info

    # -- shutdown -------------------------------------------------------------------------

    async def shutdown_request(self, stream: Any, ident: Any, parent: dict[str, Any]) -> None:
        # A kernel a lemon_exec host manages belongs to an agent's session: a person attached
        # with `jupyter console --existing` who types `exit` must not end it. The host never
        # asks; it stops its kernels with signals.
        if not _managed():
            await super().shutdown_request(stream, ident, parent)  # type: ignore[no-untyped-call]
            return
        content = {
            "status": "error",
            "restart": bool(parent.get("content", {}).get("restart")),
            "ename": "ManagedKernel",
            "evalue": "this kernel is managed by lemon_exec and stops with its session; "
            "detach with Ctrl-D, exit or quit",
            "traceback": [],
        }
        assert self.session is not None
        self.session.send(stream, "shutdown_reply", content, parent, ident=ident)

    # -- interrupts -----------------------------------------------------------------------

    async def interrupt_request(self, stream: Any, ident: Any, parent: dict[str, Any]) -> None:
        # The host interrupts its scripts with signals, never with this message: an
        # interrupt_request comes from a viewer (JupyterLab's Interrupt, a console's Ctrl-C).
        # In a managed kernel it may stop only a viewer's own cell, never the agent's script,
        # and an idle kernel is left alone (the agent's next script could start meanwhile).
        if not _managed():
            await super().interrupt_request(stream, ident, parent)  # type: ignore[no-untyped-call]
            return
        content: dict[str, Any] = {"status": "ok"}
        with self._running_lock:
            running = self._running
            if running == "cell":
                try:
                    ipykernel_patches.interrupt_children(self)
                except OSError as exc:
                    content = _error_content(type(exc).__name__, str(exc))
        if running == "script":
            content = _error_content("ManagedKernel", AGENT_CELL_NOT_INTERRUPTIBLE)
        assert self.session is not None
        self.session.send(stream, "interrupt_reply", content, parent, ident=ident)

    def _set_running(self, what: str) -> None:
        with self._running_lock:
            self._running = what

    # -- host replies on the control channel ----------------------------------------------

    async def dispatch_control(self, msg: list[Any]) -> None:
        # Bridge replies skip the control lock and the busy/idle status messages that
        # every other control request publishes: they are frequent and need no reply.
        if _peek_msg_type(self.session, msg) == protocol.REPLY_MSG_TYPE:
            self._handle_bridge_reply(msg)
            return
        await super().dispatch_control(msg)  # type: ignore[no-untyped-call]

    def _handle_bridge_reply(self, raw: list[Any]) -> None:
        try:
            msg = jupyter_messages.unpack_signed(self.session, raw)
        except Exception:  # bad signature or malformed: dropped, like ipykernel does
            self.log.error("invalid lemon bridge reply", exc_info=True)
            return
        content = msg.get("content")
        bridge = cells.STATE.bridge
        if not isinstance(content, dict) or bridge is None:
            return
        if content.get("comm_id") != bridge.comm_id:
            return  # a reply for a cell that has ended
        bridge.deliver(content)

    # -- execution --------------------------------------------------------------------------

    async def do_execute(
        self,
        code: str,
        silent: bool,
        store_history: bool = True,
        user_expressions: dict[str, Any] | None = None,
        allow_stdin: bool = False,
        *,
        cell_meta: dict[str, Any] | None = None,
        cell_id: str | None = None,
    ) -> dict[str, Any]:
        lemon = (cell_meta or {}).get(protocol.CELL_METADATA_KEY)
        self._set_running("script" if isinstance(lemon, dict) else "cell")
        try:
            if not isinstance(lemon, dict):
                reply: dict[str, Any] = await super().do_execute(  # type: ignore[no-untyped-call]
                    code,
                    silent,
                    store_history,
                    user_expressions,
                    allow_stdin,
                    cell_meta=cell_meta,
                    cell_id=cell_id,
                )
                return reply
            return await self._run_lemon_cell(code, lemon)
        finally:
            self._set_running("idle")

    async def _run_lemon_cell(self, code: str, meta: dict[str, Any]) -> dict[str, Any]:
        setup = cell_setup.parse_cell_setup(meta)
        if isinstance(setup, str):
            outcome = script_outcome.ScriptOutcome(
                "protocol_error", 1, protocol.VERSION_ENAME, setup
            )
            return script_outcome.script_reply(outcome, self.execution_count)
        if setup.cwd:
            os.chdir(setup.cwd)
        if setup.env:
            os.environ.update(setup.env)
        assert self.shell is not None
        namespace = self.shell.user_ns
        try:
            helpers.install(namespace, setup.helpers, setup.tools_digest, setup.tools)
        except helpers.ToolSetupError as exc:
            outcome = script_outcome.ScriptOutcome(
                "protocol_error", 1, protocol.VERSION_ENAME, str(exc)
            )
            return script_outcome.script_reply(outcome, self.execution_count)
        bridge = CellBridge(
            # The kernel's own Session: the bridge's frames take their ids from the same
            # counter as the kernel's messages (and a forked child fails fast in the bridge).
            session=self.session,
            iopub_socket=self.iopub_socket,
            parent=self.get_parent("shell"),  # type: ignore[no-untyped-call]
            comm_id=setup.comm_id,
            token=setup.token,
            generation=cells.next_generation(),
            max_text_bytes=setup.max_text_bytes,
            max_images=setup.max_images,
            max_image_bytes=setup.max_image_bytes,
        )
        # The script's argv, as `python script.py` would give it (`lemon-exec run FILE -- ARGS`
        # sends its own); the kernel's `-f <connection file>` is not the script's business.
        saved_argv = sys.argv
        sys.argv = list(setup.argv) if setup.argv is not None else [setup.filename]
        saved_streams = sys.stdout, sys.stderr
        kernel_out = sys.stdout
        merged = ChunkedStream(kernel_out)
        sys.stdout = sys.stderr = merged
        # Child processes write to a pipe of this cell's own, so what a child left running
        # writes after the cell ended is told apart (streams.BoundedOutStream.begin_cell).
        if isinstance(kernel_out, BoundedOutStream):
            kernel_out.begin_cell()
        # Child processes' stderr joins stdout's pipe too: one ordered stream, as specified.
        saved_fd2 = _merge_fd(2, into=1)
        cells.open_cell(bridge)
        try:
            outcome = await script.run_script(code, setup.filename, namespace)
        finally:
            cells.close_cell()
            merged.flush()
            sys.stdout, sys.stderr = saved_streams
            sys.argv = saved_argv
            _restore_fd(2, saved_fd2)
            if isinstance(kernel_out, BoundedOutStream):
                kernel_out.end_cell()
        # Output that threads and children of ended cells wrote meanwhile: dropped, counted.
        outcome = dataclasses.replace(outcome, late_output_bytes=cells.take_late_bytes())
        return script_outcome.script_reply(outcome, self.execution_count)


def _error_content(ename: str, evalue: str) -> dict[str, Any]:
    return {"status": "error", "ename": ename, "evalue": evalue, "traceback": []}


def _merge_fd(fd: int, *, into: int) -> int | None:
    try:
        saved = os.dup(fd)
        os.dup2(into, fd)
    except OSError:
        return None
    return saved


def _restore_fd(fd: int, saved: int | None) -> None:
    if saved is not None:
        with contextlib.suppress(OSError):
            os.dup2(saved, fd)
            os.close(saved)


def _peek_msg_type(session: Any, raw: list[Any]) -> str | None:
    """Read a message's type from its header frame without verifying or consuming it."""
    try:
        frames = [f.bytes if hasattr(f, "bytes") else f for f in raw]
        start = frames.index(b"<IDS|MSG>") + 2  # delimiter, signature, then the header
        msg_type = json.loads(frames[start]).get("msg_type")
    except (ValueError, IndexError, AttributeError, TypeError):
        return None
    return msg_type if isinstance(msg_type, str) else None
