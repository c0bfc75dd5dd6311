"""The MCP server object: ``execute_code`` plus the shell tools, on the SDK's ``MCPServer``.

Design notes (see docs/mcp.md for the user-facing page):

* Tools are registered with hand-written JSON input schemas. ``execute_code`` publishes
  ``ExecuteCode.schema()`` verbatim, so its arguments are handed to the facade as the client
  sent them and the facade's own validation (and its spec error texts) applies.
* ``ExecuteCode`` binds to the event loop it first runs on and cannot be reopened once closed,
  so each server *lifespan* (one stdio process, one HTTP app, one in-process client
  connection) gets a fresh facade, and closes it when the lifespan ends: no kernel outlives
  the serving period.
* SDK cancellation is anyio's level-triggered cancellation: every await inside a cancelled
  scope is cancelled again. The facade and the shell clean up after an ordinary, one-shot
  asyncio cancellation, so the work runs in a task of its own; a client's cancel is passed
  on as a single ``Task.cancel()`` and then waited out under a shield (see ``_detached``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import secrets
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError, UnexpectedToolError
from mcp.server.mcpserver.tools import Tool
from mcp.shared.exceptions import MCPError
from mcp_types import CallToolResult, TextContent, ToolAnnotations

from lemon_exec import __version__
from lemon_exec.config import ExecuteCodeConfig
from lemon_exec.errors import LemonExecError
from lemon_exec.facade import ExecuteCode
from lemon_exec.host.kernels import sandbox as sandboxes
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

T = TypeVar("T")

#: Name of the full server (execute_code + shell tools).
SERVER_NAME = "lemon-exec"
#: Name of the shell-only server, as in the spec (``code_execution_server``'s MCP name).
SHELL_SERVER_NAME = "code-execution-tools"
#: The agent id of the session scope every execute_code call of one server runs under.
AGENT_ID = "mcp"

# How long a cancelled call waits for the script's or command's teardown. The facade escalates
# INT -> TERM -> KILL with 1 s graces and the shell kills at once, so this is ample.
_CANCEL_GRACE_S = 15.0
# Upper bound for ExecuteCode.aclose() when the server stops.
_CLOSE_TIMEOUT_S = 15.0

_EXECUTE_COMMAND_DESCRIPTION = (
    "Run a shell command with /bin/bash -c in this server's shell session and return JSON: "
    "stdout, stderr, exit_code (int) and timed_out (bool).\n"
    "\n"
    "- Pipes, redirects and chaining (&&, ||, ;) work.\n"
    "- Each call runs in a fresh subprocess started in the session's working directory; the "
    "directory the command finished in carries over to the next call (so `cd` persists). "
    "Nothing else carries over: variables set with `export` or `source` are gone on the next "
    "call, so set them in the same command. Files on disk persist.\n"
    "- There is no stdin and no terminal: interactive commands are not supported; pass flags "
    "such as -y or --yes.\n"
    "- timeout is in seconds. Its default and maximum is DPTTOOLS_SANDBOX_TIMEOUT (default "
    "30); a larger value is lowered to it. On timeout the whole process tree is killed, and "
    "the result has timed_out true and exit_code -1 with the output captured so far.\n"
    "- A background job that keeps the output open (`job &`) makes the call wait until the "
    "timeout; redirect it (`job > job.log 2>&1 &`) to let it outlive the call.\n"
    "- stdout and stderr are each cut at DPTTOOLS_OUTPUT_TRUNCATION_LIMIT characters "
    "(default 50000).\n"
    "- Commands are not filtered: they run with the server's permissions. This is not a "
    "sandbox."
)
#: Replaces the last point of the description when the server runs under --sandbox.
_UNCONFINED_POINT = (
    "- Commands are not filtered: they run with the server's permissions. This is not a sandbox."
)
_SANDBOXED_POINT = (
    "- Commands run in the same bubblewrap sandbox as execute_code: the filesystem is "
    "read-only except the server's working directory, /tmp is private to each command, "
    "credential stores are hidden{network}, and background jobs end with the server."
)
_RESTART_SESSION_DESCRIPTION = (
    "Reset the shell session's working directory to the directory the server started in. "
    "Returns a confirmation naming that directory."
)
_EXECUTE_COMMAND_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "command": {
            "type": "string",
            "description": "The bash command line to run.",
        },
        "timeout": {
            "type": "number",
            "description": "Timeout in seconds (default and maximum: DPTTOOLS_SANDBOX_TIMEOUT, "
            "default 30).",
        },
    },
    "required": ["command"],
    "additionalProperties": False,
}
#: execute_code's structuredContent. Clients such as pydantic-ai, the OpenAI Agents SDK (with
#: use_structured_content) and fastmcp (result.data) hand the model this object instead of
#: ``content``, so it repeats the result text.
_EXECUTE_CODE_OUTPUT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "content": {
            "type": "string",
            "description": "The result text, as in the content block: the text() blocks, "
            "then any diagnostics; an untrusted result keeps its external-content envelope.",
        },
        "details": {
            "type": "object",
            "description": "Execution metadata: exit_code, duration_ms, mode, python, ...",
        },
        "trust": {
            "type": "string",
            "enum": ["trusted", "untrusted"],
            "description": "untrusted when third-party content (webfetch) reached the result.",
        },
    },
    "required": ["content", "details", "trust"],
}
_RESTART_SESSION_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {},
    "additionalProperties": False,
}

_BAD_COMMAND = "execute_command: `command` is required and must be a string."
_BAD_TIMEOUT = "execute_command: `timeout` must be a number of seconds."
_INSTRUCTIONS = (
    "execute_code runs a Python 3 script whose helpers (read, grep, find, ls, webfetch) call "
    "host tools; only text() blocks are its result. execute_command runs a bash command in a "
    "shell session that remembers its working directory. Both run with the server user's "
    "permissions: this is not a sandbox."
)
_SHELL_INSTRUCTIONS = (
    "execute_command runs a bash command in a shell session that remembers its working "
    "directory between calls; restart_session returns to the start directory. Commands run "
    "with the server user's permissions: this is not a sandbox."
)


@dataclass
class _Lifespan:
    """State of one serving period (the MCP lifespan context)."""

    execute_code: ExecuteCode | None


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
                _schema_tool(
                    self._execute_code,
                    name="execute_code",
                    description=schema["description"],
                    input_schema=schema["input_schema"],
                    output_schema=_EXECUTE_CODE_OUTPUT_SCHEMA,
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
            _schema_tool(
                self._execute_command,
                name="execute_command",
                description=_command_description(shell),
                input_schema=_EXECUTE_COMMAND_SCHEMA,
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
            _schema_tool(
                self._restart_session,
                name="restart_session",
                description=_RESTART_SESSION_DESCRIPTION,
                input_schema=_RESTART_SESSION_SCHEMA,
                annotations=ToolAnnotations(
                    title="Restart shell session",
                    read_only_hint=False,
                    destructive_hint=False,
                    idempotent_hint=True,
                    open_world_hint=False,
                ),
            )
        )
        super().__init__(
            SHELL_SERVER_NAME if only_shell else SERVER_NAME,
            instructions=_SHELL_INSTRUCTIONS if only_shell else _INSTRUCTIONS,
            version=__version__,
            tools=tools,
            lifespan=_lifespan,
            log_level="WARNING",
        )

    @property
    def open_lifespans(self) -> int:
        """How many serving periods are open (each owns one ExecuteCode facade)."""
        return self._open_lifespans

    # -- lifespan ------------------------------------------------------------------------------

    @asynccontextmanager
    async def _serving(self) -> AsyncIterator[_Lifespan]:
        facade = self._facade_factory(self.config) if self.offers_execute_code else None
        with self._lifespans_lock:
            self._open_lifespans += 1
        try:
            if facade is not None:
                # An agent calls soon after connecting: start the fork server and spares now.
                await facade.warm_up()
            yield _Lifespan(facade)
        finally:
            try:
                if facade is not None:
                    # Shielded: the lifespan usually ends *because* of a cancellation, and
                    # this is the step that stops the kernels.
                    with anyio.CancelScope(shield=True), anyio.move_on_after(_CLOSE_TIMEOUT_S):
                        await facade.aclose()
            finally:
                with self._lifespans_lock:
                    self._open_lifespans -= 1
                    last = self._open_lifespans == 0
                if last:
                    # Background jobs of the shell end with the serving period.
                    with anyio.CancelScope(shield=True):
                        await self.shell.aclose()

    # -- tools -------------------------------------------------------------------------------

    async def _execute_code(self, arguments: Mapping[str, Any], ctx: Context) -> CallToolResult:
        facade = _lifespan_state(ctx).execute_code
        if facade is None:  # pragma: no cover - the tool is not listed then
            raise ToolError("execute_code is not available on this server.")
        unknown = sorted(set(arguments) - {"script", "timeout_ms", "reset"})
        if unknown:
            raise ToolError(f"execute_code: unknown argument(s): {', '.join(unknown)}")
        # Strict-mode clients send every parameter: null stands for "not given".
        reset = arguments.get("reset")

        loop = asyncio.get_running_loop()
        loop_thread = threading.get_ident()
        send, receive = anyio.create_memory_object_stream[str](math.inf)

        def on_update(message: str) -> None:
            # notify() frames arrive on the loop; the thread check keeps a future
            # off-loop caller safe too (memory streams are not thread-safe).
            if threading.get_ident() == loop_thread:
                _send_quietly(send, message)
            else:
                loop.call_soon_threadsafe(_send_quietly, send, message)

        result: ExecuteCodeResult | None = None
        failure: LemonExecError | None = None
        async with anyio.create_task_group() as tg:
            tg.start_soon(_forward_progress, ctx, receive)
            try:
                result = await _detached(
                    facade.run(
                        arguments.get("script"),
                        timeout_ms=arguments.get("timeout_ms"),
                        reset=False if reset is None else reset,
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
        return _code_result(result)

    async def _execute_command(self, arguments: Mapping[str, Any], ctx: Context) -> CallToolResult:
        unknown = sorted(set(arguments) - {"command", "timeout"})
        if unknown:
            raise ToolError(f"execute_command: unknown argument(s): {', '.join(unknown)}")
        command = arguments.get("command")
        timeout = arguments.get("timeout")
        if not isinstance(command, str):
            raise ToolError(_BAD_COMMAND)
        if timeout is not None and (
            isinstance(timeout, bool) or not isinstance(timeout, int | float)
        ):
            raise ToolError(_BAD_TIMEOUT)
        outcome = await _detached(self.shell.aexecute_command(command, timeout))
        payload = dict(outcome)
        return CallToolResult(
            content=[TextContent(type="text", text=json.dumps(payload, ensure_ascii=False))],
            structured_content=payload,
        )

    async def _restart_session(self, arguments: Mapping[str, Any], ctx: Context) -> CallToolResult:
        if arguments:
            raise ToolError("restart_session takes no arguments.")
        message = await _detached(self.shell.arestart_session())
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
    spec = sandboxes.spec_from_config(config)
    if shell is None:
        shell = ShellSession(sandbox=spec)
    elif spec.enabled and shell.sandbox != spec:
        raise ValueError(
            f"build_server: the config asks for sandbox = {spec.kind!r} but the given shell "
            "is not confined to it; pass ShellSession(start_dir, sandbox="
            "lemon_exec.host.kernels.sandbox.spec_from_config(config)), or no shell"
        )
    return LemonExecServer(
        config,
        only_shell=only_shell,
        shell=shell,
        scope=scope,
        facade_factory=facade_factory if facade_factory is not None else ExecuteCode,
    )


# -- helpers ---------------------------------------------------------------------------------


def _command_description(shell: ShellSession) -> str:
    """execute_command's description: it says whether commands run in the sandbox."""
    spec = shell.sandbox
    if spec is None:
        return _EXECUTE_COMMAND_DESCRIPTION
    network = "" if spec.network else ", and there is no network (not even the host's loopback)"
    return _EXECUTE_COMMAND_DESCRIPTION.replace(
        _UNCONFINED_POINT, _SANDBOXED_POINT.format(network=network)
    )


