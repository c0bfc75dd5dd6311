"""Bearer-token authentication for the MCP HTTP endpoint: an ASGI wrapper around the SDK app.

Every HTTP request must carry ``Authorization: Bearer <token>``; anything else gets 401
before the SDK sees it. The token is compared in constant time (:func:`hmac.compare_digest`).
Lifespan events pass through untouched, so the facade still starts and stops with the app.
An authenticated request carries its principal (a digest of the token) in the ASGI scope under
:data:`PRINCIPAL_KEY`: MCP tasks belong to the principal that made them.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

__all__ = [
    "MIN_TOKEN_LENGTH",
    "PRINCIPAL_KEY",
    "BearerAuth",
    "check_token",
    "new_token",
    "principal",
]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

#: Shortest token accepted from the user: 16 characters (a generated one has 43).
MIN_TOKEN_LENGTH = 16
#: ASGI scope key of an authenticated request's principal (read by ``_tasks``).
PRINCIPAL_KEY = "lemon_exec.principal"


def principal(token: bytes) -> str:
    """The principal of a token holder: a digest, so the token itself is not kept around."""
    return "bearer:" + hashlib.sha256(token).hexdigest()[:32]


def new_token() -> str:
    """A fresh random token: 256 bits, 43 URL-safe characters, never a leading ``-``.

    A token starting with ``-`` would be taken for an option in ``--token TOKEN``.
    """
    while (token := secrets.token_urlsafe(32)).startswith("-"):
        pass
    return token


def check_token(token: str) -> str:
    """``token`` if it can be sent in a header and is long enough, else ``ValueError``."""
    if len(token) < MIN_TOKEN_LENGTH:
        raise ValueError(
            f"the token must be at least {MIN_TOKEN_LENGTH} characters long "
            f"(got {len(token)}); omit it to have one generated"
        )
    if not all("!" <= ch <= "~" for ch in token):
        raise ValueError(
            "the token may only hold printable ASCII characters without spaces "
            "(it travels in an HTTP header)"
        )
    return token


class BearerAuth:
    """ASGI middleware: 401 unless the request's bearer token equals ``token``."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self._expected = check_token(token).encode("ascii")
        self._principal = principal(self._expected)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)  # lifespan: start and stop the facade
            return
        presented = _bearer(scope)
        if presented is not None and hmac.compare_digest(presented, self._expected):
            scope[PRINCIPAL_KEY] = self._principal
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        await _unauthorized(send, invalid=presented is not None)


def _bearer(scope: Scope) -> bytes | None:
    """The token of the request's ``Authorization: Bearer`` header, or None."""
    values = [v for k, v in scope.get("headers", ()) if k.lower() == b"authorization"]
    if len(values) != 1:
        return None  # none, or an ambiguous pair
    scheme, _, token = bytes(values[0]).strip().partition(b" ")
    if scheme.lower() != b"bearer":
        return None
    return token.strip()


async def _unauthorized(send: Send, *, invalid: bool) -> None:
    # RFC 6750: no credentials -> no error code; wrong credentials -> invalid_token.
    challenge = 'Bearer realm="lemon-exec"' + (', error="invalid_token"' if invalid else "")
    body = json.dumps(
        {
            "error": "invalid_token" if invalid else "unauthorized",
            "error_description": (
                "lemon-exec mcp: this endpoint requires the header 'Authorization: Bearer "
                "<token>' with the token the server printed at start (or was given with "
                "--token / LEMON_EXEC_MCP_TOKEN)"
            ),
        }
    ).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 401,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"www-authenticate", challenge.encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
