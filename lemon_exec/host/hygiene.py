"""Last-resort cleanup when the host process exits without closing its facades.

Normal shutdown is ``await ExecuteCode.aclose()``. If the program exits without it (normal
interpreter exit, or SIGTERM with the default disposition), these hooks SIGKILL every live
kernel's process group and remove the private staging roots, so no kernel, connection file
or workspace outlives the host. Kernels also watch their parent (ipykernel's parent poller,
armed by jupyter_client's JPY_PARENT_PID), which covers a host killed with SIGKILL.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import threading
import weakref
from typing import Any, Protocol


class _Cleanable(Protocol):
    def emergency_cleanup(self) -> None: ...


_engines: weakref.WeakSet[Any] = weakref.WeakSet()
_installed = False
_lock = threading.Lock()


def register(engine: _Cleanable) -> None:
    """Track ``engine`` for exit-time cleanup (installs the hooks once)."""
    global _installed
    with _lock:
        _engines.add(engine)
        if _installed:
            return
        _installed = True
    atexit.register(cleanup_all)
    _install_sigterm()


def unregister(engine: _Cleanable) -> None:
    with _lock:
        _engines.discard(engine)


def cleanup_all() -> None:
    for engine in list(_engines):
        with contextlib.suppress(Exception):
            engine.emergency_cleanup()
    _engines.clear()


def _install_sigterm() -> None:
    # Only take SIGTERM over when nobody else handles it, and only from the main thread.
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return

    def on_sigterm(signum: int, _frame: Any) -> None:
        cleanup_all()
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)  # die of SIGTERM as the default would have

    signal.signal(signal.SIGTERM, on_sigterm)
