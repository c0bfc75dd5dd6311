"""ExecuteCode: the public facade of the execute_code tool.

Async-first (``await run(...)``) with a synchronous twin (``run_sync``) that drives the same
engine on a private event-loop thread. One facade lives on one event loop.
"""

from __future__ import annotations

import asyncio
import math
import os
import stat
import threading
import time
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any, TypeVar

from lemon_exec.config import MIN_TIMEOUT_MS, ExecuteCodeConfig
from lemon_exec.errors import ConfigError, RefusedError
from lemon_exec.host.cell import AbortSignal
from lemon_exec.host.engine import Call, Engine
from lemon_exec.host.sessions import SessionOwner, SessionRegistry, run_in_session
from lemon_exec.interpreter import fallback_note
from lemon_exec.kernel.protocol import normalize_text
from lemon_exec.result import ExecuteCodeResult, refusal
from lemon_exec.schema import tool_schema
from lemon_exec.scope import SessionScope
from lemon_exec.telemetry import Handler, Telemetry
from lemon_exec.tools import ToolHost, ToolRegistry, default_registry

T = TypeVar("T")

DISABLED = (
    "execute_code is disabled. Enable it with `enabled = true` under "
    "[runtime.tools.execute_code] or LEMON_EXECUTE_CODE_ENABLED=1."
)
MISSING_SCRIPT = "execute_code: `script` is required and must be a non-empty string."
BAD_RESET = "execute_code: `reset` must be a boolean (true or false)."
BAD_TIMEOUT = "execute_code: `timeout_ms` must be an integer number of milliseconds."
NAN_TIMEOUT = "execute_code: `timeout_ms` is NaN; pass a number of milliseconds (or omit it)."
ALREADY_ABORTED = "execute_code: the call was aborted before it started; nothing ran."
BAD_CWD = "execute_code: the working directory {path} {problem}; nothing ran. {fix}"
_CWD_FIX = "Pass an existing directory as the scope's cwd."
_BOM = "\ufeff"


