"""``lemon-exec mcp --sandbox`` confines execute_command too: real bwrap, the real server
(in process and over stdio), a key planted under a temporary HOME and a TCP server on the
host's loopback that the commands must not reach."""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mcp import Client, StdioServerParameters
from support import wait_until

from lemon_exec import ExecuteCodeConfig, SessionScope
from lemon_exec.host.kernels.sandbox import spec_from_config
from lemon_exec.mcp import build_server
from lemon_exec.shell import ShellSession

from .conftest import lemon_exec_argv

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]

KEY = "-----BEGIN OPENSSH PRIVATE KEY----- planted-by-the-test"
#: A background job the test can find by its command line (sandboxed PIDs mean nothing here).
JOB_SECONDS = "987.25"


class Listener:
    """A TCP server on 127.0.0.1 that counts the connections it accepts."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            conn.close()

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def listener() -> Iterator[Listener]:
    server = Listener()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The server's working directory, with a HOME beside it that holds an ssh key."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_rsa").write_text(KEY + "\n")
    monkeypatch.setenv("HOME", str(home))
    work = tmp_path / "project"
    work.mkdir()
    return work


def _tcp(port: int) -> str:
    return f"exec 3<>/dev/tcp/127.0.0.1/{port} && echo connected"


async def _shell_checks(client: Client, project: Path, listener: Listener) -> None:
    """What a confined execute_command must refuse, and what must still work."""

    async def run(command: str, **extra: Any) -> dict[str, Any]:
        result = await client.call_tool("execute_command", {"command": command, **extra})
        assert result.structured_content is not None, result
        return dict(result.structured_content)

    # The host itself can reach the listener: a refusal below is the sandbox's doing.
    before = listener.accepted
    socket.create_connection(("127.0.0.1", listener.port), timeout=5).close()
    wait_until(lambda: listener.accepted != before, 10, interval=0.01)
    reached = listener.accepted
    assert reached == before + 1

    key = await run("cat ~/.ssh/id_rsa")
    assert KEY not in key["stdout"] + key["stderr"]
    assert key["exit_code"] != 0

    tcp = await run(_tcp(listener.port))
    assert "connected" not in tcp["stdout"]
    assert tcp["exit_code"] != 0

    # Refused, or written to the sandbox's private /tmp (this HOME lies under /tmp): never
    # to the host's HOME.
    await run("touch ~/planted-from-the-sandbox")
    assert not (project.parent / "home" / "planted-from-the-sandbox").exists()

    pipes = await run("printf 'b\\na\\n' | sort | tr a-z A-Z > sorted.txt && cat sorted.txt")
    assert pipes == {"stdout": "A\nB\n", "stderr": "", "exit_code": 0, "timed_out": False}
    assert (project / "sorted.txt").read_text() == "A\nB\n"  # the project is writable

    await run("mkdir -p sub && cd sub")
    assert (await run("pwd"))["stdout"] == f"{os.path.realpath(project)}/sub\n"
    assert (await run("cd / && exit 7"))["exit_code"] == 7
    assert (await run("pwd"))["stdout"] == "/\n"

    slow = await run("sleep 30; echo never", timeout=1)
    assert slow["timed_out"] is True
    assert slow["exit_code"] == -1
    assert slow["stdout"] == ""

    assert listener.accepted == reached


def _config(**overrides: Any) -> ExecuteCodeConfig:
    return ExecuteCodeConfig(
        enabled=True, warm_kernels=0, fork_server=False, sandbox="bwrap", **overrides
    )


# -- in process ------------------------------------------------------------------------------


async def test_sandboxed_server_confines_execute_command(project: Path, listener: Listener) -> None:
    config = _config()
    server = build_server(
        config,
        shell=ShellSession.for_config(config, project),
        scope=SessionScope("sandboxed", "mcp", project),
        only_shell=True,
    )
    async with Client(server) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
        await _shell_checks(client, project, listener)
    description = tools["execute_command"].description or ""
    assert "same bubblewrap sandbox as execute_code" in description
    assert "This is not a sandbox" not in description


def test_default_shell_of_a_sandboxed_server_is_confined(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(project)
    config = _config(sandbox_network=True)
    server = build_server(config)
    assert server.shell.sandbox == spec_from_config(config)
    assert server.shell.sandbox is not None and server.shell.sandbox.network


def test_sandboxed_server_refuses_an_unconfined_shell(project: Path) -> None:
    with pytest.raises(ValueError, match="not confined"):
        build_server(_config(), shell=ShellSession(project))
    # Confined, but to another sandbox (this one reaches the network): refused too.
    elsewhere = ShellSession.for_config(_config(sandbox_network=True), project)
    with pytest.raises(ValueError, match="not confined"):
        build_server(_config(), shell=elsewhere)


async def test_network_setting_applies_to_the_shell(project: Path, listener: Listener) -> None:
    config = _config(sandbox_network=True)
    shell = ShellSession.for_config(config, project)
    async with Client(build_server(config, shell=shell, only_shell=True)) as client:
        result = await client.call_tool("execute_command", {"command": _tcp(listener.port)})
    assert result.structured_content is not None
    assert result.structured_content["stdout"] == "connected\n"


# -- a real lemon-exec mcp --sandbox over stdio ----------------------------------------------


def _params(project: Path, *args: str) -> StdioServerParameters:
    argv = lemon_exec_argv("mcp", "--sandbox", *args)
    return StdioServerParameters(
        command=argv[0], args=argv[1:], env=dict(os.environ), cwd=str(project)
    )


def _jobs() -> list[int]:
    """PIDs (host view) of the background job the tests start."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if argv[:2] == [b"sleep", JOB_SECONDS.encode()]:
                found.append(int(entry))
    return found


@pytest.mark.slow
@pytest.mark.parametrize("only", [(), ("--only", "shell")])
@pytest.mark.kernel
async def test_stdio_sandbox_confines_execute_command(
    project: Path, listener: Listener, only: tuple[str, ...]
) -> None:
    async with Client(_params(project, *only)) as client:
        await _shell_checks(client, project, listener)
        job = await client.call_tool(
            "execute_command", {"command": f"sleep {JOB_SECONDS} > /dev/null 2>&1 &"}
        )
        assert job.structured_content is not None
        assert job.structured_content["exit_code"] == 0
        assert _jobs(), "the background job should run while the server does"
    # The server has exited: the job died with it.
    assert wait_until(lambda: not _jobs(), 10), "a background job outlived the server"


# -- the session itself ----------------------------------------------------------------------


def test_a_directory_only_the_sandbox_had_falls_back_to_the_start(project: Path) -> None:
    shell = ShellSession.for_config(_config(), project)
    inside = f"/tmp/lemon-shell-test-{os.getpid()}"
    moved = shell.execute_command(f"mkdir -p {inside} && cd {inside} && pwd")
    assert moved["stdout"] == f"{inside}\n"
    # The sandbox's /tmp is private to each command: the next one cannot start there.
    assert f"{inside} no longer exists; falling back to" in moved["stderr"]
    assert not os.path.exists(inside)
    assert shell.cwd == os.path.realpath(project)
    assert shell.execute_command("pwd")["stdout"] == f"{os.path.realpath(project)}\n"


def test_an_unknown_sandbox_refuses_every_command(project: Path) -> None:
    config = ExecuteCodeConfig(enabled=True, sandbox="bwarp")
    shell = ShellSession.for_config(config, project)
    result = shell.execute_command(f"touch {project}/ran")
    assert result["exit_code"] == -1
    assert "unknown sandbox 'bwarp'" in result["stderr"]
    assert not (project / "ran").exists()
