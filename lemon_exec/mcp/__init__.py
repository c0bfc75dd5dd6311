"""An MCP server for execute_code and the shell tools, on the official ``mcp`` SDK (2.x).

``lemon-exec mcp`` serves three tools: ``execute_code`` (Python scripts in Jupyter kernels),
``execute_command`` and ``restart_session`` (one shell session per server process).
``lemon-exec mcp --only shell`` serves just the shell tools, under the server name
``code-execution-tools``. In code::

    from lemon_exec.mcp import build_server, run_stdio

    server = build_server()          # an mcp.server.mcpserver.MCPServer
    run_stdio(server)

Needs the ``mcp`` extra (``pip install 'lemon_exec[mcp]'``). See ``docs/mcp.md``.
"""

from __future__ import annotations

from lemon_exec.mcp._serve import (
    HttpLimits,
    ListenFailed,
    NoAuthRefused,
    RemoteHostRefused,
    is_loopback_host,
    parse_http_address,
    run_http,
    run_stdio,
)
from lemon_exec.mcp._server import (
    AGENT_ID,
    SERVER_NAME,
    SHELL_SERVER_NAME,
    LemonExecServer,
    build_server,
)

__all__ = [
    "AGENT_ID",
    "SERVER_NAME",
    "SHELL_SERVER_NAME",
    "HttpLimits",
    "LemonExecServer",
    "ListenFailed",
    "NoAuthRefused",
    "RemoteHostRefused",
    "build_server",
    "is_loopback_host",
    "parse_http_address",
    "run_http",
    "run_stdio",
]
