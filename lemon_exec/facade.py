"""ExecuteCode: the public facade of the execute_code tool.

Async-first (``await run(...)``) with a synchronous twin (``run_sync``) that drives the same
runner on a private event-loop thread. One facade lives on one event loop.

The facade owns the lifecycle (the loop it is bound to, the sync twin, closing) and the
public signatures; it checks each call's arguments (:func:`lemon_exec.host.run.calls.prepare`)
and hands the valid ones to the modes (:mod:`lemon_exec.host.run.router`), which own the
per-call pool and the session registry and ask the engine for kernels.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

from lemon_exec.config import ExecuteCodeConfig
from lemon_exec.errors import ConfigError, RefusedError
from lemon_exec.host.kernels.engine import Engine
from lemon_exec.host.run.calls import (  # noqa: F401  (the refusal texts, re-exported)
    ALREADY_ABORTED,
    BAD_CWD,
    BAD_RESET,
    BAD_TIMEOUT,
    DISABLED,
    MISSING_SCRIPT,
    NAN_TIMEOUT,
    Call,
    CallArgs,
    prepare,
)
from lemon_exec.host.run.router import Modes, finish, staging_refused
from lemon_exec.result import ExecuteCodeResult
from lemon_exec.schema import tool_schema
from lemon_exec.scope import AbortSignal, ScriptSource, SessionScope
from lemon_exec.session import SessionOwner
from lemon_exec.telemetry import Handler, Telemetry
from lemon_exec.tools import ToolHost, ToolRegistry, default_registry
from lemon_exec.tools._toolset import toolset

T = TypeVar("T")


class ExecuteCode:
    """The execute_code tool.

    ``config`` defaults to ``ExecuteCodeConfig.load()`` (TOML-less, environment applied).
    ``tools`` is the registry scripts call: the five default helpers (or replacements) and
    any tool the program registers beyond them, each a helper in scripts (docs/tools.md);
    ``policy``, ``approval`` and ``approval_required`` are the runtime's hooks.
    Use as ``async with ExecuteCode(...) as tool:`` or call :meth:`aclose` when done.
    """

    def __init__(
        self,
        config: ExecuteCodeConfig | None = None,
        *,
        tools: ToolRegistry | None = None,
        policy: Any = None,
        approval: Any = None,
        approval_required: Any = None,
        on_event: Handler | None = None,
        staging_base: str | os.PathLike[str] | None = None,
    ) -> None:
        self.config = config if config is not None else ExecuteCodeConfig.load()
        self.telemetry = Telemetry()
        if on_event is not None:
            self.telemetry.subscribe(on_event)
        self._tool_host = ToolHost(
            tools if tools is not None else default_registry(),
            policy=policy,
            approval=approval,
            approval_required=approval_required,
        )
        self._staging_base = Path(staging_base) if staging_base is not None else None
        #: Made on first use, on the loop the facade is then bound to.
        self._modes: Modes | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._portal: _LoopThread | None = None
        self._closed = False

    # -- public API -------------------------------------------------------------------------------

    def schema(self) -> dict[str, Any]:
        """The tool's name, generated description and JSON input schema."""
        extras = toolset(self._tool_host.registry, self.config.tools)
        return tool_schema(self.config, extras.specs)

    async def run(
        self,
        script: Any,
        *,
        timeout_ms: Any = None,
        reset: Any = False,
        scope: SessionScope | None = None,
        on_update: Callable[[str], None] | None = None,
        abort: AbortSignal | None = None,
        on_output: Callable[[str], None] | None = None,
        source: ScriptSource | None = None,
    ) -> ExecuteCodeResult:
        """Run one script and return its result; script failures are results, not exceptions.

        ``script``, ``timeout_ms`` and ``reset`` are the model's arguments (the input schema);
        the rest are the runtime's. ``scope`` identifies the session in session mode (without
        it the call runs isolated with ``fallback_reason: missing_session_scope``);
        ``on_update`` receives each notify() message in order, as the partial update
        ``notify: <msg>``; ``abort`` (an ``asyncio.Event`` or ``threading.Event``) stops the
        script when set. Cancelling the awaiting task counts as the caller's death.
        ``on_output`` receives the script's printed output (stdout and stderr, merged) live,
        chunk by chunk, as the kernel sent it; the result holds it all the same. ``source``
        (a :class:`~lemon_exec.scope.ScriptSource`) names the script for tracebacks and sets
        its ``sys.argv``, for runtimes that run a file as ``lemon-exec run`` does; the model
        never sets it.
        """
        args = CallArgs(
            script,
            timeout_ms=timeout_ms,
            reset=reset,
            scope=scope,
            on_update=on_update,
            abort=abort,
            on_output=on_output,
            source=source or ScriptSource(),
        )
        entered = time.monotonic()
        call = prepare(self.config, args, entered)  # checked before anything starts
        if not isinstance(call, Call):
            return finish(call, entered, self.telemetry)
        # MCP servers' tools are listed (connecting once) before the kernel is told the names.
        await self._tool_host.prepare_tools()
        try:
            modes = self._ensure_modes()
        except RefusedError as exc:  # the private staging root could not be made
            result = staging_refused(exc, call.details, self.config.mode, self.telemetry)
        else:
            result = await modes.run_call(call)
        return finish(result, entered, self.telemetry)

    async def warm_up(self, cwd: str | os.PathLike[str] | None = None) -> None:
        """Start the fork server and the per-call spares now, so the first call is warm.

        Optional: without it they start with the first call. Does nothing when disabled or
        when the interpreter cannot be resolved (the first call reports that).
        """
        if not self.config.enabled:
            return
        try:
            interpreter = self.config.resolve_python(cwd)
            modes = self._ensure_modes()
        except (ConfigError, RefusedError):
            return
        modes.warm_up(interpreter)
        await self._tool_host.prepare_tools()  # MCP servers connect and list their tools now

    async def attach(self, scope: SessionScope) -> SessionOwner:
        """An explicit owner handle for ``scope`` (co-ownership; see docs/modes.md)."""
        return self._ensure_modes().attach(scope)

    def snapshot(self) -> dict[str, Any]:
        """Aggregate kernel counts (no identities): the session registry plus spares."""
        if self._modes is not None:
            return self._modes.snapshot()
        return {
            "live": 0,
            "capacity": self.config.max_live_kernels,
            "phases": {"starting": 0, "idle": 0, "running": 0, "stopping": 0},
            "owners": 0,
            "forks": 0,
            "queued": 0,
            "evicted_total": 0,
            "reaped_total": 0,
            "idle_timeout_ms": self.config.kernel_idle_timeout_ms,
            "max_queued_cells_per_kernel": self.config.max_queued_cells_per_kernel,
            "spares": 0,
            "kernels_total": 0,
        }

    def run_sync(self, script: Any, **kwargs: Any) -> ExecuteCodeResult:
        """Blocking twin of :meth:`run` (``abort`` may be a ``threading.Event``)."""
        return self._call_sync(self.run(script, **kwargs))

    async def aclose(self) -> None:
        """Stop every kernel this facade started and remove its private files."""
        self._closed = True
        if self._modes is not None:
            modes, self._modes = self._modes, None
            await modes.aclose()
        await self._tool_host.aclose()  # its grep/find worker processes

    def close(self) -> None:
        """Blocking twin of :meth:`aclose`."""
        if self._portal is not None:
            portal, self._portal = self._portal, None
            try:
                portal.call(self.aclose())
            finally:
                portal.stop()
        elif self._modes is not None:
            loop = self._loop
            if loop is not None and loop.is_running():
                raise RuntimeError("ExecuteCode.close() called on a running loop; await aclose()")
            asyncio.run(self.aclose())

    async def __aenter__(self) -> ExecuteCode:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __enter__(self) -> ExecuteCode:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals -----------------------------------------------------------------------------

    @property
    def _engine(self) -> Engine | None:
        """The kernel supervisor, once started (for tests and diagnostics)."""
        return self._modes.engine if self._modes is not None else None

    def _ensure_engine(self) -> Engine:
        return self._ensure_modes().engine

    def _ensure_modes(self) -> Modes:
        loop = asyncio.get_running_loop()
        if self._closed:
            raise RuntimeError("this ExecuteCode facade is closed")
        if self._loop is None:
            self._loop = loop
        elif self._loop is not loop:
            raise RuntimeError(
                "an ExecuteCode facade is bound to the event loop it was first used on; "
                "create one facade per loop (or use run_sync from threads)"
            )
        if self._modes is None:
            self._modes = Modes(self.config, self._tool_host, self.telemetry, self._staging_base)
        return self._modes

    def _call_sync(self, coro: Coroutine[Any, Any, T]) -> T:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:
            coro.close()
            raise RuntimeError("run_sync() called from a running event loop; use await run()")
        if self._portal is None:
            if self._loop is not None:
                coro.close()
                raise RuntimeError("this facade is bound to another event loop; use await run()")
            self._portal = _LoopThread()
        return self._portal.call(coro)


class _LoopThread:
    """An event loop on a daemon thread, for the synchronous API."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="lemon-exec-loop", daemon=True
        )
        self._thread.start()

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=5)
        if not self._thread.is_alive():
            self.loop.close()
