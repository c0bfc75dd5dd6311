"""How a script cell ended, as its execute_reply carries it (kernel → host, §2).

The kernel writes the outcome under the reply's ``lemon`` entry with :func:`script_reply`;
the host reads it back with :func:`parse_script_reply`, which also reads the reply of a
kernel that ran the cell as plain IPython (docs/comm-protocol.md §2). Standard library only:
the kernel side imports it too.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from lemon_exec.wire.protocol import CELL_METADATA_KEY


@dataclass(frozen=True)
class ScriptOutcome:
    """How a script ended: ``ok``, ``exit`` (SystemExit != 0), ``exception``, ``interrupted``
    (the host stopped it) or ``protocol_error`` (the cell setup was not understood)."""

    kind: str
    exit_code: int = 0
    ename: str = ""
    evalue: str = ""
    #: Output dropped because the thread or child process that wrote it belonged to an
    #: ended cell (written while this script ran, or since the previous script's reply).
    late_output_bytes: int = 0


def script_reply(outcome: ScriptOutcome, execution_count: int) -> dict[str, Any]:
    """The execute_reply content of a script cell, its outcome under ``lemon``."""
    reply: dict[str, Any] = {
        "status": "ok" if outcome.kind == "ok" else "error",
        "execution_count": execution_count,
        "user_expressions": {},
        CELL_METADATA_KEY: {
            "kind": outcome.kind,
            "exit_code": outcome.exit_code,
            "ename": outcome.ename,
            "evalue": outcome.evalue,
            "late_output_bytes": outcome.late_output_bytes,
        },
    }
    if outcome.kind != "ok":
        # The filtered traceback is already in the output: front ends must not print it twice.
        reply.update(ename=outcome.ename or "SystemExit", evalue=outcome.evalue, traceback=[])
    return reply


def parse_script_reply(reply: Mapping[str, Any]) -> ScriptOutcome:
    """The outcome of a script cell from its execute_reply; ``kind`` is ok, exit or exception.

    A reply without ``lemon`` (a kernel that ran the cell as plain IPython) is read from its
    ``status``; every kind but ok and exit counts as an exception.
    """
    outcome = reply.get(CELL_METADATA_KEY)
    if isinstance(outcome, Mapping):
        kind = outcome.get("kind", "ok")
        return ScriptOutcome(
            kind if kind in ("ok", "exit", "exception") else "exception",
            int(outcome.get("exit_code") or 0),
            str(outcome.get("ename") or ""),
            str(outcome.get("evalue") or ""),
            _count(outcome.get("late_output_bytes")),
        )
    if reply.get("status") == "error":
        return ScriptOutcome(
            "exception", 1, str(reply.get("ename", "")), str(reply.get("evalue", ""))
        )
    return ScriptOutcome("ok")


def _count(value: object) -> int:
    """A non-negative int from the reply, or 0 (an old kernel sends none)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0
