"""The bridge's fast path, piece by piece: frames packed once, sent past the IOPub thread only
when nothing waits there, and replies read from the host link.

End-to-end behaviour (helpers that do not wait for a busy control or IOPub thread, output
that stays before the frames sent after it) is in ``test_bridge.py``; these tests pin down
the mechanisms with real sockets (the link's Unix socket, zmq on ipc), in this process.
"""

from __future__ import annotations

import json
import random
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq
from jupyter_client.session import Session

from lemon_exec.kernel import cells, hostlink
from lemon_exec.kernel.app import LocalIOPubThread
from lemon_exec.wire import json_strings, jupyter_messages, protocol, text_budget
from lemon_exec.wire import link_framing as linkwire
from lemon_exec.wire import zmq_frames as zmqwire

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def context() -> Iterator[zmq.Context[Any]]:
    ctx: zmq.Context[Any] = zmq.Context()
    yield ctx
    ctx.destroy(linger=0)


def _pull(context: zmq.Context[Any], address: str) -> zmq.Socket[Any]:
    socket = context.socket(zmq.PULL)
    socket.setsockopt(zmq.RCVTIMEO, 5000)
    socket.connect(address)
    return socket


def _link_pair(short_tmp: Path) -> tuple[hostlink.HostLink, socket.socket]:
    """A kernel-side HostLink connected to a plain socket standing in for the host."""
    path = str(short_tmp / "link")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)
    link = hostlink.HostLink.connect(path)
    host, _ = listener.accept()
    listener.close()
    host.settimeout(5)
    return link, host


def _recv_message(host: socket.socket, reader: linkwire.FrameReader) -> list[bytes]:
    while True:
        for message in reader.messages():
            assert isinstance(message, list)
            return message
        data = host.recv(1 << 16)
        assert data, "the link closed"
        reader.feed(data)


def test_a_frame_never_overtakes_messages_waiting_in_the_iopub_thread(
    context: zmq.Context[Any], short_tmp: Path
) -> None:
    session = Session(key=b"k" * 32)
    public = context.socket(zmq.PUB)
    public.bind(f"ipc://{short_tmp}/pub")
    io = LocalIOPubThread(public, session=session)
    io.host_link, host = _link_pair(short_tmp)
    reader = linkwire.FrameReader(2**20)
    io.start()
    try:
        # Nothing queued: the frame goes out from this thread.
        assert io.send_direct([b"direct"]) is True
        assert _recv_message(host, reader) == [b"direct"]
        # Output waiting behind a busy IO thread: the frame must queue behind it.
        release = threading.Event()
        io.io_loop.add_callback(release.wait, 5)
        io.send_multipart([b"output"])
        assert io.send_direct([b"frame"]) is False
        io.send_multipart([b"frame"])
        release.set()
        assert _recv_message(host, reader) == [b"output"]
        assert _recv_message(host, reader) == [b"frame"]
        # Once the IO thread has caught up, the direct path is open again.
        deadline = time.monotonic() + 5
        while not io.send_direct([b"again"]):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert _recv_message(host, reader) == [b"again"]
    finally:
        io.stop()
        io.close()
        host.close()


class _Bridge:
    def __init__(self, comm_id: str) -> None:
        self.comm_id = comm_id
        self.delivered: list[dict[str, Any]] = []

    def deliver(self, reply: dict[str, Any]) -> bool:
        self.delivered.append(reply)
        return True