def _lifespan(app: MCPServer[_Lifespan]) -> Any:
    """The MCPServer lifespan hook: one serving period of a :class:`LemonExecServer`."""
    assert isinstance(app, LemonExecServer)
    return app._serving()


def _lifespan_state(ctx: Context) -> _Lifespan:
    state = ctx.request_context.lifespan_context
    if not isinstance(state, _Lifespan):  # pragma: no cover - SDK contract
        raise ToolError("the server is not running (no lifespan state)")
    return state


class _SchemaTool(Tool):
    """A tool published with a hand-written input schema.

    ``Tool.run`` validates arguments against a pydantic model derived from the function's
    signature, which would both diverge from the published schema and coerce values (``"1"``
    to ``True``) that the tools must refuse with their own messages. This variant hands the
    function the raw argument mapping and the request context instead.
    """

    async def run(
        self, arguments: dict[str, Any], context: Context[Any, Any], convert_result: bool = False
    ) -> Any:
        try:
            return await self.fn(arguments, context)
        except (MCPError, ToolError):
            raise
        except Exception as exc:
            # Same contract as Tool.run: a crash's own text stays in the server log.
            raise UnexpectedToolError(f"Error executing tool {self.name}") from exc


def _schema_tool(
    fn: Callable[[Mapping[str, Any], Context], Awaitable[CallToolResult]],
    *,
    name: str,
    description: str,
    input_schema: dict[str, Any],
    annotations: ToolAnnotations,
    output_schema: dict[str, Any] | None = None,
) -> Tool:
    tool = _SchemaTool.from_function(
        fn,
        name=name,
        description=description,
        annotations=annotations,
        structured_output=False,
    )
    update: dict[str, Any] = {"parameters": input_schema, "description": description}
    if output_schema is not None:
        # Published in tools/list as outputSchema; the tool returns its CallToolResult as is.
        update["fn_metadata"] = tool.fn_metadata.model_copy(update={"output_schema": output_schema})
    return tool.model_copy(update=update)


