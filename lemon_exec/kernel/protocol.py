"""Constants and frame helpers of the lemon comm protocol, shared by host and kernel.

The protocol is specified in ``docs/comm-protocol.md``; this module is its single source of
numbers and names. Standard library only: the kernel side imports it too.
"""

from __future__ import annotations

import hmac
import json
import re
from typing import Any

#: Bumped on any incompatible change to frames, metadata or message types.
PROTOCOL_VERSION = 1

#: Comm target of the per-cell bridge (kernel → host frames are ``comm_msg`` on IOPub).
COMM_TARGET = "lemon.rpc"

#: Host → kernel replies travel on the control channel as this message type, because a
#: shell-channel message would queue behind the running cell (docs/comm-protocol.md §3).
REPLY_MSG_TYPE = "lemon_reply_request"

#: Key of the execute_request ``metadata`` entry that turns a cell into a lemon script run.
CELL_METADATA_KEY = "lemon"

#: Set to "1" in the environment of kernels a lemon_exec host starts and manages: such a
#: kernel refuses shutdown requests from attached clients (the host stops it with signals).
MANAGED_ENV = "LEMON_EXEC_MANAGED"

#: The address of the host's private IOPub channel (a PUSH socket the kernel binds), given
#: in the kernel's environment by the host. The host reads IOPub only there, with blocking
#: semantics; the public IOPub socket of the connection file drops for slow subscribers, so
#: a viewer that stops reading can never stall a script (docs/inspection.md).
HOST_IOPUB_ENV = "LEMON_EXEC_HOST_IOPUB"

#: How long the kernel waits for the host to acknowledge a frame that needs an answer
#: (a ``call``'s ack or a ``text`` block's reply) before failing the helper: a bound on a
#: lost frame, not on the tool's own run time. Override with this environment variable.
ACK_TIMEOUT_ENV = "LEMON_EXEC_ACK_TIMEOUT_S"
ACK_TIMEOUT_S = 20.0

#: Largest serialised frame either side accepts (fixed by the spec).
FRAME_CAP_BYTES = 256 * 1024

#: Per-message cap and per-run count cap of notify() frames (fixed by the spec).
NOTIFY_MAX_BYTES = 4 * 1024
NOTIFY_MAX_COUNT = 64

#: Token length: 32 random bytes, url-safe base64 without padding → 43 characters.
TOKEN_BYTES = 32
TOKEN_LENGTH = 43

# Frame types, kernel → host.
CALL = "call"
TEXT = "text"
NOTIFY = "notify"

_SURROGATE = re.compile("[\ud800-\udfff]")


#: The partial update a notify() message becomes for the caller's ``on_update`` (the spec's
#: ``notify: <msg>``); the 4 KiB cap applies to the message, not to the prefix.
NOTIFY_UPDATE_PREFIX = "notify: "


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


def text_frame_bytes(n: int, text: str) -> int:
    """Bytes charged against max_text_bytes for text block ``n``: its JSON-encoded frame."""
    return len(json.dumps({"n": n, "text": text}).encode("utf-8"))


def text_cost(n: int, encoded_len: int) -> int:
    """:func:`text_frame_bytes` from ``encoded_len = len(json.dumps(text))``, without re-encoding.

    ``json.dumps`` escapes to ASCII one character at a time, so a block's cost is also the sum
    of its pieces' encoded lengths (minus their quotes): that is how a block sent in several
    frames is charged exactly as one.
    """
    return len(f'{{"n": {n}, "text": }}') + encoded_len


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
        encoded_len = len(json.dumps(text))
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
            size = len(json.dumps(piece))
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


def frame_size(frame: dict[str, Any]) -> int:
    """Serialised size of a frame, as compared against FRAME_CAP_BYTES."""
    return len(json.dumps(frame).encode("utf-8"))


def unpack_signed(session: Any, raw: list[Any]) -> dict[str, Any]:
    """Verify and decode a Jupyter wire message on the bridge's hot path.

    Does what ``Session.deserialize`` does, minus parsing ISO dates in the headers and the
    digest-history replay check: neither side uses the dates, and both refuse the replays
    that matter (call ids, text block numbers, per-cell comm ids). Raises ValueError for an
    unsigned, badly signed or malformed message.
    """
    copy = bool(raw) and isinstance(raw[0], bytes)
    _idents, parts = session.feed_identities(raw, copy=copy)
    frames = [part if isinstance(part, bytes) else part.bytes for part in parts[:5]]
    if len(frames) < 5:
        raise ValueError("malformed message: fewer than 5 frames")
    signed = session.auth is None or (
        bool(frames[0]) and hmac.compare_digest(frames[0], session.sign(frames[1:5]))
    )
    if not signed:
        raise ValueError("invalid message signature")
    header = session.unpack(frames[1])
    return {
        "header": header,
        "msg_id": header.get("msg_id"),
        "msg_type": header.get("msg_type"),
        "parent_header": session.unpack(frames[2]),
        "metadata": session.unpack(frames[3]),
        "content": session.unpack(frames[4]),
    }
