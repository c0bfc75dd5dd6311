"""The ``details`` contract of an execute_code result, declared once, and its outcome decoder.

Every key any result may carry is declared in :class:`Details` (all optional: which keys a
result has depends on its mode and on how far the call got). :func:`outcome_of` is the only
place that reads the flags back into one outcome; result assembly (``host/run/results.py``)
writes them from the same :data:`OUTCOME_FLAGS` table, and telemetry and the notebook runner
decode with :func:`outcome_of` instead of testing flags themselves.

Standard library only, and no host imports: the public value type (``result.py``) and the
notebook runner (which reads stored records) use it too.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal, TypedDict

__all__ = ["OUTCOME_FLAGS", "Details", "Outcome", "outcome_of"]

#: How a call ended, as far as its details tell. ``failed``: the script ended with a non-zero
#: exit code (an exception or ``SystemExit(n)``; the headline says which). ``refused``:
#: nothing ran (bad input, disabled, a kernel that could not start, ...).
Outcome = Literal[
    "ok", "failed", "timeout", "cancelled", "crashed", "protocol_fault", "busy", "refused"
]

#: The details flag that marks each flagged outcome, in decoding precedence: a busy refusal
#: also carries ``error``, a cancelled queue wait may also be a refusal.
OUTCOME_FLAGS: dict[Outcome, str] = {
    "timeout": "timed_out",
    "cancelled": "cancelled",
    "crashed": "crashed",
    "protocol_fault": "protocol_fault",
    "busy": "busy",
    "refused": "error",
}


class Details(TypedDict, total=False):
    """Every key of ``ExecuteCodeResult.details`` (docs/modes.md has the tables)."""

    # -- how the script ended (every result) --
    exit_code: int | None  # 0 ok; n: SystemExit(n), an exception (1), a crash; None: unfinished
    truncated: bool  # the printed output was cut to max_output_bytes (the rest was spilled)
    duration_ms: int  # wall time of the whole call, queue wait included
    error: bool  # refused: nothing ran (the content says why)
    timed_out: bool  # the deadline passed (while running, or while queued)
    cancelled: bool  # aborted, or the caller went away
    crashed: bool  # the interpreter died (os._exit, a crash, a kill)
    protocol_fault: bool  # a kernel message failed validation; the kernel was discarded
    memory_limit_exceeded: bool  # crashed: killed for going over kernel_memory_mb
    full_output_path: str  # the spill file holding the output beyond max_output_bytes
    late_output_bytes: int  # session: output of earlier cells' threads/children, dropped
    # -- the bridge's accounting --
    text_blocks: int  # text() blocks in the result
    notifications: int  # notify() messages delivered
    rpc_calls: int  # helper calls that took a call slot
    rpc_denied: int  # helper calls denied (policy, approval, authentication)
    rpc_errors: int  # helper calls that failed (tool error, limit, unknown tool, ...)
    rpc_bytes: int  # helper result bytes charged against max_rpc_result_bytes
    rpc_tools: list[str]  # the helpers the script called, sorted
    rpc_accounting_loss: bool  # some helper calls could not be accounted for
    # -- the image channel (image(), display() of an image; present when any was shown) --
    images: int  # images in the result (result.images)
    image_bytes: int  # their bytes as the script sent them, charged against max_image_bytes
    images_downscaled: int  # images cut to max_image_edge (their originals are kept)
    image_originals: list[str]  # spill files holding the originals of downscaled images
    image_notes: list[str]  # images kept larger than max_image_edge, and why
    # -- mode and state (docs/modes.md) --
    mode: str  # the configured kernel_mode: "per_call" or "session"
    persistent: bool  # the call ran in a session kernel (state may persist)
    reset_performed: bool  # reset: true discarded the session's state first
    state_retained: bool  # the kernel's state survives this call
    kernel_reused: bool  # a session kernel from an earlier call ran this one
    kernel_id: str  # the session kernel's public id (an HMAC, not the real id)
    kernel_source: str  # per-call: "spare" (started ahead) or "cold"
    kernel_lost_reason: str  # why the session's previous kernel (and its state) is gone
    never_started: bool  # the call left the queue or its kernel's start (or lost its owner) first
    left_during: str  # "kernel_start": the deadline or abort came while its kernel started
    session_tainted: bool  # the session's state holds untrusted (fetched) data
    fallback_reason: str  # session mode ran this call isolated per-call, and why
    queue_wait_ms: int  # time spent waiting for a kernel slot or the session queue
    # -- admission (busy results) --
    busy: bool  # no room: the session queue or the per-call queue was full (or timed out)
    busy_reason: str  # per-call: queue_full | queue_timeout | cancelled | closed
    per_call_running: int  # per-call runs holding a slot when this call was refused
    per_call_waiting: int  # per-call runs queued when this call was refused
    max_concurrent_per_call: int  # the per-call slot limit in force
    # -- interpreter and startup --
    python: str  # the interpreter the kernel runs
    python_fallback: str  # why that is not the configured python_path (a note)
    startup_failed: bool  # the kernel (or the staging root) could not be started
    startup_error: str  # timeout | interpreter | failed | staging


def outcome_of(details: Mapping[str, object]) -> Outcome:
    """The outcome the details record: the first flag set, else by exit code."""
    for outcome, flag in OUTCOME_FLAGS.items():
        if details.get(flag):
            return outcome
    return "ok" if details.get("exit_code") == 0 else "failed"
