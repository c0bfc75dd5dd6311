"""MCP servers as tool sources (issue 14, item 2): real upstream servers over stdio and HTTP.

The upstream server is tests/mcp_upstream/server.py (the SDK's MCPServer). These tests drive
the tool host directly (host.invoke), the way the bridge does for a script's helper call.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from mcp_upstream import serving_http
from support import await_until

from lemon_exec import ExecuteCodeConfig
from lemon_exec.errors import ToolDenied, ToolFailure
from lemon_exec.tools import (
    ApprovalOutcome,
    PolicyDecision,
    ToolCall,
    ToolHost,
    ToolRegistry,
)
from lemon_exec.tools._mcp_tools import identifier

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

SERVER = str(Path(__file__).parent / "mcp_upstream" / "server.py")


def _registry() -> ToolRegistry:
    registry = ToolRegistry()
    registry.add_mcp_server("up", command=sys.executable, args=[SERVER])
    return registry


_ids = iter(range(1, 1_000_000))


def _call(tool: str, notify: list[str] | None = None, **params: object) -> ToolCall:
    return ToolCall(
        tool=tool,
        params=dict(params),
        cwd=Path.cwd(),
        call_id=next(_ids),
        notify=notify.append if notify is not None else None,
    )


@pytest.fixture
async def host() -> AsyncIterator[ToolHost]:
    tool_host = ToolHost(_registry())
    await tool_host.prepare_tools()
    try:
        yield tool_host
    finally:
        await tool_host.aclose()


def test_identifier() -> None:
    assert identifier("get-weather") == "get_weather"
    assert identifier("9lives") == "_9lives"  # server and argument names
    assert identifier("class") == "class_"
    assert identifier("ok") == "ok"


def test_add_mcp_server_rejects_bad_targets() -> None:
    registry = ToolRegistry()
    with pytest.raises(ValueError, match="exactly one of command= and url="):
        registry.add_mcp_server("x")
    with pytest.raises(ValueError, match="exactly one"):
        registry.add_mcp_server("x", command="a", url="http://127.0.0.1:1/mcp")
    with pytest.raises(ValueError, match="http"):
        registry.add_mcp_server("x", url="ftp://host/")
    registry.add_mcp_server("x", command="cat")
    with pytest.raises(ValueError, match="already added"):
        registry.add_mcp_server("x", command="cat")
    assert registry.names() == []  # nothing connects (or lists) before a host needs it


async def test_specs_come_from_the_input_schema(host: ToolHost) -> None:
    names = host.names()
    assert {"up.echo", "up.add", "up.get_weather", "up.class_", "up.progress"} <= set(names)
    echo = host.describe("up.echo")
    assert echo["signature"] == "up.echo(text, times=1)"
    assert echo["description"] == "Echo text back, repeated."
    assert echo["types"] == {"text": "str", "times": "int"}
    weather = host.registry.get("up.get_weather")
    assert weather is not None and weather.mcp is not None
    assert weather.mcp.tool == "get-weather" and weather.required == ("city",)
    klass = host.describe("up.class_")
    assert klass["types"] == {"value": "int | float"}


async def test_results_errors_and_validation(host: ToolHost) -> None:
    assert await host.invoke(_call("up.echo", text="ab", times=2)) == "abab"
    assert await host.invoke(_call("up.get_weather", city="Oslo")) == "Oslo: 21 C"
    add = host.registry.get("up.add")
    assert add is not None and add.result == "json"
    assert json.loads(await host.invoke(_call("up.add", a=2, b=3))) == {"sum": 5, "inputs": [2, 3]}
    with pytest.raises(ToolFailure, match=r"up\.fail failed: .*out of cheese"):
        await host.invoke(_call("up.fail", message="out of cheese"))
    with pytest.raises(ToolFailure, match="text"):
        await host.invoke(_call("up.echo", text=5))  # refused before it reaches the server


async def test_progress_becomes_notify_lines(host: ToolHost) -> None:
    lines: list[str] = []
    assert await host.invoke(_call("up.progress", lines, steps=3)) == "progressed"
    assert lines == ["step 1 of 3", "step 2 of 3", "step 3 of 3"]


async def test_policy_and_approval_see_server_tool_and_params() -> None:
    seen: list[tuple[str | None, str | None, str, dict[str, object]]] = []

    def policy(call: ToolCall) -> PolicyDecision:
        seen.append((call.server, call.server_tool, call.tool, call.params))
        if call.params.get("city") == "Mordor":
            return PolicyDecision.deny("no travel there")
        return PolicyDecision.allow()

    asked: list[tuple[str | None, str | None]] = []

    async def approval(call: ToolCall) -> ApprovalOutcome:
        asked.append((call.server, call.server_tool))
        return ApprovalOutcome.DENIED if call.server_tool == "echo" else ApprovalOutcome.APPROVED

    tool_host = ToolHost(_registry(), policy=policy, approval=approval)
    try:
        await tool_host.prepare_tools()
        assert await tool_host.invoke(_call("up.get_weather", city="Rome")) == "Rome: 21 C"
        with pytest.raises(ToolDenied, match="no travel there"):
            await tool_host.invoke(_call("up.get_weather", city="Mordor"))
        with pytest.raises(ToolDenied, match="denied by the user"):
            await tool_host.invoke(_call("up.echo", text="x"))
    finally:
        await tool_host.aclose()
    assert seen[0] == ("up", "get-weather", "up.get_weather", {"city": "Rome"})
    assert asked == [("up", "get-weather"), ("up", "echo")]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:  # it exited between the two looks (ENOENT or ESRCH)
        return False
    return stat[0] != "Z"


async def _gone(pid: int, within: float = 5.0) -> bool:
    return await await_until(lambda: not _alive(pid), within, interval=0.05)


async def test_crash_restart_and_close() -> None:
    tool_host = ToolHost(_registry())
    try:
        await tool_host.prepare_tools()
        first = int(json.loads(await tool_host.invoke(_call("up.pid"))))
        with pytest.raises(ToolFailure, match=r"closed the connection .*restarted on the next"):
            await tool_host.invoke(_call("up.crash"))
        assert await _gone(first)
        second = int(json.loads(await tool_host.invoke(_call("up.pid"))))
        assert second != first and _alive(second)
        await tool_host.prepare_tools()  # a restarted server is listed again
        assert "up.echo" in tool_host.names()
    finally:
        await tool_host.aclose()
    assert await _gone(second), "closing the host must end the stdio server"


async def test_a_server_killed_while_idle_is_restarted_by_the_next_call() -> None:
    import signal

    tool_host = ToolHost(_registry())
    try:
        await tool_host.prepare_tools()
        first = int(json.loads(await tool_host.invoke(_call("up.pid"))))
        os.kill(first, signal.SIGKILL)
        assert await _gone(first)
        await asyncio.sleep(0.2)  # the client's reader sees the end of the pipe
        second = int(json.loads(await tool_host.invoke(_call("up.pid"))))
        assert second != first
    finally:
        await tool_host.aclose()
    assert await _gone(second)


async def test_stdio_server_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LEMON_TEST_HOST_SECRET", "s3cret")
    registry = ToolRegistry()
    registry.add_mcp_server("up", command=sys.executable, args=[SERVER], env={"GIVEN": "yes"})
    tool_host = ToolHost(registry)
    try:
        await tool_host.prepare_tools()
        env = json.loads(await tool_host.invoke(_call("up.environ")))
    finally:
        await tool_host.aclose()
    assert env.get("GIVEN") == "yes" and "PATH" in env
    assert "LEMON_TEST_HOST_SECRET" not in env


async def test_a_server_that_cannot_start_is_reported(tmp_path: Path) -> None:
    registry = ToolRegistry()
    registry.add_mcp_server("bad", command=str(tmp_path / "no-such-program"))
    tool_host = ToolHost(registry)
    try:
        await tool_host.prepare_tools()  # logged, not raised: the run goes on without them
        assert tool_host.names() == []
    finally:
        await tool_host.aclose()


async def test_concurrent_calls_share_one_connection(host: ToolHost) -> None:
    one_started = time.monotonic()
    await host.invoke(_call("up.slow", ms=100))
    one = time.monotonic() - one_started
    started = time.monotonic()
    results = await asyncio.gather(*(host.invoke(_call("up.slow", ms=100)) for _ in range(20)))
    wall = time.monotonic() - started
    assert results == ["slept 100"] * 20
    assert wall <= 3 * max(one, 0.1) + 0.5, (wall, one)  # slack for a loaded 2-core machine


@pytest.fixture
def http_upstream() -> Iterator[str]:
    with serving_http(SERVER) as url:
        yield url


async def test_streamable_http_upstream(http_upstream: str) -> None:
    registry = ToolRegistry()
    registry.add_mcp_server("web", url=http_upstream, headers={"X-Test": "1"})
    tool_host = ToolHost(registry)
    try:
        await tool_host.prepare_tools()
        assert "web.echo" in tool_host.names()
        assert await tool_host.invoke(_call("web.echo", text="hi")) == "hi"
        lines: list[str] = []
        assert await tool_host.invoke(_call("web.progress", lines, steps=2)) == "progressed"
        assert lines == ["step 1 of 2", "step 2 of 2"]
    finally:
        await tool_host.aclose()


# -- scripts calling MCP tools, and the operator flag ------------------------------------------


def _config(**overrides: Any) -> ExecuteCodeConfig:
    return ExecuteCodeConfig(enabled=True, warm_kernels=0, **overrides)


@pytest.mark.slow
@pytest.mark.kernel
async def test_a_script_calls_mcp_tools_within_budgets() -> None:
    from lemon_exec import ExecuteCode
    from lemon_exec.tools import default_registry

    registry = default_registry()
    registry.add_mcp_server("up", command=sys.executable, args=[SERVER])
    updates: list[str] = []
    script = """
