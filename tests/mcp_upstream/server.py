"""A small upstream MCP server for the tests: ``python server.py [--http PORT]``.

Runs over stdio by default, or streamable HTTP on 127.0.0.1:PORT (path /mcp). Its tools cover
what code mode must handle: structured and text results, errors, progress, slow calls, a crash,
and names that are not Python identifiers.
"""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError

server = MCPServer("upstream")


@server.tool(description="Echo text back, repeated.")
def echo(text: str, times: int = 1) -> str:
    return text * times


@server.tool(description="Add two integers; a structured result.")
def add(a: int, b: int) -> dict[str, Any]:
    return {"sum": a + b, "inputs": [a, b]}


@server.tool(description="Always fails with the given message.")
def fail(message: str) -> str:
    raise ToolError(message)


@server.tool(description="Sleep ms milliseconds, then answer.")
async def slow(ms: int = 100) -> str:
    await asyncio.sleep(ms / 1000)
    return f"slept {ms}"


@server.tool(description="Report progress steps, then answer.")
async def progress(steps: int, ctx: Context) -> str:
    for i in range(steps):
        await ctx.report_progress(i + 1, steps, f"step {i + 1} of {steps}")
    return "progressed"


@server.tool(description="The server's process id.")
def pid() -> int:
    return os.getpid()


@server.tool(description="The server's environment variables.")
def environ() -> dict[str, str]:
    return dict(os.environ)


@server.tool(description="Kill this server process.")
def crash() -> str:
    os._exit(3)


@server.tool(name="get-weather", description="A tool whose name is not an identifier.")
def get_weather(city: str, unit: str = "C") -> str:
    return f"{city}: 21 {unit}"


@server.tool(name="class", description="A tool named by a keyword.")
def klass(value: float) -> str:
    return f"value={value}"


def main(argv: list[str]) -> None:
    if argv[:1] == ["--http"]:
        import uvicorn

        app = server.streamable_http_app()
        uvicorn.run(app, host="127.0.0.1", port=int(argv[1]), log_level="warning")
    else:
        server.run()


if __name__ == "__main__":
    main(sys.argv[1:])
