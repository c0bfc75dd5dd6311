"""The kernel application: IPKernelApp running LemonKernel, tuned for short-lived kernels."""

from __future__ import annotations

import os
from typing import Any

import zmq
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
        super().init_iopub(context)
        # Block instead of silently dropping when a subscriber falls behind: dropped bridge
        # frames would leave a helper waiting, and dropped output would break truncation.
        # Together with ChunkedStream this slows a flooding script to the host's pace.
        self.iopub_thread.socket.setsockopt(zmq.XPUB_NODROP, 1)


def main() -> None:
    LemonKernelApp.launch_instance()