class ExecuteCode:
    """The execute_code tool.

    ``config`` defaults to ``ExecuteCodeConfig.load()`` (TOML-less, environment applied).
    ``tools`` replaces the default read/grep/find/ls/webfetch implementations; ``policy``,
    ``approval`` and ``approval_required`` are the runtime's hooks (see docs/tools.md).
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
        self._engine: Engine | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._portal: _LoopThread | None = None
        self._owners: dict[SessionScope, SessionOwner] = {}
        self._closed = False

    # -- public API -------------------------------------------------------------------------------

    def schema(self) -> dict[str, Any]:
        """The tool's name, generated description and JSON input schema."""
        return tool_schema(self.config)

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
        _owner: SessionOwner | None = None,
        _filename: str = "script.py",
        _argv: Sequence[str] | None = None,
    ) -> ExecuteCodeResult:
        """Run one script and return its result; script failures are results, not exceptions.

        ``scope`` identifies the session in session mode (without it the call runs isolated
        with ``fallback_reason: missing_session_scope``); ``on_update`` receives each notify()
        message in order, as the partial update ``notify: <msg>``; ``abort`` (an
        ``asyncio.Event`` or ``threading.Event``) stops the script when set. Cancelling the
        awaiting task counts as the caller's death. ``on_output`` receives the script's
        printed output (stdout and stderr, merged) live, chunk by chunk, as the kernel sent it;
        the result holds it all the same. ``_filename`` (the name tracebacks show) and
        ``_argv`` (``sys.argv`` in the script) serve ``lemon-exec run``.
        """
        entered = time.monotonic()
        result = await self._run(
            script,
            entered,
            timeout_ms,
            reset,
            scope,
            on_update,
            abort,
            _owner,
            on_output=on_output,
            filename=_filename,
            argv=_argv,
        )
        result.details["duration_ms"] = int((time.monotonic() - entered) * 1000)
        self._emit_stop(result)
        return result

    async def _run(
        self,
        script: Any,
        entered: float,
        timeout_ms: Any,
        reset: Any,
        scope: SessionScope | None,
        on_update: Callable[[str], None] | None,
        abort: AbortSignal | None,
        owner: SessionOwner | None,
        *,
        on_output: Callable[[str], None] | None = None,
        filename: str = "script.py",
        argv: Sequence[str] | None = None,
    ) -> ExecuteCodeResult:
        config = self.config
        mode = config.mode
        details: dict[str, Any] = {
            "mode": mode,
            "persistent": False,
            "reset_performed": False,
            "state_retained": False,
        }
        if not config.enabled:
            return refusal(DISABLED, details)
        if isinstance(script, str):
            # Editors and some encoders prepend a UTF-8 byte order mark; it is not code.
            script = script.removeprefix(_BOM)
        if not isinstance(script, str) or not script.strip():
            return refusal(MISSING_SCRIPT, details)
        if not isinstance(reset, bool):
            return refusal(BAD_RESET, details)
        # A lone surrogate (e.g. a bad "\ud800" escape in the model's JSON) cannot be sent or
        # compiled; as in every other text crossing the bridge, it becomes U+FFFD.
        script = normalize_text(script)
        if timeout_ms is not None and (
            isinstance(timeout_ms, bool) or not isinstance(timeout_ms, int | float)
        ):
            return refusal(BAD_TIMEOUT, details)
        if isinstance(timeout_ms, float) and math.isnan(timeout_ms):
            return refusal(NAN_TIMEOUT, details)
        if abort is not None and abort.is_set():
            return refusal(ALREADY_ABORTED, details)
        effective_ms = _clamp_timeout(timeout_ms, config.run_timeout_ms)
        cwd_or_problem = _working_dir(scope)
        if isinstance(cwd_or_problem, str):
            return refusal(cwd_or_problem, details)
        cwd = cwd_or_problem
        try:
            interpreter = config.resolve_python(cwd)
        except ConfigError as exc:
            return refusal(str(exc), details)
        details["python"] = interpreter
        if (note := fallback_note(interpreter)) is not None:
            details["python_fallback"] = note
        try:
            engine = self._ensure_engine()
            engine.ensure_staging()  # a script may have deleted it: made again, or refused
        except RefusedError as exc:  # the private staging root could not be made
            if mode == "session":  # the spec's pre-start fallback; per-call fails closed too
                details |= {"fallback_reason": "startup_failed", "kernel_reused": False}
                details |= {"startup_failed": True, "startup_error": "staging"}
                self.telemetry.emit("session.fallback", {}, {"reason": "startup_failed"})
            return refusal(str(exc), details)
        call = Call(
            script=script,
            interpreter=interpreter,
            cwd=cwd,
            deadline=entered + effective_ms / 1000,
            timeout_ms=effective_ms,
            abort=abort,
            on_update=on_update,
            details=details,
            on_output=on_output,
            filename=filename,
            argv=None if argv is None else tuple(str(a) for a in argv),
        )
        if mode == "session":
            if owner is None and scope is not None and scope.complete:
                owner = self._default_owner(scope)
            return await run_in_session(engine, call, owner=owner, scope=scope, reset=reset)
        return await engine.run_per_call(call)

    async def warm_up(self, cwd: str | os.PathLike[str] | None = None) -> None:
        """Start the fork server and the per-call spares now, so the first call is warm.

        Optional: without it they start with the first call. Does nothing when disabled or
        when the interpreter cannot be resolved (the first call reports that).
        """
        if not self.config.enabled:
            return
        try:
            interpreter = self.config.resolve_python(cwd)
            engine = self._ensure_engine()
        except (ConfigError, RefusedError):
            return
        engine.warm_up(interpreter, per_call=self.config.mode != "session")

    async def attach(self, scope: SessionScope) -> SessionOwner:
        """An explicit owner handle for ``scope`` (co-ownership; see docs/modes.md)."""
        engine = self._ensure_engine()
        return SessionOwner(self, self._registry(engine), scope)

    def snapshot(self) -> dict[str, Any]:
        """Aggregate kernel counts (no identities): the session registry plus spares."""
        engine = self._engine
        sessions = (
            engine.sessions.snapshot()
            if engine and engine.sessions
            else {
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
            }
        )
        sessions["spares"] = engine.pool.spare_count if engine else 0
        sessions["kernels_total"] = engine.live_kernels if engine else 0
        return sessions

    def run_sync(self, script: Any, **kwargs: Any) -> ExecuteCodeResult:
        """Blocking twin of :meth:`run` (``abort`` may be a ``threading.Event``)."""
        return self._call_sync(self.run(script, **kwargs))

    async def aclose(self) -> None:
        """Stop every kernel this facade started and remove its private files."""
        self._closed = True
        if self._engine is not None:
            engine, self._engine = self._engine, None
            await engine.aclose()
        await self._tool_host.aclose()  # its grep/find worker processes

    def close(self) -> None:
        """Blocking twin of :meth:`aclose`."""
        if self._portal is not None:
            portal, self._portal = self._portal, None
            try:
                portal.call(self.aclose())
            finally:
                portal.stop()
        elif self._engine is not None:
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

    def _ensure_engine(self) -> Engine:
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
        if self._engine is None:
            self._engine = Engine(self.config, self._tool_host, self.telemetry, self._staging_base)
        return self._engine

    def _registry(self, engine: Engine) -> SessionRegistry:
        if engine.sessions is None:
            engine.sessions = SessionRegistry(engine)
        return engine.sessions

    def _default_owner(self, scope: SessionScope) -> SessionOwner:
        """The facade's own owner for ``scope`` (``run(scope=...)`` without ``attach``)."""
        owner = self._owners.get(scope)
        if owner is None or owner.closed:
            engine = self._ensure_engine()
            owner = SessionOwner(self, self._registry(engine), scope)
            self._owners[scope] = owner
        return owner

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

    def _emit_stop(self, result: ExecuteCodeResult) -> None:
        d = result.details
        self.telemetry.emit(
            "execute_code.stop",
            {
                k: d.get(k, 0) or 0
                for k in (
                    "duration_ms",
                    "rpc_calls",
                    "rpc_denied",
                    "rpc_errors",
                    "rpc_bytes",
                    "text_blocks",
                    "notifications",
                )
            },
            {
                "mode": d.get("mode"),
                "outcome": _outcome(d),
                "trust": result.trust,
                "fallback_reason": d.get("fallback_reason"),
                "truncated": bool(d.get("truncated")),
            },
        )


