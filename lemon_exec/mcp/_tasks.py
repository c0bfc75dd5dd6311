"""MCP tasks (protocol revision 2025-11-25): a tool call that returns at once.

A ``tools/call`` that carries ``task`` is handed to the :class:`TaskSource` of its tool, which
starts the work in the background and gives a :class:`TaskJob`; the answer is
``CreateTaskResult`` with the job's id as the task id. Two sources: execute_code's jobs
(:mod:`~lemon_exec.mcp._code_tasks`, :meth:`ExecuteCode.start`) and execute_command's shell
tasks (:mod:`~lemon_exec.mcp._shell_tasks`). ``tasks/get``, ``tasks/result``, ``tasks/cancel``
and ``tasks/list`` read and stop the job, whatever its source; a task's ``notify()`` messages
go on as ``notifications/progress`` under the call's progress token, and its end is announced
with ``notifications/tasks/status``. A call without ``task`` runs as it always did (blocking).

Tasks exist only in the 2025-11-25 revision: on another revision the methods are unknown and
a ``task`` field is ignored (the call blocks). The SDK serves the methods through its
extension seam (:class:`TasksExtension`); its :meth:`~TasksExtension.middleware` takes the
task-augmented calls and puts the ``tasks`` capability into the ``initialize`` result, which
the SDK does not derive by itself.

A task belongs to the client that made it: its *principal* is the bearer token's digest over
HTTP (``_auth`` stamps it on the request), and the one client over stdio. Another principal
gets "no such task", as for an unknown id.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.extension import Extension, MethodBinding
from mcp.server.session import ServerSession
from mcp.shared.exceptions import MCPError
from mcp_types import (
    INVALID_PARAMS,
    CallToolRequestParams,
    CancelTaskRequestParams,
    CancelTaskResult,
    CreateTaskResult,
    GetTaskPayloadRequestParams,
    GetTaskRequestParams,
    GetTaskResult,
    ListTasksResult,
    PaginatedRequestParams,
    ProgressNotification,
    ProgressNotificationParams,
    ProgressToken,
    Task,
    TaskStatus,
    TaskStatusNotification,
    TaskStatusNotificationParams,
)
from pydantic import ValidationError

from lemon_exec.errors import JobExpiredError
from lemon_exec.mcp._auth import PRINCIPAL_KEY
from lemon_exec.mcp._calls import send_quietly
from lemon_exec.mcp._task_source import TaskJob, TaskSource

__all__ = [
    "PRINCIPAL_KEY",
    "RELATED_TASK",
    "TASKS_VERSION",
    "TaskBook",
    "TaskJob",
    "TaskSource",
    "TasksExtension",
]

log = logging.getLogger(__name__)

#: The protocol revision that defines tasks.
TASKS_VERSION = "2025-11-25"
#: ``_meta`` key tying a message to its task.
RELATED_TASK = "io.modelcontextprotocol/related-task"
#: The principal of a client that is not authenticated per request (stdio, in-process).
LOCAL_PRINCIPAL = "local"
#: The principal of an HTTP client of a server run with ``--no-auth``.
ANONYMOUS = "anonymous"
#: The tools that accept a task (``Tool.execution.taskSupport: optional``).
TASK_TOOLS = frozenset({"execute_code", "execute_command"})
#: Suggested ``tasks/get`` interval.
POLL_INTERVAL_MS = 1000
#: Tasks per ``tasks/list`` page.
PAGE_SIZE = 50
#: The ``tasks`` capability: list, cancel, and task-augmented ``tools/call``.
CAPABILITY: dict[str, Any] = {"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}}

_STATUS: dict[str, TaskStatus] = {
    "queued": "working",
    "running": "working",
    "completed": "completed",
    "cancelled": "cancelled",
}
_IDENTIFIER = "dev.lemon-exec/tasks"


class Serving(Protocol):
    """What a serving period (the lifespan state) offers the tasks."""

    @property
    def tasks(self) -> TaskBook: ...


@dataclass
class TaskRecord:
    """One MCP task: its job, whose it is, where its notifications go."""

    job: TaskJob
    principal: str
    session: ServerSession
    progress_token: ProgressToken | None
    created_at: str
    updated_at: str
    watcher: asyncio.Task[None] | None = field(default=None, repr=False)

    @property
    def status(self) -> TaskStatus:
        return _STATUS.get(self.job.state, "failed")

    def task(self, ttl_ms: int) -> dict[str, Any]:
        """The ``Task`` fields (for ``GetTaskResult``, ``CancelTaskResult``, notifications)."""
        return {
            "task_id": self.job.id,
            "status": self.status,
            "status_message": self._message(),
            "created_at": self.created_at,
            "last_updated_at": self.updated_at,
            "ttl": ttl_ms,
            "poll_interval": POLL_INTERVAL_MS,
        }

    def _message(self) -> str:
        headline = self.job.headline()  # '' while queued or running (or once expired)
        return f"{self.job.state}: {headline}" if headline else self.job.state


class TaskBook:
    """The MCP tasks of one serving period, by task id, and the sources they come from."""

    def __init__(self, ttl_ms: int, sources: Sequence[TaskSource]) -> None:
        #: A finished job's result is kept this long after it ended (``job_result_ttl_ms``).
        self.ttl_ms = ttl_ms
        self._sources = {tool: source for source in sources for tool in source.tools}
        self._records: dict[str, tuple[TaskSource, TaskRecord]] = {}

    def source_for(self, tool: str) -> TaskSource | None:
        """Where a task of ``tool`` comes from; None when the tool runs no tasks here."""
        return self._sources.get(tool)

    def add(self, source: TaskSource, record: TaskRecord) -> None:
        self._records[record.job.id] = (source, record)

    def find(self, task_id: str, principal: str) -> TaskRecord:
        """The task ``task_id`` of ``principal``; ``MCPError`` (invalid params) otherwise."""
        source, record = self._records.get(task_id, (None, None))
        if source is None or record is None or record.principal != principal:
            raise MCPError(code=INVALID_PARAMS, message=f"no task {task_id!r}")
        try:
            source.get(task_id)  # expires what is due (job_result_ttl_ms, max_finished_jobs)
        except (JobExpiredError, KeyError) as exc:
            del self._records[task_id]
            raise MCPError(code=INVALID_PARAMS, message=str(exc).strip("'\"")) from None
        return record

    def owned(self, principal: str) -> list[TaskRecord]:
        """The tasks of ``principal`` that have not expired, oldest first."""
        kept = {job.id for source in set(self._sources.values()) for job in source.list()}
        for task_id in [t for t in self._records if t not in kept]:
            del self._records[task_id]
        return [r for _, r in self._records.values() if r.principal == principal]

    async def aclose(self) -> None:
        """Stop what still runs, then the notification watchers (the serving period is over)."""
        for source in set(self._sources.values()):
            await source.aclose()
        watchers = [r.watcher for _, r in self._records.values() if r.watcher is not None]
        for watcher in watchers:
            watcher.cancel()
        await asyncio.gather(*watchers, return_exceptions=True)


class TasksExtension(Extension):
    """Serves the ``tasks/*`` methods and takes task-augmented calls of the task tools."""

    identifier = _IDENTIFIER

    def methods(self) -> Sequence[MethodBinding]:
        versions = frozenset({TASKS_VERSION})
        return (
            MethodBinding("tasks/get", GetTaskRequestParams, self._get, versions),
            MethodBinding("tasks/result", GetTaskPayloadRequestParams, self._result, versions),
            MethodBinding("tasks/cancel", CancelTaskRequestParams, self._cancel, versions),
            MethodBinding("tasks/list", PaginatedRequestParams, self._list, versions),
        )

    async def middleware(
        self, ctx: ServerRequestContext[Any, Any], call_next: CallNext
    ) -> HandlerResult:
        """Server middleware: takes task-augmented tool calls, declares ``tasks``.

        A middleware rather than the extension's ``tools/call`` interceptor because the SDK
        checks a ``tools/call`` handler's result against ``CallToolResult``, which a
        ``CreateTaskResult`` is not; a middleware's own result goes out as it is.
        """
        if ctx.method == "tools/call":
            params = _task_call(ctx)
            if params is not None:
                return await self._start(ctx, params)
            return await call_next(ctx)
        result = await call_next(ctx)
        if ctx.method in ("initialize", "server/discover") and isinstance(result, dict):
            _declare(result)
        return result

    async def _start(
        self, ctx: ServerRequestContext[Any, Any], params: CallToolRequestParams
    ) -> CreateTaskResult:
        """Start the call as a task of its tool's source and answer with the task."""
        book = _serving(ctx).tasks
        source = book.source_for(params.name)
        assert source is not None  # _task_call checked
        send, receive = anyio.create_memory_object_stream[str](math.inf)
        job = await source.start(
            params.arguments or {}, lambda message: send_quietly(send, message)
        )
        now = _now()
        meta = params.meta or {}
        record = TaskRecord(
            job,
            principal_of(ctx),
            ctx.session,
            meta.get("progress_token"),
            created_at=now,
            updated_at=now,
        )
        book.add(source, record)
        record.watcher = asyncio.get_running_loop().create_task(
            _watch(record, send, receive, book.ttl_ms), name=f"lemon-exec-task-{job.id}"
        )
        return CreateTaskResult(task=Task(**record.task(book.ttl_ms)))

    async def _get(
        self, ctx: ServerRequestContext[Any, Any], params: GetTaskRequestParams
    ) -> GetTaskResult:
        book, record = _find(ctx, params.task_id)
        return GetTaskResult(**record.task(book.ttl_ms))

    async def _result(
        self, ctx: ServerRequestContext[Any, Any], params: GetTaskPayloadRequestParams
    ) -> HandlerResult:
        _, record = _find(ctx, params.task_id)
        try:
            payload = await record.job.payload()  # blocks until the task ends, as the spec asks
        except JobExpiredError as exc:
            raise MCPError(code=INVALID_PARAMS, message=str(exc)) from None
        return payload.model_copy(update={"meta": {RELATED_TASK: {"taskId": record.job.id}}})

    async def _cancel(
        self, ctx: ServerRequestContext[Any, Any], params: CancelTaskRequestParams
    ) -> CancelTaskResult:
        book, record = _find(ctx, params.task_id)
        if record.job.done:
            raise MCPError(
                code=INVALID_PARAMS,
                message=f"task {params.task_id!r} has already ended ({record.status}); "
                "only a working task can be cancelled",
            )
        await record.job.cancel()  # a queued one leaves its queue, a running one is stopped
        record.updated_at = _now()
        return CancelTaskResult(**record.task(book.ttl_ms))

    async def _list(
        self, ctx: ServerRequestContext[Any, Any], params: PaginatedRequestParams
    ) -> ListTasksResult:
        book = _serving(ctx).tasks
        records = book.owned(principal_of(ctx))
        try:
            start = int(params.cursor or 0)
        except ValueError:
            raise MCPError(code=INVALID_PARAMS, message="invalid cursor") from None
        page = records[start : start + PAGE_SIZE]
        after = start + PAGE_SIZE
        return ListTasksResult(
            tasks=[Task(**r.task(book.ttl_ms)) for r in page],
            next_cursor=str(after) if after < len(records) else None,
        )


def _task_call(ctx: ServerRequestContext[Any, Any]) -> CallToolRequestParams | None:
    """The params of a task-augmented call this server runs as a task, else None.

    Anything else (no ``task``, another tool or revision, malformed params, a connection not
    yet initialized) goes down the ordinary path, which answers it as it always did.
    """
    if ctx.protocol_version != TASKS_VERSION or ctx.session.client_params is None:
        return None
    try:
        params = CallToolRequestParams.model_validate(ctx.params or {}, by_name=False)
    except ValidationError:
        return None
    if params.task is None or _serving(ctx).tasks.source_for(params.name) is None:
        return None
    return params


def _declare(result: dict[str, Any]) -> None:
    """The ``tasks`` capability in a 2025-11-25 ``initialize`` result.

    The extension seam advertises under ``capabilities.extensions``; tasks are a core
    capability of that revision instead, so the extension entry is taken out again.
    """
    capabilities = result.get("capabilities")
    if not isinstance(capabilities, dict):
        return
    extensions = capabilities.get("extensions")
    if isinstance(extensions, dict):
        extensions.pop(_IDENTIFIER, None)
        if not extensions:
            del capabilities["extensions"]
    if result.get("protocolVersion") == TASKS_VERSION:
        capabilities["tasks"] = CAPABILITY


def principal_of(ctx: ServerRequestContext[Any, Any]) -> str:
    """Who makes this request: the authenticated principal over HTTP, else the one local client."""
    request = ctx.request
    if request is None:
        return LOCAL_PRINCIPAL
    scope = getattr(request, "scope", None) or {}
    principal = scope.get(PRINCIPAL_KEY)
    return principal if isinstance(principal, str) else ANONYMOUS


# -- helpers ---------------------------------------------------------------------------------


async def _watch(
    record: TaskRecord, send: Any, receive: MemoryObjectReceiveStream[str], ttl_ms: int
) -> None:
    """Forward the task's notify() messages as progress, then announce how it ended."""
    forward = asyncio.ensure_future(_forward_progress(record, receive))
    try:
        await record.job.wait()
    finally:
        send.close()  # the forwarder ends once it has sent what is queued
    await forward
    record.updated_at = _now()
    notification = TaskStatusNotification(
        params=TaskStatusNotificationParams(
            **record.task(ttl_ms), _meta={RELATED_TASK: {"taskId": record.job.id}}
        )
    )
    await _notify(record.session, notification)


async def _forward_progress(record: TaskRecord, receive: MemoryObjectReceiveStream[str]) -> None:
    count = 0
    async with receive:
        async for message in receive:
            count += 1
            if record.progress_token is None:
                continue  # the client asked for no progress
            notification = ProgressNotification(
                params=ProgressNotificationParams(
                    progress_token=record.progress_token,
                    progress=count,
                    message=message,
                    _meta={RELATED_TASK: {"taskId": record.job.id}},
                )
            )
            await _notify(record.session, notification)


async def _notify(session: ServerSession, notification: Any) -> None:
    # The request that made the task has ended: the connection's own channel carries these
    # (over HTTP, the client's GET stream). A client that is gone must not fail the task.
    try:
        await session.send_notification(notification)
    except Exception:
        log.debug("task notification not sent", exc_info=True)


def _serving(ctx: ServerRequestContext[Any, Any]) -> Serving:
    serving: Serving = ctx.lifespan_context
    return serving


def _find(ctx: ServerRequestContext[Any, Any], task_id: str) -> tuple[TaskBook, TaskRecord]:
    book = _serving(ctx).tasks
    return book, book.find(task_id, principal_of(ctx))


def _now() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")
