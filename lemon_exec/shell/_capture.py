"""Bounded, incremental UTF-8 capture of one output stream."""

from __future__ import annotations

import codecs


class BoundedText:
    """Keep the first ``limit`` characters of a byte stream, decoded as UTF-8.

    Bytes are decoded incrementally, so a multi-byte character split across two reads is
    decoded whole; invalid bytes become U+FFFD. Once ``limit`` characters are kept, further
    bytes are dropped without decoding, so memory stays bounded however much is fed. The cut
    is made in decoded characters, so it never falls inside a multi-byte sequence.
    """

    def __init__(self, limit: int) -> None:
        if limit < 0:
            raise ValueError("limit must not be negative")
        self._limit = limit
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._parts: list[str] = []
        self._size = 0
        self._finished: str | None = None

    @property
    def size(self) -> int:
        """Number of characters kept so far."""
        return self._size

    @property
    def full(self) -> bool:
        """True once ``limit`` characters are kept; later input is discarded."""
        return self._size >= self._limit

    def feed(self, data: bytes) -> None:
        """Add a chunk of raw bytes."""
        if self._finished is not None:
            raise RuntimeError("feed() after finish()")
        if self.full:
            return
        self._keep(self._decoder.decode(data))

    def finish(self) -> str:
        """Flush the decoder (a dangling partial sequence becomes U+FFFD) and return the text."""
        if self._finished is None:
            if not self.full:
                self._keep(self._decoder.decode(b"", final=True))
            self._finished = "".join(self._parts)
            self._parts = []
        return self._finished

    def _keep(self, text: str) -> None:
        room = self._limit - self._size
        if len(text) > room:
            text = text[:room]
        if text:
            self._parts.append(text)
            self._size += len(text)
