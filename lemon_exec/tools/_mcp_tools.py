"""What an upstream MCP server's tools become here, and what their results become.

:func:`tool_specs` turns the server's tool listing into :class:`ToolSpec` entries named
``"<server>.<tool>"`` with identifier-safe parts (:func:`tool_attribute`, :func:`identifier`)
and the parameter types the schema states simply; :func:`result_text` turns a
``CallToolResult`` into the text the script gets (JSON for structured results).
"""

from __future__ import annotations

import json
import keyword
import re
from collections.abc import Mapping
from typing import Any

from lemon_exec.errors import ToolFailure

from ._types import McpToolInfo, ToolSpec

__all__ = ["MAX_TOOL_NAME", "identifier", "result_text", "tool_attribute", "tool_specs"]

#: JSON schema ``type`` -> the Python types the host accepts for it.
_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "array": (list, tuple),
    "object": (dict,),
}


def identifier(name: str) -> str:
    """``name`` made a Python identifier: other characters -> ``_``, a leading digit
    prefixed with ``_``, a keyword suffixed with ``_``."""
    out = re.sub(r"\W", "_", name, flags=re.ASCII) or "_"
    if out[0].isdigit():
        out = "_" + out
    if keyword.iskeyword(out):
        out += "_"
    return out


#: Longest upstream tool name offered (the MCP spec's own bound); longer ones are skipped.
MAX_TOOL_NAME = 128


def tool_attribute(name: object) -> str | None:
    """The attribute an upstream tool ``name`` is offered as, or None when it cannot be.

    Characters other than ASCII letters, digits and ``_`` become ``_``; leading underscores
    are dropped (``__get__`` -> ``get__``: a name with one is Python's, never a tool's); a
    leading digit gets ``tool_`` (``3d`` -> ``tool_3d``); a keyword gets a trailing ``_``.
    None for a non-string, an empty or over-long name, or one with no letter or digit.
    """
    if not isinstance(name, str) or not name or len(name) > MAX_TOOL_NAME:
        return None
    out = re.sub(r"\W", "_", name, flags=re.ASCII).lstrip("_")
    if not out:
        return None
    if out[0].isdigit():
        out = "tool_" + out
    if keyword.iskeyword(out):
        out += "_"
    return out


def _skip_reason(name: object) -> str:
    if not isinstance(name, str):
        return "its name is not a string"
    if not name:
        return "its name is empty"
    if len(name) > MAX_TOOL_NAME:
        return f"its name is longer than {MAX_TOOL_NAME} characters"
    return "its name has no ASCII letter or digit"


def _shown(name: object) -> str:
    text = repr(name)
    return text if len(text) <= 60 else text[:57] + "..."


def tool_specs(
    server: str, tools: list[Any], func: Any
) -> tuple[list[tuple[ToolSpec, McpToolInfo]], list[str]]:
    """One :class:`ToolSpec` per upstream tool, named ``"<server>.<attribute>"``, and a note
    for each tool that is not offered (its name cannot be one, or it repeats a name).

    Two names that map to one attribute: the later gets ``_`` appended until it is free.
    """
    out: list[tuple[ToolSpec, McpToolInfo]] = []
    notes: list[str] = []
    seen: set[str] = set()
    upstream_seen: set[str] = set()
    for tool in tools:
        attr = tool_attribute(tool.name)
        if attr is None:
            notes.append(f"{server}: upstream tool {_shown(tool.name)}: {_skip_reason(tool.name)}")
            continue
        if tool.name in upstream_seen:
            notes.append(f"{server}: upstream tool {_shown(tool.name)}: listed twice, first kept")
            continue
        upstream_seen.add(tool.name)
        name = attr
        while name in seen:  # two upstream names that map to one attribute
            name += "_"
        seen.add(name)
        schema = tool.input_schema or {}
        props: Mapping[str, Any] = schema.get("properties") or {}
        required_up = [p for p in schema.get("required") or [] if p in props]
        arg_names: dict[str, str] = {}
        used: set[str] = set()
        for up in props:
            ident = identifier(up)
            while ident in used:
                ident += "_"
            used.add(ident)
            arg_names[ident] = up
        upstream_to_ident = {v: k for k, v in arg_names.items()}
        required = tuple(upstream_to_ident[p] for p in required_up)
        optional = tuple(k for k in arg_names if k not in required)
        types: dict[str, type | tuple[type, ...]] = {}
        defaults: dict[str, Any] = {}
        for ident, up in arg_names.items():
            prop = props[up] if isinstance(props[up], Mapping) else {}
            expected = _python_types(prop)
            if expected is not None:
                types[ident] = expected
            if ident not in required and "default" in prop:
                defaults[ident] = prop["default"]
        output = getattr(tool, "output_schema", None) or {}
        out_props = output.get("properties") if isinstance(output, Mapping) else None
        # The SDK wraps a non-object return value as {"result": value}; a wrapped string is
        # handed over as plain text, any other wrapped value as JSON.
        wrapped = (
            isinstance(out_props, Mapping)
            and set(out_props) == {"result"}
            and str(output.get("title", "")).endswith("Output")
        )
        text_result = not output or (
            wrapped
            and isinstance(out_props, Mapping)
            and out_props["result"].get("type") == "string"
        )
        info = McpToolInfo(
            server=server,
            tool=tool.name,
            arg_names=arg_names,
            unwrap_result=wrapped,
            text_result=text_result,
        )
        description = (tool.description or "").strip()
        if name != tool.name:  # searchable by the name the server's documentation uses
            description += f"\n\nUpstream name: {tool.name!r}."
        spec = ToolSpec(
            name=f"{server}.{name}",
            func=func,
            description=description.strip(),
            parameters=required + optional,
            required=required,
            param_types=types,
            defaults=defaults,
            result="text" if text_result else "json",
            mcp=info,
        )
        out.append((spec, info))
    return out, notes


def _python_types(prop: Mapping[str, Any]) -> tuple[type, ...] | None:
    """The Python types of a JSON schema property, or None when not simply expressible."""
    kind = prop.get("type")
    kinds = kind if isinstance(kind, list) else [kind]
    types: list[type] = []
    for k in kinds:
        if k == "null":
            continue
        if not isinstance(k, str) or k not in _JSON_TYPES:
            return None
        types.extend(_JSON_TYPES[k])
    return tuple(dict.fromkeys(types)) or None


def result_text(result: Any, info: McpToolInfo, label: str) -> str:
    """A ``CallToolResult`` as the script's text: JSON of structured content, else the text."""
    if result.is_error:
        raise ToolFailure(f"{label} failed: {_content_text(result.content) or 'error'}")
    structured = result.structured_content
    if structured is not None:
        if info.unwrap_result and isinstance(structured, dict) and set(structured) == {"result"}:
            structured = structured["result"]
        if info.text_result and isinstance(structured, str):
            return structured
        if not info.text_result:
            return json.dumps(structured, ensure_ascii=False)
    if not info.text_result:  # a JSON tool that sent only text: the text, as a JSON string
        return json.dumps(_content_text(result.content), ensure_ascii=False)
    return _content_text(result.content)


def _content_text(content: list[Any]) -> str:
    parts = []
    for block in content:
        kind = getattr(block, "type", "")
        if kind == "text":
            parts.append(block.text)
        else:  # images, audio, resources: named, not inlined
            mime = getattr(block, "mime_type", None) or getattr(block, "mimeType", "")
            parts.append(f"[{kind} content{' ' + mime if mime else ''}]")
    return "\n".join(parts)
