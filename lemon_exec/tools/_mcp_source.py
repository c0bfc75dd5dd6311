"""MCP servers as tool sources: one client connection per upstream server and tool host.

A :class:`McpServerConfig` says how to reach a server (a stdio command or a streamable HTTP
URL). A :class:`McpSource` is one tool host's connection to it: connected lazily on first use,
owned by one task (the SDK's client must be entered and left in the same task), restarted on
the next use after the server crashed or closed the connection, and closed with the host.
What its tools and results become here is :mod:`lemon_exec.tools._mcp_tools`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from lemon_exec.errors import ToolFailure

from ._mcp_bounded import bounded_http_client, bounded_stdio_client, too_large
from ._mcp_tools import result_text
from ._types import McpToolInfo, ToolCall

__all__ = ["ListingFailure", "McpServerConfig", "McpSource"]

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

#: The words every "message too large" error carries (see _mcp_bounded.too_large).
TOO_LARGE_TEXT = too_large(0).split(" 0 ")[0]


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
