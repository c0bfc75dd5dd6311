"""The tool worker process: runs ``isolated`` tools (grep, find) for the host, one call at a time.

The host (:mod:`._workers`) starts it, writes one request frame, reads one reply frame, and
kills it when a call is cancelled or overruns its deadline; a regex that holds the GIL for
minutes then costs a process, never the host's event loop. A frame is a 4-byte big-endian
length and a JSON object:

* request: ``{"func": "module:qualname", "tool", "params", "cwd", "call_id", "budget_s"}``
* reply: ``{"ok": true, "text": ...}``, ``{"ok": false, "failure": msg}`` (a ``ToolFailure``)
  or ``{"ok": false, "error": "TypeName: msg"}`` (any other exception).

The process exits when its stdin closes (the host went away). Each call also arms
``SIGALRM`` with its default action (terminate) a little after the call's budget: a backstop
that ends a runaway call even if the host died without killing it.
"""

from __future__ import annotations

import importlib
import json
import os
import pathlib
import signal
import struct
import sys
from typing import Any, BinaryIO

from lemon_exec.errors import ToolFailure

from ._types import ToolCall

#: Extra seconds past a call's budget before the alarm backstop ends the process.
ALARM_SLACK_S = 5.0

_HEADER = struct.Struct(">I")


def read_frame(stream: BinaryIO) -> dict[str, Any] | None:
    """One frame from ``stream``, or ``None`` at end of file."""
    header = _read_exactly(stream, _HEADER.size)
    if header is None:
        return None
    body = _read_exactly(stream, _HEADER.unpack(header)[0])
    if body is None:
        return None
    value = json.loads(body)
    if not isinstance(value, dict):
        raise ValueError("frame is not a JSON object")
    return value


def encode_frame(value: dict[str, Any]) -> bytes:
    """``value`` as one frame (lone surrogates in file names survive as JSON escapes)."""
    body = json.dumps(value).encode("ascii")
    return _HEADER.pack(len(body)) + body


def _read_exactly(stream: BinaryIO, size: int) -> bytes | None:
    data = b""
    while len(data) < size:
        chunk = stream.read(size - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def _resolve(ref: str) -> Any:
    module_name, _, qualname = ref.partition(":")
    target: Any = importlib.import_module(module_name)
    for attr in qualname.split("."):
        target = getattr(target, attr)
    return target


def handle(request: dict[str, Any]) -> dict[str, Any]:
    """Run one request; every outcome becomes a reply."""
    try:
        func = _resolve(str(request["func"]))
        call = ToolCall(
            tool=str(request["tool"]),
            params=dict(request["params"]),
            cwd=pathlib.Path(request["cwd"]),
            call_id=int(request["call_id"]),
        )
        text = func(call.params, call)
    except ToolFailure as e:
        return {"ok": False, "failure": str(e)}
    except Exception as e:
        return {"ok": False, "error": f"{type(e).__name__}: {e}"}
    if not isinstance(text, str):
        return {"ok": False, "error": f"returned {type(text).__name__} instead of str"}
    return {"ok": True, "text": text}


def main() -> None:
    """Serve requests on stdin/stdout until stdin closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the host decides when we stop
    signal.signal(signal.SIGALRM, signal.SIG_DFL)
    # Replies go to the original stdout; anything a tool prints goes to stderr instead.
    out = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)
    inp = sys.stdin.buffer
    while True:
        request = read_frame(inp)
        if request is None:
            return
        budget = float(request.get("budget_s") or 0)
        if budget > 0:
            signal.setitimer(signal.ITIMER_REAL, budget + ALARM_SLACK_S)
        reply = handle(request)
        signal.setitimer(signal.ITIMER_REAL, 0)
        out.write(encode_frame(reply))


if __name__ == "__main__":
    main()
