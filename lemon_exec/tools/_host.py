"""The tool host: validate a call, ask the policy and approval hooks, run the tool.

Every failure becomes a :class:`~lemon_exec.errors.ToolFailure` (or its subclass
:class:`~lemon_exec.errors.ToolDenied`), whose message the script sees as a ``ToolError``.
Hooks fail closed (:mod:`lemon_exec.tools._hooks`): a hook that raises, returns garbage or
times out denies the call.

Where a tool runs: async tools on the event loop; sync tools whose ``inline`` predicate says
so on the event loop too; ``isolated`` tools (grep, find) in killable worker processes; other
sync tools on a thread lane of their own (one per tool name), so a stuck kind of tool can only
starve itself. Every run is bounded by the tool's time limit and the call's deadline.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import logging
import os
import pathlib
import time
import weakref
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from lemon_exec.errors import ToolFailure

from ._hooks import (
    ApprovalHook,
    ApprovalRequired,
    PolicyHook,
    ask_approval,
    check_policy,
    needs_approval,
)
from ._lanes import DEFAULT_LANE_THREADS, ThreadLane
from ._mcp_source import ListingFailure, McpSource
from ._mcp_tools import tool_specs
from ._paths import resolve
from ._registry import ToolRegistry, _not_connected
from ._types import ToolCall, ToolSpec
from ._validate import validate_params
from ._workers import DEFAULT_MAX_WORKERS, DeadlineExceeded, WorkerPool

__all__ = ["ToolHost"]

logger = logging.getLogger(__name__)

#: Seconds an async or threaded tool may run past its deadline before the host stops waiting:
#: room for the tool to report the timeout in its own words (webfetch does).
DEADLINE_GRACE_S = 0.5


class ToolHost:
    """Runs tool calls for scripts, guarded by an optional policy hook and approval hook.

    Args:
        registry: the tools this host offers.
        policy: checked for every valid call; a denial raises :class:`ToolDenied`.
        approval: asked for calls that need approval (see ``approval_required``).
        approval_required: which calls need approval. ``None`` means: every call when an
            ``approval`` hook is given, none otherwise. Giving it without ``approval`` is a
            configuration error (``ValueError``).
        approval_timeout_s: how long to wait for the approval hook (``None``: forever).
        time_limits: per-tool time limits in seconds, overriding ``ToolSpec.time_limit_s``
            (``None`` removes a limit). Defaults: webfetch 20 s, grep and find 60 s.
        max_workers: worker processes for ``isolated`` tools (grep, find), started lazily.
        lane_threads: threads per tool in the thread lanes of the other sync tools.

    Close the host with :meth:`close` (or ``async with``) to stop its worker processes; the
    ``ExecuteCode`` facade closes its own host.
    """

    def __init__(
        self,
        registry: ToolRegistry,
        *,
        policy: PolicyHook | None = None,
        approval: ApprovalHook | None = None,
        approval_required: ApprovalRequired | None = None,
        approval_timeout_s: float | None = 300.0,
        time_limits: Mapping[str, float | None] | None = None,
        max_workers: int = DEFAULT_MAX_WORKERS,
        lane_threads: int = DEFAULT_LANE_THREADS,
    ) -> None:
        if approval_required is not None and approval is None:
            raise ValueError("approval_required was given without an approval hook")
        if approval_timeout_s is not None and approval_timeout_s <= 0:
            raise ValueError("approval_timeout_s must be positive (or None for no timeout)")
        for name, limit in (time_limits or {}).items():
            if limit is not None and not limit > 0:
                raise ValueError(f"time_limits[{name!r}] must be positive (or None), got {limit}")
        if lane_threads < 1:
            raise ValueError("lane_threads must be >= 1")
        self.registry = registry
        self._policy = policy
        self._approval = approval
        self._approval_required = approval_required
        self._approval_timeout_s = approval_timeout_s
        self._time_limits = dict(time_limits or {})
        # Withdrawn hook tasks that ignored cancellation, and abandoned tool tasks; kept
        # referenced until they finish so they are neither garbage-collected mid-flight nor
        # reported as "never retrieved".
        self._orphans: set[asyncio.Future[Any]] = set()
        self._workers = WorkerPool(max_workers)
        self._lane_threads = lane_threads
        self._lanes: dict[str, ThreadLane] = {}
        self._closed = False
        #: One connection per MCP server (registry.add_mcp_server), made on first need, and
        #: the connection generation whose tool listing the registry holds.
        self._mcp: dict[str, McpSource] = {}
        self._mcp_listed: dict[str, int] = {}
        # A host dropped without close() still kills its workers (also at interpreter exit).
        self._finalizer = weakref.finalize(self, _shutdown, self._workers, self._lanes)

    # -- lifecycle ---------------------------------------------------------------------------

    def close(self) -> None:
        """Kill the worker processes and let the lane threads go. Idempotent.

        Later calls fail with ``ToolError("<tool> failed: the tool host is closed")``.
        """
        self._closed = True
        for source in self._mcp.values():
            source.close_nowait()
        self._finalizer()

    async def aclose(self) -> None:
        """:meth:`close`, awaitable: also ends the MCP connections (and stdio servers)."""
        self._closed = True
        for source in list(self._mcp.values()):
            await source.aclose()
        self.close()

    async def prepare_tools(self) -> None:
        """List the tools of each MCP server not listed yet (or restarted since), so the
        registry names them before a run. A server that cannot be reached is logged and
        keeps the tools it had."""
        for config in self.registry.mcp_servers():
            source = self._mcp.get(config.name)
            if source is None:
                source = self._mcp[config.name] = McpSource(config)
            if self._closed or self._mcp_listed.get(config.name) == source.generation:
                continue
            try:
                tools = await source.list_tools()
            except ListingFailure as exc:  # connected but not listing: not waited on again
                logger.warning("MCP server %s: %s", config.name, exc)
                self._mcp_listed[config.name] = source.generation
                continue
            except Exception as exc:
                logger.warning("MCP server %s: listing tools failed: %s", config.name, exc)
                continue
            pairs, notes = tool_specs(config.name, tools, _not_connected)
            self.registry.set_server_tools(config.name, [spec for spec, _info in pairs], notes)
            self._mcp_listed[config.name] = source.generation

    async def __aenter__(self) -> ToolHost:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def worker_pids(self) -> set[int]:
        """PIDs of this host's live worker processes (for monitoring and tests)."""
        return self._workers.pids()

    def set_time_limit(self, name: str, seconds: float | None) -> None:
        """Change tool ``name``'s time limit for later calls (``None``: no limit)."""
        if seconds is not None and not seconds > 0:
            raise ValueError(f"time limit for {name!r} must be positive (or None), got {seconds}")
        self._time_limits[name] = seconds

    def time_limit(self, name: str) -> float | None:
        """The time limit in seconds that applies to tool ``name`` (``None``: none)."""
        if name in self._time_limits:
            return self._time_limits[name]
        spec = self.registry.get(name)
        return None if spec is None else spec.time_limit_s

    def names(self) -> list[str]:
        """The tools this host offers, in registration order."""
        return self.registry.names()

    def describe(self, name: str) -> dict[str, Any]:
        """A JSON-friendly description of tool ``name``, for the schema/helper generator.

        Keys: ``name``, ``description``, ``parameters``, ``required``, ``defaults``,
        ``types`` (type names per parameter) and ``signature`` (e.g.
        ``"read(path, offset=None, limit=None)"``). Raises ``KeyError`` for an unknown name.
        """
        spec = self.registry.get(name)
        if spec is None:
            raise KeyError(f"unknown tool: {name}")
        return {
            "name": spec.name,
            "description": spec.description,
            "parameters": list(spec.parameters),
            "required": list(spec.required),
            "defaults": dict(spec.defaults),
            "types": {k: _type_label(v) for k, v in spec.param_types.items()},
            "signature": _signature(spec),
        }

    async def invoke(self, call: ToolCall) -> str:
        """Run one call and return the tool's text.

        Raises :class:`ToolFailure` (or :class:`ToolDenied`) with the message for the script.
        If the awaiting task is cancelled while approval is pending, the approval is withdrawn:
        the hook's task is cancelled, ``CancelledError`` propagates, and the tool never runs.
        """
        spec = self.registry.get(call.tool)
        if spec is None:
            raise ToolFailure(f"unknown tool: {call.tool}")
        if self._closed:
            raise ToolFailure(f"{call.tool} failed: the tool host is closed")
        params = validate_params(spec, call.params)
        if spec.mcp is not None:  # hooks see (server, tool, params) as the server names them
            call = dataclasses.replace(call, server=spec.mcp.server, server_tool=spec.mcp.tool)
        raw_path = params.get(spec.path_param) if spec.path_param else None
        if isinstance(raw_path, str):  # hooks see where a link leads, the tool opens that
            resolved = os.path.realpath(resolve(raw_path, call.cwd))
            call = dataclasses.replace(call, resolved_path=pathlib.Path(resolved))
        await check_policy(self._policy, call)
        if self._approval is not None and needs_approval(self._approval_required, call):
            await ask_approval(
                self._approval, call, timeout_s=self._approval_timeout_s, withdraw=self._withdraw
            )
        return await self._run(spec, params, call)

    # -- withdrawn work ----------------------------------------------------------------------

    def _withdraw(self, task: asyncio.Future[Any]) -> None:
        """Cancel a pending approval or an overrun tool; whatever it answers later is dropped."""
        task.cancel()
        if task.done():
            self._forget_orphan(task)  # it answered just too late
        else:
            self._orphans.add(task)
            task.add_done_callback(self._forget_orphan)

    def _forget_orphan(self, task: asyncio.Future[Any]) -> None:
        self._orphans.discard(task)
        if not task.cancelled():
            task.exception()  # mark retrieved; the answer itself is deliberately dropped

    # -- the tool ----------------------------------------------------------------------------

    def run_inline(self, call: ToolCall) -> str | None:
        """Run ``call`` at once when nothing in it can wait; ``None``: use :meth:`invoke`.

        That is: no policy or approval hook (either may wait), a tool that is neither a
        coroutine nor an MCP server's, and whose inline predicate holds (``read`` of a small
        regular file, say). The result and the errors are exactly :meth:`invoke`'s; what is
        saved is the event loop's task, timer and slot for the most frequent helper calls.
        """
        if self._policy is not None or self._approval is not None or self._closed:
            return None
        spec = self.registry.get(call.tool)
        if spec is None or spec.inline is None or spec.mcp is not None:
            return None
        if inspect.iscoroutinefunction(spec.func):
            return None
        params = validate_params(spec, call.params)
        if not _runs_inline(spec, params, call):
            return None
        call = self._with_deadline(spec, call, time.monotonic())
        try:
            result = spec.func(params, call)
        except ToolFailure:
            raise
        except Exception as e:
            raise _tool_raised(spec, e) from e
        return _checked_result(spec, result)

    def _with_deadline(self, spec: ToolSpec, call: ToolCall, started: float) -> ToolCall:
        """``call`` with its deadline lowered to the tool's time limit, if that is sooner."""
        limit = self.time_limit(spec.name)
        deadline = call.deadline
        if limit is not None and (deadline is None or started + limit < deadline):
            return dataclasses.replace(call, deadline=started + limit)
        return call

    async def _run(self, spec: ToolSpec, params: dict[str, Any], call: ToolCall) -> str:
        started = time.monotonic()
        call = self._with_deadline(spec, call, started)
        deadline = call.deadline
        try:
            result = await self._execute(spec, params, call)
        except DeadlineExceeded:
            budget = (deadline or started) - started
            raise ToolFailure(
                f"{spec.name} exceeded its time limit ({_seconds(budget)} s) and was stopped; "
                "narrow the request (a smaller path, a more specific pattern) and try again"
            ) from None
        except ToolFailure:
            raise
        except Exception as e:
            raise _tool_raised(spec, e) from e
        return _checked_result(spec, result)

    async def _execute(self, spec: ToolSpec, params: dict[str, Any], call: ToolCall) -> Any:
        if spec.mcp is not None:
            source = self._mcp.get(spec.mcp.server)
            if source is None:
                raise ToolFailure(f"{spec.name} failed: MCP server {spec.mcp.server!r} is gone")
            return await self._bounded(source.call(spec.mcp, params, call), call.deadline)
        if inspect.iscoroutinefunction(spec.func):
            return await self._bounded(spec.func(params, call), call.deadline)
        if _runs_inline(spec, params, call):
            return spec.func(params, call)
        if spec.isolated:
            # Regex and walk work can hold the GIL: a process, killed on overrun or cancel.
            return await self._workers.run(func_ref(spec.func), params, call, call.deadline)
        # Sync tools do blocking I/O; a thread keeps the event loop (and every other running
        # script) responsive, and a lane per tool keeps one stuck kind from starving the rest.
        result = await self._bounded(
            self._lane(spec.name).run(spec.func, params, call), call.deadline
        )
        if inspect.isawaitable(result):
            result = await self._bounded(result, call.deadline)
        return result

    async def _bounded(self, work: Awaitable[Any], deadline: float | None) -> Any:
        """Await ``work`` until ``deadline`` plus a grace period; then cancel it and give up."""
        if deadline is None:
            return await work
        task = asyncio.ensure_future(work)
        try:
            done, _ = await asyncio.wait(
                {task}, timeout=max(0.0, deadline + DEADLINE_GRACE_S - time.monotonic())
            )
        except asyncio.CancelledError:
            self._withdraw(task)
            raise
        if not done:
            self._withdraw(task)
            raise DeadlineExceeded
        return task.result()

    def _lane(self, name: str) -> ThreadLane:
        lane = self._lanes.get(name)
        if lane is None:
            lane = self._lanes[name] = ThreadLane(f"lemon-tool-{name}", self._lane_threads)
        return lane


