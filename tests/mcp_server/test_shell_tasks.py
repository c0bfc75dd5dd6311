"""MCP tasks (2025-11-25) for execute_command: a real ``lemon-exec mcp`` process over stdio,
driven by the official SDK client in handshake mode (``mode="legacy"``)."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client, MCPError, StdioServerParameters
from mcp_types import INVALID_PARAMS

from .conftest import gone, lemon_exec_argv, read_pid
from .tasks_client import (
    RELATED_TASK,
    StatusWatch,
    cancel_task,
    get_task,
    list_tasks,
    start_task,
    task_result,
    until,
)

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]


async def _command_task(client: Client, command: str, **extra: Any) -> str:
    task = await start_task(client, {"command": command, **extra}, tool="execute_command")
    assert task.status == "working" and task.ttl == 3_600_000
    return task.task_id


async def _async(value: bool) -> bool:
    return value


async def test_shell_tasks_answer_as_blocking_calls_cancel_and_expire(tmp_path: Path) -> None:
    argv = lemon_exec_argv("mcp")
    env = {
        **os.environ,
        "LEMON_EXECUTE_CODE_FORK_SERVER": "0",
        "LEMON_EXECUTE_CODE_MAX_FINISHED_JOBS": "3",
        "DPTTOOLS_SANDBOX_TIMEOUT": "100",
    }
    params = StdioServerParameters(command=argv[0], args=argv[1:], env=env, cwd=str(tmp_path))
    watch = StatusWatch()
    async with Client(params, mode="legacy", extensions=[watch]) as client:
        assert client.server_capabilities.tasks is not None

        # A task's payload is the blocking call's CallToolResult (plus the related-task _meta).
        blocking = await client.call_tool("execute_command", {"command": "pwd"})
        pwd = await _command_task(client, "pwd")
        assert re.fullmatch(r"[0-9a-f]{24}", pwd)  # safe on `lemon-exec jobs`' command line
        pwd_result = await task_result(client, pwd)
        assert pwd_result.content == blocking.content
        assert pwd_result.structured_content == blocking.structured_content
        assert pwd_result.structured_content == {
            "stdout": f"{os.path.realpath(tmp_path)}\n",
            "stderr": "",
            "exit_code": 0,
            "timed_out": False,
        }
        assert pwd_result.meta == {RELATED_TASK: {"taskId": pwd}}
        got = await get_task(client, pwd)
        assert (got.status, got.status_message) == ("completed", "completed: exit code 0")

        failing = "echo out; echo err >&2; exit 3"
        blocking = await client.call_tool("execute_command", {"command": failing})
        failed = await _command_task(client, failing)
        failed_result = await task_result(client, failed)
        assert failed_result.structured_content == blocking.structured_content
        assert failed_result.structured_content is not None
        assert failed_result.structured_content["exit_code"] == 3
        got = await get_task(client, failed)
        assert (got.status, got.status_message) == ("failed", "failed: exit code 3")

        # A: running (it has the session); B: queued behind it for the session's lock.
        a_pid = tmp_path / "a.pid"
        a = await _command_task(client, f"echo started; sleep 60 & echo $! > {a_pid}; wait")
        pid = await anyio.to_thread.run_sync(read_pid, a_pid)
        assert (await get_task(client, a)).status_message == "running"
        b = await _command_task(client, "touch ran.txt")
        got_b = await get_task(client, b)
        assert (got_b.status, got_b.status_message) == ("working", "queued")

        # Cancel while queued: it never runs.
        assert (await cancel_task(client, b)).status == "cancelled"
        b_result = await task_result(client, b)
        assert b_result.structured_content is not None
        assert b_result.structured_content["stderr"] == "Command cancelled before it started.\n"
        assert b_result.structured_content["exit_code"] == -1
        with pytest.raises(MCPError) as again:
            await cancel_task(client, b)
        assert again.value.error.code == INVALID_PARAMS

        # Cancel while running: the command's process tree is killed, its output so far kept.
        assert (await cancel_task(client, a)).status == "cancelled"
        assert await anyio.to_thread.run_sync(gone, pid)
        a_result = await task_result(client, a)
        assert a_result.structured_content is not None
        assert a_result.structured_content["stdout"] == "started\n"
        assert "its process tree was killed" in a_result.structured_content["stderr"]
        assert a_result.structured_content["exit_code"] == -1
        await until(lambda: _async(watch.final(a) is not None))
        final = watch.final(a)
        assert final is not None and final.status == "cancelled"
        assert not (tmp_path / "ran.txt").exists()

        # max_finished_jobs (3) applies to shell tasks: the oldest finished one has expired.
        with pytest.raises(MCPError) as expired:
            await get_task(client, pwd)
        assert expired.value.error.code == INVALID_PARAMS
        assert f"execute_command: task {pwd} has expired" in expired.value.error.message
        listed = await list_tasks(client)
        assert [t.task_id for t in listed.tasks] == [failed, a, b]

        # A call that asks for no task blocks and answers as it always did.
        after = await client.call_tool("execute_command", {"command": "echo after"})
        assert after.structured_content is not None
        assert after.structured_content["stdout"] == "after\n"
