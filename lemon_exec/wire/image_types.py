"""What an image's bytes are, by their content: the MIME type and the pixel size.

The host checks every image a script shows by its magic bytes (docs/comm-protocol.md §6,
``image``), never by the type the script claimed, and reads its width and height from the
format's header, without decoding it (no Pillow). SVG is untrusted XML text: it is sniffed
(UTF-8, an optional prolog, then an ``<svg`` root) and its root tag's ``width``/``height``
(else ``viewBox``) are read with a regular expression; nothing else of it is ever parsed.

Standard library only: the kernel side imports it too (``image()`` outside a host run shows
the image inline, under its sniffed type).
"""

from __future__ import annotations

import re
import struct

__all__ = ["MIME_TYPES", "dimensions", "sniff"]

PNG = "image/png"
JPEG = "image/jpeg"
GIF = "image/gif"
WEBP = "image/webp"
SVG = "image/svg+xml"
MIME_TYPES = (PNG, JPEG, GIF, WEBP, SVG)

_PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
#: How far into an SVG the root element may start (after the XML prolog), and the longest
#: root tag read for its dimensions: a sniff, never a parse.
_SVG_HEAD_BYTES = 64 * 1024
_SVG_TAG_BYTES = 8 * 1024
# The prolog: whitespace, the XML declaration, comments, processing instructions, a doctype
# without an internal subset. Anything else before the root means "not an SVG".
_SVG_PROLOG = re.compile(
    r"(?:\s+|<\?[^>]{0,4096}\?>|<!--.{0,8192}?-->|<!DOCTYPE\s[^\[>]{0,4096}>)*", re.DOTALL
)
_SVG_ROOT = re.compile(r"<svg(?=[\s/>])")
_SVG_ATTR = re.compile(r"""\s(width|height|viewBox)\s*=\s*(?:"([^"]*)"|'([^']*)')""")
_SVG_LENGTH = re.compile(r"\s*([0-9]+(?:\.[0-9]*)?)\s*(px)?\s*$")
#: SOF markers (frame headers) that carry a JPEG's size: C0-CF but DHT, JPG and DAC.
_JPEG_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}


def sniff(data: bytes) -> str | None:
    """The MIME type of ``data`` by its content, or None when it is none of the five."""
    if data.startswith(_PNG_MAGIC):
        return PNG
    if data.startswith(b"\xff\xd8\xff"):
        return JPEG
    if data[:6] in (b"GIF87a", b"GIF89a"):
        return GIF
    if len(data) >= 16 and data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return WEBP
    if _svg_root(data) is not None:
        return SVG
    return None


def dimensions(data: bytes, mime: str) -> tuple[int, int] | None:
    """``(width, height)`` in pixels from the header of a ``mime`` image, or None if unknown."""
    try:
        if mime == PNG:
            return _png_size(data)
        if mime == GIF:
            return struct.unpack_from("<HH", data, 6) if len(data) >= 10 else None
        if mime == JPEG:
            return _jpeg_size(data)
        if mime == WEBP:
            return _webp_size(data)
        if mime == SVG:
            return _svg_size(data)
    except struct.error:
        return None
    return None


def _png_size(data: bytes) -> tuple[int, int] | None:
    if len(data) < 24 or data[12:16] != b"IHDR":
        return None
    width, height = struct.unpack_from(">II", data, 16)
    return width, height


def _jpeg_size(data: bytes) -> tuple[int, int] | None:
    at = 2
    end = len(data)
    while at + 4 <= end:
        if data[at] != 0xFF:
            return None
        marker = data[at + 1]
        if marker == 0xFF:  # fill byte
            at += 1
            continue
        if marker in (0x01, *range(0xD0, 0xD8)):  # standalone markers: no length
            at += 2
            continue
        (length,) = struct.unpack_from(">H", data, at + 2)
        if marker in _JPEG_SOF:
            height, width = struct.unpack_from(">HH", data, at + 5)
            return width, height
        if marker == 0xDA:  # start of scan before any frame header
            return None
        at += 2 + length
    return None


def _webp_size(data: bytes) -> tuple[int, int] | None:
    chunk = data[12:16]
    if chunk == b"VP8 " and data[23:26] == b"\x9d\x01\x2a":
        width, height = struct.unpack_from("<HH", data, 26)
        return width & 0x3FFF, height & 0x3FFF
    if chunk == b"VP8L" and len(data) >= 25 and data[20] == 0x2F:
        (bits,) = struct.unpack_from("<I", data, 21)
        return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    if chunk == b"VP8X" and len(data) >= 30:
        width = int.from_bytes(data[24:27], "little") + 1
        height = int.from_bytes(data[27:30], "little") + 1
        return width, height
    return None


def _svg_root(data: bytes) -> str | None:
    """The text of an SVG's root tag (up to ``_SVG_TAG_BYTES``), or None if not an SVG."""
    head = data[:_SVG_HEAD_BYTES].removeprefix(b"\xef\xbb\xbf")
    if head.lstrip()[:1] != b"<":
        return None
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError as exc:
        if exc.start < len(head) - 3:  # not just a character cut at the head's end
            return None
        text = head[: exc.start].decode("utf-8")
    prolog = _SVG_PROLOG.match(text)
    start = prolog.end() if prolog is not None else 0
    if _SVG_ROOT.match(text, start) is None:
        return None
    return text[start : start + _SVG_TAG_BYTES].split(">", 1)[0]


def _svg_size(data: bytes) -> tuple[int, int] | None:
    tag = _svg_root(data)
    if tag is None:
        return None
    attrs: dict[str, str] = {}
    for match in _SVG_ATTR.finditer(tag):
        attrs.setdefault(match[1], match[2] if match[2] is not None else match[3])
    width, height = _svg_length(attrs.get("width")), _svg_length(attrs.get("height"))
    if width is not None and height is not None:
        return width, height
    box = attrs.get("viewBox", "").replace(",", " ").split()
    if len(box) == 4:
        try:
            box_w, box_h = float(box[2]), float(box[3])
        except ValueError:
            return None
        if 0 < box_w < 2**31 and 0 < box_h < 2**31:
            return round(box_w), round(box_h)
    return None


def _svg_length(value: str | None) -> int | None:
    """A plain or ``px`` length as whole pixels (percentages, ems and the like: unknown)."""
    if value is None:
        return None
    match = _SVG_LENGTH.match(value)
    if match is None:
        return None
    number = float(match[1])
    return round(number) if 0 < number < 2**31 else None
