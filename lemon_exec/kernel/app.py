"""The kernel application: IPKernelApp running LemonKernel, tuned for short-lived kernels."""

from __future__ import annotations

import contextlib
import importlib
import json
import logging
import os
import sys
import threading
import traceback
from typing import Any

from ipykernel.iostream import IOPubThread
from ipykernel.kernelapp import IPKernelApp
from ipykernel.kernelbase import Kernel
from IPython.core.application import BaseIPythonApplication
from traitlets import DottedObjectName, Type
from traitlets.config import Config
from traitlets.config.application import catch_config_error
from traitlets.utils.nested_update import nested_update

from lemon_exec.kernel import helpers, ipykernel_patches, prebuilt
from lemon_exec.kernel.hostlink import HostLink
from lemon_exec.kernel.lean import restore_optional_modules
from lemon_exec.kernel.lemon_kernel import LemonKernel, LemonShell
from lemon_exec.proc import supervise
from lemon_exec.proc.supervise import connection_file_arg
from lemon_exec.wire.limits import MAX_MESSAGE_BYTES
from lemon_exec.wire.protocol import HOST_LINK_ENV

_DELIM = b"<IDS|MSG>"  # ends the routing frames of a Jupyter message

#: The umask while the kernel binds its sockets: zmq creates an ipc socket's file with
#: 0777 less the umask, so this makes them 0600 like every file of the host's private
#: staging root (as ssh-agent does; connecting needs write permission, nothing needs x).
#: Nothing but sockets is created while it holds (see init_sockets).
SOCKET_UMASK = 0o177
#: How long initialisation waits for the heartbeat thread to bind (it binds in its thread).
_HEARTBEAT_BIND_S = 10.0

#: How the note names what was not sent, by message type.
_KINDS = {
    "display_data": "display output",
    "update_display_data": "display output",
    "execute_result": "result output",
    "comm_msg": "comm message",
    "comm_open": "comm message",
    "comm_close": "comm message",
    "stream": "stream output",
    "error": "error report",
}


#: The logging configuration this process applied last, with the handlers it made
#: (LemonKernelApp._configure_logging).
_applied_logging: tuple[dict[str, Any], list[logging.Handler]] | None = None


class _ConfigPhase(BaseIPythonApplication):
    """IPython's configuration phase, taken over from the fork-server template when it fits.

    Sits between IPKernelApp and BaseIPythonApplication in LemonKernelApp's method order,
    so that IPKernelApp.initialize's ``super().initialize(argv)`` comes here. A forked
    kernel whose configuration phase would come out as the template's (``prebuilt.app_setup``)
    takes its profile directory and loads no configuration file, instead of finding the one
    and searching for the others again (~0.17 MiB less copied per kernel: 64 idle session
    kernels take 633 MiB of PSS with it, 644 without); any other kernel runs IPython's.
    """

    # IPython leaves BaseIPythonApplication's methods unannotated: untyped calls.
    @catch_config_error
    def initialize(self, argv: list[str] | None = None) -> None:
        setup = prebuilt.app_setup(argv) if ipykernel_patches.enabled("config_phase") else None
        if setup is None:
            super().initialize(argv)  # type: ignore[no-untyped-call]
            return
        # BaseIPythonApplication.initialize, with the template's results for the rest.
        self.parse_command_line(argv)
        self.init_crash_handler()  # type: ignore[no-untyped-call]
        self.profile_dir = setup.profile_dir
        self.config_file_paths = list(setup.config_file_paths)