import inspect
text(str(inspect.signature(tools.up.get_weather)))
text(repr(tools.up.add(a=1, b=2)))
text(tools.up.progress(steps=2))
try:
    tools.up.fail(message="upstream says no")
except ToolError as exc:
    text(f"error: {exc}")
try:
    tools.up.echo(text="x")
except ToolError as exc:
    text(f"budget: {exc}")
"""
    async with ExecuteCode(_config(max_rpc_calls=3), tools=registry) as tool:
        result = await tool.run(script, on_update=updates.append)
    lines = result.content.splitlines()
    assert "(city: str, unit: str = 'C') -> str" in lines, result.content
    assert "{'sum': 3, 'inputs': [1, 2]}" in lines
    assert "progressed" in lines
    assert any(line.startswith("error: ") and "upstream says no" in line for line in lines)
    assert any(line.startswith("budget: ") and "call limit exceeded" in line for line in lines)
    assert updates == ["notify: step 1 of 2", "notify: step 2 of 2"]
    assert result.details["rpc_calls"] == 3
    assert result.details["rpc_tools"] == ["up.add", "up.fail", "up.progress"]


@pytest.mark.slow
@pytest.mark.kernel
async def test_result_bytes_budget_counts_mcp_results() -> None:
    from lemon_exec import ExecuteCode
    from lemon_exec.tools import default_registry

    registry = default_registry()
    registry.add_mcp_server("up", command=sys.executable, args=[SERVER])
    script = """
