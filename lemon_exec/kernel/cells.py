"""Which cell is open, and which cell each thread belongs to.

A thread inherits the cell of the thread that created it, captured when it is constructed
(an untagged creator such as the main thread gives the cell open at that moment). Helpers
refuse to run in a thread tagged with an earlier cell, so a thread a finished cell left
behind can never spend a later cell's budget. This is isolation hygiene, not a sandbox.

A pooled worker (``concurrent.futures`` threads, which back ``asyncio.to_thread`` and
``run_in_executor``) outlives the cell that started it, so while it runs a work item it
belongs to the cell that *submitted* that item: a pool reused by a later cell works there,
and work a finished cell left queued is still refused.

The same tags keep a cell's output its own: a write from a thread of a cell that has ended
(:func:`late_writer`) is dropped and only counted (:func:`count_late`), and reported with the
next result as ``late_output_bytes``, never shown in a later call's output.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from concurrent.futures import thread as _pool_thread
from typing import TYPE_CHECKING, Any

from lemon_exec.wire import protocol

if TYPE_CHECKING:
    from lemon_exec.kernel.bridge import CellBridge

_ATTR = "_lemon_cell_generation"


class _CellState:
    def __init__(self) -> None:
        self.generation = 0
        self.bridge: CellBridge | None = None
        #: Opens a bridge for the running cell on its first helper call when no host gave
        #: one (kernel/playground.py); None where helpers have no host to reach.
        self.opener: Callable[[], CellBridge] | None = None
        #: Why a helper call without a bridge or an opener fails.
        self.no_host = protocol.NO_HOST
        #: Bytes of late output dropped since the last script's reply (see count_late).
        self.late_bytes = 0
        self.late_lock = threading.Lock()


STATE = _CellState()
_original_thread_init = threading.Thread.__init__


def _tagging_thread_init(self: threading.Thread, *args: Any, **kwargs: Any) -> None:
    _original_thread_init(self, *args, **kwargs)
    creator = getattr(threading.current_thread(), _ATTR, None)
    setattr(self, _ATTR, creator if creator is not None else STATE.generation)


_original_item_init = _pool_thread._WorkItem.__init__
_original_item_run = _pool_thread._WorkItem.run


def _tagging_item_init(self: Any, *args: Any, **kwargs: Any) -> None:
    _original_item_init(self, *args, **kwargs)
    with contextlib.suppress(AttributeError):  # a future Python with __slots__: no tagging
        setattr(self, _ATTR, thread_generation())


def _tagging_item_run(self: Any, *args: Any, **kwargs: Any) -> Any:
    worker = threading.current_thread()
    saved = getattr(worker, _ATTR, None)
    setattr(worker, _ATTR, getattr(self, _ATTR, saved))
    try:
        return _original_item_run(self, *args, **kwargs)
    finally:
        setattr(worker, _ATTR, saved)


def install_thread_tagging() -> None:
    """Make every new thread remember the cell it was created in (idempotent)."""
    threading.Thread.__init__ = _tagging_thread_init  # type: ignore[method-assign]
    _pool_thread._WorkItem.__init__ = _tagging_item_init  # type: ignore[method-assign]
    _pool_thread._WorkItem.run = _tagging_item_run  # type: ignore[method-assign]


def thread_generation() -> int:
    """The cell the current thread belongs to (untagged threads belong to the open cell)."""
    tag = getattr(threading.current_thread(), _ATTR, None)
    return STATE.generation if tag is None else tag


def late_writer() -> bool:
    """Whether the current thread belongs to a script cell that is no longer running.

    Untagged threads (the kernel's main thread) and threads made before the first script
    (tag 0: the kernel's own, such as the pipe watcher) are never late.
    """
    tag = getattr(threading.current_thread(), _ATTR, None)
    if not tag:
        return False
    bridge = STATE.bridge
    return bridge is None or tag != bridge.generation


def count_late(nbytes: int) -> None:
    """Count output that was dropped because the cell it belonged to had ended."""
    with STATE.late_lock:
        STATE.late_bytes += nbytes


def take_late_bytes() -> int:
    """The late output counted since the last call, and start counting afresh."""
    with STATE.late_lock:
        late, STATE.late_bytes = STATE.late_bytes, 0
    return late


def open_cell(bridge: CellBridge) -> None:
    STATE.bridge = bridge


def close_cell() -> None:
    bridge, STATE.bridge = STATE.bridge, None
    if bridge is not None:
        bridge.close()


def next_generation() -> int:
    STATE.generation += 1
    return STATE.generation
