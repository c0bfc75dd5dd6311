"""Killable worker processes for ``isolated`` tools (``ToolSpec.isolated``: grep, find).

A regex or glob walk can hold the GIL for minutes (``grep(r'(a+)+$')``), and a thread cannot
be stopped, so such tools run in small persistent worker processes (:mod:`._workerproc`).
Workers start lazily, serve one call at a time, are reused while healthy, and are killed (and
replaced) when a call is cancelled, overruns its deadline or its worker dies. The pool is not
tied to one event loop: each call watches its worker's pipes on the loop that awaits it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import struct
import subprocess
import sys
import threading
import time
from typing import Any

from lemon_exec.errors import ToolFailure

from ._types import ToolCall
from ._workerproc import encode_frame

__all__ = ["DEFAULT_MAX_WORKERS", "DeadlineExceeded", "WorkerPool"]

#: Worker processes one pool runs at most; further calls wait for one (within their deadline).
DEFAULT_MAX_WORKERS = max(2, min(4, os.cpu_count() or 2))
#: How long :meth:`WorkerPool.close` waits for killed workers to be reaped.
CLOSE_WAIT_S = 2.0

_HEADER = struct.Struct(">I")
_BOOT = (
    "import json, sys; sys.path[:0] = json.loads(sys.argv[1]); "
    "from lemon_exec.tools._workerproc import main; main()"
)


class DeadlineExceeded(Exception):
    """The call's deadline passed; its worker (if it had one) was killed."""


class _WorkerDied(Exception):
    """The worker's pipes closed before it answered."""