async def _detached(coro: Coroutine[Any, Any, T]) -> T:
    """Await ``coro`` in a task of its own, so a cancellation reaches it exactly once.

    When the caller is cancelled (the client cancelled the call, or the server is stopping),
    the task is cancelled once (the facade kills the kernel's process group, the shell the
    command's) and waited for under a shield, bounded by ``_CANCEL_GRACE_S``; then the
    cancellation propagates.
    """
    task = asyncio.ensure_future(coro)
    try:
        return await asyncio.shield(task)
    except BaseException:
        task.cancel()
        with anyio.CancelScope(shield=True), anyio.move_on_after(_CANCEL_GRACE_S):
            await asyncio.wait({task})
        if task.done() and not task.cancelled():
            task.exception()  # retrieved: the caller's own exception is what propagates
        raise


def _send_quietly(send: Any, message: str) -> None:
    # A notify() after the call ended has nobody to go to.
    with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError):
        send.send_nowait(message)


async def _forward_progress(ctx: Context, receive: MemoryObjectReceiveStream[str]) -> None:
    """Send each notify() message as a progress notification, in order.

    ``progress`` counts the messages (1, 2, ...) so it increases as MCP requires; there is no
    ``total``. Without a progress token from the client the SDK drops them (a no-op).
    """
    count = 0
    async with receive:
        async for message in receive:
            count += 1
            try:
                await ctx.report_progress(count, None, message)
            except Exception:  # a dead client must not fail the call
                log.debug("progress notification not sent", exc_info=True)


def _code_result(result: ExecuteCodeResult) -> CallToolResult:
    """The MCP form of an execute_code result.

    ``content`` is the result text as is (an untrusted result already carries its
    external-content envelope); ``structuredContent`` holds the same text as ``content``,
    plus ``details`` and ``trust`` (many clients show the model only the structured object).
    ``isError`` marks a call that was refused before anything ran.
    """
    structured = {
        "content": result.content,
        "details": _jsonable(result.details),
        "trust": result.trust,
    }
    return CallToolResult(
        content=[TextContent(type="text", text=result.content)],
        structured_content=structured,
        is_error=bool(result.details.get("error")),
    )


def _jsonable(value: Mapping[str, object]) -> dict[str, Any]:
    # details hold plain values today; the round trip guards the wire against a future Path.
    plain: dict[str, Any] = json.loads(json.dumps(value, default=str))
    return plain
