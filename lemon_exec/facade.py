"""ExecuteCode: the public facade of the execute_code tool.

Async-first (``await run(...)``) with a synchronous twin (``run_sync``) that drives the same
runner on a private event-loop thread. One facade lives on one event loop.

The facade owns the public signatures, the sync twin and the public handles: it hands every
call, as given, to its runner (:class:`lemon_exec.host.run.runner.Runner`), the one way a call
runs, which its session owners (:meth:`ExecuteCode.attach`) call too. The runner checks the
arguments, binds to the event loop, makes the host on first use and routes the call per-call
or into its session. :attr:`ExecuteCode.diagnostics` shows what the host runs, read-only.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

from lemon_exec.config import ExecuteCodeConfig
from lemon_exec.host.run.calls import (  # noqa: F401  (the refusal texts, re-exported)
    ALREADY_ABORTED,
    BAD_CWD,
    BAD_RESET,
    BAD_TIMEOUT,
    DISABLED,
    MISSING_SCRIPT,
    NAN_TIMEOUT,
    CallArgs,
)
from lemon_exec.host.run.diagnostics import Diagnostics
from lemon_exec.host.run.runner import Runner
from lemon_exec.host.sessions.owners import detach_when_collected
from lemon_exec.jobs import Job
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

    :attr:`diagnostics` is a read-only view of what the facade runs (for tests and
    operators): whether its host started, its private staging root and directories, live
    kernels (pid, mode, phase, connection file), fork-server templates, per-call spares and
    admission slots, the session counts of :meth:`snapshot`, and the tool worker pids.
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
        tool_host = ToolHost(
            tools if tools is not None else default_registry(),
            policy=policy,
            approval=approval,
            approval_required=approval_required,
        )
        base = Path(staging_base) if staging_base is not None else None
        #: The one way a call runs: :meth:`run` and every owner from :meth:`attach` use it.
        self._runner = Runner(self.config, tool_host, self.telemetry, base)
        self._diagnostics = Diagnostics(self._runner)
        self._portal: _LoopThread | None = None

    # -- public API -------------------------------------------------------------------------------

    def schema(self) -> dict[str, Any]:
        """The tool's name, generated description and JSON input schema."""
        extras = toolset(self._runner.tool_host.registry, self.config.tools)
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
        return await self._runner.run(args)

    async def start(
        self,
        script: Any,
        *,
        timeout_ms: Any = None,
        reset: Any = False,
        scope: SessionScope | None = None,
        on_update: Callable[[str], None] | None = None,
        on_output: Callable[[str], None] | None = None,
        source: ScriptSource | None = None,
    ) -> Job:
        """Start one script as a background :class:`~lemon_exec.jobs.Job` and return at once.

        The arguments are :meth:`run`'s; the job runs as a call does (the same queues, limits
        and result), with its own deadline: ``max_job_ms`` (default 1 h), which
        ``timeout_ms`` may lower. Its ``cancel()`` is its abort. See docs/jobs.md.
        """
        args = CallArgs(
            script,
            timeout_ms=timeout_ms,
            reset=reset,
            scope=scope,
            on_update=on_update,
            on_output=on_output,
            source=source or ScriptSource(),
        )
        return Job(self._runner.start(args), self._call_sync)

    def start_sync(self, script: Any, **kwargs: Any) -> Job:
        """Blocking twin of :meth:`start` (it returns once the job is started)."""
        return self._call_sync(self.start(script, **kwargs))

    def jobs(self) -> list[Job]:
        """The jobs started here that have not expired (live and finished), oldest first."""
        return [Job(run, self._call_sync) for run in self._runner.jobs.list()]

    def job(self, job_id: str) -> Job:
        """The job ``job_id``: ``JobExpiredError`` once expired, ``KeyError`` if unknown."""
        return Job(self._runner.jobs.get(job_id), self._call_sync)

    async def warm_up(self, cwd: str | os.PathLike[str] | None = None) -> None:
        """Start the fork server and the per-call spares now, so the first call is warm.

        Optional: without it they start with the first call. Does nothing when disabled or
        when the interpreter cannot be resolved (the first call reports that).
        """
        await self._runner.warm_up(cwd)

    async def attach(self, scope: SessionScope) -> SessionOwner:
        """An explicit owner handle for ``scope`` (co-ownership; see docs/modes.md).

        The owner runs through the same runner as :meth:`run`; dropping the handle (garbage
        collection) detaches it as :meth:`SessionOwner.close` does.
        """
        owner = SessionOwner(self._runner, scope, self._runner.attach(), self._call_sync)
        detach_when_collected(owner, self._runner, owner.owner_id)
        return owner

    def snapshot(self) -> dict[str, Any]:
        """Aggregate kernel counts (no identities): the session registry plus spares."""
        return self._runner.snapshot()

    @property
    def diagnostics(self) -> Diagnostics:
        """A read-only, live view of what this facade runs (see the class docstring)."""
        return self._diagnostics

    def run_sync(self, script: Any, **kwargs: Any) -> ExecuteCodeResult:
        """Blocking twin of :meth:`run` (``abort`` may be a ``threading.Event``)."""
        return self._call_sync(self.run(script, **kwargs))

    async def aclose(self) -> None:
        """Stop every kernel this facade started and remove its private files."""
        await self._runner.aclose()

    def close(self) -> None:
        """Blocking twin of :meth:`aclose`."""
        if self._portal is not None:
            portal, self._portal = self._portal, None
            try:
                portal.call(self.aclose())
            finally:
                portal.stop()
        elif self._runner.host is not None:
            loop = self._runner.loop
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

    def _call_sync(self, coro: Coroutine[Any, Any, T]) -> T:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:
            coro.close()
            raise RuntimeError("run_sync() called from a running event loop; use await run()")
        if self._portal is None:
            if self._runner.loop is not None:
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
