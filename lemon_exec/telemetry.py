"""Telemetry: bounded categorical metadata and counts/durations, nothing else.

Events never carry code, output, tracebacks, tokens, paths, PIDs, key digests or raw error
text. A runtime subscribes with :meth:`Telemetry.subscribe`; a failing handler is logged and
never breaks a run.

Event catalogue (name: measurements / metadata):

- ``execute_code.stop``: duration_ms, rpc_calls, rpc_denied, rpc_errors, rpc_bytes,
  text_blocks, notifications, output_bytes / mode, outcome, trust, fallback_reason, truncated
- ``kernel.start``: duration_ms / mode (per_call | session), source (spare | cold), ok
- ``kernel.stop``: lifetime_ms, cells / mode, reason (finished | evicted | reaped | discarded |
  reset | owners_gone | closed)
- ``session.fallback``: / reason (the spec's fallback_reason)
- ``session.busy``: queued / (none)
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

log = logging.getLogger(__name__)

Measurements = Mapping[str, int | float]
Metadata = Mapping[str, str | bool | int | None]
Handler = Callable[[str, Measurements, Metadata], None]


class Telemetry:
    """A tiny synchronous event bus."""

    def __init__(self) -> None:
        self._handlers: list[Handler] = []

    def subscribe(self, handler: Handler) -> Callable[[], None]:
        """Call ``handler(event, measurements, metadata)`` for every event; returns unsubscribe."""
        self._handlers.append(handler)

        def unsubscribe() -> None:
            if handler in self._handlers:
                self._handlers.remove(handler)

        return unsubscribe

    def emit(self, event: str, measurements: Measurements, metadata: Metadata) -> None:
        for handler in list(self._handlers):
            try:
                handler(event, dict(measurements), dict(metadata))
            except Exception:
                log.exception("telemetry handler failed")
