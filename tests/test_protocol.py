"""jupyter_messages.unpack_signed: the hot-path decoder must verify exactly like Session."""

from __future__ import annotations

import pytest
from jupyter_client.session import Session

from lemon_exec.wire import jupyter_messages, protocol

pytestmark = pytest.mark.timeout(30)


def _wire(session: Session, content: dict) -> list[bytes]:
    msg = session.msg(protocol.REPLY_MSG_TYPE, content)
    return [b"ident", *session.serialize(msg)]


def test_decodes_what_session_serializes() -> None:
    session = Session(key=b"secret")
    msg = jupyter_messages.unpack_signed(
        session, _wire(session, {"comm_id": "c", "id": 1, "ok": True})
    )
    assert msg["msg_type"] == protocol.REPLY_MSG_TYPE
    assert msg["content"] == {"comm_id": "c", "id": 1, "ok": True}
    assert msg["parent_header"] == {}


@pytest.mark.parametrize("part", [1, 2, 3, 4], ids=["header", "parent", "metadata", "content"])
def test_any_tampered_part_is_refused(part: int) -> None:
    session = Session(key=b"secret")
    frames = _wire(session, {"ok": True})
    delim = frames.index(b"<IDS|MSG>")
    frames[delim + 1 + part] = frames[delim + 1 + part].replace(b"}", b" }", 1)
    with pytest.raises(ValueError, match="signature"):
        jupyter_messages.unpack_signed(session, frames)


def test_wrong_key_and_unsigned_messages_are_refused() -> None:
    sender, receiver = Session(key=b"other"), Session(key=b"secret")
    with pytest.raises(ValueError, match="signature"):
        jupyter_messages.unpack_signed(receiver, _wire(sender, {"ok": True}))
    frames = _wire(receiver, {"ok": True})
    frames[frames.index(b"<IDS|MSG>") + 1] = b""
    with pytest.raises(ValueError, match="signature"):
        jupyter_messages.unpack_signed(receiver, frames)


def test_truncated_messages_are_refused() -> None:
    session = Session(key=b"secret")
    frames = _wire(session, {"ok": True})
    with pytest.raises(ValueError):
        jupyter_messages.unpack_signed(session, frames[:4])
