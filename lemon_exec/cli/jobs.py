"""``lemon-exec jobs``: list, show and cancel the tasks of a running ``lemon-exec mcp --http``.

It is an MCP client like any other: it connects to the server's URL with the bearer token,
negotiates the 2025-11-25 revision (the one with tasks) and sends ``tasks/list``,
``tasks/get``, ``tasks/result`` and ``tasks/cancel``. A task belongs to the token that made
it, so it sees the tasks of every client holding the server's token (docs/jobs.md).

The token is ``--token`` or ``LEMON_EXEC_MCP_TOKEN`` (the variable the server reads too); a
token the server generated is on its stderr ("bearer token: ..."). ``--no-auth`` for a server
run with ``--no-auth``.

Exit status: 0 done, 1 the server refused (unknown or expired task, a task that already
ended cannot be cancelled) or cannot be reached, 2 usage errors (no token, the ``mcp``
package missing, a server without tasks).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

__all__ = ["jobs_command", "register"]

EXIT_REFUSED = 1
EXIT_USAGE = 2
#: The bearer token's environment variable (the server's own).
TOKEN_ENV = "LEMON_EXEC_MCP_TOKEN"
#: The server's URL, when ``--url`` is not given.
URL_ENV = "LEMON_EXEC_MCP_URL"
_TASKS_VERSION = "2025-11-25"
_TERMINAL = frozenset({"completed", "failed", "cancelled"})


class _Refused(Exception):
    """The server answered with an error, or cannot be used for tasks."""

    def __init__(self, message: str, status: int = EXIT_REFUSED) -> None:
        super().__init__(message)
        self.status = status


def register(subparsers: Any) -> None:
    """Add the ``jobs`` subcommand to the ``lemon-exec`` parser."""
    parser = subparsers.add_parser(
        "jobs",
        help="list, show and cancel the jobs (MCP tasks) of a running lemon-exec mcp --http",
        description=(
            "List, show and cancel the execute_code jobs that MCP clients started as tasks on "
            "a running 'lemon-exec mcp --http' server, through the MCP tasks requests."
        ),
        epilog=(
            f"The token comes from --token or ${TOKEN_ENV} (a generated one is printed on the "
            "server's stderr). exit status: 0 done, 1 refused by the server or unreachable, "
            "2 usage error"
        ),
    )
    parser.add_argument(
        "--url",
        default=None,
        help=f"the server's MCP endpoint, e.g. http://127.0.0.1:8000/mcp (default: ${URL_ENV})",
    )
    parser.add_argument(
        "--token",
        default=None,
        help=f"the server's bearer token (default: ${TOKEN_ENV}; prefer the variable: other "
        "users can read command lines)",
    )
    parser.add_argument(
        "--no-auth", action="store_true", help="the server runs without a token (--no-auth)"
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    actions = parser.add_subparsers(dest="action", metavar="ACTION")
    actions.required = True
    actions.add_parser("list", help="every task of this token, oldest first")
    show = actions.add_parser("show", help="one task; its result too once it has ended")
    show.add_argument("task_id", metavar="TASK_ID")
    cancel = actions.add_parser("cancel", help="stop a queued or running task")
    cancel.add_argument("task_id", metavar="TASK_ID")
    parser.set_defaults(func=jobs_command)


def jobs_command(args: argparse.Namespace) -> int:
    url = args.url or os.environ.get(URL_ENV)
    if not url:
        return _error(f"give the server's URL with --url or ${URL_ENV}", EXIT_USAGE)
    token = args.token if args.token is not None else os.environ.get(TOKEN_ENV)
    if token is None and not args.no_auth:
        return _error(
            f"give the server's bearer token with --token or ${TOKEN_ENV} (or --no-auth)",
            EXIT_USAGE,
        )
    try:
        import anyio
    except ImportError:  # pragma: no cover - anyio comes with the package
        return _error("anyio is missing", EXIT_USAGE)
    try:
        output: Any = anyio.run(_run, url, None if args.no_auth else token, args)
    except _Refused as exc:
        return _error(str(exc), exc.status)
    except ModuleNotFoundError as exc:
        return _error(f"needs the mcp extra (pip install 'lemon_exec[mcp]'): {exc}", EXIT_USAGE)
    except Exception as exc:  # unreachable server, 401, ...: one line, not a traceback
        return _error(f"cannot talk to {url}: {_reason(exc)}", EXIT_REFUSED)
    _print(output, args)
    return 0


async def _run(url: str, token: str | None, args: argparse.Namespace) -> Any:
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    async with (
        httpx2.AsyncClient(headers=headers) as http,
        Client(streamable_http_client(url, http_client=http), mode="legacy") as client,
    ):
        if client.protocol_version != _TASKS_VERSION or client.server_capabilities.tasks is None:
            raise _Refused(f"{url} does not offer MCP tasks (not a lemon-exec mcp server?)", 2)
        if args.action == "list":
            return await _list(client)
        if args.action == "cancel":
            return await _request(client, "tasks/cancel", {"taskId": args.task_id})
        task = await _request(client, "tasks/get", {"taskId": args.task_id})
        if task.get("status") in _TERMINAL:
            task["result"] = await _request(client, "tasks/result", {"taskId": args.task_id})
        return task


async def _list(client: Any) -> list[dict[str, Any]]:
    tasks: list[dict[str, Any]] = []
    cursor: str | None = None
    while True:
        page = await _request(client, "tasks/list", {"cursor": cursor} if cursor else {})
        tasks.extend(page.get("tasks", []))
        cursor = page.get("nextCursor")
        if not cursor:
            return tasks


async def _request(client: Any, method: str, params: dict[str, Any]) -> dict[str, Any]:
    """One tasks request, as its wire JSON (the SDK has types but no helpers for them)."""
    from mcp.shared.exceptions import MCPError
    from mcp_types import (
        CancelTaskRequest,
        GetTaskPayloadRequest,
        GetTaskRequest,
        ListTasksRequest,
        Result,
    )

    kinds: dict[str, Any] = {
        "tasks/get": GetTaskRequest,
        "tasks/result": GetTaskPayloadRequest,
        "tasks/cancel": CancelTaskRequest,
        "tasks/list": ListTasksRequest,
    }
    request = kinds[method].model_validate({"method": method, "params": params})

    class _Raw(Result):
        model_config = {"extra": "allow"}

    try:
        result = await client.session.send_request(request, _Raw)
    except MCPError as exc:
        raise _Refused(exc.error.message) from None
    wire: dict[str, Any] = result.model_dump(by_alias=True, mode="json", exclude_none=True)
    wire.pop("resultType", None)
    return wire


def _print(output: Any, args: argparse.Namespace) -> None:
    if args.json:
        print(json.dumps(output, indent=2, ensure_ascii=False))
    elif args.action == "list":
        if not output:
            print("no jobs")
        for task in output:
            print(_line(task))
    else:
        print(_line(output))
        result = output.get("result")
        if result is not None:
            for block in result.get("content", []):
                if block.get("type") == "text":
                    print()
                    print(block["text"])


def _line(task: dict[str, Any]) -> str:
    """``ID  STATUS  CREATED  MESSAGE`` of one task."""
    message = task.get("statusMessage") or ""
    return f"{task['taskId']}  {task['status']:<9}  {task['createdAt']}  {message}".rstrip()


def _reason(exc: BaseException) -> str:
    """The innermost message of a (grouped) exception."""
    inner = getattr(exc, "exceptions", None)
    if isinstance(inner, tuple) and inner:
        return _reason(inner[0])
    return str(exc) or type(exc).__name__


def _error(message: str, status: int) -> int:
    print(f"lemon-exec jobs: {message}", file=sys.stderr)
    return status
