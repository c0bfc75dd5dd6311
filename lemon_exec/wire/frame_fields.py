"""The fields of kernel → host frames, checked by type and range (docs/comm-protocol.md §6).

A frame comes from a kernel that runs the script, so the script can send any JSON it likes
in its place: every field is checked before the bridge acts on it. The rules, per kind:

- every frame: ``type`` and ``token`` strings, and no field the kind does not define;
- ``call``: ``id`` a positive integer; ``tool`` a string; ``params`` an object;
- ``text``: ``n`` a positive integer; ``text`` a string; ``more`` (optional) a boolean;
- ``image``: ``n`` a positive integer; ``bytes`` a non-negative integer (the size of the
  message's one buffer, which holds the image); ``mime`` and ``alt`` (optional) strings;
- ``notify``: ``n`` an integer from 1 to ``NOTIFY_MAX_COUNT`` (the kernel numbers them and
  sends no more); ``msg`` a string (cut to ``NOTIFY_MAX_BYTES`` as it is delivered).

Integers are JSON integers at most ``MAX_INT``; booleans are never integers and floats never
count, even integral ones.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeGuard

from lemon_exec.wire import protocol

#: The largest frame number or call id accepted (a signed 64-bit integer).
MAX_INT = 2**63 - 1

Check = Callable[[Any], bool]


def positive_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_INT


def _string(value: object) -> bool:
    return isinstance(value, str)


def _object(value: object) -> bool:
    return isinstance(value, dict)


def _boolean(value: object) -> bool:
    return isinstance(value, bool)


def _size(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_INT


def _notify_n(value: object) -> bool:
    return positive_int(value) and value <= protocol.NOTIFY_MAX_COUNT


_COMMON: dict[str, Check] = {"type": _string, "token": _string}
#: Per kind: each field's check; the fields in ``_OPTIONAL`` may be left out.
FIELDS: dict[str, dict[str, Check]] = {
    protocol.CALL: {**_COMMON, "id": positive_int, "tool": _string, "params": _object},
    protocol.TEXT: {**_COMMON, "n": positive_int, "text": _string, "more": _boolean},
    protocol.NOTIFY: {**_COMMON, "n": _notify_n, "msg": _string},
    protocol.IMAGE: {
        **_COMMON,
        "n": positive_int,
        "bytes": _size,
        "mime": _string,
        "alt": _string,
    },
}
_OPTIONAL = frozenset({"more", "mime", "alt"})


def bad_fields(kind: str, data: dict[str, Any]) -> list[str]:
    """The fields of a ``kind`` frame that are missing, unknown or out of range ([] if none)."""
    fields = FIELDS[kind]
    bad = sorted(name for name in data if name not in fields)
    for name, check in fields.items():
        if name in data:
            if not check(data[name]):
                bad.append(name)
        elif name not in _OPTIONAL:
            bad.append(name)
    return bad


__all__ = ["FIELDS", "MAX_INT", "bad_fields", "positive_int"]
