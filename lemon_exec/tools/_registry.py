"""The tool registry: which helpers exist, and how to call each one.

Names (the contract between the registry, MCP tool sources and the kernel's helpers):

* A plain Python identifier (``search_issues``) is a **top-level helper**: scripts call it as
  ``search_issues(...)``, as ``tools.search_issues(...)`` and in ``batch()`` by that name.
* A dotted name ``"<server>.<tool>"`` (exactly one dot, both parts identifiers) is a
  **server tool**, e.g. an MCP server's tool: scripts call it as
  ``tools.<server>.<tool>(...)`` and in ``batch()`` as ``("<server>.<tool>", {...})``;
  ``help(tools.<server>)`` lists the server's tools and ``tools.search(query)`` finds them.
  Sources that register server tools make both parts identifier-safe themselves.
* Every tool is described to the kernel by its ``parameters`` (positional order),
  ``required``, ``param_types`` and ``defaults`` (which become the helper's real
  ``inspect.Signature``) and its ``description`` (its docstring; its first line is what
  ``tools.search`` shows).
* No part of a name starts with ``_`` (Python's own names: ``__get__``, ``_repr_html_``).
* Reserved: a top-level name or a server name may not shadow a Python builtin
  (``print``, ``open``, ...) or a name every script has (``text``, ``notify``, ``batch``,
  ``ToolError``, ``tools``); a server may not be named like one of the five default tools or
  ``search``; a name cannot be both a top-level tool and a server. The five default names
  (read, grep, find, ls, webfetch) can only be replaced (``replace=True``), and keep the
  kernel's fixed signatures.
"""

from __future__ import annotations

import builtins
import inspect
import keyword
import sys
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from lemon_exec.wire.protocol import HELPER_NAMES

from ._types import ToolCall, ToolFunc, ToolSpec

if TYPE_CHECKING:
    from ._mcp_source import McpServerConfig

__all__ = ["RESERVED_NAMES", "ToolRegistry", "default_registry"]

#: Names no registered tool (top-level) or server may take: Python's builtins and the names
#: every script has pre-imported.
RESERVED_NAMES: frozenset[str] = frozenset(dir(builtins)) | {
    "text",
    "notify",
    "image",
    "batch",
    "ToolError",
    "tools",
}


