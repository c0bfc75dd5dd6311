"""``lemon-exec mcp --http``: streamable HTTP on loopback behind a bearer token, and the
address and token checks. The servers are real ``lemon-exec`` subprocesses."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import queue
import selectors
import signal
import socket
import subprocess
import threading
import time
import urllib.parse
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import Client, MCPError
from mcp.client.streamable_http import streamable_http_client

from lemon_exec.cli import main
from lemon_exec.cli.mcp import LIMIT_OPTIONS, TOKEN_ENV
from lemon_exec.mcp import is_loopback_host, parse_http_address
from lemon_exec.mcp._auth import check_token, new_token

from .conftest import lemon_exec_argv

pytestmark = [pytest.mark.timeout(120)]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class HttpServer:
    """A ``lemon-exec mcp --http`` subprocess and what it announced on stderr."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc
        self.lines: queue.Queue[str] = queue.Queue()
        self.announced: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.put(line)

    def wait_listening(self, within: float = 30.0) -> str:
        """The URL from the "listening on" line, once the server printed it."""
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.1)
            except queue.Empty:
                assert self.proc.poll() is None, f"the server exited with {self.proc.returncode}"
                continue
            self.announced.append(line)
            if "listening on " in line:
                # The bearer-token lines follow at once, in the same write.
                time.sleep(0.2)
                while not self.lines.empty():
                    self.announced.append(self.lines.get())
                return line.rsplit(" ", 1)[1].strip()
        raise AssertionError(f"no 'listening on' line after {within} s: {self.announced}")

    @property
    def token(self) -> str | None:
        for line in self.announced:
            if "bearer token: " in line:
                return line.rsplit(" ", 1)[1].strip()
        return None

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(20)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(5)


@contextlib.contextmanager
def http_server(
    tmp_path: Path, *args: str, env: dict[str, str] | None = None
) -> Iterator[tuple[HttpServer, str]]:
    port = _free_port()
    proc = subprocess.Popen(
        lemon_exec_argv("mcp", "--http", f"127.0.0.1:{port}", *args),
        cwd=tmp_path,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )
    server = HttpServer(proc)
    try:
        url = server.wait_listening()
        assert url == f"http://127.0.0.1:{port}/mcp"
        yield server, url
    finally:
        status = server.stop()
    # uvicorn re-raises the signal once it has shut down (lifespan included).
    assert status in (-signal.SIGTERM, 128 + signal.SIGTERM, 0)


def _post(url: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    """A raw JSON-RPC POST (tools/list), as any local process could send it."""
    parts = urllib.parse.urlsplit(url)
    assert parts.hostname is not None, url
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
    try:
        body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
        conn.request(
            "POST",
            parts.path,
            body,
            {
                "Content-Type": "application/json",
                "Accept": "application/json, text/event-stream",
                **(headers or {}),
            },
        )
        response = conn.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        conn.close()


def _leaves(exc: BaseException) -> list[BaseException]:
    """The exceptions inside (nested) exception groups."""
    inner = getattr(exc, "exceptions", None)  # an ExceptionGroup (or its backport)
    if isinstance(inner, tuple):
        return [leaf for sub in inner for leaf in _leaves(sub)]
    return [exc]


@contextlib.asynccontextmanager
async def bearer_client(url: str, token: str, **options: Any) -> AsyncIterator[Client]:
    """The SDK's streamable HTTP client, sending the bearer token on every request.

    ``options`` go to ``Client`` (``mode="legacy"`` for the 2025-11-25 handshake, say).
    """
    async with (
        httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}) as http,
        Client(streamable_http_client(url, http_client=http), **options) as client,
    ):
        yield client


