"""Helpers refuse to run in a forked child of the kernel instead of waiting forever.

A child made by ``os.fork()`` (or multiprocessing's fork start method) inherits the cell's
bridge, but nothing it sends reaches the host: a forked process must not use its parent's
zmq sockets, so the IOPub thread and jupyter_client's Session drop its messages. A helper
call there would wait for a reply that can never come. The bridge sends through
:class:`ForkGuardedSession`, which raises :class:`ToolError` in any process but the kernel's.
"""

from __future__ import annotations

import os
from typing import Any

from lemon_exec.kernel.bridge import ToolError


def forked_child_error() -> ToolError:
    return ToolError(
        "helpers, text() and notify() work only in the kernel process, not in a forked "
        f"child (pid {os.getpid()})"
    )


class ForkGuardedSession:
    """The kernel's Session as one cell's bridge uses it; ``send`` only in the kernel process."""

    def __init__(self, session: Any) -> None:
        self._session = session
        self._kernel_pid = os.getpid()  # made per cell, in the kernel's main thread

    def send(self, *args: Any, **kwargs: Any) -> Any:
        if os.getpid() != self._kernel_pid:
            raise forked_child_error()
        return self._session.send(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._session, name)