text(tools.up.echo(text="a", times=100))
try:
    tools.up.echo(text="b", times=100)
except ToolError as exc:
    text(f"refused: {exc}")
"""
    async with ExecuteCode(_config(max_rpc_result_bytes=150), tools=registry) as tool:
        result = await tool.run(script)
    assert "a" * 100 in result.content
    assert "refused: " in result.content and "max_rpc_result_bytes" in result.content
    assert result.details["rpc_bytes"] == 100


def test_mcp_config_file_is_parsed(tmp_path: Path) -> None:
    from lemon_exec.errors import ConfigError
    from lemon_exec.tools._mcp_config import load_mcp_servers, registry_with_mcp_servers

    path = tmp_path / "mcp.json"
    path.write_text(
        json.dumps(
            {
                "mcpServers": {
                    "up": {"command": sys.executable, "args": [SERVER], "env": {"A": "1"}},
                    "web-site": {"type": "http", "url": "http://127.0.0.1:9/mcp"},
                    "off": {"command": "x", "disabled": True},
                }
            }
        )
    )
    servers = load_mcp_servers(path)
    assert servers["up"] == {"command": sys.executable, "args": (SERVER,), "env": {"A": "1"}}
    assert list(servers) == ["up", "web-site"]
    registry = registry_with_mcp_servers(path)
    assert [s.name for s in registry.mcp_servers()] == ["up", "web_site"]
    for bad, message in [
        ("{", "not valid JSON"),
        ('{"servers": {}}', "mcpServers"),
        ('{"mcpServers": {"a": {}}}', "either"),
        ('{"mcpServers": {"a": {"command": "x", "args": "y"}}}', "list of strings"),
        ('{"mcpServers": {"a": {"command": "x", "bogus": 1}}}', "unknown keys"),
    ]:
        path.write_text(bad)
        with pytest.raises(ConfigError, match=message):
            load_mcp_servers(path)


def test_run_refuses_a_bad_mcp_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from lemon_exec.cli import main

    script = tmp_path / "s.py"
    script.write_text("print(1)\n")
    assert main(["run", "--mcp-config", str(tmp_path / "missing.json"), str(script)]) == 2
    assert "--mcp-config" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.kernel
async def test_lemon_exec_mcp_with_mcp_config(tmp_path: Path) -> None:
    from mcp import Client, StdioServerParameters

    config = tmp_path / "mcp.json"
    config.write_text(
        json.dumps({"mcpServers": {"up": {"command": sys.executable, "args": [SERVER]}}})
    )
    argv = [sys.executable, "-m", "lemon_exec", "mcp", "--mcp-config", str(config)]
    env = {**os.environ, "LEMON_EXECUTE_CODE_WARM_KERNELS": "0"}
    params = StdioServerParameters(command=argv[0], args=argv[1:], env=env, cwd=str(tmp_path))
    async with Client(params) as client:
        result = await client.call_tool(
            "execute_code", {"script": "text(str(tools.up.add(a=20, b=22)['sum']))"}
        )
    assert not result.is_error, result
    assert "42" in result.content[0].text  # type: ignore[union-attr]


_BATCH_SCRIPT = """
import json, time
tools.up.slow(ms=1)
t0 = time.perf_counter()
tools.up.slow(ms=100)
one = time.perf_counter() - t0
t0 = time.perf_counter()
out = batch([("up.slow", {"ms": 100})] * 20)
twenty = time.perf_counter() - t0
text(json.dumps({"one": one, "twenty": twenty, "out": out}))
"""


@pytest.mark.slow
@pytest.mark.kernel
async def test_a_script_batch_of_mcp_calls_runs_concurrently() -> None:
    """MCP calls run on their own lane (max_parallel_mcp, 16): even with the built-ins held
    to one call at a time, batch() of 20 upstream calls takes about two waves, not 20."""
    from lemon_exec import ExecuteCode
    from lemon_exec.tools import default_registry

    registry = default_registry()
    registry.add_mcp_server("up", command=sys.executable, args=[SERVER])
    config = _config(max_parallel_rpc=1)
    async with ExecuteCode(config, tools=registry) as tool:
        result = await tool.run(_BATCH_SCRIPT)
    assert result.details["exit_code"] == 0, result.content
    data = json.loads(result.content.splitlines()[-1])
    assert data["out"] == ["slept 100"] * 20
    # The issue's bound (3x one call), plus slack for a loaded 2-core machine.
    assert data["twenty"] <= 3 * data["one"] + 0.3, data


@pytest.mark.slow
@pytest.mark.kernel
async def test_max_parallel_mcp_bounds_the_mcp_lane() -> None:
    from lemon_exec import ExecuteCode
    from lemon_exec.tools import default_registry

    registry = default_registry()
    registry.add_mcp_server("up", command=sys.executable, args=[SERVER])
    config = _config(max_parallel_rpc=20, max_parallel_mcp=5)
    async with ExecuteCode(config, tools=registry) as tool:
        result = await tool.run(_BATCH_SCRIPT)
    assert result.details["exit_code"] == 0, result.content
    data = json.loads(result.content.splitlines()[-1])
    assert data["out"] == ["slept 100"] * 20
    # 20 calls of 100 ms, at most 5 at once: four waves at least, whatever max_parallel_rpc.
    assert data["twenty"] >= 0.4, data