@pytest.mark.slow
@pytest.mark.anyio
@pytest.mark.kernel
async def test_http_requires_the_generated_bearer_token(tmp_path: Path) -> None:
    with http_server(tmp_path) as (server, url):
        token = server.token
        assert token is not None and len(token) >= 43, server.announced
        # No token, a wrong one, the wrong scheme, a prefix of the right one: 401, and the
        # SDK behind never sees the request.
        for headers in (
            {},
            {"Authorization": "Bearer " + "x" * len(token)},
            {"Authorization": f"Basic {token}"},
            {"Authorization": f"Bearer {token[:-1]}"},
            {"Authorization": token},
        ):
            status, reply_headers, body = _post(url, headers)
            assert status == 401, (headers, body)
            assert reply_headers["www-authenticate"].startswith("Bearer")
            assert b"Authorization: Bearer <token>" in body
        status, _, _ = _post(url.replace("/mcp", "/elsewhere"))
        assert status == 401
        # The SDK client without the header fails too.
        with pytest.raises(BaseException) as refused:
            async with Client(url) as client:
                await client.list_tools()
        assert any(isinstance(e, MCPError) for e in _leaves(refused.value)), refused.value

        async with bearer_client(url, token) as client:
            assert client.server_info is not None
            assert client.server_info.name == "lemon-exec"
            names = [t.name for t in (await client.list_tools()).tools]
            assert names == ["execute_code", "execute_command", "restart_session"]
            code = await client.call_tool("execute_code", {"script": "text(6 * 7)"})
            command = await client.call_tool("execute_command", {"command": "echo over-http"})
    assert not code.is_error
    assert code.structured_content is not None
    assert code.structured_content["details"]["exit_code"] == 0
    assert "42" in code.content[0].text  # type: ignore[union-attr]
    assert command.structured_content is not None
    assert command.structured_content["stdout"] == "over-http\n"


# --- slow and idle clients (issue 25 item 10) ----------------------------------------------------

#: What a slowloris client sends: a request line and part of the headers, then nothing.
HALF_SENT = b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: appl"


def _connect(url: str, data: bytes) -> socket.socket:
    parts = urllib.parse.urlsplit(url)
    sock = socket.create_connection((parts.hostname, parts.port), timeout=10)
    sock.sendall(data)
    return sock


def _request_head(url: str, token: str, body_length: int) -> bytes:
    return (
        f"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n"
        "Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n"
        f"Content-Length: {body_length}\r\n\r\n"
    ).encode()


def _wait_closed(
    socks: list[socket.socket], within: float, *, enough: int | None = None
) -> dict[socket.socket, tuple[float, bytes]]:
    """Read the sockets until the server closes them: ``{sock: (when, what it sent)}``.

    Stops when all (or ``enough``) are closed, or after ``within`` seconds.
    """
    selector = selectors.DefaultSelector()
    received: dict[socket.socket, bytearray] = {}
    by_fd = {sock.fileno(): sock for sock in socks}
    for sock in socks:
        sock.setblocking(False)
        selector.register(sock, selectors.EVENT_READ)
        received[sock] = bytearray()
    closed: dict[socket.socket, tuple[float, bytes]] = {}
    deadline = time.monotonic() + within
    want = len(socks) if enough is None else enough
    while len(closed) < want and (left := deadline - time.monotonic()) > 0:
        for key, _ in selector.select(min(left, 0.5)):
            sock = by_fd[key.fd]
            try:
                data = sock.recv(65536)
            except ConnectionResetError:
                data = b""
            if data:
                received[sock] += data
                continue
            selector.unregister(sock)
            closed[sock] = (time.monotonic(), bytes(received[sock]))
    selector.close()
    return closed


