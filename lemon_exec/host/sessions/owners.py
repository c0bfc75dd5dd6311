"""Who owns which session kernel: owner ids, their bindings, and owner death by collection.

An owner (:class:`lemon_exec.session.SessionOwner`) binds one kernel entry per key: an
owner whose key changes (helper set, interpreter) keeps its other kernels, as a session
owns several kernels in the spec. Closing an owner, or dropping it (garbage collection),
detaches it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import weakref
from typing import Generic, Protocol, TypeVar

K = TypeVar("K")
E = TypeVar("E")

_OWNER_IDS = itertools.count(1)


def new_owner_id() -> int:
    """A process-wide unique owner id."""
    return next(_OWNER_IDS)


class OwnerBindings(Generic[K, E]):
    """owner id → {key → entry}."""

    def __init__(self) -> None:
        self._bindings: dict[int, dict[K, E]] = {}

    def get(self, owner_id: int, key: K) -> E | None:
        return self._bindings.get(owner_id, {}).get(key)

    def bind(self, owner_id: int, key: K, entry: E) -> None:
        """Bind (or rebind, after a fork) the owner's kernel for ``key``."""
        self._bindings.setdefault(owner_id, {})[key] = entry

    def pop(self, owner_id: int) -> list[E]:
        """Forget the owner; the entries it was bound to."""
        return list(self._bindings.pop(owner_id, {}).values())

    def __len__(self) -> int:
        return len(self._bindings)


class Detachable(Protocol):
    def detach_soon(self, owner_id: int) -> None: ...


def detach_when_collected(owner: object, registry: Detachable, owner_id: int) -> None:
    """Detach ``owner_id`` from ``registry`` (on this loop) once ``owner`` is collected.

    The registry is held weakly: a registry that is gone needs no detach.
    """
    loop = asyncio.get_running_loop()
    weakref.finalize(owner, _collected, weakref.ref(registry), owner_id, loop)


def _collected(
    registry_ref: weakref.ref[Detachable], owner_id: int, loop: asyncio.AbstractEventLoop
) -> None:
    registry = registry_ref()
    if registry is not None and not loop.is_closed():
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(registry.detach_soon, owner_id)
