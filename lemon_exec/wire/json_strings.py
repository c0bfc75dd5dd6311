"""JSON strings of bridge text, without the encoder's per-character pass for plain ASCII.

A text() block is most of what the bridge carries, and both sides need its JSON string: the
kernel to put it in a frame, the host to charge it against ``max_text_bytes`` (the budget is
counted in the bytes of ``json.dumps(text)``, docs/comm-protocol.md §6). Plain ASCII text
encodes as itself between quotes, which a C-speed byte scan decides; anything else goes
through ``json.dumps``. Standard library only: the kernel side imports it too.
"""

from __future__ import annotations

import json

#: ASCII bytes json.dumps escapes as two characters (``\\"``, ``\\n``, ...) and as six
#: (``\\u00XX``: the other control characters and DEL).
_JSON_SHORT_ESCAPES = tuple(bytes([c]) for c in b'"\\\n\r\t\b\f')
_JSON_LONG_ESCAPES = tuple(
    bytes([c]) for c in (*range(32), 127) if bytes([c]) not in _JSON_SHORT_ESCAPES
)

_JSON_ESCAPES = _JSON_SHORT_ESCAPES + _JSON_LONG_ESCAPES

#: The last text found plain by :func:`ascii_escape_extra` on an unpacked frame (see
#: :func:`remember_plain`), by identity: a str is immutable, so the same object needs no
#: second scan for its budget.
_PLAIN: list[str | None] = [None]


def ascii_escape_extra(raw: bytes) -> int:
    """How many bytes longer than ``raw`` (plain ASCII) its JSON string body is.

    One ``in`` test per escaped byte (memchr, a few microseconds for a 200 KB block) and a
    count only for the bytes present: a single pass over a table (``bytes.translate``) was
    ten times slower, and this runs on both sides for every text block.
    """
    extra = 0
    for char in _JSON_SHORT_ESCAPES:
        if char in raw:
            extra += raw.count(char)
    for char in _JSON_LONG_ESCAPES:
        if char in raw:
            extra += 5 * raw.count(char)
    return extra


def remember_plain(text: str) -> None:
    """Note that ``text`` needs no escaping: :func:`json_string_len` then skips its scan."""
    _PLAIN[0] = text


def json_string_bytes(text: str) -> bytes:
    """``json.dumps(text).encode("ascii")``: a text's JSON string as the frame carries it.

    Plain ASCII text is copied once, into its quotes: the kernel's text() path splices
    this result into the frame as it is (``jupyter_messages.comm_content``).
    """
    if text.isascii():
        raw = text.encode("ascii")
        if not any(char in raw for char in _JSON_ESCAPES):  # stops at the first one found
            return b"".join((b'"', raw, b'"'))
    return json.dumps(text).encode("ascii")


def json_string_len(text: str) -> int:
    """``len(json.dumps(text))`` (what text() budgets charge), without building the string."""
    if text is _PLAIN[0]:
        return len(text) + 2  # scanned when its frame was unpacked (remember_plain)
    if text.isascii():
        return len(text) + 2 + ascii_escape_extra(text.encode("ascii"))
    return len(json.dumps(text))
