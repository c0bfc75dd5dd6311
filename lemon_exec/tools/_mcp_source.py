"""MCP servers as tool sources: one client connection per upstream server and tool host.

A :class:`McpServerConfig` says how to reach a server (a stdio command or a streamable HTTP
URL). A :class:`McpSource` is one tool host's connection to it: connected lazily on first use,
owned by one task (the SDK's client must be entered and left in the same task), restarted on
the next use after the server crashed or closed the connection, and closed with the host.
:func:`tool_specs` turns the server's tool listing into :class:`ToolSpec` entries named
``"<server>.<tool>"`` with identifier-safe parts.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import keyword
import logging
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from lemon_exec.errors import ToolFailure

from ._mcp_bounded import bounded_http_client, bounded_stdio_client, too_large
from ._types import McpToolInfo, ToolCall, ToolSpec

__all__ = ["McpServerConfig", "McpSource", "identifier", "tool_attribute", "tool_specs"]

log = logging.getLogger(__name__)

#: Seconds to start a server and complete the MCP handshake.
CONNECT_TIMEOUT_S = 30.0
#: Seconds a closing connection gets to end its server before its task is cancelled.
CLOSE_GRACE_S = 5.0

# Bounds on one upstream message while it arrives (_mcp_bounded.py). A call's answer may
# hold its result twice (text and structured content) plus JSON escaping: it may be twice
# the call's result limit plus a margin; past that it cannot fit and is stopped.
MESSAGE_MARGIN = 1024 * 1024
#: A message while no call with a known limit is in flight (the handshake, tool listings).
LISTING_CAP = 8 * 1024 * 1024
#: A call without a result limit (a ToolHost used without a bridge).
UNLIMITED_CALL_CAP = 64 * 1024 * 1024
#: One server-sent event (HTTP); POST bodies are bounded per call instead.
SSE_EVENT_CAP = 16 * 1024 * 1024

#: Seconds a connected server has to list its tools, and the most pages it may take.
LIST_TIMEOUT_S = 10.0
MAX_LIST_PAGES = 100

#: JSON schema ``type`` -> the Python types the host accepts for it.
_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "array": (list, tuple),
    "object": (dict,),
}


#: The words every "message too large" error carries (see _mcp_bounded.too_large).
TOO_LARGE_TEXT = too_large(0).split(" 0 ")[0]


def identifier(name: str) -> str:
    """``name`` made a Python identifier: other characters -> ``_``, a leading digit
    prefixed with ``_``, a keyword suffixed with ``_``."""
    out = re.sub(r"\W", "_", name, flags=re.ASCII) or "_"
    if out[0].isdigit():
        out = "_" + out
    if keyword.iskeyword(out):
        out += "_"
    return out


class ListingFailure(ToolFailure):
    """A connected server did not finish listing its tools (too slow, or pages without
    end); the host does not ask it again until the connection is made anew."""


@dataclass(frozen=True)
class McpServerConfig:
    """How to reach one upstream MCP server: ``command`` (stdio) or ``url`` (HTTP)."""

    name: str
    command: str | None = None
    args: tuple[str, ...] = ()
    env: Mapping[str, str] | None = None
    cwd: str | None = None
    url: str | None = None
    headers: Mapping[str, str] | None = None

    def __post_init__(self) -> None:
        if (self.command is None) == (self.url is None):
            raise ValueError(f"MCP server {self.name!r}: give exactly one of command= and url=")
        if self.command is not None and not self.command:
            raise ValueError(f"MCP server {self.name!r}: command is empty")
        if self.url is not None and not re.match(r"https?://", self.url):
            raise ValueError(f"MCP server {self.name!r}: url must be http:// or https://")

    def describe(self) -> str:
        return self.url if self.url is not None else " ".join([str(self.command), *self.args])


class McpSource:
    """One tool host's connection to one upstream server."""

    def __init__(self, config: McpServerConfig) -> None:
        self.config = config
        self._client: Any = None
        self._task: asyncio.Task[None] | None = None
        self._stop: asyncio.Event | None = None
        self._lock: asyncio.Lock | None = None
        self._error: BaseException | None = None
        #: Connections made so far; the host re-lists the tools when it changes.
        self.generation = 0
        self._closed = False
        #: Message caps of the calls in flight, by call.
        self._caps: dict[object, int] = {}

    def message_cap(self) -> int:
        """Bytes one upstream message may reach before it is stopped (see _mcp_bounded)."""
        return max(self._caps.values()) if self._caps else LISTING_CAP

    # -- connection ---------------------------------------------------------------------------

    def _alive(self) -> bool:
        client = self._client
        if client is None or self._task is None or self._task.done():
            return False
        # The SDK fails every request on a closed transport without sending it; its
        # dispatcher's flag is the only way to see a dead server before using it.
        dispatcher = getattr(getattr(client, "_session", None), "_dispatcher", None)
        return not getattr(dispatcher, "_closed", False)

    async def client(self) -> Any:
        """The live client, (re)connecting first if there is none or the server died."""
        if self._closed:
            raise ToolFailure(f"MCP server {self.config.name!r}: the tool host is closed")
        if self._alive():  # the hot path: no lock
            return self._client
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self._alive():
                return self._client
            await self._disconnect()
            ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._stop = asyncio.Event()
            self._error = None
            self._task = asyncio.create_task(
                self._own(ready, self._stop), name=f"lemon-mcp-{self.config.name}"
            )
            try:
                await asyncio.wait_for(asyncio.shield(ready), CONNECT_TIMEOUT_S)
            except TimeoutError:
                await self._disconnect()
                raise ToolFailure(
                    f"MCP server {self.config.name!r} did not answer within "
                    f"{CONNECT_TIMEOUT_S:g} s ({self.config.describe()})"
                ) from None
            if self._client is None:
                err = self._error
                await self._disconnect()
                raise ToolFailure(
                    f"MCP server {self.config.name!r} could not be started "
                    f"({self.config.describe()}): {_describe_error(err)}"
                )
            self.generation += 1
            return self._client

    async def _own(self, ready: asyncio.Future[None], stop: asyncio.Event) -> None:
        """Enter the SDK client, publish it, and hold it until told to stop."""
        from mcp import Client

        try:
            async with contextlib.AsyncExitStack() as stack:
                target = await _target(self.config, stack, self.message_cap)
                client = await stack.enter_async_context(Client(target))
                self._client = client
                ready.set_result(None)
                await stop.wait()
        except BaseException as exc:
            self._error = exc
            if isinstance(exc, asyncio.CancelledError):
                raise
        finally:
            self._client = None
            if not ready.done():
                ready.set_result(None)

    async def _disconnect(self) -> None:
        task, stop = self._task, self._stop
        self._task = self._stop = None
        self._client = None
        if task is None:
            return
        if stop is not None:
            stop.set()
        done, _ = await asyncio.wait({task}, timeout=CLOSE_GRACE_S)
        if not done:
            task.cancel()
            await asyncio.wait({task}, timeout=CLOSE_GRACE_S)

    async def aclose(self) -> None:
        """End the connection (and a stdio server's process). Idempotent."""
        self._closed = True
        await self._disconnect()

    def close_nowait(self) -> None:
        """Ask the connection to end from sync code; it ends as the loop runs."""
        self._closed = True
        if self._stop is not None:
            self._stop.set()

    # -- tools --------------------------------------------------------------------------------

    async def list_tools(self) -> list[Any]:
        """The server's tools (``mcp_types.Tool``), all pages.

        Raises :class:`ListingFailure` when the connected server does not finish its
        listing within ``LIST_TIMEOUT_S`` or ``MAX_LIST_PAGES`` pages.
        """
        client = await self.client()
        tools: list[Any] = []
        cursor: str | None = None
        name = self.config.name
        try:
            async with asyncio.timeout(LIST_TIMEOUT_S):
                for _page in range(MAX_LIST_PAGES):
                    page = await client.list_tools(cursor=cursor)
                    tools.extend(page.tools)
                    cursor = page.next_cursor
                    if not cursor:
                        return tools
        except TimeoutError:
            raise ListingFailure(
                f"MCP server {name!r} did not list its tools within {LIST_TIMEOUT_S:g} s"
            ) from None
        raise ListingFailure(f"MCP server {name!r} listed more than {MAX_LIST_PAGES} pages")

    async def call(self, info: McpToolInfo, params: Mapping[str, Any], call: ToolCall) -> str:
        """Call the upstream tool; the text the script gets (JSON for structured results)."""
        from mcp import MCPError

        label = f"{info.server}.{info.tool}"
        args = {info.arg_names.get(k, k): v for k, v in params.items() if v is not None}
        client = await self.client()
        progress = _progress_callback(call.notify) if call.notify is not None else None
        limit = call.result_limit
        token = object()
        self._caps[token] = (
            UNLIMITED_CALL_CAP if limit is None else 2 * max(0, limit) + MESSAGE_MARGIN
        )
        try:
            result = await client.call_tool(info.tool, args, progress_callback=progress)
        except MCPError as exc:
            message = str(exc)
            if TOO_LARGE_TEXT in message:  # the SDK may have prefixed it (HTTP)
                message = message[message.index(TOO_LARGE_TEXT) :]
            elif not self._alive():
                message = (
                    f"MCP server {info.server!r} closed the connection "
                    "(it is restarted on the next call)"
                )
            raise ToolFailure(f"{label} failed: {message}") from None
        finally:
            del self._caps[token]
        return result_text(result, info, label)


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


