"""The MCP server through the SDK's in-process client (``Client(server)``).

``mode="auto"`` (the default) drives the 2026 per-request path through a direct dispatcher;
``mode="legacy"`` runs the handshake-era JSON-RPC loop over memory streams. Progress and
cancellation are checked on both, since they travel differently.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp_types import CallToolResult, TextContent

from lemon_exec import ExecuteCode, ExecuteCodeConfig, SessionScope
from lemon_exec.envelope import parse_envelope
from lemon_exec.errors import KernelStartError
from lemon_exec.host.run.results import WEBFETCH_NOTICE
from lemon_exec.mcp import SERVER_NAME, SHELL_SERVER_NAME, build_server
from lemon_exec.shell import ShellSession

from .conftest import PAGE_TEXT, gone, read_pid

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120), pytest.mark.kernel]

MODES = ["auto", "legacy"]


def _config(**overrides: Any) -> ExecuteCodeConfig:
    # fork_server=False: a fork server closed before its template reports ready leaves a
    # never-retrieved future exception ("fork server exited before ready"), which anyio's
    # test runner turns into a test failure. That is the facade's bug, not the MCP layer's;
    # the stdio tests (test_stdio.py) run the default configuration, fork server on.
    return ExecuteCodeConfig(enabled=True, warm_kernels=0, fork_server=False, **overrides)


def _server(tmp_path: Path, config: ExecuteCodeConfig | None = None, **kwargs: Any) -> Any:
    return build_server(
        config if config is not None else _config(),
        shell=ShellSession(tmp_path),
        scope=SessionScope("test-session", "mcp", tmp_path),
        **kwargs,
    )


def _text(result: CallToolResult) -> str:
    assert len(result.content) == 1
    block = result.content[0]
    assert isinstance(block, TextContent)
    return block.text


class Progress:
    """A progress callback that records (progress, total, message)."""

    def __init__(self) -> None:
        self.events: list[tuple[float, float | None, str | None]] = []

    async def __call__(self, progress: float, total: float | None, message: str | None) -> None:
        self.events.append((progress, total, message))

    @property
    def messages(self) -> list[str | None]:
        return [m for _, _, m in self.events]


# -- listing ---------------------------------------------------------------------------------


async def test_lists_three_tools_with_the_facade_schema(tmp_path: Path) -> None:
    config = _config()
    async with Client(_server(tmp_path, config)) as client:
        assert client.server_info is not None
        assert client.server_info.name == SERVER_NAME == "lemon-exec"
        tools = {t.name: t for t in (await client.list_tools()).tools}
    assert list(tools) == ["execute_code", "execute_command", "restart_session"]
    expected = ExecuteCode(config).schema()
    assert tools["execute_code"].input_schema == expected["input_schema"]
    assert tools["execute_code"].description == expected["description"]
    command = tools["execute_command"].input_schema
    assert command["required"] == ["command"]
    assert command["properties"]["command"]["type"] == "string"
    assert command["properties"]["timeout"]["type"] == "number"
    assert tools["restart_session"].input_schema["properties"] == {}


async def test_session_mode_description_is_the_facade_one(tmp_path: Path) -> None:
    config = _config(kernel_mode="session", timeout_ms=5000, tools=["read"])
    async with Client(_server(tmp_path, config)) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
    assert tools["execute_code"].description == ExecuteCode(config).schema()["description"]
    assert tools["execute_code"].input_schema["properties"]["timeout_ms"]["maximum"] == 5000


async def test_only_shell_serves_the_two_shell_tools(tmp_path: Path) -> None:
    async with Client(_server(tmp_path, only_shell=True)) as client:
        assert client.server_info is not None
        assert client.server_info.name == SHELL_SERVER_NAME == "code-execution-tools"
        names = [t.name for t in (await client.list_tools()).tools]
    assert names == ["execute_command", "restart_session"]


async def test_disabled_config_offers_no_execute_code(tmp_path: Path) -> None:
    server = _server(tmp_path, ExecuteCodeConfig(enabled=False))
    async with Client(server) as client:
        assert client.server_info is not None
        assert client.server_info.name == SERVER_NAME
        names = [t.name for t in (await client.list_tools()).tools]
        result = await client.call_tool("execute_code", {"script": "text(1)"})
    assert names == ["execute_command", "restart_session"]
    assert result.is_error


@pytest.mark.parametrize(("env", "offered"), [(None, True), ("0", False), ("false", False)])
def test_default_config_is_on_unless_the_environment_says_off(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, env: str | None, offered: bool
) -> None:
    if env is not None:
        monkeypatch.setenv("LEMON_EXECUTE_CODE_ENABLED", env)
    server = build_server(shell=ShellSession(tmp_path))
    assert server.offers_execute_code is offered
    assert server.config.warm_kernels == 0  # the environment applied
    assert server.scope.agent_id == "mcp"
    assert server.scope.cwd == os.getcwd()


def test_each_server_gets_its_own_random_session_id(tmp_path: Path) -> None:
    one = build_server(_config(), shell=ShellSession(tmp_path))
    two = build_server(_config(), shell=ShellSession(tmp_path))
    assert one.scope.session_id != two.scope.session_id
    assert len(one.scope.session_id) >= 32


# -- execute_code ----------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
async def test_execute_code_text_notify_and_details(tmp_path: Path, mode: str) -> None:
    script = "notify('one')\nnotify('two: é')\ntext('result line')\nnotify('three')\nprint('diag')"
    progress = Progress()
    async with Client(_server(tmp_path), mode=mode) as client:
        result = await client.call_tool(
            "execute_code", {"script": script}, progress_callback=progress
        )
    assert progress.messages == ["notify: one", "notify: two: é", "notify: three"]
    values = [p for p, _, _ in progress.events]
    assert values == sorted(values) and len(set(values)) == 3  # strictly increasing
    assert not result.is_error
    text = _text(result)
    assert text.startswith("Script result (text()):\nresult line")
    assert "diag" in text
    structured = result.structured_content
    assert structured is not None
    assert structured["trust"] == "trusted"
    details = structured["details"]
    assert details["exit_code"] == 0
    assert details["text_blocks"] == 1
    assert details["notifications"] == 3
    assert details["mode"] == "per_call"


async def test_execute_code_without_progress_token_still_runs(tmp_path: Path) -> None:
    async with Client(_server(tmp_path)) as client:
        result = await client.call_tool("execute_code", {"script": "notify('x'); text(6 * 7)"})
    assert _text(result) == "Script result (text()):\n42"


async def test_execute_code_failure_is_a_result_not_an_error(tmp_path: Path) -> None:
    async with Client(_server(tmp_path)) as client:
        result = await client.call_tool("execute_code", {"script": "raise ValueError('boom')"})
    assert not result.is_error  # the script ran: its failure is the model's to read
    assert "ValueError: boom" in _text(result)
    assert result.structured_content is not None
    assert result.structured_content["details"]["exit_code"] == 1


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"script": "text(1)", "reset": "yes"}, "`reset` must be a boolean"),
        ({"script": "   "}, "`script` is required"),
        ({"script": "text(1)", "timeout_ms": "fast"}, "`timeout_ms` must be an integer"),
        ({"script": "text(1)", "bogus": 1}, "unknown argument(s): bogus"),
    ],
)
async def test_execute_code_refusals_are_errors(
    tmp_path: Path, arguments: dict[str, Any], message: str
) -> None:
    async with Client(_server(tmp_path)) as client:
        result = await client.call_tool("execute_code", arguments)
    assert result.is_error
    assert message in _text(result)


async def test_untrusted_result_is_marked(tmp_path: Path, page_url: str) -> None:
    script = f"text(webfetch({page_url!r}))"
    async with Client(_server(tmp_path)) as client:
        result = await client.call_tool("execute_code", {"script": script})
    text = _text(result)
    # The facade's envelope, and nothing put in front of it.
    envelope = parse_envelope(text)
    assert envelope is not None, text
    assert envelope[1].startswith(WEBFETCH_NOTICE)
    assert PAGE_TEXT in text
    assert result.structured_content is not None
    assert result.structured_content["trust"] == "untrusted"
    assert result.structured_content["details"]["rpc_tools"] == ["webfetch"]


async def test_one_connection_is_one_session_scope(tmp_path: Path) -> None:
    config = _config(kernel_mode="session")
    server = _server(tmp_path, config)
    async with Client(server) as client:
        first = "import os\nstate = 41\npid = os.getpid()"
        await client.call_tool("execute_code", {"script": first})
        second = await client.call_tool("execute_code", {"script": "text(state + 1)\ntext(pid)"})
        reset = await client.call_tool(
            "execute_code", {"script": "text('state' in globals())", "reset": True}
        )
    assert _text(second).startswith("Script result (text()):\n42\n")
    assert second.structured_content is not None
    assert second.structured_content["details"]["persistent"] is True
    assert _text(reset) == "Script result (text()):\nFalse"
    # The serving period ended with the connection: the session kernel went with it.
    pid = int(_text(second).splitlines()[-1])
    assert gone(pid), "the session kernel outlived the server's lifespan"
    assert server.open_lifespans == 0


@pytest.mark.parametrize("mode", MODES)
async def test_cancelled_execute_code_kills_the_kernel(tmp_path: Path, mode: str) -> None:
    pid_file = tmp_path / f"kernel-{mode}.pid"
    script = (
        f"import os, time\nopen({str(pid_file)!r}, 'w').write(str(os.getpid()))\ntime.sleep(60)\n"
    )
    async with Client(_server(tmp_path), mode=mode) as client:
        async with anyio.create_task_group() as tg:
            tg.start_soon(client.call_tool, "execute_code", {"script": script})
            pid = await anyio.to_thread.run_sync(read_pid, pid_file)
            pgid = os.getpgid(pid)
            tg.cancel_scope.cancel()
        assert await anyio.to_thread.run_sync(gone, pid)
        assert await anyio.to_thread.run_sync(lambda: gone(pgid, group=True))
        # The server is still fine after the cancel.
        after = await client.call_tool("execute_code", {"script": "text('still here')"})
    assert _text(after) == "Script result (text()):\nstill here"


class _HostFailure(ExecuteCode):
    """A facade whose host side fails before any script runs."""

    async def run(self, script: Any, **kwargs: Any) -> Any:
        raise KernelStartError("execute_code: the kernel could not be started (test)")


async def test_host_failure_is_an_error_with_its_message(tmp_path: Path) -> None:
    server = _server(tmp_path, facade_factory=_HostFailure)
    async with Client(server) as client:
        result = await client.call_tool("execute_code", {"script": "text(1)"})
    assert result.is_error
    assert _text(result) == "execute_code: the kernel could not be started (test)"


# -- shell tools -----------------------------------------------------------------------------


async def test_execute_command_returns_json_and_structured(tmp_path: Path) -> None:
    async with Client(_server(tmp_path)) as client:
        result = await client.call_tool("execute_command", {"command": "echo hi"})
        timed = await client.call_tool("execute_command", {"command": "exit 3", "timeout": 5})
    expected = {"stdout": "hi\n", "stderr": "", "exit_code": 0, "timed_out": False}
    assert not result.is_error
    assert json.loads(_text(result)) == expected
    assert result.structured_content == expected
    assert timed.structured_content is not None
    assert timed.structured_content["exit_code"] == 3


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({}, "`command` is required"),
        ({"command": 5}, "`command` is required"),
        ({"command": "true", "timeout": "soon"}, "`timeout` must be a number"),
        ({"command": "true", "timeout": True}, "`timeout` must be a number"),
    ],
)
async def test_execute_command_bad_arguments(
    tmp_path: Path, arguments: dict[str, Any], message: str
) -> None:
    async with Client(_server(tmp_path, only_shell=True)) as client:
        result = await client.call_tool("execute_command", arguments)
    assert result.is_error
    assert message in _text(result)


async def test_restart_session_returns_to_the_start_directory(tmp_path: Path) -> None:
    start = os.path.realpath(tmp_path)
    async with Client(_server(tmp_path, only_shell=True)) as client:
        await client.call_tool("execute_command", {"command": "cd /"})
        moved = await client.call_tool("execute_command", {"command": "pwd"})
        restart = await client.call_tool("restart_session", {})
        back = await client.call_tool("execute_command", {"command": "pwd"})
    assert moved.structured_content is not None
    assert moved.structured_content["stdout"] == "/\n"
    assert not restart.is_error
    assert _text(restart) == f"Session restarted. Working directory reset to {start}"
    assert back.structured_content is not None
    assert back.structured_content["stdout"] == start + "\n"


@pytest.mark.parametrize("mode", MODES)
async def test_cancelled_execute_command_kills_the_process_group(
    tmp_path: Path, mode: str, reap: list[tuple[int, bool]]
) -> None:
    pid_file = tmp_path / "bash.pid"
    # The command's wrapper leads its own process group; bash and sleep are in it.
    command = f"echo $$ > {pid_file}; sleep 60; echo never"
    async with Client(_server(tmp_path, only_shell=True), mode=mode) as client:
        async with anyio.create_task_group() as tg:
            tg.start_soon(client.call_tool, "execute_command", {"command": command})
            bash = await anyio.to_thread.run_sync(read_pid, pid_file)
            pgid = os.getpgid(bash)
            reap.append((pgid, True))
            tg.cancel_scope.cancel()
        assert await anyio.to_thread.run_sync(gone, bash)
        assert await anyio.to_thread.run_sync(lambda: gone(pgid, group=True))
        after = await client.call_tool("execute_command", {"command": "echo ok"})
    assert after.structured_content is not None
    assert after.structured_content["stdout"] == "ok\n"
