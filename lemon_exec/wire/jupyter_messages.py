"""Signed Jupyter messages on the bridge's hot path: packing, signing, verifying, decoding.

Every comm frame and reply is a Jupyter message signed with the connection's HMAC key. A
jupyter_client ``Session`` builds and checks such messages, but reads a dozen traits per
message and parses what the bridge never uses; these functions do the same work for the
messages the bridge sends and receives, on the same ``Session`` (its key, its ids, its
message counter). Standard library only at import time: the kernel side imports it too.
"""

from __future__ import annotations

import hmac
import json
import os
import re
from datetime import UTC, datetime
from typing import Any

from lemon_exec.wire.json_strings import ascii_escape_extra, json_string_bytes, remember_plain
from lemon_exec.wire.protocol import TEXT

#: Ends the routing frames of a Jupyter message (jupyter_client's DELIM).
DELIM = b"<IDS|MSG>"


class _Wire:
    """What the hot paths need of a jupyter_client ``Session``, read once.

    Each of a Session's traits costs about a microsecond to read, and signing, packing a
    header and unpacking read a dozen of them per message. The copy is per process (a
    message id names the pid) and per key (checked by identity on each use).
    """

    __slots__ = ("auth", "pid", "plain_json", "session_id", "unpack", "username", "version")

    def __init__(self, session: Any, auth: Any) -> None:
        from jupyter_client.session import json_unpacker

        self.auth = auth
        self.pid = os.getpid()
        self.session_id: str = session.session
        self.username: str = session.username
        self.version: str = session.msg_header("")["version"]  # the protocol's, e.g. "5.4"
        self.plain_json = session.unpack is json_unpacker
        self.unpack: Any = _loads_json if self.plain_json else session.unpack

    def sign(self, parts: list[bytes]) -> bytes:
        """``Session.sign``: the HMAC of ``parts`` as hex bytes."""
        h = self.auth.copy()
        for part in parts:
            h.update(part)
        return h.hexdigest().encode()  # type: ignore[no-any-return]


def _wire(session: Any) -> _Wire:
    auth = session.auth
    wire: _Wire | None = getattr(session, "_lemon_wire", None)
    if wire is None or wire.auth is not auth or wire.pid != os.getpid():
        wire = _Wire(session, auth)
        session._lemon_wire = wire
    return wire


def _loads_json(raw: bytes) -> Any:
    """jupyter_client's ``json_unpacker`` (undecodable bytes replaced, not refused)."""
    return json.loads(raw.decode("utf8", "replace"))


def unpack_signed(session: Any, raw: list[Any]) -> dict[str, Any]:
    """Verify and decode a Jupyter wire message on the bridge's hot path.

    Does what ``Session.deserialize`` does, minus parsing ISO dates in the headers and the
    digest-history replay check: neither side uses the dates, and both refuse the replays
    that matter (call ids, text block numbers, per-cell comm ids). Raises ValueError for an
    unsigned, badly signed or malformed message.
    """
    wire = _wire(session)
    if raw and isinstance(raw[0], bytes):
        parts = raw[raw.index(DELIM) + 1 :]  # ValueError without the delimiter
    else:
        _idents, parts = session.feed_identities(raw, copy=False)
    frames = [part if isinstance(part, bytes) else part.bytes for part in parts[:5]]
    if len(frames) < 5:
        raise ValueError("malformed message: fewer than 5 frames")
    signed = wire.auth is None or (
        bool(frames[0]) and hmac.compare_digest(frames[0], wire.sign(frames[1:5]))
    )
    if not signed:
        raise ValueError("invalid message signature")
    unpack = wire.unpack
    header = unpack(frames[1])
    msg = {
        "header": header,
        "msg_id": header.get("msg_id"),
        "msg_type": header.get("msg_type"),
        "parent_header": unpack(frames[2]),
        "metadata": unpack(frames[3]),
        "content": _unpack_content(wire, frames[4]),
    }
    if len(parts) > 5:
        # Binary buffers (an image frame's bytes): unsigned, as in Jupyter's own protocol;
        # the frame's signed content states each buffer's size.
        msg["buffers"] = [part if isinstance(part, bytes) else part.bytes for part in parts[5:]]
    return msg