def _progress_callback(notify: Callable[[str], None]) -> Any:
    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        if message:
            notify(message)
        else:
            notify(f"{progress:g}/{total:g}" if total else f"{progress:g}")

    return on_progress


async def _target(
    config: McpServerConfig, stack: contextlib.AsyncExitStack, cap: Callable[[], int]
) -> Any:
    """What ``mcp.Client`` connects to: a stdio or HTTP transport bounding each message."""
    if config.command is not None:
        from mcp import StdioServerParameters

        # The SDK merges env over a minimal inherited environment (HOME, PATH, ...), as MCP
        # clients do: the host's other variables (its keys and tokens) stay out of the server.
        env = None if config.env is None else dict(config.env)
        params = StdioServerParameters(
            command=config.command, args=list(config.args), env=env, cwd=config.cwd
        )
        return bounded_stdio_client(params, cap)
    assert config.url is not None
    from mcp.client.streamable_http import streamable_http_client

    headers = dict(config.headers) if config.headers else None
    http = await stack.enter_async_context(bounded_http_client(headers, cap))
    return streamable_http_client(config.url, http_client=http, max_sse_event_size=SSE_EVENT_CAP)


def _describe_error(exc: BaseException | None) -> str:
    """The first leaf of a (nested) exception group, as ``Type: message``."""
    while exc is not None:
        inner = getattr(exc, "exceptions", None)
        if not isinstance(inner, tuple) or not inner:
            return f"{type(exc).__name__}: {exc}"
        exc = inner[0]
    return "the connection ended"


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
