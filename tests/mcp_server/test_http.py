"""``lemon-exec mcp --http``: streamable HTTP on loopback, and the address checks."""

from __future__ import annotations

import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
from mcp import Client

from lemon_exec.cli import main
from lemon_exec.mcp import is_loopback_host, parse_http_address

from .conftest import lemon_exec_argv

pytestmark = [pytest.mark.timeout(120)]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_listening(proc: subprocess.Popen[bytes], port: int, within: float = 30.0) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"the server exited with {proc.returncode}"
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise AssertionError(f"nothing listens on 127.0.0.1:{port} after {within} s")


@pytest.mark.anyio
@pytest.mark.parametrize("only", [(), ("--only", "shell")])
async def test_http_lists_tools(tmp_path: Path, only: tuple[str, ...]) -> None:
    port = _free_port()
    proc = subprocess.Popen(
        lemon_exec_argv("mcp", "--http", f"127.0.0.1:{port}", *only),
        cwd=tmp_path,
        stderr=subprocess.PIPE,
    )
    try:
        _wait_listening(proc, port)
        async with Client(f"http://127.0.0.1:{port}/mcp") as client:
            assert client.server_info is not None
            name = client.server_info.name
            names = [t.name for t in (await client.list_tools()).tools]
            result = await client.call_tool("execute_command", {"command": "echo over-http"})
        if only:
            assert name == "code-execution-tools"
            assert names == ["execute_command", "restart_session"]
        else:
            assert name == "lemon-exec"
            assert names == ["execute_code", "execute_command", "restart_session"]
        assert result.structured_content is not None
        assert result.structured_content["stdout"] == "over-http\n"
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            status = proc.wait(20)
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.communicate()
    # uvicorn re-raises the signal once it has shut down (lifespan included).
    assert status in (-signal.SIGTERM, 128 + signal.SIGTERM, 0)


@pytest.mark.parametrize("host", ["0.0.0.0", "[::]", "192.0.2.1"])
def test_http_refuses_non_loopback_hosts(host: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["mcp", "--http", f"{host}:8765"]) == 2
    err = capsys.readouterr().err
    assert "not a loopback address" in err
    assert "--allow-remote" in err
    assert "bash-equivalent" in err


@pytest.mark.parametrize(
    "argv",
    [
        ["mcp", "--http", "8765"],
        ["mcp", "--http", "127.0.0.1:http"],
        ["mcp", "--http", "127.0.0.1:70000"],
        ["mcp", "--http", "::1:8765"],
        ["mcp", "--allow-remote"],
        ["mcp", "--config", "/nonexistent/lemon.toml"],
    ],
)
def test_usage_errors_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    assert capsys.readouterr().err.startswith("lemon-exec")


def test_parse_http_address() -> None:
    assert parse_http_address("127.0.0.1:8000") == ("127.0.0.1", 8000)
    assert parse_http_address("localhost:1") == ("localhost", 1)
    assert parse_http_address("[::1]:8000") == ("::1", 8000)
    for bad in ("8000", ":8000", "host:", "host:0", "::1:8000"):
        with pytest.raises(ValueError):
            parse_http_address(bad)


def test_is_loopback_host() -> None:
    assert is_loopback_host("127.0.0.1")
    assert is_loopback_host("127.0.0.2")
    assert is_loopback_host("::1")
    assert is_loopback_host("localhost")
    assert not is_loopback_host("0.0.0.0")
    assert not is_loopback_host("::")
    assert not is_loopback_host("192.0.2.1")
    assert not is_loopback_host("no-such-host.invalid")


def test_mcp_help_names_the_options(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["mcp", "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    for option in ("--only", "--http", "--allow-remote", "--config"):
        assert option in out
