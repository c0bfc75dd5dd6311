"""Fixtures for the tool-host tests: a default host bound to tmp_path, and a loopback server."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gzip
import http.server
import pathlib
import threading
from collections.abc import Callable, Iterator

import pytest

from lemon_exec.tools import ToolCall, ToolHost, default_registry

Invoke = Callable[..., str]


def run_call(host: ToolHost, tool: str, cwd: pathlib.Path, /, **params: object) -> str:
    """Invoke one call on ``host`` in a fresh event loop."""
    return asyncio.run(host.invoke(ToolCall(tool, dict(params), cwd, 1)))


@pytest.fixture(scope="session")
def shared_host() -> Iterator[ToolHost]:
    """One default ToolHost for the whole session: its grep/find worker processes stay warm."""
    host = ToolHost(default_registry())
    yield host
    host.close()


@pytest.fixture
def invoke(tmp_path: pathlib.Path, shared_host: ToolHost) -> Invoke:
    """``invoke(tool, **params)`` through a default ToolHost, with ``tmp_path`` as the cwd."""

    def _invoke(tool: str, /, **params: object) -> str:
        return run_call(shared_host, tool, tmp_path, **params)

    return _invoke


@pytest.fixture
def invoke_here(tmp_path: pathlib.Path) -> Iterator[Invoke]:
    """Like ``invoke``, but grep and find run in this process (on a thread), not in a worker
    process: for tests that monkeypatch a module's limits, which a worker would not see."""
    registry = default_registry()
    for name in ("grep", "find"):
        spec = registry.get(name)
        assert spec is not None
        registry.register(dataclasses.replace(spec, isolated=False, inline=None), replace=True)
    host = ToolHost(registry)

    def _invoke(tool: str, /, **params: object) -> str:
        return run_call(host, tool, tmp_path, **params)

    yield _invoke
    host.close()


HTML_PAGE = b"""<!DOCTYPE html>
<html><head><title>T</title><style>body { color: red }</style>
<script>var secret = "do-not-show";</script></head>
<body><h1>Hello Lemon</h1>
<p>Some <em>emphasised</em> text with <a href="/docs">a link</a>.</p>
<img src="/logo.png" alt="logo">
</body></html>
"""
BIG_BODY_BYTES = 6 * 1024 * 1024


class _Handler(http.server.BaseHTTPRequestHandler):
    """Fixed routes for the webfetch tests."""

    def do_GET(self) -> None:
        path = self.path
        if path == "/page.html":
            self._send(200, "text/html; charset=utf-8", HTML_PAGE)
        elif path == "/plain.txt":
            self._send(
                200, "text/plain; charset=iso-8859-1", "caf\u00e9 au lait\n".encode("latin-1")
            )
        elif path == "/data.json":
            self._send(200, "application/json", b'{"ok": true}')
        elif path == "/image.png":
            self._send(200, "image/png", b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR")
        elif path == "/gzip.txt":
            self._send(
                200,
                "text/plain; charset=utf-8",
                gzip.compress(b"zipped text\n"),
                extra={"Content-Encoding": "gzip"},
            )
        elif path == "/redirect":
            self._redirect("/plain.txt")
        elif path == "/loop":
            self._redirect("/loop")
        elif path == "/to-file":
            self._redirect("file:///etc/passwd")
        elif path == "/big.txt":
            self._send(200, "text/plain", b"x" * BIG_BODY_BYTES)
        elif path == "/long.txt":
            self._send(200, "text/plain", b"abcdefghij" * 10_000)
        else:
            self._send(404, "text/plain", b"nope")

    def do_POST(self) -> None:  # pragma: no cover - webfetch must never POST
        self._send(500, "text/plain", b"POST is not expected")

    def _send(
        self, code: int, ctype: str, body: bytes, extra: dict[str, str] | None = None
    ) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for key, value in (extra or {}).items():
            self.send_header(key, value)
        self.end_headers()
        # The client may stop reading at its size cap.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            self.wfile.write(body)

    def _redirect(self, location: str) -> None:
        self.send_response(302)
        self.send_header("Location", location)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass  # keep test output clean


@pytest.fixture(scope="session")
def http_base() -> Iterator[str]:
    """Base URL of a ThreadingHTTPServer on 127.0.0.1 with an ephemeral port."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


@pytest.fixture(autouse=True)
def _no_proxy_for_loopback(monkeypatch: pytest.MonkeyPatch) -> None:
    # An ambient http_proxy must not capture the loopback test server.
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
