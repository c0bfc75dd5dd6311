"""Constants and frame helpers of the lemon comm protocol, shared by host and kernel.

The protocol is specified in ``docs/comm-protocol.md``; this module is its single source of
numbers, names, message shapes (the cell setup, the frames, the replies, the script outcome
in the execute reply: each built and parsed here) and error texts. Standard library only:
the kernel side imports it too.
"""

from __future__ import annotations

import hmac
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

#: Bumped on any incompatible change to frames, metadata or message types.
PROTOCOL_VERSION = 1

#: Host → kernel replies travel on the control channel as this message type, because a
#: shell-channel message would queue behind the running cell (docs/comm-protocol.md §3).
REPLY_MSG_TYPE = "lemon_reply_request"

#: Key of the execute_request ``metadata`` entry that turns a cell into a lemon script run.
CELL_METADATA_KEY = "lemon"

#: Set to "1" in the environment of kernels a lemon_exec host starts and manages: such a
#: kernel refuses shutdown requests from attached clients (the host stops it with signals).
MANAGED_ENV = "LEMON_EXEC_MANAGED"

#: The path of the host link (kernel/hostlink.py): a Unix socket the host listens on in its
#: private runtime directory, given in the kernel's environment by the host, never in the
#: connection file. The host reads IOPub only there, with blocking semantics (the public
#: IOPub socket drops for slow subscribers, so a viewer that stops reading can never stall a
#: script; docs/inspection.md), and sends bridge replies there; the control channel stays
#: the reply path for hosts that do not set it (docs/comm-protocol.md §3).
HOST_LINK_ENV = "LEMON_EXEC_HOST_LINK"

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

#: The five helpers, in order: the fixed allowlist (configuration can only narrow it).
HELPER_NAMES: tuple[str, ...] = ("read", "grep", "find", "ls", "webfetch")

# Frame types, kernel → host.
CALL = "call"
TEXT = "text"
NOTIFY = "notify"

