"""Small helpers shared by test modules (imported as ``support``; tests/ is on sys.path)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

from lemon_exec import ExecuteCode, ExecuteCodeConfig


def text_frame_bytes(n: int, text: str) -> int:
    """What text block ``n`` costs against max_text_bytes, as the protocol defines it: the
    bytes of its JSON-encoded frame (docs/comm-protocol.md §6). The bridge's fast path,
    ``text_budget.text_cost``, must agree."""
    return len(json.dumps({"n": n, "text": text}).encode("utf-8"))


@contextlib.contextmanager
def configured(ec: ExecuteCode, **values: Any) -> Iterator[None]:
    """Change settings of a shared facade for one test; limits are read afresh per cell."""
    saved = {key: getattr(ec.config, key) for key in values}
    for key, value in values.items():
        setattr(ec.config, key, value)
    try:
        yield
    finally:
        for key, value in saved.items():
            setattr(ec.config, key, value)


def pid_gone(pid: int) -> bool:
    """Whether process ``pid`` has ended (a zombie counts as ended)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except (FileNotFoundError, ProcessLookupError):  # gone before, or while, reading
        return True
    return bool(re.search(r"^State:\s+Z", status, re.M))


T = TypeVar("T")

#: The default patience of the polling helpers: generous, because under a loaded 2-core
#: machine a kernel start can take several seconds; a true condition returns at once.
WAIT_S = 30.0


def wait_until(
    predicate: Callable[[], object], timeout: float = WAIT_S, interval: float = 0.05
) -> bool:
    """Poll ``predicate`` until it is true or ``timeout`` seconds pass; whether it came true.

    The one way the tests wait for a state (instead of sleeping a fixed time, then asserting
    it): ``assert wait_until(lambda: ..., 10), "what did not happen"``.
    """
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return bool(predicate())
        time.sleep(interval)


async def await_until(
    predicate: Callable[[], object], timeout: float = WAIT_S, interval: float = 0.02
) -> bool:
    """:func:`wait_until` for code on an event loop: polls without blocking the loop."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return bool(predicate())
        await asyncio.sleep(interval)


def wait_for_value(
    produce: Callable[[], T | None],
    timeout: float = WAIT_S,
    what: str = "a value",
    interval: float = 0.05,
) -> T:
    """The first non-None value ``produce`` returns, polled as :func:`wait_until` does;
    AssertionError naming ``what`` if there is none within ``timeout`` seconds."""
    found: list[T] = []

    def produced() -> bool:
        value = produce()
        if value is not None:
            found.append(value)
        return value is not None

    if not wait_until(produced, timeout, interval):
        raise AssertionError(f"no {what} within {timeout} s")
    return found[0]


class LoopThread:
    """An event loop on a daemon thread, for facades that a test module shares across tests.

    ``run`` waits at most ``timeout`` seconds (default: the one given at construction).
    """

    def __init__(self, timeout: float = 45) -> None:
        self.timeout = timeout
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def run(self, coro: Awaitable[T], timeout: float | None = None) -> T:
        future: Future[T] = asyncio.run_coroutine_threadsafe(coro, self.loop)  # type: ignore[arg-type]
        return future.result(self.timeout if timeout is None else timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)
        self.loop.close()


def mcp_call_execute_code(server: subprocess.Popen[str], script: str) -> dict[str, Any]:
    """Drive a ``lemon-exec mcp`` stdio server by hand (line-delimited JSON-RPC): initialize,
    then one ``execute_code`` call of ``script``; its reply message."""
    assert server.stdin is not None and server.stdout is not None

    def send(message: dict[str, object]) -> None:
        assert server.stdin is not None
        server.stdin.write(json.dumps(message) + "\n")
        server.stdin.flush()

    send({
        "jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                   "clientInfo": {"name": "test", "version": "0"}},
    })  # fmt: skip
    assert json.loads(server.stdout.readline())["id"] == 1
    send({"jsonrpc": "2.0", "method": "notifications/initialized"})
    send({
        "jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": {"name": "execute_code", "arguments": {"script": script}},
    })  # fmt: skip
    while (reply := json.loads(server.stdout.readline())).get("id") != 2:
        pass
    return dict(reply)


def enabled_config(**overrides: Any) -> ExecuteCodeConfig:
    """An enabled config whose kernels run under the interpreter running the tests: 30 s
    timeout, no warm spares, unless ``overrides`` say otherwise."""
    values: dict[str, Any] = {
        "enabled": True,
        "timeout_ms": 30_000,
        "warm_kernels": 0,
        "python_path": sys.executable,
    }
    values.update(overrides)
    return ExecuteCodeConfig(**values)


def index_row(
    kernel_id: str, phase: str | None = "idle", timeout: float = WAIT_S
) -> dict[str, Any]:
    """This process's row for ``kernel_id`` in the live-kernel index, once it is there (and
    in ``phase``, unless that is None); the index is written within 0.2 s of a change."""
    from lemon_exec.host.disk.index import read_indexes

    def row() -> dict[str, Any] | None:
        rows = [
            r
            for r in read_indexes()
            if r.get("public_id") == kernel_id and r.get("host_pid") == os.getpid()
        ]
        return dict(rows[0]) if rows and phase in (None, rows[0].get("phase")) else None

    return wait_for_value(row, timeout, f"{phase or 'any'} row of kernel {kernel_id} in the index")
