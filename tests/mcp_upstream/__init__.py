"""Upstream MCP servers for the code-mode tests (server.py, hostile.py), and how to serve one
over streamable HTTP on loopback."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
from collections.abc import Iterator


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def serving_http(script: str, *args: str) -> Iterator[str]:
    """Run ``script --http PORT *args`` until it accepts connections; yield its MCP URL."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, script, "--http", str(port), *args])
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.terminate()
        proc.wait(10)
