"""Upstream MCP transports that bound each message as it arrives.

The SDK reads a whole stdio line (joining its chunks over and over) or a whole HTTP body
before anything can look at its size: a server answering 64 MiB costs the host seconds of
CPU and its memory. These transports read below the SDK and stop a message at ``cap()``
bytes (the largest of the in-flight calls' limits, see ``McpSource``): the request it
answers fails at once with an error naming the limit, the rest of the message is dropped
unread into memory, and the connection stays usable.

* stdio: :func:`bounded_stdio_client`, the SDK's stdio transport with its reader replaced
  (the process start and the shutdown sequence are the SDK's own functions). A stopped
  line whose start names no request in flight (garbage on the wire), or one still running
  ``DRAIN_LIMIT`` bytes past its cap, ends the connection instead: every call in flight
  fails, and the next call restarts the server.
* streamable HTTP: :func:`bounded_http_client`, an ``httpx2.AsyncClient`` whose POST
  response bodies stop at ``cap()`` bytes; the SDK turns the error into the request's
  JSON-RPC error. Server-initiated events (the GET stream) keep the SDK's per-event cap.
"""

from __future__ import annotations

import re
import sys
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import asynccontextmanager, suppress
from typing import Any

import anyio
import anyio.lowlevel

__all__ = ["TOO_LARGE_CODE", "bounded_http_client", "bounded_stdio_client", "too_large"]

#: The JSON-RPC error code of a message stopped at its cap (implementation-defined range).
TOO_LARGE_CODE = -32099
#: After a message passed its cap, this much more of it is read and dropped; a server still
#: sending then is no longer read (it blocks on its pipe) and is restarted on the next call.
DRAIN_LIMIT = 256 * 1024 * 1024
#: The part of a stopped message searched for the id of the request it answers.
_HEAD = 4096
_ID = re.compile(rb'"id"\s*:\s*(-?\d+|"(?:[^"\\]|\\.){0,200}")')


def too_large(cap: int) -> str:
    return (
        f"its answer passed {cap} bytes while arriving (the limit follows the run's "
        "remaining max_rpc_result_bytes) and was dropped; ask the tool for less"
    )


def _request_id(head: bytes, in_flight: set[Any]) -> Any:
    """The in-flight request a stopped message answers, by the id near its start, or None."""
    match = _ID.search(head)
    if match is None:
        return None
    raw = match.group(1)
    try:
        rid: Any = int(raw) if raw[:1] != b'"' else raw[1:-1].decode()
    except ValueError:
        return None
    return rid if rid in in_flight else None