@pytest.mark.slow
@pytest.mark.anyio
@pytest.mark.kernel
async def test_http_closes_half_sent_requests_and_serves_the_token_holder_meanwhile(
    tmp_path: Path,
) -> None:
    # The cap is above the 300 here: they are closed by the timer (the next test: by the cap).
    args = ("--http-header-timeout", "3", "--http-max-connections", "400")
    with http_server(tmp_path, *args) as (server, url):
        token = server.token
        assert token is not None
        opened = time.monotonic()
        slow = [_connect(url, HALF_SENT) for _ in range(300)]
        # One that trickles a header byte at a time: activity does not reset the timer.
        trickler = _connect(url, b"POST /mcp HTTP/1.1\r\nX-Slow: ")
        stop = threading.Event()

        def trickle() -> None:
            with contextlib.suppress(OSError):
                while not stop.wait(0.25):
                    trickler.send(b"a")

        threading.Thread(target=trickle, daemon=True).start()
        try:
            with anyio.fail_after(30):  # at once: nothing waits behind the 300
                async with bearer_client(url, token) as client:
                    code = await client.call_tool("execute_code", {"script": "text(6 * 7)"})
            closed = _wait_closed([*slow, trickler], within=60)
        finally:
            stop.set()
            for sock in [*slow, trickler]:
                sock.close()
    assert not code.is_error and "42" in code.content[0].text  # type: ignore[union-attr]
    assert len(closed) == 301, f"{301 - len(closed)} slow connections are still open"
    for when, reply in closed.values():
        assert when - opened >= 3 - 0.05  # never before the header timeout
        assert reply.startswith(b"HTTP/1.1 408 "), reply
        assert b"--http-header-timeout" in reply


@pytest.mark.slow
@pytest.mark.anyio
async def test_http_connection_cap_evicts_waiting_clients_and_bounds_bodies(
    tmp_path: Path,
) -> None:
    args = ["--only", "shell", "--http-max-connections", "20", "--http-header-timeout", "120"]
    args += ["--http-body-timeout", "3", "--http-keep-alive-timeout", "1"]
    with http_server(tmp_path, *args) as (server, url):
        token = server.token
        assert token is not None
        # 100 half-sent requests against a cap of 20: the oldest waiting ones are closed
        # at once, long before the 120 s header timeout.
        slow = [_connect(url, HALF_SENT) for _ in range(100)]
        evicted = _wait_closed(slow, within=20, enough=80)
        assert len(evicted) >= 80
        assert all(reply == b"" for _, reply in evicted.values())
        with anyio.fail_after(30):  # served at once: its connection evicts a waiting one
            async with bearer_client(url, token) as client:
                result = await client.call_tool("execute_command", {"command": "echo served"})
        assert result.structured_content is not None
        assert result.structured_content["stdout"] == "served\n"

        # 20 authenticated requests whose bodies never end fill the cap with requests in
        # service: a 21st connection is refused with 503 (nothing waiting to close)...
        body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}).encode()
        sent = time.monotonic()
        stuck = [_connect(url, _request_head(url, token, len(body)) + body[:5]) for _ in range(20)]
        time.sleep(0.5)
        refused = _connect(url, HALF_SENT)
        (_, reply), *_ = _wait_closed([refused], within=10).values()
        assert reply.startswith(b"HTTP/1.1 503 "), reply
        assert b"--http-max-connections" in reply
        # ...and the body timeout then closes them.
        closed = _wait_closed(stuck, within=30)
        assert len(closed) == 20
        assert all(when - sent >= 3 - 0.05 for when, _ in closed.values())

        # Idle after a response: closed after the keep-alive timeout.
        sent = time.monotonic()
        idle = _connect(url, _request_head(url, "wrong-" + "t" * 20, len(body)) + body)
        (when, reply), *_ = _wait_closed([idle], within=10).values()
        assert reply.startswith(b"HTTP/1.1 401 "), reply
        assert 1 - 0.05 <= when - sent < 60  # the keep-alive timer's, not the header timer's
        for sock in (*slow, *stuck, refused, idle):
            sock.close()


@pytest.mark.anyio
async def test_http_token_from_the_environment(tmp_path: Path) -> None:
    token = "env-token-" + "k" * 20
    with http_server(tmp_path, "--only", "shell", env={TOKEN_ENV: token}) as (server, url):
        assert server.token is None  # a token the user chose is not echoed
        assert token not in "".join(server.announced)
        assert _post(url, {"Authorization": "Bearer wrong-" + "k" * 20})[0] == 401
        async with bearer_client(url, token) as client:
            assert client.server_info is not None
            assert client.server_info.name == "code-execution-tools"
            names = [t.name for t in (await client.list_tools()).tools]
            result = await client.call_tool("execute_command", {"command": "echo over-http"})
    assert names == ["execute_command", "restart_session"]
    assert result.structured_content is not None
    assert result.structured_content["stdout"] == "over-http\n"


