"""The real ``lemon-exec mcp`` stdio server through the MCP client libraries agents use.

Each of these libraries hands the model the tool result's *structured* content when there is
one (pydantic-ai always, the OpenAI Agents SDK with ``use_structured_content=True``, fastmcp as
``result.data``), so the script's ``text()`` output must be in it, not only in ``content``.
Strict-mode clients also send every declared parameter, absent ones as ``null``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from agents.mcp import MCPServerStdio as AgentsMCPServerStdio
from agents.mcp import MCPUtil
from agents.run_context import RunContextWrapper
from fastmcp import Client as FastMCPClient
from fastmcp.client.transports import StdioTransport
from pydantic_ai import Agent, ModelRetry
from pydantic_ai.mcp import MCPToolset
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from .conftest import lemon_exec_argv

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120), pytest.mark.slow, pytest.mark.kernel]

#: What the script hands back with text(); only this has to reach the model.
MARKER = "lemon-result-4f1c"
SCRIPT = f"print('diagnostic')\ntext('{MARKER}')"
#: Every declared parameter, the optional ones null, as a strict-mode client sends them.
STRICT_ARGS = {"script": SCRIPT, "timeout_ms": None, "reset": None}


def _transport(tmp_path: Path) -> StdioTransport:
    argv = lemon_exec_argv("mcp")
    return StdioTransport(
        argv[0], argv[1:], env=dict(os.environ), cwd=str(tmp_path), keep_alive=False
    )


async def test_pydantic_ai_agent_hands_the_model_the_text(tmp_path: Path) -> None:
    seen: list[str] = []

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        returns = [
            part
            for message in messages
            for part in getattr(message, "parts", [])
            if isinstance(part, ToolReturnPart)
        ]
        if not returns:
            assert [tool.name for tool in info.function_tools] == [
                "execute_code",
                "execute_command",
                "restart_session",
            ]
            return ModelResponse(parts=[ToolCallPart("execute_code", STRICT_ARGS)])
        # The exact string pydantic-ai puts into the model request for this tool return.
        seen.extend(part.model_response_str() for part in returns)
        return ModelResponse(parts=[TextPart("done")])

    toolset = MCPToolset(_transport(tmp_path), init_timeout=60, read_timeout=90)
    agent = Agent(FunctionModel(model), toolsets=[toolset])
    async with toolset:
        result = await agent.run("run the script")
        direct = await toolset.direct_call_tool("execute_code", {"script": SCRIPT})
        # A refused call: pydantic-ai retries with the structured content as the message.
        with pytest.raises(ModelRetry) as refused:
            await toolset.direct_call_tool("execute_code", {"script": 42})

    assert result.output == "done"
    assert len(seen) == 1
    assert MARKER in seen[0]
    assert "diagnostic" in seen[0]
    assert isinstance(direct, dict)
    assert MARKER in direct["content"]
    assert direct["trust"] == "trusted"
    assert direct["details"]["exit_code"] == 0
    assert "`script`" in str(refused.value)


async def test_openai_agents_structured_content_holds_the_text(tmp_path: Path) -> None:
    argv = lemon_exec_argv("mcp")
    server = AgentsMCPServerStdio(
        params={"command": argv[0], "args": argv[1:], "env": dict(os.environ), "cwd": tmp_path},
        use_structured_content=True,
        client_session_timeout_seconds=90,
    )
    context = RunContextWrapper(context=None)
    async with server:
        tools = {tool.name: tool for tool in await server.list_tools()}
        code = tools["execute_code"]
        # The schema the SDK gives a strict-mode model: every parameter required.
        strict = MCPUtil.to_function_tool(code, server, convert_schemas_to_strict=True)
        assert sorted(strict.params_json_schema["required"]) == ["reset", "script", "timeout_ms"]
        output = await MCPUtil.invoke_mcp_tool(server, code, context, json.dumps(STRICT_ARGS))
        command = await MCPUtil.invoke_mcp_tool(
            server,
            tools["execute_command"],
            context,
            json.dumps({"command": "echo shell-ok", "timeout": None}),
        )
        restart = await MCPUtil.invoke_mcp_tool(
            server, tools["restart_session"], context, json.dumps({})
        )

    # With use_structured_content the model gets json.dumps(structuredContent), nothing else.
    assert isinstance(output, str)
    payload = json.loads(output)
    assert MARKER in payload["content"]
    assert payload["trust"] == "trusted"
    assert payload["details"]["exit_code"] == 0
    assert isinstance(command, str)
    assert json.loads(command)["stdout"] == "shell-ok\n"
    assert "Session restarted" in json.dumps(restart)


async def test_fastmcp_client_data_holds_the_text(tmp_path: Path) -> None:
    async with FastMCPClient(_transport(tmp_path), timeout=90) as client:
        tools = {tool.name: tool for tool in await client.list_tools()}
        result = await client.call_tool("execute_code", STRICT_ARGS)
        command = await client.call_tool("execute_command", {"command": "echo hi", "timeout": None})

    schema = tools["execute_code"].output_schema
    assert schema is not None
    assert set(schema["required"]) == {"content", "details", "trust"}
    assert not result.is_error
    # result.data is what fastmcp-based frameworks hand on: the output schema's object.
    data: Any = result.data
    assert data is not None
    assert MARKER in data.content
    assert data.trust == "trusted"
    assert data.details["exit_code"] == 0
    assert command.data is not None
    assert command.structured_content is not None
    assert command.structured_content["stdout"] == "hi\n"
