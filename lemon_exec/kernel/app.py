"""The kernel application: IPKernelApp running LemonKernel, tuned for short-lived kernels."""

from __future__ import annotations

import os
from typing import Any

import zmq
from ipykernel import kernelapp
from ipykernel.iostream import IOPubThread
from ipykernel.kernelapp import IPKernelApp
from traitlets import DottedObjectName, Type

from lemon_exec.kernel.kernel import LemonKernel
from lemon_exec.kernel.lean import restore_optional_modules


class LemonKernelApp(IPKernelApp):
    name = "lemon-python-kernel"
    kernel_class = Type(LemonKernel, klass="ipykernel.kernelbase.Kernel").tag(config=True)
    outstream_class = DottedObjectName("lemon_exec.kernel.streams.BoundedOutStream").tag(
        config=True
    )

    def initialize(self, argv: list[str] | None = None) -> None:
        # History in memory only: history_request works, and no sqlite file is left behind.
        self.config.HistoryManager.hist_file = ":memory:"
        # ipykernel skips capturing child-process output under pytest; a kernel started by a
        # test must behave like any other.
        os.environ.pop("PYTEST_CURRENT_TEST", None)
        super().initialize(argv)
        restore_optional_modules()  # skipped only for ipykernel's and IPython's own imports

    def init_iopub(self, context: Any) -> None:
        # ipykernel builds its IOPub thread with a "pipe" for output of forked children: a
        # PULL socket on tcp://127.0.0.1:<random>, which any local user could connect to and
        # write into a running script's output. Build it without; forked children write to
        # the captured file descriptors instead (see streams.BoundedOutStream).
        saved = kernelapp.IOPubThread
        kernelapp.IOPubThread = LocalIOPubThread  # type: ignore[misc]
        try:
            super().init_iopub(context)
        finally:
            kernelapp.IOPubThread = saved  # type: ignore[misc]
        # Block instead of silently dropping when a subscriber falls behind: dropped bridge
        # frames would leave a helper waiting, and dropped output would break truncation.
        # Together with ChunkedStream this slows a flooding script to the host's pace.
        self.iopub_thread.socket.setsockopt(zmq.XPUB_NODROP, 1)


class LocalIOPubThread(IOPubThread):
    """ipykernel's IOPub thread without the TCP pipe for forked children."""

    def __init__(self, socket: Any, pipe: bool = False, session: Any = False) -> None:
        super().__init__(socket, pipe=False, session=session)

    def _really_send(self, msg: Any, *args: Any, **kwargs: Any) -> None:
        # A forked child must not use its parent's zmq socket (it is not fork-safe); its
        # text reaches the parent through the captured file descriptors, the rest is dropped
        # (jupyter_client's Session already drops what a child sends through it).
        if not self._is_master_process():
            return
        super()._really_send(msg, *args, **kwargs)


def main() -> None:
    LemonKernelApp.launch_instance()
