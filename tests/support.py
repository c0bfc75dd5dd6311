"""Small helpers shared by test modules (imported as ``support``; tests/ is on sys.path)."""

from __future__ import annotations

import asyncio
import contextlib
import re
import threading
from collections.abc import Awaitable, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

from lemon_exec import ExecuteCode


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
