"""The lemon comm protocol's numbers, names, error texts, and its frames and replies.

The protocol is specified in ``docs/comm-protocol.md``; this module is its single source of
constants and error texts (§9), and builds the frames (kernel → host, §4) and replies
(host → kernel, §5). The rest of the protocol sits beside it in :mod:`lemon_exec.wire`:
``cell_setup`` and ``script_outcome`` (the execute request and reply, §2),
``frame_fields`` (what the host checks in a frame, §6), ``text_budget`` and
``json_strings`` (what text costs and how it is split), ``jupyter_messages`` (signed
messages on the hot path), ``link_framing`` (the host link). Standard library only: the
kernel side imports it too.
"""

from __future__ import annotations

from collections.abc import Mapping
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

#: Most images per run and bytes of one image when the host names no budget of its own: one
#: image travels in one message, which must stay under the 32 MiB message limit (limits.py).
MAX_IMAGE_COUNT = 64
MAX_IMAGE_BYTES = 32 * 2**20 - FRAME_CAP_BYTES
#: An image's ``alt`` text is cut to this many UTF-8 bytes.
IMAGE_ALT_MAX_BYTES = 1024

#: Token length: 32 random bytes, url-safe base64 without padding → 43 characters.
TOKEN_BYTES = 32
TOKEN_LENGTH = 43

#: The five helpers, in order: the fixed allowlist (configuration can only narrow it).
HELPER_NAMES: tuple[str, ...] = ("read", "grep", "find", "ls", "webfetch")

# Frame types, kernel → host.
CALL = "call"
TEXT = "text"
NOTIFY = "notify"
IMAGE = "image"

#: The image types a script may show (docs/comm-protocol.md §4, ``image``): the host
#: checks each image's bytes against these, never trusting the type the script claimed.
IMAGE_MIME_TYPES: tuple[str, ...] = (
    "image/png",
    "image/jpeg",
    "image/gif",
    "image/webp",
    "image/svg+xml",
)

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
IMAGE_COUNT_BUDGET = (
    "image() budget exceeded: max_images ({limit}) images per run; earlier images are kept"
)
IMAGE_BYTES_BUDGET = (
    "image() budget exceeded: this image is {size} bytes but only {remaining} of "
    "max_image_bytes ({limit}) remain; earlier images are kept"
)
IMAGE_UNKNOWN = (
    "image() data is not a PNG, JPEG, GIF, WebP or SVG image{claimed}; nothing was shown"
)
IMAGE_MISMATCH = (
    "image() data is {actual} but was given as {claimed}; pass the right format= (or none "
    "to use the type of the bytes)"
)
IMAGE_BAD_HEADER = (
    "image() data starts as {actual} but has no valid {actual} header; nothing was shown"
)
IMAGE_MALFORMED = "rpc request malformed: an image frame needs exactly one buffer of its size"
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
IMAGE_REFUSED = "image() was refused by the host"
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

#: The partial update a notify() message becomes for the caller's ``on_update`` (the spec's
#: ``notify: <msg>``); the 4 KiB cap applies to the message, not to the prefix.
NOTIFY_UPDATE_PREFIX = "notify: "


# -- frames (kernel → host, §4) and replies (host → kernel, §5) -------------------------------


def call_frame(call_id: int, token: str, tool: str, params: dict[str, Any]) -> dict[str, Any]:
    return {"type": CALL, "id": call_id, "token": token, "tool": tool, "params": params}


def notify_frame(n: int, token: str, msg: str) -> dict[str, Any]:
    return {"type": NOTIFY, "n": n, "token": token, "msg": msg}


def image_frame(n: int, token: str, size: int, mime: str | None, alt: str | None) -> dict[str, Any]:
    """An image frame; its bytes travel as the message's one binary buffer (``size`` long)."""
    frame: dict[str, Any] = {"type": IMAGE, "n": n, "token": token, "bytes": size}
    if mime is not None:
        frame["mime"] = mime
    if alt is not None:
        frame["alt"] = alt
    return frame


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


def image_reply(n: Any, error: str | None = None) -> dict[str, Any]:
    """An image's reply: accepted, or refused with ``error`` (raised as ToolError)."""
    return {"image": n, "ok": True} if error is None else {"image": n, "ok": False, "error": error}


_REPLY_KEYS = (
    ("ack", CALL, True),
    ("id", CALL, False),
    ("n", TEXT, False),
    ("image", IMAGE, False),
)


def reply_target(reply: Mapping[str, Any]) -> tuple[str, int, bool] | None:
    """What a reply answers: ``(frame kind, id or n, is_ack)``; None when it names nothing."""
    for key, kind, is_ack in _REPLY_KEYS:
        value = reply.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return kind, value, is_ack
    return None
