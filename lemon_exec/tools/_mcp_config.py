"""The standard MCP servers file (``--mcp-config FILE``), as used by MCP clients:

``{"mcpServers": {"<name>": {"command": ..., "args": [...], "env": {...}, "cwd": ...}
| {"url": ..., "headers": {...}}}}``

Each entry becomes ``registry.add_mcp_server(name, ...)``; an entry with ``"disabled": true``
is skipped, and a ``"type"`` key (``stdio``, ``http``, ``streamable-http``) is accepted.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lemon_exec.errors import ConfigError

from ._registry import ToolRegistry, default_registry

__all__ = ["load_mcp_servers", "registry_with_mcp_servers"]

_KNOWN = {"command", "args", "env", "cwd", "url", "headers", "type", "disabled"}


def load_mcp_servers(path: str | Path) -> dict[str, dict[str, Any]]:
    """The file's servers as ``add_mcp_server`` keyword arguments, by name.

    Raises :class:`ConfigError` naming the file and the entry for anything malformed.
    """
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"--mcp-config {path}: cannot read it: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise ConfigError(f"--mcp-config {path}: not valid JSON: {exc}") from None
    servers = data.get("mcpServers") if isinstance(data, dict) else None
    if not isinstance(servers, dict):
        raise ConfigError(f'--mcp-config {path}: expected {{"mcpServers": {{"<name>": {{...}}}}}}')
    out: dict[str, dict[str, Any]] = {}
    for name, entry in servers.items():
        where = f"--mcp-config {path}: server {name!r}"
        if not isinstance(entry, dict):
            raise ConfigError(f"{where}: expected an object")
        unknown = sorted(set(entry) - _KNOWN)
        if unknown:
            raise ConfigError(f"{where}: unknown keys {unknown} (known: {sorted(_KNOWN)})")
        if entry.get("disabled") is True:
            continue
        kwargs: dict[str, Any] = {}
        for key in ("command", "cwd", "url"):
            if key in entry:
                kwargs[key] = _string(entry[key], f"{where}: {key}")
        if "args" in entry:
            args = entry["args"]
            if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
                raise ConfigError(f"{where}: args must be a list of strings")
            kwargs["args"] = tuple(args)
        for key in ("env", "headers"):
            if key in entry:
                kwargs[key] = _string_map(entry[key], f"{where}: {key}")
        if ("command" in kwargs) == ("url" in kwargs):
            raise ConfigError(f'{where}: give either "command" (stdio) or "url" (HTTP)')
        out[str(name)] = kwargs
    return out


def registry_with_mcp_servers(path: str | Path) -> ToolRegistry:
    """The default tools plus the file's MCP servers (nothing connects yet)."""
    servers = load_mcp_servers(path)
    registry = default_registry()
    for name, kwargs in servers.items():
        try:
            registry.add_mcp_server(name, **kwargs)
        except ValueError as exc:
            raise ConfigError(f"--mcp-config {path}: server {name!r}: {exc}") from None
    return registry


def _string(value: object, where: str) -> str:
    if not isinstance(value, str):
        raise ConfigError(f"{where} must be a string")
    return value


def _string_map(value: object, where: str) -> dict[str, str]:
    if not isinstance(value, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise ConfigError(f"{where} must be an object of strings")
    return dict(value)