def test_the_reply_reader_delivers_only_signed_replies_for_the_open_cell(short_tmp: Path) -> None:
    key = b"s" * 32
    kernel_session, host_session = Session(key=key), Session(key=key)
    link, host = _link_pair(short_tmp)
    link.serve_replies(kernel_session)
    bridge = _Bridge("c" * 32)
    saved = cells.STATE.bridge
    cells.STATE.bridge = bridge  # type: ignore[assignment]
    try:

        def send(content: dict[str, Any], session: Session = host_session) -> None:
            packed = json.dumps(content).encode()
            frames = jupyter_messages.pack_signed(session, protocol.REPLY_MSG_TYPE, packed)
            # In pieces of 7 bytes: the reader must join what the stream splits.
            data = linkwire.pack_head(frames) + b"".join(frames)
            for at in range(0, len(data), 7):
                host.sendall(data[at : at + 7])

        def host_side() -> None:
            send({"comm_id": "x" * 32, "id": 1, "ok": True, "content": "another cell's"})
            send({"comm_id": bridge.comm_id, "id": 2, "ok": True, "content": "forged"}, Session())
            send({"comm_id": bridge.comm_id, "id": 3, "ok": True, "content": "x\ud800y"})

        sender = threading.Thread(target=host_side)
        sender.start()
        # A waiting thread reads the link and delivers what it finds (the event is never set).
        deadline = time.monotonic() + 5
        while not bridge.delivered:
            assert time.monotonic() < deadline
            link.wait(threading.Event(), 0.05)
        sender.join(5)
        link.wait(threading.Event(), 0.05)
        # Unsigned (a session without the key) and foreign-cell replies are dropped.
        assert bridge.delivered == [
            {"comm_id": bridge.comm_id, "id": 3, "ok": True, "content": "x\ud800y"}
        ]
    finally:
        cells.STATE.bridge = saved
        link.close()
        host.close()


def test_link_framing_round_trips_and_bounds_a_message() -> None:
    frames = [b"<IDS|MSG>", b"sig", b"{}", b"", memoryview(b"content"), bytearray(b"buf")]
    wire = linkwire.pack_head(frames) + b"".join(bytes(f) for f in frames)
    reader = linkwire.FrameReader(max_bytes=64)
    big = [b"x" * 100]
    oversized = linkwire.pack_head(big) + big[0]
    stream = wire + oversized + wire
    got: list[Any] = []
    for at in range(0, len(stream), 5):  # fed in small pieces, as a stream arrives
        reader.feed(stream[at : at + 5])
        got.extend(reader.messages())
    plain = [bytes(f) for f in frames]
    assert got == [plain, 100, plain]  # the oversized one is skipped, its size reported
    with pytest.raises(ValueError):
        linkwire.pack_head([])
    bad = linkwire.FrameReader(max_bytes=64)
    bad.feed(b"\x05\x00\x00\x00\xff\x00\x00\x00")  # 255 frames: no sender writes that
    with pytest.raises(linkwire.LinkFramingError):
        list(bad.messages())
    lying = linkwire.FrameReader(max_bytes=64)
    lying.feed(b"\x04\x00\x00\x00\x01\x00\x00\x00\x09\x00\x00\x00abcd")
    with pytest.raises(linkwire.LinkFramingError):
        list(lying.messages())


@pytest.mark.parametrize(
    "text",
    ["", "plain ascii", 'quote " and \\ backslash', "nul \x00 del \x7f", "é € 😀", "y" * 70_000],
)
def test_packed_frames_are_what_jupyter_would_send(text: str) -> None:
    """pack_signed and comm_content make a message Session.deserialize accepts, with the
    content json.dumps would give: the budgets both sides charge stay byte-exact."""
    session = Session(key=b"k" * 32)
    frame = {"type": "text", "n": 1, "token": "t" * 43, "text": text, "more": True}
    content = jupyter_messages.comm_content("c" * 32, frame)
    parent = session.pack({"msg_id": "p"})
    wire = jupyter_messages.pack_signed(session, "comm_msg", content, parent, b"comm-x")
    idents, parts = session.feed_identities(wire)
    assert idents == [b"comm-x"]
    msg = session.deserialize(parts)
    assert msg["msg_type"] == "comm_msg"
    assert msg["parent_header"] == {"msg_id": "p"}
    assert msg["content"] == {"comm_id": "c" * 32, "data": frame}
    assert json_strings.json_string_bytes(text) == json.dumps(text).encode()
    assert json_strings.json_string_len(text) == len(json.dumps(text))


def test_a_lone_surrogate_in_call_params_is_refused_before_sending() -> None:
    with pytest.raises(UnicodeEncodeError):
        jupyter_messages.comm_content("c", protocol.call_frame(1, "t", "read", {"path": "a\ud800"}))


