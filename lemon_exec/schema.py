"""The execute_code tool's JSON input schema and its model-facing description."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from lemon_exec.config import ExecuteCodeConfig
from lemon_exec.wire.cell_setup import first_line, tool_signature

#: The model-facing signature of each of the five helpers (protocol.HELPER_NAMES).
_SIGNATURES = {
    "read": "read(path, offset=None, limit=None) -> str",
    "grep": "grep(pattern, path='.', glob=None, ignore_case=False, max_results=None) -> str",
    "find": "find(pattern, path='.') -> str",
    "ls": "ls(path='.') -> str",
    "webfetch": "webfetch(url, extract_mode='markdown', max_chars=None) -> str",
}


def _extra_lines(tools: Sequence[Mapping[str, Any]]) -> list[str]:
    """Registered tools beyond the five: top-level ones in full, servers by name only.

    A server's tools cost the model nothing up front: the script discovers them with
    tools.search() and help(tools.<server>).
    """
    lines: list[str] = []
    servers: dict[str, int] = {}
    for spec in tools:
        if "note" in spec:  # an upstream tool not offered: tools.search() lists the note
            continue
        name = str(spec.get("name"))
        if "." in name:
            server = name.split(".", 1)[0]
            servers[server] = servers.get(server, 0) + 1
            continue
        summary = first_line(spec.get("doc"))
        lines.append(f"- {tool_signature(spec)} -> str" + (f": {summary}" if summary else ""))
    for server, count in servers.items():
        lines.append(
            f"- tools.{server}: {count} tools of server {server!r}; help(tools.{server}) lists "
            f"them, call as tools.{server}.<tool>(...) (in batch(): '{server}.<tool>')."
        )
    lines.append(
        "- tools.search(query) -> matching tools, one 'name(signature) — summary' line each; "
        "help(f) shows a tool's full description."
    )
    return lines


def describe(config: ExecuteCodeConfig, tools: Sequence[Mapping[str, Any]] | None = None) -> str:
    """A description generated from ``config`` and the extra tools' specs (``tools``, as
    lemon_exec/tools/_toolset.py builds them); byte-identical for identical inputs."""
    helpers = config.enabled_helpers
    persistent = config.mode == "session"
    lines = [
        "Run a Python 3 script and return its result. Use it to call tools in bulk and "
        "return only a summary: intermediate tool results never enter the transcript.",
        "",
        "Pre-imported in the script:",
        *(f"- {_SIGNATURES[name]}" for name in helpers),
        *(_extra_lines(tools) if tools else ()),
        "- text(s): add s to the result. Only text() blocks are the result; printed "
        "output is returned separately as diagnostics.",
        "- notify(msg): stream a short progress message while the script runs.",
        "- image(obj, format=None, alt=None): show the model an image (a matplotlib figure or "
        "plt, a PIL image, an image file path, or bytes with format='png'); shown images "
        f"follow the text, at most {config.max_images} ({config.max_image_bytes} bytes) per run.",
        "- batch([(tool, params_dict), ...]) -> list[str]: run helper calls in parallel, "
        "results in input order; the first failure is re-raised.",
        "- ToolError: raised by a helper on denial, failure or a budget limit (catchable).",
        "",
        "Limits per run: "
        f"{config.run_timeout_ms} ms wall time (timeout_ms may lower it), "
        f"{config.max_rpc_calls} helper calls, "
        f"{config.max_rpc_result_bytes} bytes of helper results, "
        f"{config.max_text_bytes} bytes of text() blocks, "
        f"{config.max_output_bytes} bytes of printed output (the rest is saved to a file), "
        f"{config.max_parallel_rpc} helper calls at once.",
        "No stdin: input() raises an error. This is not a sandbox: the script runs with the "
        "user's permissions.",
    ]
    if persistent:
        lines.append(
            "State persists between calls in this session (imports, variables). "
            "reset=true starts from a fresh interpreter. A timeout or crash loses the state."
        )
    else:
        lines.append("Every call runs in a fresh interpreter; nothing persists between calls.")
    return "\n".join(lines)


def input_schema(config: ExecuteCodeConfig) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            "script": {"type": "string", "description": "The Python 3 source to run."},
            "timeout_ms": {
                "type": "integer",
                "minimum": 1000,
                "maximum": config.run_timeout_ms,
                "description": f"Wall-time limit in ms (1000..{config.run_timeout_ms}).",
            },
            "reset": {
                "type": "boolean",
                "description": "Discard retained session state before running.",
            },
        },
        "required": ["script"],
        "additionalProperties": False,
    }


def tool_schema(
    config: ExecuteCodeConfig, tools: Sequence[Mapping[str, Any]] | None = None
) -> dict[str, Any]:
    return {
        "name": "execute_code",
        "description": describe(config, tools),
        "input_schema": input_schema(config),
    }
