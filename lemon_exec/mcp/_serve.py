"""Serving a :class:`LemonExecServer` over stdio or streamable HTTP, with a clean shutdown.

Shutdown is what matters here: the server's lifespan closes the ExecuteCode facade (and so
every kernel) when serving ends, whether it ends by stdin EOF, SIGTERM, SIGINT or SIGHUP.

Over HTTP every request needs a bearer token (``_auth``): the tools run code as this user, so
without one any local process (or, with --allow-remote, any host) could use them.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import signal
import socket
import sys
from typing import Any

import anyio
from mcp.server.transport_security import TransportSecuritySettings

from lemon_exec.mcp._auth import BearerAuth, check_token, new_token
from lemon_exec.mcp._http_limits import HttpLimits
from lemon_exec.mcp._server import LemonExecServer

__all__ = [
    "HttpLimits",
    "ListenFailed",
    "NoAuthRefused",
    "RemoteHostRefused",
    "is_loopback_host",
    "parse_http_address",
    "run_http",
    "run_stdio",
]

log = logging.getLogger(__name__)

# After a signal, how long the facade's shutdown may take before the process exits anyway.
_SHUTDOWN_GRACE_S = 20.0
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)

REMOTE_REFUSED = (
    "lemon-exec mcp: refusing to listen on {host!r}, which is not a loopback address. The "
    "tools run Python scripts and shell commands with this user's permissions (bash-equivalent "
    "authority), and the bearer token would cross the network in clear text (plain HTTP). Use "
    "127.0.0.1 / localhost / ::1, or pass --allow-remote if the network is trusted (better: "
    "put a TLS proxy in front of a loopback listener)."
)
NO_AUTH_REFUSED = (
    "lemon-exec mcp: refusing --no-auth on {host!r}, which is not a loopback address: anyone "
    "who can reach the port could run code here with this user's permissions. --no-auth is "
    "only allowed on 127.0.0.1 / localhost / ::1; drop it to require a bearer token."
)


class RemoteHostRefused(ValueError):
    """The HTTP host is not a loopback address and remote serving was not allowed."""


class NoAuthRefused(ValueError):
    """``no_auth`` was asked for a host that is not a loopback address."""


class ListenFailed(OSError):
    """The HTTP address could not be bound (the port is taken, the address is not local...)."""


def parse_http_address(value: str) -> tuple[str, int]:
    """Split ``HOST:PORT`` (``[::1]:8000`` for IPv6) into host and port.

    Raises ``ValueError`` with a message fit for the command line.
    """
    host, sep, port_text = value.rpartition(":")
    if not sep or not host:
        raise ValueError(f"expected HOST:PORT, got {value!r}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise ValueError(f"write an IPv6 host in brackets, e.g. [::1]:8000; got {value!r}")
    try:
        port = int(port_text)
    except ValueError:
        raise ValueError(f"the port must be a number, got {port_text!r}") from None
    if not 0 < port < 65536:
        raise ValueError(f"the port must be 1..65535, got {port}")
    return host, port


def is_loopback_host(host: str) -> bool:
    """Whether every address ``host`` names is a loopback address (``0.0.0.0`` is not)."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except OSError:
        return False
    addresses = {info[4][0] for info in infos}
    return bool(addresses) and all(
        ipaddress.ip_address(str(a).split("%", 1)[0]).is_loopback for a in addresses
    )


def run_stdio(server: LemonExecServer) -> int:
    """Serve over stdin/stdout until stdin closes or a stop signal arrives; the exit status."""
    return anyio.run(_serve_stdio, server)


async def _serve_stdio(server: LemonExecServer) -> int:
    received: list[int] = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(_stop_on_signal, server, tg.cancel_scope, received)
        await server.run_stdio_async()  # returns at stdin EOF, after the lifespan closed
        tg.cancel_scope.cancel()
    return 128 + received[0] if received else 0


async def _stop_on_signal(
    server: LemonExecServer, scope: anyio.CancelScope, received: list[int]
) -> None:
    with anyio.open_signal_receiver(*_STOP_SIGNALS) as signals:
        async for signum in signals:
            received.append(signum)
            scope.cancel()  # ends serving; the lifespan then closes the facade
            break
        # Still inside the receiver: a second Ctrl-C or SIGTERM cannot kill the process
        # half-way through stopping the kernels (the wait is bounded).
        # The SDK's stdin reader blocks in a thread that a cancellation cannot interrupt, so
        # serving may never unwind while the client keeps stdin open. Wait (shielded) for
        # the lifespan's cleanup, which runs before that point, then leave without the reader.
        with anyio.CancelScope(shield=True):
            with anyio.move_on_after(_SHUTDOWN_GRACE_S):
                while server.open_lifespans:
                    await anyio.sleep(0.05)
            await anyio.sleep(0.2)  # a normal exit, if it is going to happen, happens now
    sys.stderr.flush()
    os._exit(128 + received[0])