#: The content of a text frame exactly as the kernel packs it (comm_content), up to the
#: opening quote of the text; anything else is left to the JSON parser.
_TEXT_CONTENT_HEAD = re.compile(
    rb'\{"comm_id": "([0-9A-Za-z_-]*)", "data": \{"type": "text", "n": ([1-9][0-9]{0,17}), '
    rb'"token": "([0-9A-Za-z_-]*)", ("more": true, )?"text": "'
)
#: Contents shorter than this go to the JSON parser (the fast path pays off on large blocks).
_FAST_TEXT_MIN_BYTES = 4096


def _unpack_content(wire: _Wire, raw: bytes) -> Any:
    """``session.unpack(raw)``; a large text frame of plain ASCII without ``json.loads``.

    A text block is most of what the bridge carries, and ``json.loads`` would be a third of
    the host's work per block. A content of exactly the kernel's layout whose text needs no escaping
    (ASCII without quotes, backslashes, control characters or DEL: the escape scan the
    budget needs anyway) decodes to what ``json.loads`` would give, so it is built directly,
    and its text is remembered as plain (``json_string_len`` need not scan it again).
    """
    if len(raw) < _FAST_TEXT_MIN_BYTES or not wire.plain_json:
        return wire.unpack(raw)
    head = _TEXT_CONTENT_HEAD.match(raw)
    if head is None or not raw.endswith(b'"}}'):
        return wire.unpack(raw)
    body = raw[head.end() : -3]
    if not body.isascii() or ascii_escape_extra(body):
        return wire.unpack(raw)
    text = body.decode("ascii")
    remember_plain(text)
    data: dict[str, Any] = {"type": TEXT, "n": int(head[2]), "token": head[3].decode()}
    if head[4]:
        data["more"] = True
    data["text"] = text
    return {"comm_id": head[1].decode(), "data": data}


def pack_signed(
    session: Any,
    msg_type: str,
    content: bytes,
    parent: bytes = b"{}",
    ident: bytes | None = None,
    buffers: tuple[Any, ...] = (),
) -> list[Any]:
    """The wire frames of a signed Jupyter message whose content is already JSON.

    What ``Session.serialize(Session.msg(...))`` makes, for the bridge's hot path: the
    content is packed once by the caller (a text block's JSON is built from its string
    directly), and ``parent`` is the cell's header, packed once per cell. ``buffers``
    (bytes-like) follow the content as Jupyter's binary buffers, unsigned and uncopied.
    """
    wire = _wire(session)
    number = session.message_count  # shared with Session.msg_id: ids stay unique
    session.message_count = number + 1
    header = {
        "msg_id": f"{wire.session_id}_{wire.pid}_{number}",
        "msg_type": msg_type,
        "username": wire.username,
        "session": wire.session_id,
        "date": datetime.now(UTC).isoformat(),
        "version": wire.version,
    }
    packed = json.dumps(header).encode()
    parts = [packed, parent, b"{}", content]
    signature = wire.sign(parts) if wire.auth is not None else b""
    return [*([ident] if ident is not None else []), DELIM, signature, *parts, *buffers]


def comm_content(comm_id: str, frame: Any, encoded_text: bytes | None = None) -> bytes:
    """The packed content of the ``comm_msg`` that carries ``frame`` (UTF-8 JSON).

    A text frame's string is encoded once, by :func:`json_string_bytes` (or given as
    ``encoded_text``, its result), and spliced in. Raises UnicodeEncodeError for a lone
    surrogate (helper arguments must be valid text).
    """
    text = frame.get("text") if isinstance(frame, dict) else None
    if not isinstance(text, str):
        return _pack_json({"comm_id": comm_id, "data": frame})
    rest = {key: value for key, value in frame.items() if key != "text"}
    head = _pack_json({"comm_id": comm_id, "data": {**rest, "text": ""}})
    # ``head`` ends with the empty text's quotes and the two closing braces.
    encoded = json_string_bytes(text) if encoded_text is None else encoded_text
    return b"".join((memoryview(head)[:-4], encoded, b"}}"))


def _pack_json(value: Any) -> bytes:
    """JSON of a frame or reply as the bridge sends it: UTF-8, a lone surrogate refused.

    Raises UnicodeEncodeError for a lone surrogate (helper arguments must be valid text).
    """
    return json.dumps(value, ensure_ascii=False).encode("utf-8")
