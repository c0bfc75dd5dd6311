"""MCP tasks (2025-11-25) for execute_code: real ``lemon-exec mcp`` processes over stdio and
streamable HTTP, driven by the official SDK client in handshake mode (``mode="legacy"``
negotiates 2025-11-25, the revision that defines tasks)."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client, MCPError, StdioServerParameters
from mcp.server.context import ServerRequestContext
from mcp_types import INVALID_PARAMS, METHOD_NOT_FOUND, ProgressNotification, TextContent

from lemon_exec import ExecuteCode, ExecuteCodeConfig, SessionScope
from lemon_exec.mcp import build_server
from lemon_exec.mcp._auth import PRINCIPAL_KEY, BearerAuth
from lemon_exec.mcp._code_tasks import CodeTask, CodeTasks
from lemon_exec.mcp._tasks import LOCAL_PRINCIPAL, TaskBook, TaskRecord, principal_of

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
from .test_http import bearer_client, http_server

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(180)]


def _text(result: Any) -> str:
    block = result.content[0]
    assert isinstance(block, TextContent)
    return block.text


def _waiting_script(pid_file: Path, go_file: Path, *, notes: int = 0) -> str:
    """Writes its pid, sends ``notes`` notify()s, waits for ``go_file``, returns 'done'."""
    return (
        "import os, time\n"
        "print('partial output', flush=True)\n"
        f"for i in range({notes}):\n"
        "    notify(f'step {i}')\n"
        f"open({str(pid_file)!r}, 'w').write(str(os.getpid()))\n"
        f"while not os.path.exists({str(go_file)!r}):\n"
        "    time.sleep(0.05)\n"
        "text('done')\n"
    )


async def _status(client: Client, task_id: str, status: str) -> bool:
    return (await get_task(client, task_id)).status == status


@pytest.mark.kernel
async def test_stdio_tasks_progress_queue_cancel_and_blocking_calls(tmp_path: Path) -> None:
    argv = lemon_exec_argv("mcp")
    env = {**os.environ, "LEMON_EXECUTE_CODE_KERNEL_MODE": "session"}
    params = StdioServerParameters(command=argv[0], args=argv[1:], env=env, cwd=str(tmp_path))
    progress: list[ProgressNotification] = []

    async def on_message(message: Any) -> None:
        if isinstance(message, ProgressNotification):
            progress.append(message)

    watch = StatusWatch()
    async with Client(
        params, mode="legacy", message_handler=on_message, extensions=[watch]
    ) as client:
        assert client.protocol_version == "2025-11-25"
        tasks_cap = client.server_capabilities.tasks
        assert tasks_cap is not None and tasks_cap.list is not None
        assert tasks_cap.cancel is not None
        assert tasks_cap.requests is not None and tasks_cap.requests.tools is not None
        assert tasks_cap.requests.tools.call is not None
        tools = {t.name: t for t in (await client.list_tools()).tools}
        assert tools["execute_code"].execution is not None
        assert tools["execute_code"].execution.task_support == "optional"
        assert tools["execute_command"].execution is not None
        assert tools["execute_command"].execution.task_support == "optional"
        assert tools["restart_session"].execution is None  # it stays blocking

        # A: the session's active cell; B: queued behind it in the session's FIFO.
        a_pid, go = tmp_path / "a.pid", tmp_path / "go"
        a = await start_task(
            client, {"script": _waiting_script(a_pid, go, notes=3)}, progress_token="a-progress"
        )
        assert a.status == "working" and a.ttl == 3_600_000 and a.poll_interval == 1000
        await anyio.to_thread.run_sync(read_pid, a_pid)
        assert (await get_task(client, a.task_id)).status_message == "running"
        b = await start_task(client, {"script": "text('never')"})
        got_b = await get_task(client, b.task_id)
        assert (got_b.status, got_b.status_message) == ("working", "queued")

        # Cancel while queued: it leaves the queue, nothing ran.
        cancelled_b = await cancel_task(client, b.task_id)
        assert cancelled_b.status == "cancelled"
        b_result = await task_result(client, b.task_id)
        assert "it never started" in _text(b_result)
        assert b_result.structured_content is not None
        assert b_result.structured_content["details"]["never_started"] is True
        with pytest.raises(MCPError) as again:
            await cancel_task(client, b.task_id)
        assert again.value.error.code == INVALID_PARAMS

        listed = await list_tasks(client)
        assert [t.task_id for t in listed.tasks] == [a.task_id, b.task_id]
        assert [t.status for t in listed.tasks] == ["working", "cancelled"]

        go.write_text("")
        a_result = await task_result(client, a.task_id)  # blocks until A ends
        assert _text(a_result).startswith("Script result (text()):\ndone\n")
        assert a_result.meta == {RELATED_TASK: {"taskId": a.task_id}}
        assert a_result.structured_content is not None
        assert a_result.structured_content["details"]["notifications"] == 3
        assert (await get_task(client, a.task_id)).status == "completed"
        await until(lambda: _async(watch.final(a.task_id) is not None))
        final = watch.final(a.task_id)
        assert final is not None and final.status == "completed"

        # notify() kept flowing to the task: progress under the call's token, tied to it.
        assert [p.params.message for p in progress] == [f"notify: step {i}" for i in range(3)]
        assert [p.params.progress for p in progress] == [1, 2, 3]
        assert {p.params.progress_token for p in progress} == {"a-progress"}
        assert all(p.params.meta == {RELATED_TASK: {"taskId": a.task_id}} for p in progress)

        # Cancel while running: the kernel is interrupted, its partial output kept.
        c_pid = tmp_path / "c.pid"
        c = await start_task(client, {"script": _waiting_script(c_pid, tmp_path / "never")})
        pid = await anyio.to_thread.run_sync(read_pid, c_pid)
        cancelled_c = await cancel_task(client, c.task_id)
        assert cancelled_c.status == "cancelled"
        assert await anyio.to_thread.run_sync(gone, pid)
        c_result = await task_result(client, c.task_id)
        assert c_result.structured_content is not None
        assert c_result.structured_content["details"]["cancelled"] is True
        assert c_result.structured_content["details"]["state_retained"] is False

        # A call that asks for no task blocks and answers as it always did.
        # The session's kernel went with the cancelled task, and the next call says so.
        blocking = await client.call_tool("execute_code", {"script": "text(6 * 7)"})
        assert _text(blocking).startswith("[Session state was lost before this call")
        assert _text(blocking).endswith("Script result (text()):\n42")

        with pytest.raises(MCPError) as unknown:
            await get_task(client, "no-such-task")
        assert unknown.value.error.code == INVALID_PARAMS


async def _async(value: bool) -> bool:
    return value


@pytest.mark.kernel
@pytest.mark.slow
async def test_http_tasks_belong_to_the_token_and_cancel_over_another_session(
    tmp_path: Path,
) -> None:
    env = {"LEMON_EXECUTE_CODE_MAX_CONCURRENT_PER_CALL": "1"}
    with http_server(tmp_path, env=env) as (server, url):
        token = server.token
        assert token is not None
        watch = StatusWatch()
        async with bearer_client(url, token, mode="legacy", extensions=[watch]) as first:
            assert first.server_capabilities.tasks is not None
            a_pid = tmp_path / "a.pid"
            a = await start_task(first, {"script": _waiting_script(a_pid, tmp_path / "never")})
            pid = await anyio.to_thread.run_sync(read_pid, a_pid)
            # One per-call run at a time: B waits for a slot in the admission queue.
            b = await start_task(first, {"script": "text('never')"})
            assert (await get_task(first, b.task_id)).status_message == "queued"

            # Another session with the same token is the same principal: it sees and stops them.
            async with bearer_client(url, token, mode="legacy") as second:
                listed = await list_tasks(second)
                assert [t.task_id for t in listed.tasks] == [a.task_id, b.task_id]
                assert (await cancel_task(second, b.task_id)).status == "cancelled"
                assert (await cancel_task(second, a.task_id)).status == "cancelled"
            assert await anyio.to_thread.run_sync(gone, pid)
            result = await task_result(first, a.task_id)
            assert result.structured_content is not None
            assert result.structured_content["details"]["cancelled"] is True
            assert "partial output" in _text(result)
            await until(lambda: _async(watch.final(a.task_id) is not None))
            final = watch.final(a.task_id)
            assert final is not None and final.status == "cancelled"

            # A blocking call still runs (the slot is free again).
            blocking = await first.call_tool("execute_code", {"script": "text('after')"})
            assert _text(blocking) == "Script result (text()):\nafter"


async def test_tasks_exist_only_at_2025_11_25() -> None:
    server = build_server(ExecuteCodeConfig(enabled=True, warm_kernels=0, fork_server=False))
    async with Client(server) as client:  # the SDK default negotiates 2026-07-28
        assert client.protocol_version == "2026-07-28"
        assert client.server_capabilities.tasks is None
        assert client.server_capabilities.extensions is None
        with pytest.raises(MCPError) as refused:
            await get_task(client, "anything")
        assert refused.value.error.code == METHOD_NOT_FOUND
    only_shell = build_server(ExecuteCodeConfig(enabled=True), only_shell=True)
    async with Client(only_shell) as client:
        assert client.server_capabilities.tasks is None
    async with Client(only_shell, mode="legacy") as client:  # execute_command runs as a task
        assert client.server_capabilities.tasks is not None
        tools = {t.name: t for t in (await client.list_tools()).tools}
        assert set(tools) == {"execute_command", "restart_session"}
        execution = tools["execute_command"].execution
        assert execution is not None and execution.task_support == "optional"


async def test_a_task_belongs_to_its_principal() -> None:
    # BearerAuth stamps the token holder's principal on the request ...
    seen: dict[str, Any] = {}

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.update(scope)

    token = "t" * 32
    scope = {"type": "http", "headers": [(b"authorization", f"Bearer {token}".encode())]}
    await BearerAuth(app, token)(scope, _never, _never_send)
    assert isinstance(seen[PRINCIPAL_KEY], str) and token not in seen[PRINCIPAL_KEY]

    # ... which principal_of reads; a request without one (stdio) is the local client.
    class _Request:
        def __init__(self, scope: dict[str, Any]) -> None:
            self.scope = scope

    def ctx(request: Any) -> ServerRequestContext[Any, Any]:
        return ServerRequestContext(
            session=None,  # type: ignore[arg-type]
            lifespan_context=None,
            protocol_version="2025-11-25",
            method="tasks/get",
            request=request,
        )

    owner = principal_of(ctx(_Request(seen)))
    assert owner == seen[PRINCIPAL_KEY]
    assert principal_of(ctx(None)) == LOCAL_PRINCIPAL

    # Another principal gets "no such task", as for an unknown id; the owner finds it.
    async with ExecuteCode(ExecuteCodeConfig(enabled=True, warm_kernels=0)) as tool:
        job = await tool.start(None)  # refused at once (no script): a finished job
        await job.wait()
        source = CodeTasks(tool, SessionScope(session_id="s", agent_id="a"))
        book = TaskBook(1000, [source])
        task = CodeTask(job)
        book.add(source, TaskRecord(task, owner, None, None, "t", "t"))  # type: ignore[arg-type]
        assert book.find(job.id, owner).job is task
        with pytest.raises(MCPError) as other:
            book.find(job.id, "bearer:someone-else")
        assert other.value.error.code == INVALID_PARAMS
        assert book.owned("bearer:someone-else") == []
        assert [r.job for r in book.owned(owner)] == [task]


async def _never() -> Any:
    raise AssertionError("not called")


async def _never_send(message: Any) -> None:
    raise AssertionError("not called")


def _jobs_cli(url: str, *args: str, token: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "LEMON_EXEC_MCP_TOKEN"}
    if token is not None:
        env["LEMON_EXEC_MCP_TOKEN"] = token
    return subprocess.run(
        lemon_exec_argv("jobs", "--url", url, *args),
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )


@pytest.mark.kernel
@pytest.mark.slow
async def test_jobs_cli_lists_shows_and_cancels_the_tasks_of_an_http_server(
    tmp_path: Path,
) -> None:
    with http_server(tmp_path) as (server, url):
        token = server.token
        assert token is not None
        async with bearer_client(url, token, mode="legacy") as client:
            done = await start_task(client, {"script": "text('finished')"})
            # Hex ids: an id with a leading "-" would be read as an option by the CLI.
            assert re.fullmatch(r"[0-9a-f]{24}", done.task_id)
            await task_result(client, done.task_id)
            pid_file = tmp_path / "run.pid"
            running = await start_task(
                client, {"script": _waiting_script(pid_file, tmp_path / "never")}
            )
            pid = await anyio.to_thread.run_sync(read_pid, pid_file)

            def cli(*args: str, token: str | None = token) -> subprocess.CompletedProcess[str]:
                return _jobs_cli(url, *args, token=token)

            listed = await anyio.to_thread.run_sync(cli, "list")
            assert listed.returncode == 0, listed.stderr
            lines = listed.stdout.splitlines()
            assert [line.split()[:2] for line in lines] == [
                [done.task_id, "completed"],
                [running.task_id, "working"],
            ]
            as_json = await anyio.to_thread.run_sync(cli, "--json", "list")
            assert [t["taskId"] for t in json.loads(as_json.stdout)] == [
                done.task_id,
                running.task_id,
            ]
            shown = await anyio.to_thread.run_sync(cli, "show", done.task_id)
            assert shown.returncode == 0 and "Script result (text()):\nfinished" in shown.stdout

            cancelled = await anyio.to_thread.run_sync(cli, "cancel", running.task_id)
            assert cancelled.returncode == 0, cancelled.stderr
            assert cancelled.stdout.split()[:2] == [running.task_id, "cancelled"]
            assert await anyio.to_thread.run_sync(gone, pid)
            assert (await get_task(client, running.task_id)).status == "cancelled"

            again = await anyio.to_thread.run_sync(cli, "cancel", running.task_id)
            assert again.returncode == 1 and "already ended" in again.stderr
            unknown = await anyio.to_thread.run_sync(cli, "show", "no-such-task")
            assert unknown.returncode == 1 and "no task" in unknown.stderr
            no_token = await anyio.to_thread.run_sync(lambda: cli("list", token=None))
            assert no_token.returncode == 2 and "--token" in no_token.stderr
            wrong = await anyio.to_thread.run_sync(lambda: cli("list", token="w" * 43))
            assert wrong.returncode == 1 and "cannot talk to" in wrong.stderr


@pytest.mark.kernel
@pytest.mark.parametrize("mode", ["per_call", "session"])
async def test_a_server_closed_with_tasks_working_leaves_nothing(
    tmp_path: Path, short_tmp: Path, reap: list[tuple[int, bool]], mode: str
) -> None:
    """The client goes while a task's script runs (and its setsid child): the server cancels
    the task, stops its kernel and every process under it, and removes its files."""
    argv = lemon_exec_argv("mcp")
    base = short_tmp  # the staging root's sockets need a short path
    env = {**os.environ, "LEMON_EXECUTE_CODE_KERNEL_MODE": mode, "TMPDIR": str(base)}
    params = StdioServerParameters(command=argv[0], args=argv[1:], env=env, cwd=str(tmp_path))
    pid_file, child_file = tmp_path / "kernel.pid", tmp_path / "child.pid"
    script = (
        "import subprocess\n"
        "child = subprocess.Popen(['sleep', '300'], start_new_session=True)\n"
        f"open({str(child_file)!r}, 'w').write(str(child.pid))\n"
        + _waiting_script(pid_file, tmp_path / "never")
    )
    async with Client(params, mode="legacy") as client:
        task = await start_task(client, {"script": script})
        assert task.status == "working"
        kernel = await anyio.to_thread.run_sync(read_pid, pid_file)
        child = await anyio.to_thread.run_sync(read_pid, child_file)
        reap.extend([(kernel, False), (child, False)])
        assert (await get_task(client, task.task_id)).status == "working"
    # stdin closed: the server shuts down with the task still working.
    assert await anyio.to_thread.run_sync(lambda: gone(kernel, within=15))
    assert await anyio.to_thread.run_sync(lambda: gone(child, within=15))
    for root in base.glob("lemon-exec-*"):
        assert {p.name for p in root.iterdir()} <= {"owner", "spill"}, root


@pytest.mark.kernel
async def test_execute_code_tasks_expire_by_age_and_by_count(tmp_path: Path) -> None:
    """A finished task's result is kept job_result_ttl_ms, and only the newest
    max_finished_jobs; then tasks/get and tasks/result answer that it has expired."""
    argv = lemon_exec_argv("mcp")
    env = {
        **os.environ,
        "LEMON_EXECUTE_CODE_JOB_RESULT_TTL_MS": "1500",
        "LEMON_EXECUTE_CODE_MAX_FINISHED_JOBS": "2",
    }
    params = StdioServerParameters(command=argv[0], args=argv[1:], env=env, cwd=str(tmp_path))
    async with Client(params, mode="legacy") as client:
        ids = []
        for i in range(3):
            task = await start_task(client, {"script": f"text('t{i}')"})
            assert task.ttl == 1500  # the retention the server applies, said at the start
            assert _text(await task_result(client, task.task_id)).endswith(f"t{i}")
            ids.append(task.task_id)
        # By count: the oldest of three finished tasks is gone, the newest two stay.
        with pytest.raises(MCPError) as by_count:
            await get_task(client, ids[0])
        assert by_count.value.error.code == INVALID_PARAMS
        assert f"{ids[0]} has expired" in by_count.value.error.message
        assert [t.task_id for t in (await list_tasks(client)).tasks] == ids[1:]
        assert (await get_task(client, ids[2])).status == "completed"

        # By age: untouched, both expire on time.
        await anyio.sleep(2.0)
        for task_id in ids[1:]:
            with pytest.raises(MCPError) as by_age:
                await task_result(client, task_id)
            assert by_age.value.error.code == INVALID_PARAMS
            assert f"{task_id} has expired" in by_age.value.error.message
        assert (await list_tasks(client)).tasks == []
