"""The registered tools beyond the five defaults, as the kernel sees them (code mode).

The host describes each extra tool to the kernel once per kernel: the cell setup carries a
digest of the enabled extra tools' specs on every cell, and the specs themselves only on the
first cell a kernel runs with that digest (docs/comm-protocol.md §2). The kernel builds real
functions from them (``lemon_exec/kernel/namespace.py``).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import weakref
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from lemon_exec.wire.protocol import HELPER_NAMES

from ._registry import ToolRegistry
from ._types import ToolSpec

__all__ = ["ToolSet", "extra_tool_names", "toolset"]


def kernel_spec(spec: ToolSpec) -> dict[str, Any]:
    """One tool's entry in the cell setup's ``tools`` list (JSON)."""
    params: list[dict[str, Any]] = []
    for name in spec.parameters:
        entry: dict[str, Any] = {"name": name}
        expected = spec.param_types.get(name)
        if expected is not None:
            types = expected if isinstance(expected, tuple) else (expected,)
            entry["type"] = " | ".join(t.__name__ for t in types)
        if name in spec.required:
            entry["required"] = True
        elif name in spec.defaults:
            value = spec.defaults[name]
            try:
                json.dumps(value)
                entry["default"] = value
            except (TypeError, ValueError):  # shown in the signature, never sent as a value
                entry["default_repr"] = repr(value)
        params.append(entry)
    out: dict[str, Any] = {"name": spec.name, "doc": spec.description, "params": params}
    if spec.result != "text":  # e.g. "json": the kernel decodes the reply (MCP tools)
        out["result"] = spec.result
    return out


def extra_tool_names(registry: ToolRegistry, wanted: Iterable[str] | None) -> tuple[str, ...]:
    """The registered tools beyond the five, narrowed by the ``tools`` setting.

    ``wanted`` is the setting (``None`` or empty: no narrowing); a name in it enables the tool
    of that name, a server name enables all of that server's tools. It can only narrow: a name
    that is not registered enables nothing.
    """
    names = [n for n in registry.names() if n not in HELPER_NAMES]
    allowed = {w.strip() for w in wanted or ()}
    if not allowed:
        return tuple(names)
    return tuple(n for n in names if n in allowed or n.split(".", 1)[0] in allowed)


@dataclass
class ToolSet:
    """The enabled extra tools: names, kernel specs, and their digest."""

    names: tuple[str, ...]
    specs: list[dict[str, Any]]
    digest: str
    #: The digest each kernel (by handle) last received specs for; shared by all ToolSets.
    _sent: weakref.WeakKeyDictionary[Any, str] = field(repr=False)

    def setup_for(self, kernel: Any) -> tuple[str | None, list[dict[str, Any]] | None]:
        """``(digest, specs or None)`` for the next cell on ``kernel``: specs only when new."""
        if not self.names:
            return None, None
        try:
            if self._sent.get(kernel) == self.digest:
                return self.digest, None
            self._sent[kernel] = self.digest
        except TypeError:  # a handle that cannot be weakly referenced: always send
            pass
        return self.digest, self.specs

    def forget(self, kernel: Any) -> None:
        """Send the specs again next time (the cell may not have reached the kernel)."""
        with contextlib.suppress(TypeError):
            self._sent.pop(kernel, None)


_CACHE: weakref.WeakKeyDictionary[ToolRegistry, tuple[int, tuple[str, ...], ToolSet]] = (
    weakref.WeakKeyDictionary()
)
# What each kernel has seen: one record, whichever ToolSet sent it.
_SENT: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()


def toolset(registry: ToolRegistry, wanted: Iterable[str] | None) -> ToolSet:
    """The :class:`ToolSet` of ``registry`` under the ``tools`` setting; cached per version."""
    wanted_key = tuple(wanted or ())
    cached = _CACHE.get(registry)
    if cached is not None and cached[0] == registry.version and cached[1] == wanted_key:
        return cached[2]
    names = extra_tool_names(registry, wanted_key)
    specs = [kernel_spec(spec) for name in names if (spec := registry.get(name)) is not None]
    # Upstream tools not offered: notes for tools.search(), for each server offered at all.
    servers = dict.fromkeys(name.split(".", 1)[0] for name in names if "." in name)
    specs += [{"note": note} for server in servers for note in registry.notes(server)]
    blob = json.dumps(specs, sort_keys=True, separators=(",", ":")).encode()
    digest = hashlib.sha256(blob).hexdigest()[:32]
    result = ToolSet(names, specs, digest, _SENT)
    _CACHE[registry] = (registry.version, wanted_key, result)
    return result
