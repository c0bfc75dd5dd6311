"""The cell setup: what the host tells the kernel about one script cell (host → kernel, §2).

It travels as the ``lemon`` entry of the execute_request ``metadata``
(docs/comm-protocol.md §2): built by the host with :func:`cell_metadata`, read by the kernel
with :func:`parse_cell_setup`. The registered tools' specs it may carry are rendered for
listings by :func:`tool_signature` and :func:`first_line`, on both sides. Standard library
only: the kernel side imports it too.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from lemon_exec.wire.protocol import (
    CELL_METADATA_KEY,
    HELPER_NAMES,
    PROTOCOL_VERSION,
    VERSION_MISMATCH,
)


@dataclass(frozen=True)
class CellSetup:
    """What the host tells the kernel about one script cell."""

    token: str
    comm_id: str
    helpers: tuple[str, ...]
    max_text_bytes: int
    filename: str = "script.py"
    argv: tuple[str, ...] | None = None  # sys.argv while the script runs; None: untouched
    cwd: str | None = None  # chdir first (per-call claims); sessions start in their cwd
    env: Mapping[str, str] | None = None  # merged into os.environ
    #: Digest of the enabled registered tools beyond the five (code mode); None: none.
    tools_digest: str | None = None
    #: Their specs, sent only when the kernel has not seen this digest yet (see
    #: lemon_exec/tools/_toolset.py; each entry: name, doc, params).
    tools: tuple[Mapping[str, Any], ...] | None = None
    #: The run's image budgets (image()); None: the kernel checks only what one message holds.
    max_images: int | None = None
    max_image_bytes: int | None = None


def cell_metadata(setup: CellSetup) -> dict[str, Any]:
    """The execute_request ``metadata`` that makes a cell a lemon script run."""
    meta: dict[str, Any] = {
        "v": PROTOCOL_VERSION,
        "token": setup.token,
        "comm_id": setup.comm_id,
        "helpers": list(setup.helpers),
        "max_text_bytes": setup.max_text_bytes,
        "filename": setup.filename,
    }
    if setup.argv is not None:
        meta["argv"] = list(setup.argv)
    if setup.cwd is not None:
        meta["cwd"] = setup.cwd
    if setup.env:
        meta["env"] = dict(setup.env)
    if setup.tools_digest is not None:
        meta["tools_digest"] = setup.tools_digest
    if setup.tools is not None:
        meta["tools"] = list(setup.tools)
    if setup.max_images is not None:
        meta["max_images"] = setup.max_images
    if setup.max_image_bytes is not None:
        meta["max_image_bytes"] = setup.max_image_bytes
    return {CELL_METADATA_KEY: meta}


def parse_cell_setup(meta: Mapping[str, Any]) -> CellSetup | str:
    """The setup in ``metadata.lemon``, or the error text when its version is not ours."""
    if meta.get("v") != PROTOCOL_VERSION:
        return VERSION_MISMATCH.format(got=meta.get("v"))
    argv, env, helpers = meta.get("argv"), meta.get("env"), meta.get("helpers")
    digest, tools = meta.get("tools_digest"), meta.get("tools")
    return CellSetup(
        token=str(meta["token"]),
        comm_id=str(meta["comm_id"]),
        helpers=HELPER_NAMES if helpers is None else tuple(str(h) for h in helpers),
        max_text_bytes=int(meta.get("max_text_bytes", 65536)),
        filename=str(meta.get("filename", "script.py")),
        argv=tuple(str(a) for a in argv) if isinstance(argv, list) else None,
        cwd=str(meta["cwd"]) if meta.get("cwd") else None,
        env={str(k): str(v) for k, v in env.items()} if env else None,
        tools_digest=str(digest) if digest else None,
        tools=_tool_specs(tools),
        max_images=_optional_int(meta.get("max_images")),
        max_image_bytes=_optional_int(meta.get("max_image_bytes")),
    )


def _optional_int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _tool_specs(tools: object) -> tuple[Mapping[str, Any], ...] | None:
    if not isinstance(tools, list):
        return None
    return tuple(t for t in tools if isinstance(t, Mapping))


def tool_signature(spec: Mapping[str, Any]) -> str:
    """``name(query: str, limit: int = 5)``: a registered tool's signature, from its spec."""
    parts = []
    for param in spec.get("params", ()):
        text = str(param["name"])
        if param.get("type"):
            text += f": {param['type']}"
        if not param.get("required"):
            default = (
                param["default_repr"] if "default_repr" in param else repr(param.get("default"))
            )
            text += f" = {default}" if param.get("type") else f"={default}"
        parts.append(text)
    return f"{spec.get('name')}({', '.join(parts)})"


def first_line(doc: object) -> str:
    """The first non-empty line of a tool's description (what listings show)."""
    for line in str(doc or "").splitlines():
        if line.strip():
            return line.strip()
    return ""
