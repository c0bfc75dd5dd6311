"""Jupyter Enterprise Gateway's REST API and kernel websocket, as lemon_exec uses them.

Kernels start with ``POST /api/kernels`` (the kernel id chosen here and passed as
``KERNEL_ID``, so a start that times out can still be deleted), are interrupted with
``POST /api/kernels/{id}/interrupt`` and shut down with ``DELETE /api/kernels/{id}``. All
channels travel over one websocket, ``/api/kernels/{id}/channels``, as JSON messages that
name their ``channel`` (jupyter_server's GatewayKernelClient leaves it out of control
messages, and the gateway then puts them on shell, behind the running cell: that is why
lemon_exec speaks the protocol itself). Every request carries ``Authorization: token ...``.

Tornado (a jupyter_client dependency) is the HTTP and websocket client; the exit-time
delete uses urllib, because no event loop runs then.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest
from tornado.websocket import WebSocketClientConnection, websocket_connect

from lemon_exec.errors import KernelStartError
from lemon_exec.wire.limits import MAX_MESSAGE_BYTES

#: The websocket refuses (by closing) any message over this many bytes; between
#: MAX_MESSAGE_BYTES and this, a message is dropped unread (JSON may escape some bytes).
WS_MAX_MESSAGE_BYTES = 2 * MAX_MESSAGE_BYTES
#: Websocket pings: a connection silent for PING_INTERVAL_S + PING_TIMEOUT_S is lost.
PING_INTERVAL_S = 10.0
PING_TIMEOUT_S = 10.0

_URL_HINT = "check gateway_url (LEMON_EXECUTE_CODE_GATEWAY_URL) and that the gateway runs"
_TOKEN_HINT = "check gateway_auth_token (LEMON_EXECUTE_CODE_GATEWAY_AUTH_TOKEN)"
#: The user EG starts a kernel for: taken from the host's environment when set there.
USERNAME_ENV = "KERNEL_USERNAME"
#: EG's refusals of the kernel's user (its _raise_authorization_error), and the fix of each.
_USER_REFUSALS = {
    "is not authorized to start kernel": (
        "the user is in the gateway's unauthorized_users (EG refuses root by default): start "
        "the gateway with --EnterpriseGatewayApp.unauthorized_users set without that user "
        "(docs/scale-out.md), or set KERNEL_USERNAME in the host's environment to a user "
        "the gateway allows (lemon_exec sends it with each start)"
    ),
    "is not in the set of users authorized": (
        "the user is not in the gateway's authorized_users: add it there, or set "
        "KERNEL_USERNAME in the host's environment to a user in that set (lemon_exec sends "
        "it with each start)"
    ),
}


def request_env() -> dict[str, str]:
    """The ``KERNEL_*`` variables a start request carries besides ``KERNEL_ID``."""
    username = os.environ.get(USERNAME_ENV, "")
    return {USERNAME_ENV: username} if username else {}


@dataclass(frozen=True)
class Gateway:
    """Where the gateway is and how to authenticate to it."""

    url: str  # http(s)://host:port[/base], no trailing slash
    token: str = ""

    def headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json"}
        if self.token:
            headers["Authorization"] = f"token {self.token}"
        return headers

    def kernel_url(self, kernel_id: str = "", action: str = "") -> str:
        path = "/api/kernels"
        if kernel_id:
            path += "/" + urllib.parse.quote(kernel_id, safe="")
        if action:
            path += "/" + action
        return self.url + path

    def channels_url(self, kernel_id: str, session_id: str) -> str:
        base = "ws" + self.url[len("http") :]  # http -> ws, https -> wss
        query = urllib.parse.urlencode({"session_id": session_id})
        quoted = urllib.parse.quote(kernel_id, safe="")
        return f"{base}/api/kernels/{quoted}/channels?{query}"


async def start_kernel(
    gateway: Gateway, name: str, kernel_id: str, env: dict[str, str], timeout: float
) -> None:
    """Ask the gateway to start kernel ``kernel_id`` of kernelspec ``name``.

    Raises ``KernelStartError`` saying what to fix (unreachable, bad token, no such
    kernelspec, the gateway's own refusal); ``TimeoutError`` when it did not answer in time.
    """
    body = json.dumps({"name": name, "env": {**env, "KERNEL_ID": kernel_id}})
    request = HTTPRequest(
        gateway.kernel_url(),
        method="POST",
        headers=gateway.headers(),
        body=body,
        connect_timeout=timeout,
        request_timeout=timeout,
    )
    try:
        await AsyncHTTPClient().fetch(request)
    except HTTPClientError as exc:
        if exc.code == 599:  # tornado's own timeout
            raise TimeoutError(str(exc)) from exc
        raise start_error(gateway, exc, name) from exc
    except OSError as exc:
        raise KernelStartError(
            f"execute_code: cannot reach the Enterprise Gateway at {gateway.url} ({exc}); "
            + _URL_HINT
        ) from exc


def start_error(gateway: Gateway, exc: HTTPClientError, name: str) -> KernelStartError:
    """The start failure for an HTTP error answer of the gateway, naming the fix."""
    reason = _reason(exc)
    where = f"the Enterprise Gateway at {gateway.url}"
    if "No such kernel" in reason or "NoSuchKernel" in reason:
        return KernelStartError(
            f"execute_code: {where} has no kernelspec {name!r}; install the lemon-python "
            "kernelspec there (docs/scale-out.md) or set gateway_kernel_name"
        )
    if exc.code == 403 and "Resource Limit" in reason:
        return KernelStartError(
            f"execute_code: {where} refused to start another kernel (its max_kernels "
            "limit); try again shortly"
        )
    for refusal, fix in _USER_REFUSALS.items():
        if exc.code == 403 and refusal in reason:
            return KernelStartError(
                f"execute_code: {where} refused to start a kernel (HTTP 403: {reason}); {fix}"
            )
    if exc.code in (401, 403):
        return KernelStartError(
            f"execute_code: {where} refused the request (HTTP {exc.code} {reason}); " + _TOKEN_HINT
        )
    if exc.code == 404:
        return KernelStartError(
            f"execute_code: {where} has no kernels API (HTTP 404 at /api/kernels); " + _URL_HINT
        )
    return KernelStartError(
        f"execute_code: {where} could not start a kernel (HTTP {exc.code}: {reason})"
    )


def _reason(exc: HTTPClientError) -> str:
    """The gateway's error: its traceback's last line, its message, or the HTTP reason."""
    response = exc.response
    data = None
    if response is not None and response.body:
        with contextlib.suppress(ValueError):
            data = json.loads(response.body)
    if isinstance(data, dict):
        for key in ("traceback", "message", "reason"):
            lines = str(data.get(key) or "").strip().splitlines()
            if lines and lines[-1].strip() != "Unknown server error":
                return lines[-1].strip()[:300]
    return exc.message or "error"


async def interrupt_kernel(gateway: Gateway, kernel_id: str, timeout: float) -> bool:
    """Interrupt the kernel's running cell; False when the gateway did not confirm it."""
    return await _fetch(gateway, gateway.kernel_url(kernel_id, "interrupt"), "POST", timeout)


async def delete_kernel(gateway: Gateway, kernel_id: str, timeout: float) -> bool:
    """Shut the kernel down; True when it is gone (a 404 means it already was)."""
    return await _fetch(gateway, gateway.kernel_url(kernel_id), "DELETE", timeout)


async def _fetch(gateway: Gateway, url: str, method: str, timeout: float) -> bool:
    request = HTTPRequest(
        url,
        method=method,
        headers=gateway.headers(),
        body="{}" if method == "POST" else None,
        connect_timeout=timeout,
        request_timeout=timeout,
    )
    try:
        await AsyncHTTPClient().fetch(request)
    except HTTPClientError as exc:
        return exc.code == 404 and method == "DELETE"
    except OSError:
        return False
    return True


def delete_kernel_sync(gateway: Gateway, kernel_id: str, timeout: float) -> bool:
    """:func:`delete_kernel` without an event loop (exit-time cleanup); never raises."""
    request = urllib.request.Request(
        gateway.kernel_url(kernel_id), method="DELETE", headers=gateway.headers()
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout):
            return True
    except urllib.error.HTTPError as exc:
        return exc.code == 404
    except (OSError, ValueError):
        return False


async def connect_channels(
    gateway: Gateway, kernel_id: str, session_id: str, timeout: float
) -> WebSocketClientConnection:
    """The kernel's websocket (all channels); ``KernelStartError`` when refused."""
    request = HTTPRequest(
        gateway.channels_url(kernel_id, session_id),
        headers=gateway.headers(),
        connect_timeout=timeout,
        request_timeout=timeout,
    )
    try:
        return await websocket_connect(
            request,
            ping_interval=PING_INTERVAL_S,
            ping_timeout=PING_TIMEOUT_S,
            max_message_size=WS_MAX_MESSAGE_BYTES,
        )
    except HTTPClientError as exc:
        if exc.code == 599:
            raise TimeoutError(str(exc)) from exc
        hint = _TOKEN_HINT if exc.code in (401, 403) else _URL_HINT
        raise KernelStartError(
            f"execute_code: the Enterprise Gateway at {gateway.url} refused the kernel's "
            f"websocket (HTTP {exc.code} {_reason(exc)}); {hint}"
        ) from exc
    except OSError as exc:
        raise KernelStartError(
            f"execute_code: cannot open the kernel's websocket at {gateway.url} ({exc}); "
            + _URL_HINT
        ) from exc


def encode(msg: dict[str, Any]) -> str:
    """One Jupyter message (with its ``channel``) as the websocket's JSON text."""
    return json.dumps(msg)  # ASCII: a lone surrogate cannot break the UTF-8 frame


def decode(raw: str | bytes) -> dict[str, Any]:
    """One websocket message as a Jupyter message dict (``ValueError`` when malformed).

    Text messages are JSON; binary ones are jupyter_server's legacy framing (a count and
    offsets, then the JSON, then the buffers), used when a message carries buffers.
    """
    msg = _decode_binary(raw) if isinstance(raw, bytes) else json.loads(raw)
    if not isinstance(msg, dict) or not isinstance(msg.get("header"), dict):
        raise ValueError("not a Jupyter message")
    if not isinstance(msg.get("parent_header", {}), dict):
        raise ValueError("not a Jupyter message")
    return msg


def _decode_binary(raw: bytes) -> Any:
    if len(raw) < 8:
        raise ValueError("short binary message")
    count = int.from_bytes(raw[:4], "big")
    if count < 1 or 4 * (count + 1) > len(raw):
        raise ValueError("bad binary message")
    offsets = [int.from_bytes(raw[4 * (i + 1) : 4 * (i + 2)], "big") for i in range(count)]
    offsets.append(len(raw))
    if offsets != sorted(offsets):
        raise ValueError("bad binary message")
    msg = json.loads(raw[offsets[0] : offsets[1]])
    if isinstance(msg, dict):
        msg["buffers"] = [raw[a:b] for a, b in itertools.pairwise(offsets[1:])]
    return msg


def peek_channel(raw: str | bytes) -> str:
    """The channel a message too large to decode was on, from its tail (else IOPub).

    jupyter_server writes the ``channel`` key last, so the tail of the JSON names it.
    """
    tail = raw[-80:]
    text = tail.decode("utf-8", "replace") if isinstance(tail, bytes) else tail
    return "shell" if '"channel": "shell"' in text else "IOPub"
