"""Bounds on slow and idle HTTP clients of ``lemon-exec mcp --http``.

uvicorn (the SDK's HTTP runner) closes a connection only when it has been idle after a
response; a client that sends half a request, or trickles its headers a byte at a time, or
never sends a byte, holds its connection (and a file descriptor) for ever. This module's
protocol, uvicorn's own h11 protocol with timers added, bounds each phase of a request:

- **head**: from the moment a connection opens, or its previous response ends, the request
  line and headers must be complete within ``header_timeout_s`` (a partial head then gets
  ``408`` and the connection is closed);
- **body**: once the head is in, the body must be complete within ``body_timeout_s``
  (the connection is closed; the app sees the client disconnect);
- **idle**: no byte at all for ``keep_alive_timeout_s`` after a response closes the
  connection (uvicorn's keep-alive timer, with this value);
- **count**: at most ``max_connections`` connections are open. A new one past the cap
  closes the oldest connection that is waiting for a request head (no request of it is
  being served); only when every connection is serving a request is the new one refused
  with ``503``. The head comes before the bearer token is checked, so connections that
  never finish one cannot crowd out a client that has the token.

A request whose head and body are in is never timed here: a long ``execute_code`` call and
its event stream run as long as the call does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from lemon_exec._constants import (
    HTTP_BODY_TIMEOUT_S,
    HTTP_HEADER_TIMEOUT_S,
    HTTP_KEEP_ALIVE_TIMEOUT_S,
    HTTP_MAX_CONNECTIONS,
)

__all__ = ["HttpLimits"]


@dataclass(frozen=True)
class HttpLimits:
    """The bounds (see the module docstring); the defaults are the CLI's."""

    header_timeout_s: float = HTTP_HEADER_TIMEOUT_S
    body_timeout_s: float = HTTP_BODY_TIMEOUT_S
    keep_alive_timeout_s: float = HTTP_KEEP_ALIVE_TIMEOUT_S
    max_connections: int = HTTP_MAX_CONNECTIONS

    def __post_init__(self) -> None:
        for name in ("header_timeout_s", "body_timeout_s", "keep_alive_timeout_s"):
            value = getattr(self, name)
            if not 0 < value < math.inf:  # NaN fails this too
                raise ValueError(f"{name} must be a positive number of seconds, not {value}")
        if self.max_connections < 1:
            raise ValueError(f"max_connections must be at least 1, not {self.max_connections}")
