"""Telemetry: bounded categorical metadata and counts/durations, nothing else.

Events never carry code, output, tracebacks, tokens, paths, PIDs, key digests or raw error
text. A runtime subscribes with :meth:`Telemetry.subscribe`; a failing handler is logged and
never breaks a run.

Event catalogue (name: measurements / metadata):

- ``execute_code.stop``: duration_ms, rpc_calls, rpc_denied, rpc_errors, rpc_bytes,
  text_blocks, notifications / mode, outcome (ok | failed | timed_out | cancelled | crashed |
  protocol_fault | busy | error), trust, fallback_reason, truncated (built by
  :func:`stop_event`)
- ``kernel.start``: duration_ms / mode (per_call | session), source (spare | cold), ok
- ``kernel.stop``: lifetime_ms, cells / mode, reason (finished | evicted | reaped | discarded |
  reset | owners_gone | closed)
- ``session.fallback``: / reason (the spec's fallback_reason)
- ``session.busy``: queued / (none)
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

from lemon_exec.details import Outcome, outcome_of
from lemon_exec.result import ExecuteCodeResult

log = logging.getLogger(__name__)

Measurements = Mapping[str, int | float]
Metadata = Mapping[str, str | bool | int | None]
Handler = Callable[[str, Measurements, Metadata], None]

#: The ``execute_code.stop`` measurements: counts and durations from the result's details.
STOP_MEASUREMENTS = (
    "duration_ms",
    "rpc_calls",
    "rpc_denied",
    "rpc_errors",
    "rpc_bytes",
    "text_blocks",
    "notifications",
)
#: Telemetry's names for two outcomes (kept from before the outcome was decoded in one place).
_OUTCOME_LABELS: dict[Outcome, str] = {"timeout": "timed_out", "refused": "error"}


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


def stop_event(result: ExecuteCodeResult) -> tuple[str, Measurements, Metadata]:
    """The ``execute_code.stop`` event of ``result``: ``telemetry.emit(*stop_event(r))``."""
    details: Mapping[str, object] = result.details
    measurements: dict[str, int | float] = {}
    for key in STOP_MEASUREMENTS:
        value = details.get(key)
        measurements[key] = value if isinstance(value, int | float) else 0
    outcome = outcome_of(details)
    fallback = details.get("fallback_reason")
    metadata: dict[str, str | bool | int | None] = {
        "mode": str(details["mode"]) if "mode" in details else None,
        "outcome": _OUTCOME_LABELS.get(outcome, outcome),
        "trust": result.trust,
        "fallback_reason": fallback if isinstance(fallback, str) else None,
        "truncated": bool(details.get("truncated")),
    }
    return "execute_code.stop", measurements, metadata
