"""The host process's heap and the garbage collector: the ``gc_freeze`` setting.

A full collection walks every object the process holds; with jupyter_client, zmq, traitlets
and asyncio imported that is tens of milliseconds on the event loop, so every call in flight
stalls. After its first call the host moves the objects alive then (modules, classes, the
host's own long-lived state) to the collector's permanent generation (:func:`gc.freeze`), as
pre-fork servers do: later collections walk only what came after. The cost: a cycle among
those objects that becomes unreachable later is never collected. Once per process.
"""

from __future__ import annotations

import gc

_frozen = False


def freeze_once() -> None:
    """Freeze the heap as it is now, the first time only (see the module doc)."""
    global _frozen
    if _frozen:
        return
    _frozen = True
    gc.freeze()


def frozen() -> bool:
    """Whether this process's heap was frozen by :func:`freeze_once`."""
    return _frozen
