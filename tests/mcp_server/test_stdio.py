"""A real ``lemon-exec mcp`` subprocess over stdio, through the SDK's stdio client.

The shutdown tests speak JSON-RPC by hand instead, because they need the server's pid.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import IO, Any

import anyio
import pytest
from mcp import Client, StdioServerParameters
from mcp_types import TextContent

from lemon_exec import ExecuteCode, ExecuteCodeConfig

from .conftest import descendants, gone, lemon_exec_argv, read_pid

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120), pytest.mark.kernel]


def _params(tmp_path: Path, *args: str, **env: str) -> StdioServerParameters:
    argv = lemon_exec_argv("mcp", *args)
    return StdioServerParameters(
        command=argv[0], args=argv[1:], env={**os.environ, **env}, cwd=str(tmp_path)
    )


def _text(result: Any) -> str:
    block = result.content[0]
    assert isinstance(block, TextContent)
    return block.text


async def test_stdio_tools_progress_and_shell(tmp_path: Path) -> None:
    messages: list[str | None] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        messages.append(message)

    async with Client(_params(tmp_path)) as client:
        assert client.server_info is not None
        assert client.server_info.name == "lemon-exec"
        tools = {t.name: t for t in (await client.list_tools()).tools}
        code = await client.call_tool(
            "execute_code",
            {"script": "for i in range(5):\n    notify(f'step {i}')\ntext('done')"},
            progress_callback=on_progress,
        )
        command = await client.call_tool("execute_command", {"command": "echo hi"})
        restart = await client.call_tool("restart_session", {})

    assert list(tools) == ["execute_code", "execute_command", "restart_session"]
    # The subprocess loaded the same config (defaults + LEMON_EXECUTE_CODE_* from the env).
    expected = ExecuteCode(ExecuteCodeConfig.load(default_enabled=True)).schema()
    assert tools["execute_code"].input_schema == expected["input_schema"]
    assert tools["execute_code"].description == expected["description"]

    assert messages == [f"notify: step {i}" for i in range(5)]
    assert _text(code) == "Script result (text()):\ndone"
    assert code.structured_content is not None
    assert code.structured_content["trust"] == "trusted"
    assert code.structured_content["details"]["notifications"] == 5
    assert code.structured_content["details"]["exit_code"] == 0

    result = {"stdout": "hi\n", "stderr": "", "exit_code": 0, "timed_out": False}
    assert json.loads(_text(command)) == result
    assert command.structured_content == result
    assert _text(restart) == (
        f"Session restarted. Working directory reset to {os.path.realpath(tmp_path)}"
    )


async def test_stdio_only_shell(tmp_path: Path) -> None:
    async with Client(_params(tmp_path, "--only", "shell")) as client:
        assert client.server_info is not None
        assert client.server_info.name == "code-execution-tools"
        names = [t.name for t in (await client.list_tools()).tools]
    assert names == ["execute_command", "restart_session"]


async def test_stdio_config_file_can_disable_execute_code(tmp_path: Path) -> None:
    config = tmp_path / "lemon.toml"
    config.write_text("[runtime.tools.execute_code]\nenabled = false\n")
    async with Client(_params(tmp_path, "--config", str(config))) as client:
        assert client.server_info is not None
        assert client.server_info.name == "lemon-exec"
        names = [t.name for t in (await client.list_tools()).tools]
    assert names == ["execute_command", "restart_session"]


async def test_stdio_cancelled_calls_leave_no_process(
    tmp_path: Path, reap: list[tuple[int, bool]]
) -> None:
    kernel_file = tmp_path / "kernel.pid"
    bash_file = tmp_path / "bash.pid"
    script = (
        "import os, time\n"
        f"open({str(kernel_file)!r}, 'w').write(str(os.getpid()))\n"
        "time.sleep(60)\n"
    )
    async with Client(_params(tmp_path)) as client:
        async with anyio.create_task_group() as tg:
            tg.start_soon(client.call_tool, "execute_code", {"script": script})
            pid = await anyio.to_thread.run_sync(read_pid, kernel_file)
            pgid = os.getpgid(pid)
            reap.append((pgid, True))
            tg.cancel_scope.cancel()
        assert await anyio.to_thread.run_sync(gone, pid)
        assert await anyio.to_thread.run_sync(lambda: gone(pgid, group=True))

        async with anyio.create_task_group() as tg:
            command = f"echo $$ > {bash_file}; sleep 60"
            tg.start_soon(client.call_tool, "execute_command", {"command": command})
            bash = await anyio.to_thread.run_sync(read_pid, bash_file)
            bash_group = os.getpgid(bash)
            reap.append((bash_group, True))
            tg.cancel_scope.cancel()
        assert await anyio.to_thread.run_sync(gone, bash)
        assert await anyio.to_thread.run_sync(lambda: gone(bash_group, group=True))

        after = await client.call_tool("execute_command", {"command": "echo ok"})
    assert after.structured_content is not None
    assert after.structured_content["stdout"] == "ok\n"


# -- shutdown: no kernel outlives the server -------------------------------------------------


class _RawServer:
    """``lemon-exec mcp`` over stdio, driven with hand-written JSON-RPC lines."""

    def __init__(self, tmp_path: Path) -> None:
        self.proc = subprocess.Popen(
            lemon_exec_argv("mcp"),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            cwd=tmp_path,
            text=True,
        )
        self.send({
            "jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                       "clientInfo": {"name": "test", "version": "0"}},
        })  # fmt: skip
        assert json.loads(self._stdout.readline())["id"] == 1
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})

    @property
    def _stdout(self) -> IO[str]:
        assert self.proc.stdout is not None
        return self.proc.stdout

    def send(self, message: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(message) + "\n")
        self.proc.stdin.flush()

    def start_sleeper(self, pid_file: Path) -> int:
        script = (
            "import os, time\n"
            f"open({str(pid_file)!r}, 'w').write(str(os.getpid()))\n"
            "time.sleep(60)\n"
        )
        self.send({
            "jsonrpc": "2.0", "id": 2, "method": "tools/call",
            "params": {"name": "execute_code", "arguments": {"script": script}},
        })  # fmt: skip
        return read_pid(pid_file)

    def wait(self, within: float = 20.0) -> int:
        try:
            return self.proc.wait(within)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()


@pytest.mark.parametrize(
    ("stop", "status"),
    [("sigterm", 128 + signal.SIGTERM), ("sigint", 128 + signal.SIGINT), ("eof", 0)],
)
def test_stopping_the_server_stops_every_kernel(
    tmp_path: Path, reap: list[tuple[int, bool]], stop: str, status: int
) -> None:
    server = _RawServer(tmp_path)
    pid = server.start_sleeper(tmp_path / "kernel.pid")
    pgid = os.getpgid(pid)
    reap.append((pgid, True))
    # The running kernel, and whatever else the facade started: spares, the fork server.
    below = descendants(server.proc.pid)
    reap.extend((p, False) for p in below)
    assert pid in below
    started = time.monotonic()
    if stop == "eof":
        assert server.proc.stdin is not None
        server.proc.stdin.close()
    else:
        server.proc.send_signal(signal.SIGTERM if stop == "sigterm" else signal.SIGINT)
    assert server.wait() == status
    assert time.monotonic() - started < 10
    assert gone(pid, within=1)
    assert gone(pgid, group=True, within=1)
    left = [p for p in below if not gone(p, within=1)]
    assert not left, f"processes outlived the server: {left}"
