"""Images through the real ``lemon-exec mcp`` server to the MCP clients agents use.

The script shows a real PNG with ``image()`` between two ``text()`` blocks. Every client must
get it as an image (MCP ``ImageContent``; pydantic-ai's ``BinaryContent``; the OpenAI Agents
SDK's ``image_url`` data URL) after the unchanged result text, and the structured content
must hold the image's metadata, never its bytes.
"""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]  # (nbformat and mcp depend on it)
import pytest
from agents.mcp import MCPServerStdio as AgentsMCPServerStdio
from agents.mcp import MCPUtil
from agents.run_context import RunContextWrapper
from fastmcp import Client as FastMCPClient
from fastmcp.client.transports import StdioTransport
from mcp import Client, StdioServerParameters
from mcp_types import CallToolResult, ImageContent, TextContent
from pydantic_ai import Agent
from pydantic_ai.mcp import MCPToolset
from pydantic_ai.messages import (
    BinaryContent,
    ModelMessage,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from support_images import png

from .conftest import lemon_exec_argv
from .test_http import bearer_client, http_server

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120), pytest.mark.slow, pytest.mark.kernel]

PNG = png(5, 4)
TEXT = "Script result (text()):\nbefore\nafter"
SCRIPT = (
    "import base64\n"
    "text('before')\n"
    f"image(base64.b64decode({base64.b64encode(PNG).decode()!r}), format='png', alt='a patch')\n"
    "text('after')\n"
)
METADATA = {
    "mime_type": "image/png",
    "width": 5,
    "height": 4,
    "alt": "a patch",
    "bytes": len(PNG),
    "after_text_blocks": 1,
}


def _check(result: CallToolResult, output_schema: dict[str, Any] | None) -> None:
    assert not result.is_error
    text, image = result.content
    assert isinstance(text, TextContent)
    assert text.text == TEXT  # the spec's text: first, and unchanged
    assert isinstance(image, ImageContent)
    assert image.mime_type == "image/png"
    assert base64.b64decode(image.data, validate=True) == PNG
    structured = result.structured_content
    assert structured is not None
    assert structured["content"] == TEXT
    assert structured["images"] == [METADATA]
    assert structured["details"]["images"] == 1
    assert image.data not in json.dumps(structured)
    assert output_schema is not None
    jsonschema.validate(structured, output_schema)  # the SDK checked it too


async def test_sdk_stdio_client_gets_the_image_block(tmp_path: Path) -> None:
    argv = lemon_exec_argv("mcp")
    params = StdioServerParameters(
        command=argv[0], args=argv[1:], env=dict(os.environ), cwd=str(tmp_path)
    )
    async with Client(params) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
        result = await client.call_tool("execute_code", {"script": SCRIPT})
    _check(result, tools["execute_code"].output_schema)


async def test_sdk_streamable_http_client_gets_the_image_block(tmp_path: Path) -> None:
    with http_server(tmp_path) as (server, url):
        assert server.token is not None
        async with bearer_client(url, server.token) as client:
            tools = {t.name: t for t in (await client.list_tools()).tools}
            result = await client.call_tool("execute_code", {"script": SCRIPT})
    _check(result, tools["execute_code"].output_schema)


async def test_pydantic_ai_hands_the_model_binary_content(tmp_path: Path) -> None:
    returned: list[Any] = []

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        parts = [part for message in messages for part in getattr(message, "parts", [])]
        if not any(isinstance(part, ToolReturnPart) for part in parts):
            return ModelResponse(parts=[ToolCallPart("execute_code", {"script": SCRIPT})])
        # Everything the model is given after the call: the tool return, and whatever part
        # pydantic-ai moves the binary content to.
        for part in parts:
            content = getattr(part, "content", None)
            returned.extend(content if isinstance(content, list) else [content])
        return ModelResponse(parts=[TextPart("done")])

    argv = lemon_exec_argv("mcp")
    transport = StdioTransport(
        argv[0], argv[1:], env=dict(os.environ), cwd=str(tmp_path), keep_alive=False
    )
    toolset = MCPToolset(transport, init_timeout=60, read_timeout=90)
    async with toolset:
        result = await Agent(FunctionModel(model), toolsets=[toolset]).run("draw")
        direct = await toolset.direct_call_tool("execute_code", {"script": SCRIPT})

    assert result.output == "done"
    # With an image among the blocks pydantic-ai returns the blocks, not the structured object.
    assert isinstance(direct, list)
    text, image = direct
    assert text == TEXT
    assert isinstance(image, BinaryContent)
    assert (image.data, image.media_type) == (PNG, "image/png")
    images = [item for item in returned if isinstance(item, BinaryContent)]
    assert [(item.data, item.media_type) for item in images] == [(PNG, "image/png")]
    assert any(isinstance(item, str) and TEXT in item for item in returned)


async def test_openai_agents_gets_an_image_url(tmp_path: Path) -> None:
    argv = lemon_exec_argv("mcp")
    # use_structured_content off (its default): with it on, the SDK hands the model only
    # json.dumps(structuredContent), which holds the images' metadata, not the images.
    server = AgentsMCPServerStdio(
        params={"command": argv[0], "args": argv[1:], "env": dict(os.environ), "cwd": tmp_path},
        client_session_timeout_seconds=90,
    )
    async with server:
        tools = {tool.name: tool for tool in await server.list_tools()}
        output = await MCPUtil.invoke_mcp_tool(
            server,
            tools["execute_code"],
            RunContextWrapper(context=None),
            json.dumps({"script": SCRIPT, "timeout_ms": None, "reset": None}),
        )

    assert isinstance(output, list)
    text, image = output
    assert text == {"type": "text", "text": TEXT}
    assert image["type"] == "image"
    assert image["image_url"] == f"data:image/png;base64,{base64.b64encode(PNG).decode()}"


async def test_fastmcp_content_has_the_image_and_data_the_metadata(tmp_path: Path) -> None:
    argv = lemon_exec_argv("mcp")
    transport = StdioTransport(
        argv[0], argv[1:], env=dict(os.environ), cwd=str(tmp_path), keep_alive=False
    )
    async with FastMCPClient(transport, timeout=90) as client:
        result = await client.call_tool("execute_code", {"script": SCRIPT})

    text, image = result.content
    assert isinstance(text, TextContent) and text.text == TEXT
    assert isinstance(image, ImageContent)
    assert base64.b64decode(image.data) == PNG
    data: Any = result.data  # the structured object: the metadata, not the picture
    assert data.content == TEXT
    assert [dict(item) if isinstance(item, dict) else vars(item) for item in data.images] == [
        METADATA
    ]