def run_http(
    server: LemonExecServer,
    host: str,
    port: int,
    *,
    token: str | None = None,
    no_auth: bool = False,
    allow_remote: bool = False,
    path: str = "/mcp",
    limits: HttpLimits | None = None,
) -> int:
    """Serve streamable HTTP on ``http://HOST:PORT/mcp`` until SIGINT/SIGTERM.

    ``limits`` bound slow and idle clients (head and body timeouts, keep-alive, a cap on
    connections; :mod:`lemon_exec.mcp._http_limits`); default: :class:`HttpLimits`'s.

    Every request must send ``Authorization: Bearer <token>`` (else 401). Without ``token``
    a random one is generated and printed to stderr with the URL. ``no_auth`` serves without
    a token, and only on a loopback host (``NoAuthRefused`` otherwise). Refuses
    (``RemoteHostRefused``) a host that is not loopback unless ``allow_remote``. On loopback
    the SDK's DNS-rebinding protection is on (Host and Origin must be local). ``OSError`` if
    the address cannot be bound (``ListenFailed``, say the port is taken).
    """
    loopback = is_loopback_host(host)
    if no_auth and token is not None:
        raise ValueError("a token and no_auth exclude each other")
    if no_auth and not loopback:
        raise NoAuthRefused(NO_AUTH_REFUSED.format(host=host))
    if not allow_remote and not loopback:
        raise RemoteHostRefused(REMOTE_REFUSED.format(host=host))
    generated = token is None and not no_auth
    if generated:
        token = new_token()
    elif token is not None:
        check_token(token)
    import uvicorn  # the SDK's HTTP runner; imported here so stdio never needs it

    from lemon_exec.mcp._http_protocol import limited_protocol

    app: Any = server.streamable_http_app(
        streamable_http_path=path, host=host, transport_security=_transport_security(host)
    )
    if token is not None:
        app = BearerAuth(app, token)
    # Listening before the announcement, so a client that reads the URL can connect at once
    # (its connection waits in the backlog until uvicorn has started).
    sock = _listen(host, port)
    _announce(host, sock.getsockname()[1], path, token if generated else None, no_auth=no_auth)
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level="warning",
        lifespan="on",
        http=limited_protocol(limits or HttpLimits()),  # bounds slow and idle clients
        # Bounded, so a client holding an SSE stream open cannot stall a SIGTERM; the lifespan
        # (which stops the kernels) runs after this.
        timeout_graceful_shutdown=3,
    )
    # uvicorn handles SIGINT/SIGTERM itself: graceful shutdown, then the app lifespan ends.
    try:
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        sock.close()
    return 0


def _listen(host: str, port: int) -> socket.socket:
    """A socket listening on ``host:port`` (uvicorn's choices: IPv6 iff the host has a colon)."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)  # uvicorn's default backlog
    except OSError as exc:
        sock.close()
        raise ListenFailed(exc.errno, exc.strerror or str(exc)) from exc
    return sock


def _announce(host: str, port: int, path: str, token: str | None, *, no_auth: bool) -> None:
    """Tell the user (stderr) where the server listens and how to authenticate."""
    named = f"[{host}]" if ":" in host else host
    lines = [f"lemon-exec mcp: listening on http://{named}:{port}{path}"]
    if no_auth:
        lines.append(
            "lemon-exec mcp: WARNING: no authentication (--no-auth): any local process can "
            "run code through this endpoint"
        )
    elif token is not None:
        lines.append(f"lemon-exec mcp: bearer token: {token}")
        lines.append(
            "lemon-exec mcp: clients must send 'Authorization: Bearer <token>'; the token is "
            "new at every start (fix it with LEMON_EXEC_MCP_TOKEN or --token)"
        )
    else:
        lines.append("lemon-exec mcp: clients must send 'Authorization: Bearer <token>'")
    print("\n".join(lines), file=sys.stderr, flush=True)


def _transport_security(host: str) -> TransportSecuritySettings | None:
    """DNS-rebinding protection for a loopback listener: Host and Origin must be local.

    The SDK switches it on by itself only for three spellings of loopback; this covers any
    loopback host (e.g. 127.0.0.2). A remote listener (--allow-remote) gets none: its clients
    use names this process cannot know.
    """
    if not is_loopback_host(host):
        return None
    local = ["127.0.0.1", "localhost", "[::1]"]
    named = f"[{host}]" if ":" in host else host
    if named not in local:
        local.insert(0, named)
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=[f"{h}:*" for h in local],
        allowed_origins=[f"http://{h}:*" for h in local],
    )