@asynccontextmanager
async def bounded_stdio_client(
    server: Any, cap: Callable[[], int], errlog: Any = None
) -> AsyncGenerator[Any, None]:
    """The SDK's ``stdio_client`` for ``server`` (``StdioServerParameters``), with each
    stdout line bounded by ``cap()`` bytes as it is read."""
    import mcp_types as types
    from mcp.client import stdio as sdk
    from mcp.shared.message import SessionMessage

    command = await sdk._get_executable_command(server.command)
    process = await sdk._create_platform_compatible_process(
        command=command,
        args=server.args,
        env=sdk.get_default_environment() | (server.env or {}),
        errlog=errlog if errlog is not None else sys.stderr,
        cwd=server.cwd,
    )
    # As in the SDK: no awaits until the task group is entered, or a cancellation in the gap
    # would leak the live process.
    read_writer, read_stream = anyio.create_memory_object_stream[Any](0)
    write_stream, write_reader = anyio.create_memory_object_stream[Any](0)
    in_flight: set[Any] = set()  # ids of requests sent and not answered
    state = {"shutting_down": False, "abandoned": False}
    writer_done = anyio.Event()

    async def deliver(line: bytes) -> None:
        try:
            message = types.jsonrpc_message_adapter.validate_json(line, by_name=False)
        except ValueError as exc:
            await read_writer.send(exc)
            return
        if isinstance(message, types.JSONRPCResponse | types.JSONRPCError):
            in_flight.discard(message.id)
        await read_writer.send(SessionMessage(message))

    async def refuse(head: bytes, limit: int) -> bool:
        """Fail the request a stopped message answers; False when it answers none known
        (then every request in flight fails, and the stream is not to be trusted)."""
        rid = _request_id(head, in_flight)
        for rid_ in [rid] if rid is not None else list(in_flight):
            in_flight.discard(rid_)
            error = types.ErrorData(code=TOO_LARGE_CODE, message=too_large(limit))
            await read_writer.send(
                SessionMessage(types.JSONRPCError(jsonrpc="2.0", id=rid_, error=error))
            )
        return rid is not None

    async def abandon() -> None:
        """Stop reading a server that sends what answers nothing (or without end): the
        session sees the connection end, and the next call restarts the server."""
        state["abandoned"] = True
        await read_writer.aclose()
        # Its writes now fail (EPIPE) instead of blocking, so it can stop when asked to.
        if process.stdout is not None:
            with suppress(Exception):
                await process.stdout.aclose()

    async def stdout_reader() -> None:
        assert process.stdout is not None
        pieces: list[bytes] = []
        size = 0
        head = b""
        dropped = -1  # bytes dropped of the current line; -1: not dropping
        try:
            async with read_writer:
                try:
                    async for chunk in process.stdout:
                        start = 0
                        while True:
                            end = chunk.find(b"\n", start)
                            piece = chunk[start:] if end < 0 else chunk[start:end]
                            if dropped >= 0:
                                dropped += len(piece)
                                if dropped > DRAIN_LIMIT:
                                    return await abandon()
                            else:
                                if len(head) < _HEAD:
                                    head += piece[: _HEAD - len(head)]
                                limit = cap()
                                if size + len(piece) > limit:
                                    pieces.clear()
                                    dropped = size + len(piece)
                                    if not await refuse(head, limit):
                                        return await abandon()
                                else:
                                    pieces.append(piece)
                                    size += len(piece)
                            if end < 0:
                                break
                            if dropped < 0 and pieces:
                                await deliver(b"".join(pieces))
                            pieces.clear()
                            size, head, dropped = 0, b"", -1
                            start = end + 1
                except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                    return  # the session is gone
                finally:
                    if not state["abandoned"]:
                        await sdk._drain_stdout(process)
        except anyio.ClosedResourceError:
            pass  # our own shutdown closed stdout under the read
        except (anyio.BrokenResourceError, ConnectionError):
            if not state["shutting_down"]:
                sdk.logger.exception("Reading from the MCP server's stdout failed mid-session")

    async def stdin_writer() -> None:
        assert process.stdin is not None
        try:
            async with write_reader:
                async for session_message in write_reader:
                    message = session_message.message
                    if isinstance(message, types.JSONRPCRequest):
                        in_flight.add(message.id)
                    data = message.model_dump_json(by_alias=True, exclude_unset=True)
                    await process.stdin.send((data + "\n").encode())
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            await read_writer.aclose()  # the session sees the end instead of hanging
        finally:
            writer_done.set()

    async def shutdown() -> None:
        read_stream.close()
        write_stream.close()
        with anyio.move_on_after(sdk._WRITER_FLUSH_TIMEOUT):
            await writer_done.wait()
        await sdk._stop_server_process(process)
        await sdk._aclose_all(read_stream, write_stream, read_writer, write_reader)
        await anyio.lowlevel.checkpoint()

    async with anyio.create_task_group() as tg:
        tg.start_soon(stdout_reader)
        tg.start_soon(stdin_writer)
        try:
            yield read_stream, write_stream
        finally:
            state["shutting_down"] = True
            with anyio.CancelScope(shield=True):  # bounded waits: the server never leaks
                await shutdown()
            tg.cancel_scope.cancel()


def _too_large_error() -> type[Exception]:
    import httpx2

    class ResponseTooLarge(httpx2.StreamError, httpx2.SSEError):
        """Caught by the SDK's JSON (StreamError) and SSE (SSEError) readers alike."""

        def __init__(self, message: str) -> None:
            httpx2.StreamError.__init__(self, message)

    return ResponseTooLarge


def bounded_http_client(headers: dict[str, str] | None, cap: Callable[[], int]) -> Any:
    """An ``httpx2.AsyncClient`` (the SDK's timeouts) whose POST response bodies stop at
    ``cap()`` bytes, read uncompressed so the count is what memory holds."""
    import httpx2
    from mcp.shared._httpx_utils import MCP_DEFAULT_SSE_READ_TIMEOUT, MCP_DEFAULT_TIMEOUT

    too_large_error = _too_large_error()

    class BoundedBody(httpx2.AsyncByteStream):
        def __init__(self, inner: Any, limit: int) -> None:
            self._inner = inner
            self._limit = limit

        async def __aiter__(self) -> AsyncIterator[bytes]:
            total = 0
            async for chunk in self._inner:
                total += len(chunk)
                if total > self._limit:
                    raise too_large_error(too_large(self._limit))
                yield chunk

        async def aclose(self) -> None:
            await self._inner.aclose()

    class BoundedTransport(httpx2.AsyncBaseTransport):
        def __init__(self) -> None:
            self._inner = httpx2.AsyncHTTPTransport()

        async def handle_async_request(self, request: Any) -> Any:
            response = await self._inner.handle_async_request(request)
            if request.method != "POST":
                return response  # the GET event stream: the SDK caps each event
            return httpx2.Response(
                response.status_code,
                headers=response.headers,
                stream=BoundedBody(response.stream, cap()),
                extensions=response.extensions,
                request=request,
            )

        async def aclose(self) -> None:
            await self._inner.aclose()

    return httpx2.AsyncClient(
        transport=BoundedTransport(),
        headers={**(headers or {}), "Accept-Encoding": "identity"},
        timeout=httpx2.Timeout(MCP_DEFAULT_TIMEOUT, read=MCP_DEFAULT_SSE_READ_TIMEOUT),
    )
