"""Every way to run a script sees the same helpers, MCP tools included.

One upstream MCP server (tests/mcp_upstream/server.py over streamable HTTP) is configured
once, as an ``mcpServers`` file, and the same script runs through each way in: the facade,
a session owner from ``attach()`` (as its facade's first call, so nothing else listed the
server's tools before it), ``lemon-exec run --mcp-config``, the MCP server's
``tools/call`` (``lemon-exec mcp --mcp-config``) and the notebook runner. Each must report
the same helpers and reach the upstream tool.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nbformat
import pytest
from mcp_upstream import serving_http
from nbformat.v4 import new_code_cell, new_notebook

from lemon_exec import ExecuteCode, ExecuteCodeConfig, ExecuteCodeResult, SessionScope
from lemon_exec.notebooks.runner import run_scenario
from lemon_exec.tools._mcp_config import registry_with_mcp_servers

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

SERVER = str(Path(__file__).parent / "mcp_upstream" / "server.py")

#: What the script saw: the five helpers it can call, and the upstream server's add().
SCRIPT = """
import json
helpers = [n for n in ("read", "grep", "find", "ls", "webfetch") if callable(globals().get(n))]
text(json.dumps({"helpers": helpers, "up.add": tools.up.add(a=20, b=22)["sum"]}))
"""
EXPECTED = {"helpers": ["read", "grep", "find", "ls", "webfetch"], "up.add": 42}
ENV = {**os.environ, "LEMON_EXECUTE_CODE_WARM_KERNELS": "0"}


def seen(content: str) -> dict[str, Any]:
    """The script's report, from a result's content (whatever surrounds the text block)."""
    for line in content.splitlines():
        if line.startswith('{"helpers"'):
            found: dict[str, Any] = json.loads(line)
            return found
    raise AssertionError(f"the script did not report what it saw:\n{content}")


@pytest.fixture(scope="module")
def mcp_config(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """An mcpServers file naming one upstream server, ``up``, served over HTTP."""
    with serving_http(SERVER) as url:
        path = tmp_path_factory.mktemp("entry") / "mcp.json"
        path.write_text(json.dumps({"mcpServers": {"up": {"type": "http", "url": url}}}))
        yield path


def config(mode: str) -> ExecuteCodeConfig:
    return ExecuteCodeConfig(enabled=True, warm_kernels=0, kernel_mode=mode)


@pytest.mark.parametrize("mode", ["per_call", "session"])
def test_the_facade_sees_the_mcp_tools(mcp_config: Path, tmp_path: Path, mode: str) -> None:
    async def main() -> ExecuteCodeResult:
        tools = registry_with_mcp_servers(mcp_config)
        async with ExecuteCode(config(mode), tools=tools) as ec:
            return await ec.run(SCRIPT, scope=SessionScope("entry-facade", cwd=str(tmp_path)))

    assert seen(asyncio.run(main()).content) == EXPECTED


def test_an_owner_from_attach_sees_the_mcp_tools(mcp_config: Path, tmp_path: Path) -> None:
    async def main() -> list[ExecuteCodeResult]:
        tools = registry_with_mcp_servers(mcp_config)
        async with ExecuteCode(config("session"), tools=tools) as ec:
            owner = await ec.attach(SessionScope("entry-owner", cwd=str(tmp_path)))
            first = await owner.run(SCRIPT)  # the facade's first call: nothing listed them yet
            again = await owner.run(SCRIPT)  # and in the kernel the first call started
            await owner.aclose()
            return [first, again]

    for result in asyncio.run(main()):
        assert seen(result.content) == EXPECTED


def test_lemon_exec_run_sees_the_mcp_tools(mcp_config: Path, tmp_path: Path) -> None:
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    argv = [sys.executable, "-m", "lemon_exec", "run", "--mcp-config", str(mcp_config)]
    done = subprocess.run(
        [*argv, str(script)], capture_output=True, text=True, env=ENV, cwd=tmp_path, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert seen(done.stdout) == EXPECTED


def test_the_mcp_server_sees_the_mcp_tools(mcp_config: Path, tmp_path: Path) -> None:
    from mcp import Client, StdioServerParameters

    argv = [sys.executable, "-m", "lemon_exec", "mcp", "--mcp-config", str(mcp_config)]
    params = StdioServerParameters(command=argv[0], args=argv[1:], env=ENV, cwd=str(tmp_path))

    async def main() -> str:
        async with Client(params) as client:
            result = await client.call_tool("execute_code", {"script": SCRIPT})
        assert not result.is_error, result
        return str(result.content[0].text)  # type: ignore[union-attr]

    assert seen(asyncio.run(main())) == EXPECTED


def test_the_notebook_runner_sees_the_mcp_tools(mcp_config: Path) -> None:
    nb = new_notebook(cells=[new_code_cell(SCRIPT)])
    nb.metadata["lemon"] = {}
    assert isinstance(nb, nbformat.NotebookNode)
    tools = registry_with_mcp_servers(mcp_config)
    result = asyncio.run(run_scenario(nb, tools=tools))
    [call] = result.calls
    assert seen(call.content) == EXPECTED