def _clamp_timeout(requested: Any, ceiling: int) -> int:
    """A call's ``timeout_ms`` clamped to ``[MIN_TIMEOUT_MS, ceiling]`` (±inf included)."""
    if requested is None or requested >= ceiling:  # +inf lands here
        return ceiling
    if requested <= MIN_TIMEOUT_MS:  # -inf lands here
        return MIN_TIMEOUT_MS
    return int(requested)


def _working_dir(scope: SessionScope | None) -> Path | str:
    """The absolute directory the script runs in, or the refusal text saying what is wrong.

    Checked before anything starts: a missing cwd used to cost the call its whole timeout.
    """
    try:
        raw = scope.cwd if scope is not None and scope.cwd is not None else os.getcwd()
    except FileNotFoundError:
        return BAD_CWD.format(path="of the host process", problem="no longer exists", fix=_CWD_FIX)
    try:
        path = Path(os.path.abspath(os.fspath(raw)))
        st = os.stat(path)
    except (TypeError, ValueError):  # not a path at all, or a NUL byte in it
        return BAD_CWD.format(path=repr(raw), problem="is not a usable path", fix=_CWD_FIX)
    except FileNotFoundError:
        return BAD_CWD.format(path=path, problem="does not exist", fix=_CWD_FIX)
    except OSError as exc:
        problem = f"cannot be used ({exc.strerror or exc})"
        return BAD_CWD.format(path=path, problem=problem, fix=_CWD_FIX)
    if not stat.S_ISDIR(st.st_mode):
        return BAD_CWD.format(path=path, problem="is not a directory", fix=_CWD_FIX)
    if not os.access(path, os.X_OK):
        return BAD_CWD.format(path=path, problem="cannot be entered (no permission)", fix=_CWD_FIX)
    return path


def _outcome(details: dict[str, Any]) -> str:
    for flag in ("timed_out", "cancelled", "crashed", "error", "busy"):
        if details.get(flag):
            return flag
    return "ok" if details.get("exit_code") == 0 else "failed"


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