class _Worker:
    """One worker process and its pipes (non-blocking on our side)."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _BOOT, json.dumps([p for p in sys.path if p])],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            close_fds=True,
        )
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self._wfd = self.proc.stdin.fileno()
        self._rfd = self.proc.stdout.fileno()
        os.set_blocking(self._wfd, False)
        os.set_blocking(self._rfd, False)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    async def call(self, request: dict[str, Any], deadline: float | None) -> dict[str, Any]:
        """Send ``request`` and wait for the reply until ``deadline`` (``time.monotonic``)."""
        loop = asyncio.get_running_loop()
        reply: asyncio.Future[dict[str, Any]] = loop.create_future()
        out = memoryview(encode_frame(request))
        buf = bytearray()
        sent = 0

        def fail(exc: BaseException) -> None:
            if not reply.done():
                reply.set_exception(exc)

        def on_writable() -> None:
            nonlocal sent
            try:
                sent += os.write(self._wfd, out[sent:])
            except BlockingIOError:
                return
            except OSError:
                fail(_WorkerDied())
                return
            if sent == len(out):
                loop.remove_writer(self._wfd)

        def on_readable() -> None:
            try:
                chunk = os.read(self._rfd, 1 << 16)
            except BlockingIOError:
                return
            except OSError:
                chunk = b""
            if not chunk:
                fail(_WorkerDied())
                return
            buf.extend(chunk)
            if len(buf) >= _HEADER.size:
                size = _HEADER.unpack_from(buf)[0]
                if len(buf) >= _HEADER.size + size and not reply.done():
                    try:
                        reply.set_result(json.loads(bytes(buf[_HEADER.size :])))
                    except ValueError as e:
                        fail(e)

        loop.add_reader(self._rfd, on_readable)
        loop.add_writer(self._wfd, on_writable)
        try:
            timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
            done, _ = await asyncio.wait({reply}, timeout=timeout)
            if not done:
                raise DeadlineExceeded
            return reply.result()
        finally:
            loop.remove_writer(self._wfd)
            loop.remove_reader(self._rfd)
            if not reply.done():
                reply.cancel()

    def kill(self) -> None:
        """SIGKILL the process, close our pipe ends and reap it in the background."""
        if self.proc.poll() is None:
            with contextlib.suppress(OSError):
                self.proc.kill()
            # Reaping takes a moment after SIGKILL (longer if the process sits in the kernel):
            # never on the event loop.
            threading.Thread(target=self.proc.wait, name="lemon-tool-reaper", daemon=True).start()
        self.close_pipes()

    def close_pipes(self) -> None:
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()


class WorkerPool:
    """Up to ``max_workers`` worker processes, shared by every call of one tool host."""

    def __init__(self, max_workers: int = DEFAULT_MAX_WORKERS) -> None:
        if max_workers < 1:
            raise ValueError("max_workers must be >= 1")
        self._max = max_workers
        # A threading lock and per-loop futures: the pool may serve more than one loop.
        self._lock = threading.Lock()
        self._idle: list[_Worker] = []
        self._all: set[_Worker] = set()
        self._busy = 0
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        self._closed = False

    def pids(self) -> set[int]:
        """PIDs of the pool's live worker processes (idle or busy)."""
        with self._lock:
            return {w.pid for w in self._all if w.alive()}

    async def run(
        self, func_ref: str, params: dict[str, Any], call: ToolCall, deadline: float | None
    ) -> str:
        """Run ``func_ref(params, call)`` (``"module:qualname"``) in a worker.

        Returns the tool's text; raises :class:`ToolFailure` for the tool's own failures and
        :class:`DeadlineExceeded` if ``deadline`` (``time.monotonic()``, ``None``: none)
        passes first. Cancellation kills the worker.
        """
        worker = await self._acquire(call.tool, deadline)
        request = {
            "func": func_ref,
            "tool": call.tool,
            "params": params,
            "cwd": str(call.cwd),
            "call_id": call.call_id,
            "budget_s": 0.0 if deadline is None else max(0.001, deadline - time.monotonic()),
        }
        healthy = False
        try:
            reply = await worker.call(request, deadline)
            healthy = True
        except _WorkerDied:
            code = worker.proc.poll()
            raise ToolFailure(
                f"{call.tool} failed: its worker process exited unexpectedly"
                + (f" (exit status {code})" if code is not None else "")
            ) from None
        finally:
            self._release(worker, healthy)
        if reply.get("ok"):
            return str(reply.get("text", ""))
        if "failure" in reply:
            raise ToolFailure(str(reply["failure"]))
        raise ToolFailure(f"{call.tool} failed: {reply.get('error', 'unknown error')}")

    def close(self) -> None:
        """Kill every worker and wait (briefly) until they are gone. Idempotent."""
        with self._lock:
            self._closed = True
            workers = list(self._all)
            idle = list(self._idle)
            self._all.clear()
            self._idle.clear()
            waiters, self._waiters = self._waiters, []
        _wake(waiters)
        for worker in workers:
            if worker.alive():
                with contextlib.suppress(OSError):
                    worker.proc.kill()
        deadline = time.monotonic() + CLOSE_WAIT_S
        for worker in workers:
            with contextlib.suppress(subprocess.TimeoutExpired):
                worker.proc.wait(max(0.0, deadline - time.monotonic()))
        # Busy workers' pipes are closed by their calls (which see EOF); idle ones here.
        for worker in idle:
            worker.close_pipes()

    # -- checkout ------------------------------------------------------------------------------

    async def _acquire(self, tool: str, deadline: float | None) -> _Worker:
        loop = asyncio.get_running_loop()
        while True:
            stale: list[_Worker] = []
            worker: _Worker | None = None
            spawn = False
            waiter: asyncio.Future[None] | None = None
            with self._lock:
                if self._closed:
                    raise ToolFailure(f"{tool} failed: the tool host is closed")
                while self._idle:
                    candidate = self._idle.pop()
                    if candidate.alive():
                        worker = candidate
                        break
                    self._all.discard(candidate)
                    stale.append(candidate)
                if worker is not None or self._busy + len(self._idle) < self._max:
                    self._busy += 1
                    spawn = worker is None
                else:
                    waiter = loop.create_future()
                    self._waiters.append((loop, waiter))
            for dead in stale:
                dead.kill()
            if worker is not None:
                return worker
            if spawn:
                return self._spawn_checked_out(tool)
            assert waiter is not None
            try:
                if deadline is None:
                    await waiter
                else:
                    remaining = deadline - time.monotonic()
                    if remaining > 0:
                        await asyncio.wait({waiter}, timeout=remaining)
                    if time.monotonic() >= deadline:
                        raise DeadlineExceeded
            finally:
                with self._lock:
                    if (loop, waiter) in self._waiters:
                        self._waiters.remove((loop, waiter))

    def _spawn_checked_out(self, tool: str) -> _Worker:
        try:
            worker = _Worker()
        except OSError as e:
            with self._lock:
                self._busy -= 1
            raise ToolFailure(f"{tool} failed: cannot start a worker process: {e}") from None
        with self._lock:
            closed = self._closed
            if not closed:
                self._all.add(worker)
        if closed:
            worker.kill()
            with self._lock:
                self._busy -= 1
            raise ToolFailure(f"{tool} failed: the tool host is closed")
        return worker

    def _release(self, worker: _Worker, healthy: bool) -> None:
        replace = False
        with self._lock:
            self._busy -= 1
            keep = healthy and not self._closed and worker.alive()
            if keep:
                self._idle.append(worker)
            else:
                self._all.discard(worker)
                # Replace a killed worker now, so the next call finds one warm.
                replace = not self._closed and not self._idle
                if replace:
                    self._busy += 1
            waiters, self._waiters = self._waiters, []
        if not keep:
            worker.kill()
        if replace:
            try:
                fresh = self._spawn_checked_out("tool")
            except ToolFailure:
                pass  # the next call will try again, and report it
            else:
                self._release(fresh, True)
                return  # that release woke the waiters
        _wake(waiters)


def _wake(waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]]) -> None:
    """Tell waiting calls (on whatever loop) to try again."""
    for loop, fut in waiters:
        with contextlib.suppress(RuntimeError):  # a closed loop: its waiter is gone with it
            loop.call_soon_threadsafe(_set_if_pending, fut)


def _set_if_pending(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)