@pytest.mark.anyio
async def test_http_no_auth_on_loopback(tmp_path: Path) -> None:
    with http_server(tmp_path, "--only", "shell", "--no-auth") as (server, url):
        assert server.token is None
        assert any("no authentication" in line for line in server.announced)
        async with Client(url) as client:
            result = await client.call_tool("execute_command", {"command": "echo open"})
    assert result.structured_content is not None
    assert result.structured_content["stdout"] == "open\n"


def test_http_no_auth_refused_off_loopback() -> None:
    # A real subprocess, with --allow-remote: the refusal does not depend on it.
    done = subprocess.run(
        lemon_exec_argv("mcp", "--http", f"0.0.0.0:{_free_port()}", "--no-auth", "--allow-remote"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert "refusing --no-auth on '0.0.0.0'" in done.stderr
    assert "not a loopback address" in done.stderr
    assert "listening" not in done.stderr


@pytest.mark.parametrize("extra", [(), ("--allow-remote",)])
@pytest.mark.parametrize("host", ["[::]", "192.0.2.1"])
def test_no_auth_refused_for_every_non_loopback_host(
    host: str, extra: tuple[str, ...], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["mcp", "--http", f"{host}:8765", "--no-auth", *extra]) == 2
    assert "refusing --no-auth" in capsys.readouterr().err


def test_http_port_in_use_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["mcp", "--http", f"127.0.0.1:{port}", "--only", "shell"]) == 1
    err = capsys.readouterr().err
    assert f"cannot listen on 127.0.0.1:{port}" in err
    assert "listening on" not in err


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
        ["mcp", "--token", "t" * 20],
        ["mcp", "--no-auth"],
        ["mcp", "--http", "127.0.0.1:8765", "--token", "short"],
        ["mcp", "--http", "127.0.0.1:8765", "--token", "has spaces in the token"],
        ["mcp", "--http", "127.0.0.1:8765", "--token", "t" * 20, "--no-auth"],
        ["mcp", "--config", "/nonexistent/lemon.toml"],
        ["mcp", "--http-header-timeout", "5"],
        ["mcp", "--http", "127.0.0.1:8765", "--http-header-timeout", "0"],
        ["mcp", "--http", "127.0.0.1:8765", "--http-body-timeout", "-1"],
        ["mcp", "--http", "127.0.0.1:8765", "--http-keep-alive-timeout", "nan"],
        ["mcp", "--http", "127.0.0.1:8765", "--http-max-connections", "0"],
    ],
)
def test_usage_errors_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    assert capsys.readouterr().err.startswith("lemon-exec")


def test_a_bad_token_in_the_environment_is_a_usage_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(TOKEN_ENV, "short")
    assert main(["mcp", "--http", "127.0.0.1:8765"]) == 2
    assert f"{TOKEN_ENV}: the token must be at least 16 characters" in capsys.readouterr().err
    monkeypatch.setenv(TOKEN_ENV, "t" * 20)
    assert main(["mcp", "--http", "127.0.0.1:8765", "--no-auth"]) == 2
    assert "exclude each other" in capsys.readouterr().err


def test_a_generated_token_works_as_a_command_line_argument() -> None:
    # One draw in 64 of a plain token_urlsafe starts with "-", which argparse reads as an option.
    tokens = [new_token() for _ in range(4000)]
    assert not [t for t in tokens if t.startswith("-")]
    assert all(len(t) == 43 and check_token(t) == t for t in tokens)
    assert len(set(tokens)) == len(tokens)


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
    for option in ("--only", "--http", "--allow-remote", "--token", "--no-auth", "--config"):
        assert option in out
    for option in LIMIT_OPTIONS:
        assert option in out
