"""Small real images for the front-door tests (PNG built with the standard library)."""

from __future__ import annotations

import struct
import zlib

from lemon_exec import ExecuteCodeResult
from lemon_exec.details import Details
from lemon_exec.images import ImageBlock

#: An SVG document, as a script could show it.
SVG = (
    b'<svg xmlns="http://www.w3.org/2000/svg" width="4" height="3">'
    b'<rect width="4" height="3"/></svg>'
)


def png(width: int, height: int, rgb: tuple[int, int, int] = (200, 30, 30)) -> bytes:
    """A valid ``width`` x ``height`` RGB PNG filled with one colour."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return (
            struct.pack(">I", len(body))
            + kind
            + body
            + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)
        )

    row = b"\x00" + bytes(rgb) * width
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
        + chunk(b"IDAT", zlib.compress(row * height))
        + chunk(b"IEND", b"")
    )


def result_with_images() -> ExecuteCodeResult:
    """A result as the host assembles one: two text blocks, a PNG between them, an SVG after."""
    return ExecuteCodeResult(
        content="Script result (text()):\nfirst\nsecond",
        details=Details(exit_code=0, text_blocks=2),
        images=[
            ImageBlock("image/png", png(3, 2), alt="a red patch", width=3, height=2,
                       after_text_blocks=1),
            ImageBlock("image/svg+xml", SVG, alt=None, width=4, height=3, after_text_blocks=2),
        ],
    )  # fmt: skip