class LemonKernelApp(IPKernelApp, _ConfigPhase):
    # ipykernel leaves IPKernelApp's methods unannotated: calls into them are untyped calls.
    name = "lemon-python-kernel"
    kernel_class = Type(LemonKernel, klass=Kernel).tag(config=True)
    #: The link to the host (kernel/hostlink.py), when the host gave one.
    host_link: HostLink | None = None
    #: The process's umask while init_sockets..init_heartbeat hold SOCKET_UMASK.
    _umask: int | None = None
    #: Whether the connection file existed when the kernel started (the host wrote it).
    _given_connection_file = False
    outstream_class = DottedObjectName("lemon_exec.kernel.streams.BoundedOutStream").tag(
        config=True
    )

    #: Whether the launcher named the connection file (``-f FILE``): a client connects by itself.
    _launched_by_client = False

    def initialize(self, argv: list[str] | None = None) -> None:
        given = connection_file_arg(sys.argv[1:] if argv is None else argv)
        self._launched_by_client = given is not None
        self.configure_shell_config()
        # ipykernel skips capturing child-process output under pytest; a kernel started by a
        # test must behave like any other.
        os.environ.pop("PYTEST_CURRENT_TEST", None)
        try:
            # Fails here on an ipykernel/IPython the kernel cannot run on safely.
            ipykernel_patches.check()
            # Done by the fork-server template already; a cold kernel does it here.
            ipykernel_patches.memoize_signature_checks()
            super().initialize(argv)  # type: ignore[no-untyped-call]
        except Exception:
            # E.g. a socket that cannot be bound (a full disk under the runtime directory), or
            # an unsupported ipykernel version.
            # Threads started before (the host link's) would keep a kernel that can never
            # become ready alive until the host's startup timeout: end now, so the host
            # reports the reason at once.
            traceback.print_exc()
            sys.stderr.flush()
            os._exit(1)
        restore_optional_modules()  # skipped only for ipykernel's and IPython's own imports

    def log_connection_info(self) -> None:
        # ipykernel prints its standalone banner ("Ctrl-C will not work", "--existing FILE")
        # to the terminal when no parent process is named, and __main__ removes that name
        # (its own parent watch replaces ipykernel's): a kernel a Jupyter client started would
        # print it into the client's output on every start. Logged only, in that case.
        if not self._launched_by_client:
            super().log_connection_info()  # type: ignore[no-untyped-call]
            return
        handle, self.parent_handle = self.parent_handle, 1
        try:
            super().log_connection_info()  # type: ignore[no-untyped-call]
        finally:
            self.parent_handle = handle

    def init_extensions(self) -> None:
        # A shell adopted from the fork-server template has IPython's default extensions
        # loaded (prebuilt.build): only the others are loaded here.
        preloaded = prebuilt.loaded_extensions()
        if not preloaded:
            super().init_extensions()  # type: ignore[no-untyped-call]
            return
        defaults = self.default_extensions
        self.default_extensions = [name for name in defaults if name not in preloaded]
        try:
            super().init_extensions()  # type: ignore[no-untyped-call]
        finally:
            self.default_extensions = defaults

    def _configure_logging(self) -> None:
        # traitlets runs logging.config.dictConfig when an application's log is first used,
        # which closes every handler and builds new ones. With the configuration this
        # process applied last (in a forked kernel: the template's, for its prebuilt shell)
        # and its handlers still in place, that changes nothing: skipped.
        global _applied_logging
        config = self.get_default_logging_config()
        nested_update(config, self.logging_config or {})
        logger = logging.getLogger(type(self).__name__)
        if _applied_logging == (config, logger.handlers):
            self._logging_configured = True
            return
        super()._configure_logging()
        _raise_to_handlers(logger)
        _applied_logging = (config, list(logger.handlers))

    def configure_shell_config(self) -> None:
        """What every lemon-python kernel sets in its shell's configuration."""
        # History in memory only: history_request works, and no sqlite file is left behind.
        self.config.HistoryManager.hist_file = ":memory:"

    def init_code(self) -> None:
        # IPython's, but the modules loaded at start (for %reset --aggressive) are
        # prebuilt.module_names(): the template's set is shared, not copied.
        if not ipykernel_patches.run_init_code(self, prebuilt.module_names()):
            super().init_code()  # type: ignore[no-untyped-call]

    def parse_command_line(self, argv: list[str] | None = None) -> None:
        # The host starts every kernel with just ``-f FILE``: taken as is. traitlets builds an
        # argparse parser of every alias and flag first, ~10 ms of each kernel's start.
        args = sys.argv[1:] if argv is None else list(argv)
        if not prebuilt.is_host_command_line(args):
            super().parse_command_line(argv)
            return
        self.argv = args
        config = Config()
        config.IPKernelApp.connection_file = args[1]
        self.cli_config = config
        self.update_config(config)
        self.extra_args = []

    def init_connection_file(self) -> None:
        super().init_connection_file()  # type: ignore[no-untyped-call]
        self._given_connection_file = os.path.exists(self.abs_connection_file)

    def write_connection_file(self, **kwargs: Any) -> None:
        # A connection file the kernel was given and that is gone now was removed on
        # purpose: by its parent watch when its host or template died (the kernel is on its
        # way out), or by the host. Never written back: that would resurrect the key, and
        # jupyter_client would set the sticky bit on the host's runtime directory, whose
        # mode the host checks before every call (a 1700 runtime/ refused them all).
        with supervise.connection_file_lock:
            if self._given_connection_file and not os.path.exists(self.abs_connection_file):
                return
            super().write_connection_file(**kwargs)

    def init_sockets(self) -> None:
        # Every socket file is 0600 from its creation (no chmod afterwards, no window): the
        # strict umask holds from the first bind to the heartbeat's (init_heartbeat), and
        # the process's own umask is back before any code of the user's runs.
        self._umask = os.umask(SOCKET_UMASK)
        try:
            super().init_sockets()  # type: ignore[no-untyped-call]
        except BaseException:
            self._restore_umask()
            raise

    def init_heartbeat(self) -> None:
        try:
            ipykernel_patches.init_binding_heartbeat(
                super().init_heartbeat, self, _HEARTBEAT_BIND_S
            )
        finally:
            self._restore_umask()

    def _restore_umask(self) -> None:
        if self._umask is not None:
            os.umask(self._umask)
            self._umask = None

    def init_iopub(self, context: Any) -> None:
        # ipykernel builds its IOPub thread with a "pipe" for output of forked children: a
        # PULL socket on tcp://127.0.0.1:<random>, which any local user could connect to and
        # write into a running script's output. Build it without; forked children write to
        # the captured file descriptors instead (see streams.BoundedOutStream).
        with ipykernel_patches.iopub_thread_class(LocalIOPubThread):
            super().init_iopub(context)  # type: ignore[no-untyped-call]
        # The public IOPub socket (the one in the connection file) keeps zmq's default: a
        # subscriber that falls behind loses messages, so a viewer that stops reading (a
        # suspended Jupyter Server, an idle client) never stalls a script. The host reads a
        # copy of every message on its link instead, which blocks rather than drops: no
        # bridge frame or output is ever lost, and with ChunkedStream a flooding script
        # slows to the host's pace (docs/comm-protocol.md §7). Bridge replies come back on
        # the same link, read by the helpers that wait for them (kernel/hostlink.py).
        path = os.environ.pop(HOST_LINK_ENV, "")
        if path:
            assert isinstance(self.iopub_thread, LocalIOPubThread)
            link = self.host_link = HostLink.connect(path)
            self.iopub_thread.host_link = link
            link.serve_replies(self.session)


