"""Framing of the host link: Jupyter messages over one Unix stream socket, both ways.

A message is its frames (``[<IDS|MSG>, signature, header, parent, metadata, content, ...]``)
behind a header: two little-endian u32 (body length, frame count), then one u32 length per
frame; the body is the frames back to back. Nothing else is on the wire: signing and
checking stay with the Jupyter session (the HMAC key of the connection file).

Standard library only: the kernel side imports it in every kernel.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence
from typing import Any

#: Frames in one message at most: a Jupyter message has 6-7, with a few buffers at most.
MAX_FRAMES = 64

_HEAD = struct.Struct("<II")
_LENGTHS = {n: struct.Struct(f"<{n}I") for n in range(1, MAX_FRAMES + 1)}


class LinkFramingError(ValueError):
    """The stream is not in the link's framing: nothing after this point can be trusted."""


def _nbytes(frame: Any) -> int:
    if isinstance(frame, bytes | bytearray):
        return len(frame)
    return memoryview(frame).nbytes


def pack_head(frames: Sequence[Any]) -> bytes:
    """The header that goes before ``frames`` (bytes-like) on the wire."""
    count = len(frames)
    if not 1 <= count <= MAX_FRAMES:
        raise ValueError(f"a link message has 1 to {MAX_FRAMES} frames, not {count}")
    lengths = [_nbytes(frame) for frame in frames]
    return _HEAD.pack(sum(lengths), count) + _LENGTHS[count].pack(*lengths)


class FrameReader:
    """Cuts a byte stream into messages; feed it what arrives, take what is complete.

    ``max_bytes`` bounds one message: a larger one is skipped unread (its bytes are consumed
    as they arrive, never held) and reported by its size through :meth:`messages`, as an
    ``int`` in place of the frame list.
    """

    def __init__(self, max_bytes: int) -> None:
        self._max_bytes = max_bytes
        self._buffer = bytearray()
        self._skip = 0  # bytes of an oversized message still to be discarded

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        if self._skip:
            skipped = min(self._skip, len(data))
            self._skip -= skipped
            data = memoryview(data)[skipped:]
        self._buffer += data

    def messages(self) -> Iterator[list[bytes] | int]:
        """Each complete message's frames (or an oversized one's size); raises
        :class:`LinkFramingError` on a header no sender of this framing writes."""
        buffer = self._buffer
        start = 0
        try:
            while not self._skip and len(buffer) - start >= _HEAD.size:
                body, count = _HEAD.unpack_from(buffer, start)
                if not 1 <= count <= MAX_FRAMES:
                    raise LinkFramingError(f"a message of {count} frames")
                lengths_end = start + _HEAD.size + 4 * count
                if body > self._max_bytes:
                    if len(buffer) < lengths_end:
                        break
                    available = len(buffer) - lengths_end
                    self._skip = body - min(body, available)
                    start = lengths_end + min(body, available)
                    yield body
                    continue
                end = lengths_end + body
                if len(buffer) < end:
                    break
                lengths = _LENGTHS[count].unpack_from(buffer, start + _HEAD.size)
                if sum(lengths) != body:
                    raise LinkFramingError("frame lengths do not add up to the body")
                frames = []
                at = lengths_end
                for length in lengths:
                    frames.append(bytes(buffer[at : at + length]))
                    at += length
                start = end
                yield frames
        finally:
            del buffer[:start]