def func_ref(func: Callable[..., Any]) -> str:
    """``"module:qualname"`` of a module-level function, as a worker process imports it."""
    return f"{func.__module__}:{func.__qualname__}"


def _shutdown(workers: WorkerPool, lanes: dict[str, ThreadLane]) -> None:
    workers.close()
    for lane in list(lanes.values()):
        lane.close()


def _seconds(value: float) -> str:
    return f"{round(value, 1):g}"


def _tool_raised(spec: ToolSpec, exc: Exception) -> ToolFailure:
    """The ToolFailure the script sees for a tool that raised something else (logged)."""
    logger.warning("tool %s raised", spec.name, exc_info=exc)
    return ToolFailure(f"{spec.name} failed: {type(exc).__name__}: {exc}")


def _checked_result(spec: ToolSpec, result: object) -> str:
    if not isinstance(result, str):
        raise ToolFailure(f"{spec.name} failed: returned {type(result).__name__} instead of str")
    return result


def _runs_inline(spec: ToolSpec, params: dict[str, Any], call: ToolCall) -> bool:
    if spec.inline is None:
        return False
    try:
        return bool(spec.inline(params, call))
    except Exception:  # the predicate is an optimisation; when in doubt, use a thread
        return False


def _type_label(expected: type | tuple[type, ...]) -> str:
    types = expected if isinstance(expected, tuple) else (expected,)
    return " | ".join(t.__name__ for t in types)


def _signature(spec: ToolSpec) -> str:
    parts = []
    for p in spec.parameters:
        if p in spec.required:
            parts.append(p)
        else:
            parts.append(f"{p}={spec.defaults.get(p)!r}")
    return f"{spec.name}({', '.join(parts)})"
