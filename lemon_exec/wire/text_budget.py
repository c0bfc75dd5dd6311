"""Text on the bridge: its normal form, what a text() block costs, and frames that fit the cap.

Both sides charge text() budgets on the same normalised string and the same byte count
(docs/comm-protocol.md §6), and split a block too large for one frame the same way: so the
rules live here, once. Standard library only: the kernel side imports it too.
"""

from __future__ import annotations

import json
import re
from typing import Any

from lemon_exec.wire.json_strings import json_string_len
from lemon_exec.wire.protocol import FRAME_CAP_BYTES, TEXT

_SURROGATE = re.compile("[\ud800-\udfff]")


def normalize_text(value: object) -> str:
    """Coerce ``value`` to ``str`` and replace each lone surrogate with U+FFFD.

    Both sides charge text() budgets on the normalised string, so every frame is valid JSON
    and the byte count is identical on both sides.
    """
    text = value if isinstance(value, str) else str(value)
    if text.isascii():  # the common case, and a C-speed check: no surrogate possible
        return text
    # In a Python str every code point in D800-DFFF is a lone surrogate (pairs are decoded).
    return _SURROGATE.sub("\ufffd", text)


def text_cost(n: int, encoded_len: int) -> int:
    """Bytes charged against max_text_bytes for text block ``n``: its JSON-encoded frame.

    That is ``len(json.dumps({"n": n, "text": text}).encode())``, computed from
    ``encoded_len = len(json.dumps(text))`` without re-encoding. ``json.dumps`` escapes to
    ASCII one character at a time, so a block's cost is also the sum of its pieces' encoded
    lengths (minus their quotes): that is how a block sent in several frames is charged
    exactly as one.
    """
    return len(f'{{"n": {n}, "text": }}') + encoded_len


def frame_size(frame: dict[str, Any]) -> int:
    """Serialised size of a frame, as compared against FRAME_CAP_BYTES."""
    return len(json.dumps(frame).encode("utf-8"))


def frame_size_with_text(frame: dict[str, Any], encoded_len: int) -> int:
    """:func:`frame_size` of ``frame``, given ``encoded_len = len(json.dumps(frame["text"]))``."""
    rest = {key: value for key, value in frame.items() if key != "text"}
    separator = 2 if rest else 0  # the ", " before the "text" member
    return frame_size(rest) + separator + len('"text": ') + encoded_len


def text_frames(
    n: int, token: str, text: str, encoded_len: int | None = None
) -> list[dict[str, Any]]:
    """The frames of text block ``n``: one, or continuation frames that each fit the frame cap.

    Every frame but the last carries ``"more": true``; the host joins the pieces in order.
    Pieces are cut between characters of ``text``, never inside a JSON escape.
    """
    if encoded_len is None:
        encoded_len = json_string_len(text)
    single = {"type": TEXT, "n": n, "token": token, "text": text}
    if frame_size_with_text(single, encoded_len) <= FRAME_CAP_BYTES:
        return [single]
    shell = {"type": TEXT, "n": n, "token": token, "text": "", "more": True}
    limit = FRAME_CAP_BYTES - (frame_size(shell) - 2)  # largest json.dumps(piece) that fits
    frames: list[dict[str, Any]] = []
    step = limit - 2  # characters per piece: exact for plain ASCII, adapted below
    start = 0
    while start < len(text):
        while True:
            piece = text[start : start + step]
            size = json_string_len(piece)
            if size <= limit:
                break
            # Shrink in proportion to the overshoot; always by at least one character (a
            # single character encodes to at most 14 bytes, far below the limit).
            step = max(1, min(step - 1, step * (limit - 2) // (size - 2)))
        start += len(piece)
        frames.append({"type": TEXT, "n": n, "token": token, "text": piece, "more": True})
        if size - 2 > 0:  # grow back towards the limit when this piece encoded compactly
            step = min(limit - 2, max(step, step * (limit - 2) // (size - 2)))
    del frames[-1]["more"]
    return frames


def truncate_utf8(text: str, max_bytes: int) -> str:
    """Cut ``text`` to at most ``max_bytes`` UTF-8 bytes without splitting a character."""
    data = text.encode("utf-8")
    if len(data) <= max_bytes:
        return text
    return data[:max_bytes].decode("utf-8", "ignore")