# -- error texts (docs/comm-protocol.md §9) ------------------------------------------------
# Host side: the ``error`` of a failed reply, which the helper raises as ToolError.
AUTH_FAILED = "rpc authentication failed"
REPLAYED = "rpc request already processed"
TOO_LARGE = f"rpc frame too large (max {FRAME_CAP_BYTES} bytes)"
OUT_OF_ORDER = "rpc request malformed: text blocks must be numbered in order"
BAD_CALL_ID = "rpc request malformed: id must be a positive integer"
BAD_CALL_SHAPE = "rpc request malformed: tool must be a string and params an object"
BAD_FIELDS = "rpc request malformed: unknown or invalid fields: {fields}"
CALL_LIMIT = "rpc call limit exceeded (max {max_calls} calls per script)"
UNKNOWN_TOOL = "unknown tool: {tool}"
RESULT_BUDGET = (
    "rpc result budget exceeded: this result is {size} bytes, {remaining} of "
    "max_rpc_result_bytes ({limit}) remain"
)
TEXT_BUDGET = "text() budget exceeded (max_text_bytes {limit})"
TEXT_ABANDONED = "text() block abandoned before its last frame"
# Kernel side: raised as ToolError in the script.
KERNEL_TEXT_BUDGET = (
    "text() budget exceeded: this block needs {cost} bytes but only {remaining} of "
    "max_text_bytes ({limit}) remain; earlier blocks are kept"
)
FRAME_TOO_LARGE = (
    "frame too large: {size} bytes exceeds the {cap}-byte protocol frame cap; split the data "
    "into smaller pieces"
)
NO_REPLY = (
    "no reply from the host within {timeout:g} s: the {kind} frame was lost on its way to "
    "the host; try again"
)
CELL_ENDED = "the execute_code cell ended before the host replied"
CELL_CLOSED = "the execute_code cell that owned this helper has ended"
TEXT_REFUSED = "text() was refused by the host"
BAD_UNICODE = (
    "helper arguments must be valid Unicode text (a lone surrogate cannot be sent to the host)"
)
NO_HOST = (
    "no lemon_exec host is attached to this kernel: helpers work only in scripts run through "
    "execute_code (lemon_exec)"
)
STALE_THREAD = (
    "this thread was started by an earlier execute_code script; helpers are only available "
    "to threads of the script that is running now"
)
#: The ``ename`` of the execute reply when the cell setup is not one this kernel speaks.
VERSION_ENAME = "ProtocolError"
VERSION_MISMATCH = (
    "lemon protocol version {got!r} is not supported by this kernel (it speaks version "
    f"{PROTOCOL_VERSION})"
)

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
    return {
        "header": header,
        "msg_id": header.get("msg_id"),
        "msg_type": header.get("msg_type"),
        "parent_header": unpack(frames[2]),
        "metadata": unpack(frames[3]),
        "content": _unpack_content(wire, frames[4]),
    }


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

    A text block is most of what the bridge carries and parsing it was a third of the host's
    work per block. A content of exactly the kernel's layout whose text needs no escaping
    (ASCII without quotes, backslashes, control characters or DEL: the escape scan the
    budget needs anyway) decodes to what ``json.loads`` would give, so it is built directly,
    and its text is remembered as plain (:func:`json_string_len` need not scan it again).
    """
    if len(raw) < _FAST_TEXT_MIN_BYTES or not wire.plain_json:
        return wire.unpack(raw)
    head = _TEXT_CONTENT_HEAD.match(raw)
    if head is None or not raw.endswith(b'"}}'):
        return wire.unpack(raw)
    body = raw[head.end() : -3]
    if not body.isascii() or _ascii_escape_extra(body):
        return wire.unpack(raw)
    text = body.decode("ascii")
    _PLAIN[0] = text
    data: dict[str, Any] = {"type": TEXT, "n": int(head[2]), "token": head[3].decode()}
    if head[4]:
        data["more"] = True
    data["text"] = text
    return {"comm_id": head[1].decode(), "data": data}


#: The last text the host found plain by the scan above, by identity: a str is immutable,
#: so the same object needs no second scan for its budget (json_string_len).
_PLAIN: list[str | None] = [None]


#: Ends the routing frames of a Jupyter message (jupyter_client's DELIM).
DELIM = b"<IDS|MSG>"

#: ASCII bytes json.dumps escapes as two characters (``\\"``, ``\\n``, ...) and as six
#: (``\\u00XX``: the other control characters and DEL).
_JSON_SHORT_ESCAPES = tuple(bytes([c]) for c in b'"\\\n\r\t\b\f')
_JSON_LONG_ESCAPES = tuple(
    bytes([c]) for c in (*range(32), 127) if bytes([c]) not in _JSON_SHORT_ESCAPES
)

_JSON_ESCAPES = _JSON_SHORT_ESCAPES + _JSON_LONG_ESCAPES


def _ascii_escape_extra(raw: bytes) -> int:
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


def json_string(text: str) -> str:
    """``json.dumps(text)``, without the encoder's per-character pass for plain ASCII text.

    Bridge text is mostly plain ASCII (the script's own result); such a string encodes as
    itself between quotes, which a C-speed byte scan decides. Anything else is encoded.
    """
    if text.isascii():
        raw = text.encode("ascii")
        if not any(char in raw for char in _JSON_ESCAPES):  # stops at the first one found
            return f'"{text}"'
    return json.dumps(text)


def json_string_bytes(text: str) -> bytes:
    """``json.dumps(text).encode("ascii")``: :func:`json_string` as the frame carries it.

    Plain ASCII text is copied once, into its quotes (the kernel's text() path: the encoded
    string was copied twice more on its way into the frame).
    """
    if text.isascii():
        raw = text.encode("ascii")
        if not any(char in raw for char in _JSON_ESCAPES):
            return b"".join((b'"', raw, b'"'))
    return json.dumps(text).encode("ascii")


def json_string_len(text: str) -> int:
    """``len(json.dumps(text))`` (what text() budgets charge), without building the string."""
    if text is _PLAIN[0]:
        return len(text) + 2  # scanned when its frame was unpacked (_unpack_content)
    if text.isascii():
        return len(text) + 2 + _ascii_escape_extra(text.encode("ascii"))
    return len(json.dumps(text))


def pack_signed(
    session: Any,
    msg_type: str,
    content: bytes,
    parent: bytes = b"{}",
    ident: bytes | None = None,
) -> list[bytes]:
    """The wire frames of a signed Jupyter message whose content is already JSON.

    What ``Session.serialize(Session.msg(...))`` makes, for the bridge's hot path: the
    content is packed once by the caller (a text block's JSON is built from its string
    directly), and ``parent`` is the cell's header, packed once per cell.
    """
    wire = _wire(session)
    number = session.message_count  # shared with Session.msg_id: ids stay unique
    session.message_count = number + 1
    header = {
        "msg_id": f"{wire.session_id}_{wire.pid}_{number}",
        "msg_type": msg_type,
        "username": wire.username,
        "session": wire.session_id,
        "date": datetime.now(timezone.utc).isoformat(),
        "version": wire.version,
    }
    packed = json.dumps(header).encode()
    parts = [packed, parent, b"{}", content]
    signature = wire.sign(parts) if wire.auth is not None else b""
    return [*([ident] if ident is not None else []), DELIM, signature, *parts]


def comm_content(comm_id: str, frame: Any, encoded_text: bytes | None = None) -> bytes:
    """The packed content of the ``comm_msg`` that carries ``frame`` (UTF-8 JSON).

    A text frame's string is encoded once, by :func:`json_string_bytes` (or given as
    ``encoded_text``, its result), and spliced in. Raises UnicodeEncodeError for a lone
    surrogate (helper arguments must be valid text).
    """
    text = frame.get("text") if isinstance(frame, dict) else None
    if not isinstance(text, str):
        return pack_json({"comm_id": comm_id, "data": frame})
    rest = {key: value for key, value in frame.items() if key != "text"}
    head = pack_json({"comm_id": comm_id, "data": {**rest, "text": ""}})
    # ``head`` ends with the empty text's quotes and the two closing braces.
    encoded = json_string_bytes(text) if encoded_text is None else encoded_text
    return b"".join((memoryview(head)[:-4], encoded, b"}}"))


def pack_json(value: Any) -> bytes:
    """JSON of a frame or reply as the bridge sends it: UTF-8, a lone surrogate refused.

    Raises UnicodeEncodeError for a lone surrogate (helper arguments must be valid text).
    """
    return json.dumps(value, ensure_ascii=False).encode("utf-8")


# -- cell setup: the execute_request metadata (host → kernel, §2) ---------------------------


@dataclass(frozen=True)
class CellSetup:
    """What the host tells the kernel about one script cell."""

    token: str
    comm_id: str
    helpers: tuple[str, ...]
    max_text_bytes: int
    filename: str = "script.py"
    argv: tuple[str, ...] | None = None  # sys.argv while the script runs; None: untouched
    cwd: str | None = None  # chdir first (per-call claims); sessions start in their cwd
    env: Mapping[str, str] | None = None  # merged into os.environ
    #: Digest of the enabled registered tools beyond the five (code mode); None: none.
    tools_digest: str | None = None
    #: Their specs, sent only when the kernel has not seen this digest yet (see
    #: lemon_exec/tools/_toolset.py; each entry: name, doc, params).
    tools: tuple[Mapping[str, Any], ...] | None = None


def cell_metadata(setup: CellSetup) -> dict[str, Any]:
    """The execute_request ``metadata`` that makes a cell a lemon script run."""
    meta: dict[str, Any] = {
        "v": PROTOCOL_VERSION,
        "token": setup.token,
        "comm_id": setup.comm_id,
        "helpers": list(setup.helpers),
        "max_text_bytes": setup.max_text_bytes,
        "filename": setup.filename,
    }
    if setup.argv is not None:
        meta["argv"] = list(setup.argv)
    if setup.cwd is not None:
        meta["cwd"] = setup.cwd
    if setup.env:
        meta["env"] = dict(setup.env)
    if setup.tools_digest is not None:
        meta["tools_digest"] = setup.tools_digest
    if setup.tools is not None:
        meta["tools"] = list(setup.tools)
    return {CELL_METADATA_KEY: meta}


def parse_cell_setup(meta: Mapping[str, Any]) -> CellSetup | str:
    """The setup in ``metadata.lemon``, or the error text when its version is not ours."""
    if meta.get("v") != PROTOCOL_VERSION:
        return VERSION_MISMATCH.format(got=meta.get("v"))
    argv, env, helpers = meta.get("argv"), meta.get("env"), meta.get("helpers")
    digest, tools = meta.get("tools_digest"), meta.get("tools")
    return CellSetup(
        token=str(meta["token"]),
        comm_id=str(meta["comm_id"]),
        helpers=HELPER_NAMES if helpers is None else tuple(str(h) for h in helpers),
        max_text_bytes=int(meta.get("max_text_bytes", 65536)),
        filename=str(meta.get("filename", "script.py")),
        argv=tuple(str(a) for a in argv) if isinstance(argv, list) else None,
        cwd=str(meta["cwd"]) if meta.get("cwd") else None,
        env={str(k): str(v) for k, v in env.items()} if env else None,
        tools_digest=str(digest) if digest else None,
        tools=_tool_specs(tools),
    )


def _tool_specs(tools: object) -> tuple[Mapping[str, Any], ...] | None:
    if not isinstance(tools, list):
        return None
    return tuple(t for t in tools if isinstance(t, Mapping))


def tool_signature(spec: Mapping[str, Any]) -> str:
    """``name(query: str, limit: int = 5)``: a registered tool's signature, from its spec."""
    parts = []
    for param in spec.get("params", ()):
        text = str(param["name"])
        if param.get("type"):
            text += f": {param['type']}"
        if not param.get("required"):
            default = (
                param["default_repr"] if "default_repr" in param else repr(param.get("default"))
            )
            text += f" = {default}" if param.get("type") else f"={default}"
        parts.append(text)
    return f"{spec.get('name')}({', '.join(parts)})"


