"""LangChain's MCP adapters hand the model the picture ``image()`` showed.

``langchain-mcp-adapters`` pins ``mcp<2`` (our tests use the 2.x SDK), so it lives in a venv
of its own (``LEMON_TEST_LANGCHAIN_VENV``, default ``<repo>/.ci-langchain-venv``), created
here (:mod:`support_venv`) when it lacks the package; if that fails the test fails (never
skips) with the command that fixes it. Its client drives the real ``lemon-exec mcp`` over
stdio and prints the ToolMessage's content blocks as JSON.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
from pathlib import Path

import pytest
from support_venv import ensure_own_venv

from .conftest import lemon_exec_argv
from .test_images_clients import PNG, SCRIPT, TEXT

pytestmark = [pytest.mark.timeout(900), pytest.mark.slow, pytest.mark.kernel]

REPO = Path(__file__).resolve().parents[2]
VENV_ENV = "LEMON_TEST_LANGCHAIN_VENV"
REQUIREMENT = "langchain-mcp-adapters>=0.3,<0.4"

#: Run by the venv's interpreter: argv[1:] is the server's command line, stdin the script.
_CLIENT = """
import asyncio, json, sys
from langchain_mcp_adapters.client import MultiServerMCPClient

async def main():
    server = {"command": sys.argv[1], "args": sys.argv[2:], "transport": "stdio"}
    tools = await MultiServerMCPClient({"lemon": server}).get_tools()
    tool = next(t for t in tools if t.name == "execute_code")
    call = {"args": {"script": sys.stdin.read()}, "id": "1", "name": tool.name,
            "type": "tool_call"}
    message = await tool.ainvoke(call)
    print(json.dumps({"type": type(message).__name__, "content": message.content}))

asyncio.run(main())
"""


def _venv_python() -> Path:
    venv = Path(os.environ.get(VENV_ENV) or REPO / ".ci-langchain-venv")
    return ensure_own_venv(venv, REQUIREMENT, what="langchain-mcp-adapters", env_name=VENV_ENV)


def test_langchain_gets_the_image_block_after_the_text(tmp_path: Path) -> None:
    python = _venv_python()
    done = subprocess.run(
        [str(python), "-c", _CLIENT, *lemon_exec_argv("mcp")],
        input=SCRIPT,
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=dict(os.environ),
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    message = json.loads(done.stdout.strip().splitlines()[-1])
    assert message["type"] == "ToolMessage"
    text, image = message["content"]
    assert text["type"] == "text" and text["text"] == TEXT  # the spec's text, first
    assert image["type"] == "image" and image["mime_type"] == "image/png"
    assert base64.b64decode(image["base64"], validate=True) == PNG