def _raise_to_handlers(logger: logging.Logger) -> None:
    """Set ``logger``'s level to the lowest of its handlers' levels.

    traitlets sets an application's logger to DEBUG and filters in its handler, so each
    of ipykernel's debug calls (a dozen per start, two per message) builds a record that
    the handler then drops. A logger at its handlers' level drops it before it is built.
    A handler with no level (NOTSET) takes everything: the logger is then left as it is.
    """
    levels = [handler.level for handler in logger.handlers]
    if levels and min(levels) > logger.level:
        logger.setLevel(min(levels))


class LocalIOPubThread(IOPubThread):
    """ipykernel's IOPub thread without the TCP pipe for forked children.

    It also publishes no message over :data:`MAX_MESSAGE_BYTES` (the host would refuse it by
    dropping its connection, losing neighbouring output too): a short stream note with the
    same parent takes its place, and everything else goes on normally.
    """

    # ipykernel leaves IOPubThread's methods unannotated: calls into them are untyped calls.
    def __init__(self, socket: Any, pipe: bool = False, session: Any = False) -> None:
        super().__init__(socket, pipe=False, session=session)  # type: ignore[no-untyped-call]
        #: The link to the host (see LemonKernelApp.init_iopub), or None without a host.
        self.host_link: HostLink | None = None
        # Messages handed to the IO thread and not yet on the host link. A bridge frame goes
        # straight to the host (send_direct) only when none are, so it never overtakes
        # output printed before it; the lock keeps that check and the send together.
        self._host_lock = threading.Lock()
        self._host_backlog = 0

    def send_multipart(self, *args: Any, **kwargs: Any) -> None:
        # Checked in the sending thread, before the message is queued for the IO thread.
        if args and isinstance(args[0], list | tuple) and self._is_master_process():  # type: ignore[no-untyped-call]
            frames = args[0]
            size = sum(_nbytes(frame) for frame in frames)
            if size > MAX_MESSAGE_BYTES:
                note = self._oversize_note(frames, size)
                if note is None:
                    return
                args = (note, *args[1:])
        counted = self.host_link is not None
        if counted:
            with self._host_lock:
                self._host_backlog += 1
        # What IOPubThread.send_multipart does, plus the backlog count (see send_direct).
        self.schedule(lambda: self._send_scheduled(counted, args, kwargs))  # type: ignore[no-untyped-call]

    def _send_scheduled(self, counted: bool, args: Any, kwargs: Any) -> None:
        try:
            self._really_send(*args, **kwargs)
        finally:
            if counted:
                with self._host_lock:
                    self._host_backlog -= 1

    def send_direct(self, frames: list[bytes]) -> bool:
        """Send a bridge frame to the host from the calling thread, without the IO thread.

        Only while nothing sent before it waits in the IO thread (it would be overtaken);
        False means the caller must use :meth:`send_multipart`, which keeps the order.
        """
        link = self.host_link
        if link is None or not self._is_master_process():  # type: ignore[no-untyped-call]
            return False
        with self._host_lock:
            if self._host_backlog or link.closed:
                return False
            with contextlib.suppress(OSError):  # the host is gone: its end is its to report
                link.send(frames)
        return True

    def _oversize_note(self, frames: Any, size: int) -> list[bytes] | None:
        """The frames of the stream note that replaces an over-limit message (None: drop)."""
        session = self.session
        try:
            start = next(i for i, f in enumerate(frames) if _is_delimiter(f))
            header = json.loads(bytes(frames[start + 2]))
            parent = json.loads(bytes(frames[start + 3]))
        except (StopIteration, ValueError, IndexError, TypeError):
            parent, header = None, {}
        msg_type = str(header.get("msg_type", "")) if isinstance(header, dict) else ""
        if msg_type == "execute_input":
            # The echo of a big script's code: not output, and the host already has the
            # code. A note would put text into the result that the script never wrote.
            return None
        kind = _KINDS.get(msg_type, f"{msg_type or 'a'} message")
        note = (
            f"[{kind} of {size / 2**20:.1f} MiB was not sent: over the "
            f"{MAX_MESSAGE_BYTES // 2**20} MiB per-message limit]"
        )
        if not session or not isinstance(parent, dict):
            return None  # not a Jupyter message: nobody to address a note to
        # Output the script printed before comes first, as it would have with the message.
        if threading.current_thread() is not self.thread:
            streams = (sys.stdout,) if sys.stderr is sys.stdout else (sys.stdout, sys.stderr)
            for stream in streams:
                with contextlib.suppress(Exception):
                    stream.flush()
        msg = session.msg("stream", {"name": "stderr", "text": note + "\n"}, parent=parent)
        return list(session.serialize(msg, ident=b"stream.stderr"))

    def _really_send(self, msg: Any, *args: Any, **kwargs: Any) -> None:
        # A forked child must not use its parent's zmq socket (it is not fork-safe); its
        # text reaches the parent through the captured file descriptors, the rest is dropped
        # (jupyter_client's Session already drops what a child sends through it).
        if not self._is_master_process():  # type: ignore[no-untyped-call]
            return
        link = self.host_link
        if link is not None:
            with self._host_lock:
                if not link.closed:
                    # Blocks while the host is behind: the host never loses a message.
                    with contextlib.suppress(OSError):  # the host is gone
                        link.send(msg)
        super()._really_send(msg, *args, **kwargs)  # type: ignore[no-untyped-call]  # public: drops for slow subscribers

    def close(self) -> None:
        super().close()  # type: ignore[no-untyped-call]
        if self.host_link is not None:
            self.host_link.close()  # sends are synchronous: everything sent has arrived