def first_line(doc: object) -> str:
    """The first non-empty line of a tool's description (what listings show)."""
    for line in str(doc or "").splitlines():
        if line.strip():
            return line.strip()
    return ""


# -- the script's outcome in the execute_reply (kernel → host, §2) ---------------------------


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


# -- frames (kernel → host, §4) and replies (host → kernel, §5) -------------------------------


def call_frame(call_id: int, token: str, tool: str, params: dict[str, Any]) -> dict[str, Any]:
    return {"type": CALL, "id": call_id, "token": token, "tool": tool, "params": params}


def notify_frame(n: int, token: str, msg: str) -> dict[str, Any]:
    return {"type": NOTIFY, "n": n, "token": token, "msg": msg}


def call_result(call_id: int, content: str) -> dict[str, Any]:
    """A call's successful reply (the host adds the cell's ``comm_id`` to every reply)."""
    return {"id": call_id, "ok": True, "content": content}


def call_error(call_id: Any, error: str) -> dict[str, Any]:
    """A call's failed reply; ``call_id`` is echoed as sent, even when malformed."""
    return {"id": call_id, "ok": False, "error": error}


def call_ack(call_id: int) -> dict[str, Any]:
    """The host has the call and it is still running: the kernel's wait is now unbounded."""
    return {"ack": call_id}


def text_reply(n: Any, error: str | None = None) -> dict[str, Any]:
    """A text block's reply: accepted, or refused with ``error``."""
    return {"n": n, "ok": True} if error is None else {"n": n, "ok": False, "error": error}


def reply_target(reply: Mapping[str, Any]) -> tuple[str, int, bool] | None:
    """What a reply answers: ``(frame kind, id or n, is_ack)``; None when it names nothing."""
    for key, kind, is_ack in (("ack", CALL, True), ("id", CALL, False), ("n", TEXT, False)):
        value = reply.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return kind, value, is_ack
    return None
