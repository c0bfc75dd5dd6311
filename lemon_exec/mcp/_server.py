"""The MCP server object: ``execute_code`` plus the shell tools, on the SDK's ``MCPServer``.

Design notes (see docs/mcp.md for the user-facing page):

* Tools are registered with hand-written JSON input schemas. ``execute_code`` publishes
  ``ExecuteCode.schema()`` verbatim, so its arguments are handed to the facade as the client
  sent them and the facade's own validation (and its spec error texts) applies.
* ``ExecuteCode`` binds to the event loop it first runs on and cannot be reopened once closed,
  so each server *lifespan* (one stdio process, one HTTP app, one in-process client
  connection) gets a fresh facade, and closes it when the lifespan ends: no kernel outlives
  the serving period.
* A cancelled call is cancelled once and waited out (:mod:`lemon_exec.mcp._calls`); what
  the tools say about themselves is in :mod:`lemon_exec.mcp._tool_texts`.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import secrets
import threading
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.tools import Tool
from mcp_types import CallToolResult, TextContent, ToolAnnotations, ToolExecution
from mcp_types import Tool as MCPTool

from lemon_exec import __version__
from lemon_exec.config import ExecuteCodeConfig
from lemon_exec.errors import LemonExecError
from lemon_exec.facade import ExecuteCode
from lemon_exec.mcp._calls import (
    code_arguments,
    code_result,
    command_arguments,
    command_result,
    detached,
    forward_progress,
    schema_tool,
    send_quietly,
)
from lemon_exec.mcp._code_tasks import CodeTasks
from lemon_exec.mcp._shell_tasks import ShellTasks
from lemon_exec.mcp._task_source import TaskSource
from lemon_exec.mcp._tasks import TASK_TOOLS, TaskBook, TasksExtension
from lemon_exec.mcp._tool_texts import (
    EXECUTE_CODE_OUTPUT_SCHEMA,
    EXECUTE_COMMAND_SCHEMA,
    INSTRUCTIONS,
    RESTART_SESSION_DESCRIPTION,
    RESTART_SESSION_SCHEMA,
    SHELL_INSTRUCTIONS,
    command_description,
)
from lemon_exec.result import ExecuteCodeResult
from lemon_exec.scope import SessionScope
from lemon_exec.shell import ShellSession

__all__ = [
    "AGENT_ID",
    "SERVER_NAME",
    "SHELL_SERVER_NAME",
    "LemonExecServer",
    "build_server",
]

log = logging.getLogger(__name__)

#: Name of the full server (execute_code + shell tools).
SERVER_NAME = "lemon-exec"
#: Name of the shell-only server, as in the spec (``code_execution_server``'s MCP name).
SHELL_SERVER_NAME = "code-execution-tools"
#: The agent id of the session scope every execute_code call of one server runs under.
AGENT_ID = "mcp"

# Upper bound for ExecuteCode.aclose() when the server stops.
_CLOSE_TIMEOUT_S = 15.0


@dataclass
class _Lifespan:
    """State of one serving period (the MCP lifespan context)."""

    execute_code: ExecuteCode | None
    #: The MCP tasks made in this period (execute_code jobs, execute_command tasks).
    tasks: TaskBook


class LemonExecServer(MCPServer[_Lifespan]):
    """An ``MCPServer`` serving ``execute_code``, ``execute_command`` and ``restart_session``.

    Build it with :func:`build_server`. Attributes: ``config`` (the execute_code settings),
    ``shell`` (the one :class:`ShellSession` of this server), ``scope`` (the one
    :class:`SessionScope` every execute_code call runs under) and ``offers_execute_code``.
    """

    def __init__(
        self,
        config: ExecuteCodeConfig,
        *,
        only_shell: bool,
        shell: ShellSession,
        scope: SessionScope,
        facade_factory: Callable[[ExecuteCodeConfig], ExecuteCode],
    ) -> None:
        self.config = config
        self.shell = shell
        self.scope = scope
        self.offers_execute_code = not only_shell and bool(config.enabled)
        self._facade_factory = facade_factory
        self._open_lifespans = 0
        self._lifespans_lock = threading.Lock()

        tools: list[Tool] = []
        if self.offers_execute_code:
            # The same string and schema ExecuteCode.schema() gives, not a copy of them.
            schema = facade_factory(config).schema()
            tools.append(
                schema_tool(
                    self._execute_code,
                    name="execute_code",
                    description=schema["description"],
                    input_schema=schema["input_schema"],
                    output_schema=EXECUTE_CODE_OUTPUT_SCHEMA,
                    annotations=ToolAnnotations(
                        title="Execute Python code",
                        read_only_hint=False,
                        destructive_hint=True,
                        idempotent_hint=False,
                        open_world_hint=True,
                    ),
                )
            )
        tools.append(
            schema_tool(
                self._execute_command,
                name="execute_command",
                description=command_description(shell.sandbox),
                input_schema=EXECUTE_COMMAND_SCHEMA,
                annotations=ToolAnnotations(
                    title="Execute shell command",
                    read_only_hint=False,
                    destructive_hint=True,
                    idempotent_hint=False,
                    open_world_hint=True,
                ),
            )
        )
        tools.append(
            schema_tool(
                self._restart_session,
                name="restart_session",
                description=RESTART_SESSION_DESCRIPTION,
                input_schema=RESTART_SESSION_SCHEMA,
                annotations=ToolAnnotations(
                    title="Restart shell session",
                    read_only_hint=False,
                    destructive_hint=False,
                    idempotent_hint=True,
                    open_world_hint=False,
                ),
            )
        )
        tasks = TasksExtension()
        super().__init__(
            SHELL_SERVER_NAME if only_shell else SERVER_NAME,
            instructions=SHELL_INSTRUCTIONS if only_shell else INSTRUCTIONS,
            version=__version__,
            tools=tools,
            lifespan=_lifespan,
            log_level="WARNING",
            # MCP tasks (2025-11-25): a task-augmented call runs in the background.
            extensions=[tasks],
            middleware=[tasks.middleware],
        )

    @property
    def open_lifespans(self) -> int:
        """How many serving periods are open (each owns one ExecuteCode facade)."""
        return self._open_lifespans

    # -- lifespan ------------------------------------------------------------------------------

    @asynccontextmanager
    async def _serving(self) -> AsyncIterator[_Lifespan]:
        facade = self._facade_factory(self.config) if self.offers_execute_code else None
        sources: list[TaskSource] = [ShellTasks(self.shell, self.config)]
        if facade is not None:
            sources.append(CodeTasks(facade, self.scope))
        tasks = TaskBook(self.config.job_result_ttl_ms, sources)
        with self._lifespans_lock:
            self._open_lifespans += 1
        try:
            if facade is not None:
                # An agent calls soon after connecting: start the fork server and spares now.
                await facade.warm_up()
            yield _Lifespan(facade, tasks)
        finally:
            try:
                if facade is not None:
                    # Shielded: the lifespan usually ends *because* of a cancellation, and
                    # this is the step that stops the kernels (and ends the jobs of tasks).
                    with anyio.CancelScope(shield=True), anyio.move_on_after(_CLOSE_TIMEOUT_S):
                        await facade.aclose()
                with anyio.CancelScope(shield=True):
                    await tasks.aclose()  # stops the shell tasks still running
            finally:
                with self._lifespans_lock:
                    self._open_lifespans -= 1
                    last = self._open_lifespans == 0
                if last:
                    # Background jobs of the shell end with the serving period.
                    with anyio.CancelScope(shield=True):
                        await self.shell.aclose()

    async def list_tools(self) -> list[MCPTool]:
        """The tools; the task tools say so (``execution.taskSupport: optional``)."""
        return [
            tool.model_copy(update={"execution": ToolExecution(task_support="optional")})
            if tool.name in TASK_TOOLS
            else tool
            for tool in await super().list_tools()
        ]

    # -- tools -------------------------------------------------------------------------------

    async def _execute_code(self, arguments: Mapping[str, Any], ctx: Context) -> CallToolResult:
        facade = _lifespan_state(ctx).execute_code
        if facade is None:  # pragma: no cover - the tool is not listed then
            raise ToolError("execute_code is not available on this server.")
        script, timeout_ms, reset = code_arguments(arguments)

        loop = asyncio.get_running_loop()
        loop_thread = threading.get_ident()
        send, receive = anyio.create_memory_object_stream[str](math.inf)

        def on_update(message: str) -> None:
            # notify() frames arrive on the loop; the thread check keeps a future
            # off-loop caller safe too (memory streams are not thread-safe).
            if threading.get_ident() == loop_thread:
                send_quietly(send, message)
            else:
                loop.call_soon_threadsafe(send_quietly, send, message)

        result: ExecuteCodeResult | None = None
        failure: LemonExecError | None = None
        async with anyio.create_task_group() as tg:
            tg.start_soon(forward_progress, ctx, receive)
            try:
                result = await detached(
                    facade.run(
                        script,
                        timeout_ms=timeout_ms,
                        reset=reset,
                        scope=self.scope,
                        on_update=on_update,
                    )
                )
            except LemonExecError as exc:
                failure = exc  # raised below: a task group would wrap it in a group
            finally:
                # Ends the forwarder once it has sent what is queued, so every progress
                # notification goes out before the result.
                send.close()
        if failure is not None:
            # Script failures are results; this is the host failing (e.g. no private staging
            # directory): the model gets the message, the log the traceback.
            log.warning("execute_code failed", exc_info=failure)
            raise ToolError(str(failure)) from failure
        assert result is not None
        return code_result(result)

    async def _execute_command(self, arguments: Mapping[str, Any], ctx: Context) -> CallToolResult:
        command, timeout = command_arguments(arguments)
        return command_result(await detached(self.shell.aexecute_command(command, timeout)))

    async def _restart_session(self, arguments: Mapping[str, Any], ctx: Context) -> CallToolResult:
        if arguments:
            raise ToolError("restart_session takes no arguments.")
        message = await detached(self.shell.arestart_session())
        return CallToolResult(content=[TextContent(type="text", text=message)])


def build_server(
    config: ExecuteCodeConfig | None = None,
    *,
    only_shell: bool = False,
    shell: ShellSession | None = None,
    scope: SessionScope | None = None,
    facade_factory: Callable[[ExecuteCodeConfig], ExecuteCode] | None = None,
) -> LemonExecServer:
    """Build the MCP server (serve it with ``run_stdio``/``run_http`` or the SDK's own runners).

    ``config`` defaults to ``ExecuteCodeConfig.load(default_enabled=True)``: starting a server
    is the opt-in, so execute_code is on unless the environment turns it off explicitly. With
    ``config.enabled`` false, execute_code is not offered at all; the shell tools still are.
    ``only_shell`` serves just ``execute_command`` and ``restart_session`` under the name
    ``code-execution-tools`` (else the name is ``lemon-exec``).

    ``shell`` defaults to a :class:`ShellSession` starting in the current directory, one per
    server, confined to ``config``'s sandbox when it has one (``sandbox = "bwrap"``): every
    tool of a sandboxed server is confined. A given ``shell`` that is not confined while
    ``config`` asks for a sandbox is refused (``ValueError``). ``scope`` defaults to one
    :class:`SessionScope` with a random session id, agent id ``"mcp"`` and the current
    directory: every execute_code call of this server (one stdio connection) shares it,
    which is what session mode keys kernels on. ``facade_factory`` builds the ExecuteCode
    facade of each serving period (default: ``ExecuteCode``).
    """
    if config is None:
        config = ExecuteCodeConfig.load(default_enabled=True)
    if scope is None:
        scope = SessionScope(session_id=secrets.token_hex(16), agent_id=AGENT_ID, cwd=os.getcwd())
    if shell is None:
        shell = ShellSession.for_config(config)
    elif not shell.confined_like(config):
        raise ValueError(
            f"build_server: the config asks for sandbox = {config.sandbox!r} but the given "
            "shell is not confined to it; pass ShellSession.for_config(config, start_dir), "
            "or no shell"
        )
    return LemonExecServer(
        config,
        only_shell=only_shell,
        shell=shell,
        scope=scope,
        facade_factory=facade_factory if facade_factory is not None else ExecuteCode,
    )


# -- helpers ---------------------------------------------------------------------------------


def _lifespan(app: MCPServer[_Lifespan]) -> Any:
    """The MCPServer lifespan hook: one serving period of a :class:`LemonExecServer`."""
    assert isinstance(app, LemonExecServer)
    return app._serving()


def _lifespan_state(ctx: Context) -> _Lifespan:
    state = ctx.request_context.lifespan_context
    if not isinstance(state, _Lifespan):  # pragma: no cover - SDK contract
        raise ToolError("the server is not running (no lifespan state)")
    return state
