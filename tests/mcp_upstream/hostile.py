"""A hostile upstream MCP server for the tests: ``python hostile.py [--http PORT [--json]]``.

Its tool names attack the ``tools`` namespace (Python's class protocol, helper names,
names that collide after mangling, unicode, empty, over-long); ``big`` answers with as many
MiB as asked and ``flood`` writes without end on the stdio wire, to test that upstream
answers are bounded as they arrive. ``--plain`` offers only ``echo``, ``big`` and ``flood``.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

import anyio
from mcp.server.mcpserver import MCPServer

# The SDK warns about every odd name at length; they are odd on purpose.
logging.getLogger("mcp").setLevel(logging.ERROR)


class _Hostile(MCPServer):
    """``--slow-listing``: tools/list never answers; ``--endless-listing``: every page
    names a next one."""

    async def _handle_list_tools(self, ctx: Any, params: Any) -> Any:
        if "--slow-listing" in sys.argv:
            await anyio.sleep(3600)
        result = await super()._handle_list_tools(ctx, params)
        if "--endless-listing" in sys.argv:
            result = result.model_copy(update={"next_cursor": "again"})
        return result


server = _Hostile("hostile")

#: Tool names that are offered (mapped to a safe attribute) or skipped with a note.
NAMES = [
    "__set_name__",
    "__get__",
    "__init_subclass__",
    "__class_getitem__",
    "__getattr__",
    "__init__",
    "__repr__",
    "__class__",
    "__dict__",
    "__slots__",
    "_repr_html_",
    "__wrapped__",
    "_members",
    "mro",
    "search",
    "text",
    "batch",
    "tools",
    "print",
    "class",
    "get-weather",
    "get_weather",
    "9lives",
    "météo",
    "日本語",
    "x" * 200,
    "---",
]
EMPTY = ""  # registered under a placeholder, renamed below (the SDK refuses "")


def _answer(name: str):
    def tool() -> str:
        return f"called {name}"

    return tool


if "--plain" not in sys.argv:  # --plain: only echo and big
    for _name in NAMES:
        server.add_tool(_answer(_name), name=_name, description=f"The tool {_name[:40]!r}.")
    server.add_tool(_answer(EMPTY), name="placeholder-empty", description="The empty name.")
    _tools = server._tool_manager._tools
    _tools[EMPTY] = _tools.pop("placeholder-empty")
    _tools[EMPTY].name = EMPTY


@server.tool(description="Echo text back.")
def echo(text: str) -> str:
    return text


@server.tool(description="Answer mib MiB of text.", structured_output=False)
def big(mib: int) -> str:
    return "x" * (mib * 1024 * 1024)


#: The stdio wire, duplicated before the SDK diverts fd 1 to stderr (over HTTP: unused).
WIRE = os.dup(1)


@server.tool(description="Write bytes without end on the stdio wire, bypassing the protocol.")
def flood() -> str:
    chunk = b"y" * (1024 * 1024)
    for _ in range(4096):  # 4 GiB at most, should the reader never stop
        os.write(WIRE, chunk)
    return "flooded"


def main(argv: list[str]) -> None:
    if argv[:1] == ["--http"]:  # --http PORT [--json]: JSON bodies instead of SSE
        import uvicorn

        app = server.streamable_http_app(json_response="--json" in argv)
        uvicorn.run(app, host="127.0.0.1", port=int(argv[1]), log_level="warning")
    else:
        server.run()


if __name__ == "__main__":
    main(sys.argv[1:])