def _is_delimiter(frame: Any) -> bool:
    return _nbytes(frame) == len(_DELIM) and bytes(frame) == _DELIM


def _nbytes(frame: Any) -> int:
    if isinstance(frame, memoryview):
        return frame.nbytes
    try:
        return len(frame)  # bytes and zmq.Frame
    except TypeError:
        return memoryview(frame).nbytes


#: Modules a kernel imports while it initialises (IPKernelApp.initialize, the shell) or
#: runs its first script: the fork-server template imports them, so a forked kernel finds
#: them loaded and shared instead of importing them into its own memory.
PRELOAD_MODULES = (
    "faulthandler",
    "pdb",
    "runpy",
    "sqlite3",
    "unicodedata",
    "tornado.gen",
    "tornado.locks",
    "tornado.queues",
    "tornado.platform.asyncio",
    "IPython.core.completerlib",
    "IPython.core.debugger",
    "IPython.core.oinspect",
    "IPython.extensions.storemagic",
    "IPython.utils.wildcard",
    "ipykernel.debugger",
)


def preload() -> None:
    """Import what a kernel would import at start (the fork-server template calls this).

    Also what every kernel would otherwise compute the same way: the ``tools`` object of
    the five helpers, and ipykernel's signature checks.
    """
    for name in PRELOAD_MODULES:
        with contextlib.suppress(ImportError):  # another IPython/ipykernel version
            importlib.import_module(name)
    helpers.prebuild()
    ipykernel_patches.check()
    if ipykernel_patches.memoize_signature_checks():
        ipykernel_patches.signature_check(LemonKernel.do_execute, ["cell_meta", "cell_id"])
        ipykernel_patches.signature_check(LemonShell.run_cell_async, ["cell_id", "cell_meta"])


def build_prebuilt() -> bool:
    """Build the shell forked kernels adopt, in the fork-server template (kernel/prebuilt.py)."""
    return prebuilt.build(LemonKernelApp, LemonShell)


def main() -> None:
    LemonKernelApp.launch_instance()