class ToolRegistry:
    """A name -> :class:`ToolSpec` table, in registration order.

    A runtime builds one (usually starting from :func:`default_registry`), adds its own tools,
    and hands it to a :class:`~lemon_exec.tools.ToolHost`.
    """

    def __init__(self) -> None:
        self._specs: dict[str, ToolSpec] = {}
        #: Bumped on every change, so derived views (the kernel's tool specs) can be cached.
        self.version = 0
        #: MCP servers (add_mcp_server) whose tools a tool host lists on first need.
        self._mcp_servers: dict[str, McpServerConfig] = {}
        #: Per server: its upstream tools that are not offered, and why (set_server_tools).
        self._notes: dict[str, tuple[str, ...]] = {}

    def register(self, spec: ToolSpec, *, replace: bool = False) -> ToolSpec:
        """Add ``spec``; raise ``ValueError`` if it is malformed or the name is taken.

        Pass ``replace=True`` to override an existing tool (e.g. a runtime's own ``read``).
        """
        _check_spec(spec)
        if spec.name in self._specs and not replace:
            raise ValueError(f"tool {spec.name!r} is already registered (pass replace=True)")
        _check_clash(spec.name, self._specs)
        self._specs[spec.name] = spec
        self.version += 1
        return spec

    def register_function(
        self,
        name: str,
        func: ToolFunc,
        *,
        parameters: tuple[str, ...] | list[str],
        required: tuple[str, ...] | list[str] = (),
        description: str = "",
        param_types: Mapping[str, type | tuple[type, ...]] | None = None,
        defaults: Mapping[str, Any] | None = None,
        replace: bool = False,
    ) -> ToolSpec:
        """Build a :class:`ToolSpec` from the arguments and :meth:`register` it."""
        spec = ToolSpec(
            name=name,
            func=func,
            description=description,
            parameters=tuple(parameters),
            required=tuple(required),
            param_types=dict(param_types or {}),
            defaults=dict(defaults or {}),
        )
        return self.register(spec, replace=replace)

    def get(self, name: str) -> ToolSpec | None:
        """The spec registered under ``name``, or ``None``."""
        return self._specs.get(name)

    def names(self) -> list[str]:
        """Registered tool names, in registration order."""
        return list(self._specs)

    def __contains__(self, name: object) -> bool:
        return name in self._specs

    def __len__(self) -> int:
        return len(self._specs)

    def __iter__(self) -> Iterator[ToolSpec]:
        return iter(list(self._specs.values()))

    # -- MCP servers as tool sources (lemon_exec/tools/_mcp_source.py) ------------------------

    def add_mcp_server(
        self,
        name: str,
        *,
        command: str | None = None,
        args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        url: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> McpServerConfig:
        """Offer the tools of an MCP server (stdio ``command`` or streamable HTTP ``url``).

        Scripts call them as ``tools.<name>.<tool>(**params)``; ``name`` and the tool names
        are made identifiers. Nothing connects here: each tool host connects on first need
        (listing the tools before its first run), one connection per host, restarted after
        the server crashes. Raises ``ValueError`` for a bad or taken name or a bad target.
        """
        from ._mcp_source import McpServerConfig
        from ._mcp_tools import identifier

        server = identifier(name)
        servers = self._mcp_servers
        if server in servers:
            raise ValueError(f"MCP server {server!r} is already added")
        if server in self._specs or any(n.startswith(server + ".") for n in self._specs):
            raise ValueError(f"MCP server {server!r}: the name is taken by registered tools")
        _check_spec(ToolSpec(name=f"{server}.tool", func=_not_connected))  # a usable name?
        config = McpServerConfig(
            name=server,
            command=command,
            args=tuple(args),
            env=dict(env) if env is not None else None,
            cwd=cwd,
            url=url,
            headers=dict(headers) if headers is not None else None,
        )
        servers[server] = config
        return config

    def mcp_servers(self) -> list[McpServerConfig]:
        """The MCP servers added with :meth:`add_mcp_server`, in order."""
        return list(self._mcp_servers.values())

    def notes(self, server: str) -> tuple[str, ...]:
        """What :meth:`set_server_tools` noted about ``server``'s tools not offered."""
        return self._notes.get(server, ())

    def set_server_tools(
        self, server: str, specs: Sequence[ToolSpec], notes: Sequence[str] = ()
    ) -> None:
        """Make ``specs`` the tools named ``"<server>.*"``, dropping the server's others;
        ``notes`` say which of the server's tools are not offered and why (tools.search()
        lists them)."""
        if tuple(notes) != self._notes.get(server, ()):
            self._notes[server] = tuple(notes)
            self.version += 1
        keep = {spec.name for spec in specs}
        for old in [n for n in self._specs if n.startswith(server + ".") and n not in keep]:
            del self._specs[old]
            self.version += 1  # the kernels' tool specs must be rebuilt
        for spec in specs:
            self.register(spec, replace=True)


def _check_spec(spec: ToolSpec) -> None:
    """Reject specs a Python helper could not be generated from."""
    _check_name(spec.name)
    if not callable(spec.func):
        raise ValueError(f"tool {spec.name!r}: func is not callable")
    if spec.isolated:
        _check_isolated(spec)
    if spec.time_limit_s is not None and not spec.time_limit_s > 0:
        raise ValueError(f"tool {spec.name!r}: time_limit_s must be positive (or None)")
    params = tuple(spec.parameters)
    for p in params:
        if not _is_identifier(p):
            raise ValueError(f"tool {spec.name!r}: parameter {p!r} is not a Python identifier")
    if len(set(params)) != len(params):
        raise ValueError(f"tool {spec.name!r}: duplicate parameter names")
    required = tuple(spec.required)
    if params[: len(required)] != required:
        raise ValueError(
            f"tool {spec.name!r}: required {required!r} must be the first parameters "
            f"of {params!r}, in order"
        )
    for key in (*spec.param_types, *spec.defaults):
        if key not in params:
            raise ValueError(f"tool {spec.name!r}: {key!r} is not one of its parameters")
    for key in spec.defaults:
        if key in required:
            raise ValueError(f"tool {spec.name!r}: required parameter {key!r} has a default")


def _check_isolated(spec: ToolSpec) -> None:
    """An isolated tool runs in a worker process, which imports ``func`` by name."""
    func = spec.func
    if inspect.iscoroutinefunction(func):
        raise ValueError(f"tool {spec.name!r}: an isolated tool must be a sync function")
    module = sys.modules.get(getattr(func, "__module__", None) or "")
    target: Any = module
    for attr in str(getattr(func, "__qualname__", "<?>")).split("."):
        target = getattr(target, attr, None)
    if target is not func or module is None or module.__name__ == "__main__":
        raise ValueError(
            f"tool {spec.name!r}: an isolated tool's func must be a module-level function "
            "of an importable module (the worker process imports it by name)"
        )


def _check_name(name: object) -> None:
    """A top-level identifier or ``server.tool``, shadowing nothing a script relies on."""
    parts = name.split(".") if isinstance(name, str) else [name]
    if len(parts) > 2 or not all(_is_identifier(part) for part in parts):
        raise ValueError(
            "tool name must be a Python identifier or 'server.tool' (two identifiers joined "
            f"by one dot), got {name!r}"
        )
    underscored = [part for part in parts if str(part).startswith("_")]
    if underscored:
        raise ValueError(
            f"tool name {name!r}: {underscored[0]!r} starts with '_', which only Python's own "
            "names do (the tools namespace never offers one); choose a name starting with a "
            "letter"
        )
    first = str(parts[0])
    if first in RESERVED_NAMES:
        raise ValueError(
            f"tool name {name!r}: {first!r} would shadow a Python builtin or a name scripts "
            "rely on (text, notify, batch, ToolError, tools); choose another name"
        )
    if len(parts) == 2 and first in (*HELPER_NAMES, "search"):
        raise ValueError(
            f"tool name {name!r}: server name {first!r} is taken by a default tool or by "
            "tools.search(); choose another server name"
        )


def _check_clash(name: str, specs: Mapping[str, ToolSpec]) -> None:
    """A name is a top-level tool or a server, never both."""
    if "." in name:
        server = name.split(".", 1)[0]
        if server in specs:
            raise ValueError(f"tool {name!r}: {server!r} is already a top-level tool name")
    elif any(other.startswith(name + ".") for other in specs):
        raise ValueError(f"tool {name!r}: {name!r} is already a server of registered tools")


def _not_connected(params: dict[str, Any], call: ToolCall) -> str:
    """The ``func`` of an MCP server's tool: the tool host calls the server instead."""
    raise RuntimeError(f"{call.tool} is an MCP server's tool; only a ToolHost can call it")


def _is_identifier(name: object) -> bool:
    return isinstance(name, str) and name.isidentifier() and not keyword.iskeyword(name)


def default_registry() -> ToolRegistry:
    """A new registry holding the five default tools: read, grep, find, ls, webfetch."""
    # Imported here so that importing the registry alone stays cheap (webfetch pulls urllib
    # and markdownify).
    from . import _find, _grep, _ls, _read, _webfetch

    registry = ToolRegistry()
    for module in (_read, _grep, _find, _ls, _webfetch):
        registry.register(module.spec())
    # The kernel's helpers and the configuration's allowlist are protocol.HELPER_NAMES.
    assert tuple(registry.names()) == HELPER_NAMES, registry.names()
    return registry