def test_json_string_and_its_length_match_json_dumps_on_random_text() -> None:
    """The escape scan behind every text block's cost: each escaped ASCII byte (two- and
    six-character escapes), mixed with plain and non-ASCII text, in random strings."""
    rng = random.Random(17)
    alphabet = [*map(chr, range(128)), "é", "€", "😀", "\ufffd"]
    for _ in range(3000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40)))
        if rng.random() < 0.3:
            text = "y" * rng.randint(0, 5000) + text  # a long plain run before the escapes
        assert json_strings.json_string_bytes(text) == json.dumps(text).encode(), repr(text)
        assert json_strings.json_string_len(text) == len(json.dumps(text)), repr(text)


@pytest.mark.parametrize(
    "text",
    [
        "y" * 10_000,
        "plain text, with spaces and punctuation ~!@#$%^&*()" * 200,
        "y" * 9_000 + '"',
        "y" * 9_000 + "\\",
        "y" * 9_000 + "\n",
        "y" * 9_000 + "\x7f",
        "y" * 9_000 + "\x00",
        "y" * 9_000 + "é",
        "y" * 9_000 + "\ud800",
    ],
)
@pytest.mark.parametrize("more", [False, True])
def test_large_text_frames_unpack_as_json_would(text: str, more: bool) -> None:
    """The host's parser-free path for large plain text frames gives exactly what
    Session.deserialize gives, and the budget's length stays json.dumps's."""
    session = Session(key=b"k" * 32)
    frame: dict[str, Any] = {"type": "text", "n": 7, "token": "t" * 43}
    if more:
        frame["more"] = True
    frame["text"] = text_budget.normalize_text(text)
    wire = jupyter_messages.pack_signed(
        session, "comm_msg", jupyter_messages.comm_content("c" * 32, frame), b"{}", b"comm-x"
    )
    content = jupyter_messages.unpack_signed(session, wire)["content"]
    _, parts = session.feed_identities(wire)
    assert content == session.deserialize(parts)["content"]
    got = content["data"]["text"]
    assert json_strings.json_string_len(got) == len(json.dumps(got))


@pytest.mark.parametrize(
    "content",
    [
        b'{"comm_id": "c", "data": {"type": "text", "n": 1, "token": "t", "text": "'
        + b"y" * 5000
        + b'"}, "extra": 1}',  # more after the text: not the kernel's layout
        b'{"comm_id": "c", "data": {"type": "text", "n": 1, "token": "t", "text": "'
        + b"y" * 5000
        + b'", "n": 2}}',  # a duplicate key after the text
        b'{"comm_id": "c", "data": {"type": "text", "n": 01, "token": "t", "text": "'
        + b"y" * 5000
        + b'"}}',  # not JSON
        b'{"comm_id": "c", "data": {"type": "text", "n": 1, "token": "t", "more": false, "text": "'
        + b"y" * 5000
        + b'"}}',
        b'{"comm_id": "c", "data": {"type": "text", "n": 1, "token": "t", "text": "'
        + b"y" * 5000
        + b"\xff"
        + b'"}}',  # invalid UTF-8: replaced, as jupyter_client does
    ],
)
def test_forged_text_contents_are_parsed_as_json_would(content: bytes) -> None:
    session = Session(key=b"k" * 32)
    wire = jupyter_messages.pack_signed(session, "comm_msg", content, b"{}", b"comm-x")
    try:
        expected = session.unpack(content)
    except ValueError:
        with pytest.raises(ValueError):
            jupyter_messages.unpack_signed(session, wire)
        return
    assert jupyter_messages.unpack_signed(session, wire)["content"] == expected


def test_zmqwire_receives_what_send_multipart_sends(
    context: zmq.Context[Any], short_tmp: Path
) -> None:
    """recv_frames, the host channels' wrapper-free multipart receive: frames arrive whole
    and in order, NOBLOCK raises zmq.Again on an empty queue."""
    address = f"ipc://{short_tmp}/wire"
    push = context.socket(zmq.PUSH)
    push.setsockopt(zmq.LINGER, 0)
    push.bind(address)
    pull = _pull(context, address)
    with pytest.raises(zmq.Again):
        zmqwire.recv_frames(pull, zmqwire.NOBLOCK)
    frames = [b"<IDS|MSG>", b"sig", b"header", b"{}", b"{}", b"y" * 100_000]
    push.send_multipart(frames, copy=False)
    push.send_multipart([b"one"])
    assert [f.bytes for f in zmqwire.recv_frames(pull, copy=False)] == frames
    assert zmqwire.recv_frames(pull) == [b"one"]
