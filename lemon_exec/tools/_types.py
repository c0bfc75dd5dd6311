"""The two value types every tool module shares: a call, and a tool's spec."""

from __future__ import annotations

import pathlib
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["McpToolInfo", "ToolCall", "ToolFunc", "ToolSpec"]


@dataclass(frozen=True)
class ToolCall:
    """One helper call from a script, as it arrives at the host.

    Attributes:
        tool: the helper's name (``"read"``, ``"grep"``, ...).
        params: the keyword arguments the helper sent, not yet validated.
        cwd: the run's working directory; tools resolve relative paths against it.
        call_id: the id the comm protocol gave this call (used in logs and by hooks).
        deadline: optional ``time.monotonic()`` by which the tool must be done (say, when the
            script's own timeout ends). The host lowers it to the tool's time limit before
            running the tool; tools that wait on the network or the disk honour it.
        server: for a tool of an MCP server (``registry.add_mcp_server``): the server's name
            as configured; ``None`` for other tools. Set by the host before the policy and
            approval hooks see the call.
        server_tool: for an MCP server's tool: the tool's name as the server spells it
            (``tool`` is the identifier-safe ``"<server>.<tool>"``).
        notify: where a tool sends progress lines for the script's notify() stream (the
            bridge sets it; the notify caps apply). ``None``: progress is dropped.
        resolved_path: for a tool whose spec names a ``path_param`` (``read``): that
            parameter made absolute against ``cwd`` with ``~`` expanded and every symlink
            resolved (``os.path.realpath``), set by the host before the policy and approval
            hooks see the call; the tool then opens exactly this path, so a link swapped
            after the check changes nothing. ``None`` for other tools.
        result_limit: bytes of result this call may still return (what is left of the
            run's ``max_rpc_result_bytes``; the bridge sets it). A tool that receives its
            result in pieces (an MCP server's) stops when it is clearly passed; a bigger
            result is refused anyway. ``None``: no limit known.
    """

    tool: str
    params: dict[str, Any]
    cwd: pathlib.Path
    call_id: int
    deadline: float | None = None
    server: str | None = None
    server_tool: str | None = None
    notify: Callable[[str], None] | None = field(default=None, compare=False, repr=False)
    resolved_path: pathlib.Path | None = None
    result_limit: int | None = None

    def __post_init__(self) -> None:
        # Accept a str cwd from callers; tools rely on it being a Path.
        if not isinstance(self.cwd, pathlib.Path):
            object.__setattr__(self, "cwd", pathlib.Path(self.cwd))


#: A tool implementation: ``async def f(params, call) -> str`` or a sync equivalent, which the
#: host runs in a worker thread so it cannot block the event loop.
ToolFunc = Callable[[dict[str, Any], ToolCall], str | Awaitable[str]]


@dataclass
class ToolSpec:
    """Everything the host and the schema generator need to know about one tool.

    Attributes:
        name: the helper's name; must be a Python identifier (it becomes a function name).
        func: the implementation (see :data:`ToolFunc`).
        description: one paragraph for the model, shown in the generated schema / helper docs.
        parameters: accepted keyword names, in the helper's positional order.
        required: the names that must be given; they must be the first ``len(required)``
            entries of ``parameters`` (a Python signature cannot put a required argument after
            an optional one).
        param_types: optional ``name -> type or tuple of types``; the host rejects values of
            other types before the tool runs (``bool`` is never accepted where ``int`` is
            expected). ``None`` is always accepted for optional parameters and means "default".
        defaults: optional ``name -> default`` for the generated helper signature; purely
            descriptive, the host does not fill them in (tools treat a missing or ``None``
            value as "use the default").
        inline: optional cheap predicate ``(params, call) -> bool`` for a sync tool: True
            means this call is quick (say, a small local file) and runs on the event loop,
            saving the thread hand-off (~0.2-0.5 ms of a helper round trip). A predicate
            that raises counts as False.
        time_limit_s: optional wall-clock limit of one run of the tool, in seconds, counted
            from when it starts (after policy and approval). When it passes, the host stops
            waiting and the script gets ``ToolError("<name> exceeded its time limit ...")``:
            an async tool is cancelled, an ``isolated`` tool's worker process is killed, a
            sync tool's thread is abandoned. ``ToolHost(time_limits=...)`` overrides it.
        isolated: run this sync tool in a killable worker process instead of a thread: for
            CPU-bound work that may hold the GIL (regexes, glob walks), which would otherwise
            freeze the host's event loop. ``func`` must then be a module-level function the
            worker can import by name; params and the result travel as JSON. An ``inline``
            predicate that says True still runs the call on the event loop.
        result: ``"text"`` (the default): the script gets the tool's text as is; ``"json"``:
            the text is JSON and the script gets the decoded Python object (MCP tools with
            structured results).
        mcp: set for a tool of an MCP server (``registry.add_mcp_server``): the host calls
            the server instead of ``func``.
        path_param: the parameter naming a file the tool opens (``read``: ``"path"``); the
            host resolves it for the hooks (see ``ToolCall.resolved_path``).
    """

    name: str
    func: ToolFunc
    description: str = ""
    parameters: tuple[str, ...] = ()
    required: tuple[str, ...] = ()
    param_types: Mapping[str, type | tuple[type, ...]] = field(default_factory=dict)
    defaults: Mapping[str, Any] = field(default_factory=dict)
    inline: Callable[[Mapping[str, Any], ToolCall], bool] | None = None
    time_limit_s: float | None = None
    isolated: bool = False
    result: str = "text"
    mcp: McpToolInfo | None = None
    path_param: str | None = None


@dataclass(frozen=True)
class McpToolInfo:
    """What the host needs to call one upstream MCP tool (see ``ToolSpec.mcp``)."""

    server: str  # the configured server name
    tool: str  # the upstream tool name, as the server spells it
    arg_names: Mapping[str, str] = field(default_factory=dict)  # identifier -> upstream name
    unwrap_result: bool = False  # structured content is {"result": x}: the script gets x
    text_result: bool = True  # the result is text (else JSON, see ToolSpec.result)
