"""How the server's tool calls run on the MCP SDK: raw arguments in, one cancellation, progress
out, and the result's MCP form.

SDK cancellation is anyio's level-triggered cancellation: every await inside a cancelled scope
is cancelled again. The facade and the shell clean up after an ordinary, one-shot asyncio
cancellation, so the work runs in a task of its own; a client's cancel is passed on as a single
``Task.cancel()`` and then waited out under a shield (:func:`detached`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import Any, TypeVar

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError, UnexpectedToolError
from mcp.server.mcpserver.tools import Tool
from mcp.shared.exceptions import MCPError
from mcp_types import CallToolResult, ContentBlock, TextContent, ToolAnnotations

from lemon_exec.mcp._images import image_content, image_metadata
from lemon_exec.mcp._tool_texts import BAD_COMMAND, BAD_TIMEOUT
from lemon_exec.result import ExecuteCodeResult
from lemon_exec.shell import CommandResult

log = logging.getLogger(__name__)

T = TypeVar("T")

# How long a cancelled call waits for the script's or command's teardown. The facade escalates
# INT -> TERM -> KILL with 1 s graces and the shell kills at once, so this is ample.
_CANCEL_GRACE_S = 15.0


class _SchemaTool(Tool):
    """A tool published with a hand-written input schema.

    ``Tool.run`` validates arguments against a pydantic model derived from the function's
    signature, which would both diverge from the published schema and coerce values (``"1"``
    to ``True``) that the tools must refuse with their own messages. This variant hands the
    function the raw argument mapping and the request context instead.
    """

    async def run(
        self, arguments: dict[str, Any], context: Context[Any, Any], convert_result: bool = False
    ) -> Any:
        try:
            return await self.fn(arguments, context)
        except (MCPError, ToolError):
            raise
        except Exception as exc:
            # Same contract as Tool.run: a crash's own text stays in the server log.
            raise UnexpectedToolError(f"Error executing tool {self.name}") from exc


def schema_tool(
    fn: Callable[[Mapping[str, Any], Context], Awaitable[CallToolResult]],
    *,
    name: str,
    description: str,
    input_schema: dict[str, Any],
    annotations: ToolAnnotations,
    output_schema: dict[str, Any] | None = None,
) -> Tool:
    tool = _SchemaTool.from_function(
        fn,
        name=name,
        description=description,
        annotations=annotations,
        structured_output=False,
    )
    update: dict[str, Any] = {"parameters": input_schema, "description": description}
    if output_schema is not None:
        # Published in tools/list as outputSchema; the tool returns its CallToolResult as is.
        update["fn_metadata"] = tool.fn_metadata.model_copy(update={"output_schema": output_schema})
    return tool.model_copy(update=update)


async def detached(coro: Coroutine[Any, Any, T]) -> T:
    """Await ``coro`` in a task of its own, so a cancellation reaches it exactly once.

    When the caller is cancelled (the client cancelled the call, or the server is stopping),
    the task is cancelled once (the facade kills the kernel's process group, the shell the
    command's) and waited for under a shield, bounded by ``_CANCEL_GRACE_S``; then the
    cancellation propagates.
    """
    task = asyncio.ensure_future(coro)
    try:
        return await asyncio.shield(task)
    except BaseException:
        task.cancel()
        with anyio.CancelScope(shield=True), anyio.move_on_after(_CANCEL_GRACE_S):
            await asyncio.wait({task})
        if task.done() and not task.cancelled():
            task.exception()  # retrieved: the caller's own exception is what propagates
        raise


def code_arguments(arguments: Mapping[str, Any]) -> tuple[Any, Any, Any]:
    """``(script, timeout_ms, reset)`` of an execute_code call, as the client sent them.

    The facade validates the values (its refusals are results); only argument names it does
    not know are refused here (``ToolError``). Strict-mode clients send every parameter: a
    null ``reset`` stands for "not given".
    """
    unknown = sorted(set(arguments) - {"script", "timeout_ms", "reset"})
    if unknown:
        raise ToolError(f"execute_code: unknown argument(s): {', '.join(unknown)}")
    reset = arguments.get("reset")
    return arguments.get("script"), arguments.get("timeout_ms"), False if reset is None else reset


def command_arguments(arguments: Mapping[str, Any]) -> tuple[str, float | None]:
    """``(command, timeout)`` of an execute_command call; ``ToolError`` for a bad argument."""
    unknown = sorted(set(arguments) - {"command", "timeout"})
    if unknown:
        raise ToolError(f"execute_command: unknown argument(s): {', '.join(unknown)}")
    command = arguments.get("command")
    timeout = arguments.get("timeout")
    if not isinstance(command, str):
        raise ToolError(BAD_COMMAND)
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, int | float)):
        raise ToolError(BAD_TIMEOUT)
    return command, timeout


def command_result(outcome: CommandResult) -> CallToolResult:
    """The MCP form of an execute_command result: its JSON as text and as structured content."""
    payload = dict(outcome)
    return CallToolResult(
        content=[TextContent(type="text", text=json.dumps(payload, ensure_ascii=False))],
        structured_content=payload,
    )


def send_quietly(send: Any, message: str) -> None:
    # A notify() after the call ended has nobody to go to.
    with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError):
        send.send_nowait(message)


async def forward_progress(ctx: Context, receive: MemoryObjectReceiveStream[str]) -> None:
    """Send each notify() message as a progress notification, in order.

    ``progress`` counts the messages (1, 2, ...) so it increases as MCP requires; there is no
    ``total``. Without a progress token from the client the SDK drops them (a no-op).
    """
    count = 0
    async with receive:
        async for message in receive:
            count += 1
            try:
                await ctx.report_progress(count, None, message)
            except Exception:  # a dead client must not fail the call
                log.debug("progress notification not sent", exc_info=True)


def code_result(result: ExecuteCodeResult) -> CallToolResult:
    """The MCP form of an execute_code result.

    ``content`` is the result text as is (an untrusted result already carries its
    external-content envelope), then one ``ImageContent`` block per image the script showed,
    in order; ``structuredContent`` holds the same text as ``content``, plus ``details`` and
    ``trust`` (many clients show the model only the structured object), and ``images`` (their
    metadata, not their bytes) when there are any. ``isError`` marks a call that was refused
    before anything ran.
    """
    structured: dict[str, Any] = {
        "content": result.content,
        "details": _jsonable(result.details),
        "trust": result.trust,
    }
    content: list[ContentBlock] = [TextContent(type="text", text=result.content)]
    if result.images:
        structured["images"] = [image_metadata(image) for image in result.images]
        content.extend(image_content(image) for image in result.images)
    return CallToolResult(
        content=content,
        structured_content=structured,
        is_error=bool(result.details.get("error")),
    )


def _jsonable(value: Mapping[str, object]) -> dict[str, Any]:
    # details hold plain values today; the round trip guards the wire against a future Path.
    plain: dict[str, Any] = json.loads(json.dumps(value, default=str))
    return plain
