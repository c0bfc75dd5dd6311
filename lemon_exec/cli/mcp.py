"""``lemon-exec mcp``: serve execute_code and the shell tools as an MCP server.

Starting the server is the user's explicit opt-in, so execute_code is offered unless the
config file or the environment disables it explicitly (then only the shell tools are served).

Over HTTP every request needs ``Authorization: Bearer <token>``: the token comes from
``--token`` or ``LEMON_EXEC_MCP_TOKEN``, else a random one is generated and printed (stderr)
with the URL. ``--no-auth`` drops the check, and is refused unless the host is loopback.

The ``--http-*`` limits bound slow and idle HTTP clients (:mod:`lemon_exec.mcp._http_limits`).

Exit status: 0 after stdin closed (stdio) or a clean HTTP shutdown, 1 when the HTTP address
cannot be bound, 2 for usage and configuration errors (bad config, bad --http address or
token, an --http-* limit that is not positive or comes without --http, a non-loopback host
without --allow-remote, --no-auth off loopback, the ``mcp`` package missing), 128 + N after
signal N (130 Ctrl-C, 143 SIGTERM), once every kernel has been stopped.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from typing import Any

from lemon_exec._constants import (
    HTTP_BODY_TIMEOUT_S,
    HTTP_HEADER_TIMEOUT_S,
    HTTP_KEEP_ALIVE_TIMEOUT_S,
    HTTP_MAX_CONNECTIONS,
)
from lemon_exec.config import ExecuteCodeConfig
from lemon_exec.errors import LemonExecError

__all__ = ["mcp_command", "register"]

EXIT_LISTEN = 1
EXIT_USAGE = 2
#: Environment variable holding the HTTP bearer token (``--token`` wins over it).
TOKEN_ENV = "LEMON_EXEC_MCP_TOKEN"
#: The ``--http-*`` bounds on slow and idle clients: option name -> HttpLimits field.
LIMIT_OPTIONS = {
    "--http-header-timeout": "header_timeout_s",
    "--http-body-timeout": "body_timeout_s",
    "--http-keep-alive-timeout": "keep_alive_timeout_s",
    "--http-max-connections": "max_connections",
}


def register(subparsers: Any) -> None:
    """Add the ``mcp`` subcommand to the ``lemon-exec`` parser."""
    parser = subparsers.add_parser(
        "mcp",
        help="serve execute_code, execute_command and restart_session over MCP",
        description=(
            "Serve the execute_code tool and the shell tools (execute_command, "
            "restart_session) as a Model Context Protocol server, over stdio by default. "
            "execute_code is enabled unless the config file or LEMON_EXECUTE_CODE_ENABLED "
            "disables it; when disabled, only the shell tools are offered. Every tool runs "
            "code with this user's permissions (not a sandbox) unless --sandbox confines "
            "them all."
        ),
        epilog=(
            "HTTP clients must send 'Authorization: Bearer <token>'. "
            "exit status: 0 stdin closed or clean shutdown, 1 cannot listen on the address, "
            "2 usage or configuration error, 130/143 stopped by SIGINT/SIGTERM (kernels are "
            "stopped first)"
        ),
    )
    parser.add_argument(
        "--only",
        choices=("shell",),
        default=None,
        help="serve only the shell tools, under the server name code-execution-tools",
    )
    parser.add_argument(
        "--http",
        metavar="HOST:PORT",
        default=None,
        help="serve streamable HTTP at http://HOST:PORT/mcp instead of stdio "
        "(IPv6 as [::1]:PORT); HOST must be loopback unless --allow-remote",
    )
    parser.add_argument(
        "--allow-remote",
        action="store_true",
        help="allow a non-loopback --http host. The tools have bash-equivalent authority and "
        "plain HTTP carries the bearer token in clear text: use only on a trusted network",
    )
    parser.add_argument(
        "--token",
        metavar="TOKEN",
        default=None,
        help=f"the bearer token HTTP clients must send (at least 16 printable ASCII "
        f"characters); default: ${TOKEN_ENV}, else a random token printed at start. "
        f"Prefer the environment variable: other users can read command lines",
    )
    parser.add_argument(
        "--no-auth",
        action="store_true",
        help="serve HTTP without a token: any local process can then run code through it. "
        "Refused unless the --http host is loopback",
    )
    parser.add_argument(
        "--http-header-timeout",
        metavar="SECONDS",
        type=float,
        default=None,
        help="close an HTTP connection whose request line and headers are not all in "
        "within SECONDS of it opening or of its previous response "
        f"(default {HTTP_HEADER_TIMEOUT_S:g}; a partial request gets 408)",
    )
    parser.add_argument(
        "--http-body-timeout",
        metavar="SECONDS",
        type=float,
        default=None,
        help="close an HTTP connection whose request body is not all in within SECONDS of "
        f"its headers (default {HTTP_BODY_TIMEOUT_S:g})",
    )
    parser.add_argument(
        "--http-keep-alive-timeout",
        metavar="SECONDS",
        type=float,
        default=None,
        help="close an HTTP connection idle for SECONDS after a response "
        f"(default {HTTP_KEEP_ALIVE_TIMEOUT_S:g})",
    )
    parser.add_argument(
        "--http-max-connections",
        metavar="N",
        type=int,
        default=None,
        help="at most N open HTTP connections; past that a new one closes the one that "
        "has waited longest for a request, or gets 503 when all are serving requests "
        f"(default {HTTP_MAX_CONNECTIONS})",
    )
    parser.add_argument(
        "--config",
        metavar="PATH",
        default=None,
        help="TOML file with a [runtime.tools.execute_code] table",
    )
    parser.add_argument(
        "--sandbox",
        action="store_true",
        help='run kernels and shell commands under bubblewrap (sandbox = "bwrap"; see '
        "docs/sandbox.md): no network, read-only filesystem but the working directory, "
        "hidden credential stores; every tool served is confined; refused when bwrap is "
        "missing",
    )
    parser.add_argument(
        "--mcp-config",
        metavar="FILE",
        default=None,
        help='JSON file {"mcpServers": {...}} (the standard MCP client format): each '
        "server's tools become helpers in execute_code scripts, tools.<server>.<tool>(...)",
    )
    parser.set_defaults(func=mcp_command)


def mcp_command(args: argparse.Namespace) -> int:
    """Build the server from ``args`` and serve it until it stops; return the exit status."""
    if importlib.util.find_spec("mcp") is None:
        _error("the MCP server needs the mcp package: pip install 'lemon_exec[mcp]'")
        return EXIT_USAGE
    from lemon_exec.mcp import (
        HttpLimits,
        ListenFailed,
        NoAuthRefused,
        RemoteHostRefused,
        build_server,
        parse_http_address,
        run_http,
        run_stdio,
    )
    from lemon_exec.mcp._auth import check_token

    address: tuple[str, int] | None = None
    if args.http is not None:
        try:
            address = parse_http_address(args.http)
        except ValueError as exc:
            _error(f"--http: {exc}")
            return EXIT_USAGE
    else:
        for flag, given in (
            ("--allow-remote", args.allow_remote),
            ("--token", args.token is not None),
            ("--no-auth", args.no_auth),
            *((option, _option(args, option) is not None) for option in LIMIT_OPTIONS),
        ):
            if given:
                _error(f"{flag} only applies to --http")
                return EXIT_USAGE
    limits: dict[str, Any] = {}
    for option, field in LIMIT_OPTIONS.items():
        if (value := _option(args, option)) is None:
            continue
        try:
            HttpLimits(**{field: value})  # type: ignore[arg-type]  # each field's own type
        except ValueError as exc:
            _error(f"{option}: {exc}")
            return EXIT_USAGE
        limits[field] = value
    http_limits = HttpLimits(**limits)
    token = args.token if args.token is not None else os.environ.get(TOKEN_ENV)
    if address is not None and token is not None:
        source = "--token" if args.token is not None else TOKEN_ENV
        if args.no_auth:
            _error(f"--no-auth and {source} exclude each other: serve with a token or without")
            return EXIT_USAGE
        try:
            check_token(token)
        except ValueError as exc:
            _error(f"{source}: {exc}")
            return EXIT_USAGE
    try:
        config = ExecuteCodeConfig.load(
            args.config, default_enabled=True, sandbox="bwrap" if args.sandbox else None
        )
    except LemonExecError as exc:
        _error(str(exc))
        return EXIT_USAGE

    facade_factory = None
    if args.mcp_config is not None:
        from lemon_exec.facade import ExecuteCode
        from lemon_exec.tools._mcp_config import load_mcp_servers, registry_with_mcp_servers

        mcp_config = args.mcp_config
        try:
            load_mcp_servers(mcp_config)  # a bad file is a usage error now, not at first use
        except LemonExecError as exc:
            _error(str(exc))
            return EXIT_USAGE

        def facade_factory(cfg: ExecuteCodeConfig) -> ExecuteCode:
            return ExecuteCode(cfg, tools=registry_with_mcp_servers(mcp_config))

    server = build_server(config, only_shell=args.only == "shell", facade_factory=facade_factory)
    if address is None:
        return run_stdio(server)
    try:
        return run_http(
            server,
            *address,
            token=token,
            no_auth=args.no_auth,
            allow_remote=args.allow_remote,
            limits=http_limits,
        )
    except (RemoteHostRefused, NoAuthRefused) as exc:
        _error(str(exc))
        return EXIT_USAGE
    except ListenFailed as exc:
        _error(f"cannot listen on {args.http}: {exc.strerror or exc}")
        return EXIT_LISTEN


def _option(args: argparse.Namespace, option: str) -> float | int | None:
    """The value of a ``--http-*`` limit option, None when not given."""
    value: float | int | None = getattr(args, option.lstrip("-").replace("-", "_"))
    return value


def _error(message: str) -> None:
    text = message if message.startswith("lemon-exec") else f"lemon-exec mcp: {message}"
    print(text, file=sys.stderr)
