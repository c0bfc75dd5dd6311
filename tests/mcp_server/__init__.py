"""Tests of the MCP server (``lemon_exec.mcp``) and the ``lemon-exec mcp`` command."""
