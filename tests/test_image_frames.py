"""The image channel's pieces without a kernel: sniffing by content, pixel sizes from headers,
the host's checks of image frames (authentication, numbering, buffers, budgets, forged
types), downscaling and its notes, and image frames through the signed wire messages.

End to end with real kernels (charts, files, display(), timeouts, sessions) is in
``test_images.py``.
"""

from __future__ import annotations

import asyncio
import io
from pathlib import Path
from typing import Any

import pytest
from jupyter_client.session import Session
from PIL import Image

from lemon_exec.host.cell import image_scale
from lemon_exec.host.cell.host_bridge import BridgeLimits, HostBridge
from lemon_exec.tools import ToolHost, default_registry
from lemon_exec.wire import image_types, jupyter_messages, protocol
from lemon_exec.wire.frame_fields import bad_fields

pytestmark = pytest.mark.timeout(30)


def encoded(fmt: str, size: tuple[int, int] = (30, 20), mode: str = "RGB", **save: Any) -> bytes:
    buffer = io.BytesIO()
    colour = (255, 0, 0, 128) if mode == "RGBA" else "red"  # half transparent: alpha stays
    Image.new(mode, size, colour).save(buffer, format=fmt, **save)
    return buffer.getvalue()


SVG = b'<svg xmlns="http://www.w3.org/2000/svg" width="120" height="80"><rect/></svg>'


# -- sniffing and sizes ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fmt", "mime", "save"),
    [
        ("PNG", "image/png", {}),
        ("JPEG", "image/jpeg", {}),
        ("JPEG", "image/jpeg", {"progressive": True}),
        ("GIF", "image/gif", {}),
        ("WEBP", "image/webp", {}),
        ("WEBP", "image/webp", {"lossless": True}),
    ],
)
def test_raster_types_and_sizes_come_from_the_bytes(
    fmt: str, mime: str, save: dict[str, Any]
) -> None:
    data = encoded(fmt, (301, 17), **save)
    assert image_types.sniff(data) == mime
    assert image_types.dimensions(data, mime) == (301, 17)


def test_webp_with_alpha_has_an_extended_header() -> None:
    data = encoded("WEBP", (64, 9), mode="RGBA")
    assert data[12:16] == b"VP8X"
    assert image_types.dimensions(data, "image/webp") == (64, 9)


@pytest.mark.parametrize(
    ("svg", "size"),
    [
        (SVG, (120, 80)),
        (b'\xef\xbb\xbf<?xml version="1.0"?>\n<!-- a comment -->\n' + SVG, (120, 80)),
        (b'<!DOCTYPE svg PUBLIC "-//W3C//DTD SVG 1.1//EN" "x.dtd">' + SVG, (120, 80)),
        (b"<svg width='10px' height=\"5.6\"/>", (10, 6)),
        (b'<svg viewBox="0 0 300 150" width="100%"></svg>', (300, 150)),
        (b"<svg>\n</svg>", None),
    ],
)
def test_svg_is_sniffed_and_its_size_read_from_the_root_tag(
    svg: bytes, size: tuple[int, int] | None
) -> None:
    assert image_types.sniff(svg) == "image/svg+xml"
    assert image_types.dimensions(svg, "image/svg+xml") == size


@pytest.mark.parametrize(
    "data",
    [
        b"hello",
        b"",
        b"<html><body><svg width='1' height='1'/></body></html>",
        b'<?xml version="1.0"?><root/>',
        b"<svgx/>",
        # An internal DTD subset (entity declarations) is not a prolog this sniffs past.
        b'<!DOCTYPE svg [<!ENTITY a "aaaa">]><svg>&a;</svg>',
        b"\xff\xfe<\x00s\x00v\x00g\x00",
        b"\x89PNG\r\n",
    ],
)
def test_anything_else_is_no_image(data: bytes) -> None:
    assert image_types.sniff(data) is None


def test_a_truncated_header_has_no_size() -> None:
    png = encoded("PNG")
    assert image_types.dimensions(png[:20], "image/png") is None
    assert image_types.dimensions(encoded("JPEG")[:30], "image/jpeg") is None
    assert image_types.dimensions(b"GIF89a\x01", "image/gif") is None


def test_image_frame_fields() -> None:
    frame = protocol.image_frame(1, "t", 10, "image/png", "a chart")
    assert bad_fields(protocol.IMAGE, frame) == []
    assert bad_fields(protocol.IMAGE, protocol.image_frame(1, "t", 0, None, None)) == []
    assert bad_fields(protocol.IMAGE, {**frame, "bytes": -1}) == ["bytes"]
    assert bad_fields(protocol.IMAGE, {**frame, "bytes": True}) == ["bytes"]
    assert bad_fields(protocol.IMAGE, {**frame, "n": 0}) == ["n"]
    assert bad_fields(protocol.IMAGE, {**frame, "mime": 1}) == ["mime"]
    assert bad_fields(protocol.IMAGE, {**frame, "extra": 1}) == ["extra"]
    assert protocol.reply_target(protocol.image_reply(3)) == (protocol.IMAGE, 3, False)


def test_image_bytes_travel_as_an_unsigned_buffer_after_the_signed_content() -> None:
    session = Session(key=b"k" * 32)
    png = encoded("PNG")
    content = jupyter_messages.comm_content(
        "c" * 32, protocol.image_frame(1, "t", len(png), None, None)
    )
    frames = jupyter_messages.pack_signed(session, "comm_msg", content, buffers=(png,))
    msg = jupyter_messages.unpack_signed(session, frames)
    assert msg["buffers"] == [png]
    assert msg["content"]["data"]["bytes"] == len(png)
    # jupyter_client reads the same message the same way.
    assert session.deserialize(frames[1:])["buffers"][0].tobytes() == png
    assert "buffers" not in jupyter_messages.unpack_signed(
        session, jupyter_messages.pack_signed(session, "comm_msg", content)
    )


# -- the host's checks -----------------------------------------------------------------------


class Host:
    """A HostBridge whose replies are collected (no kernel: frames are handed in directly)."""

    def __init__(self, spill: Path | None = None, **limits: int) -> None:
        self.replies: list[dict[str, Any]] = []
        self.bridge = HostBridge(
            tool_host=ToolHost(default_registry()),
            enabled_tools=(),
            cwd=Path("."),
            limits=BridgeLimits(
                max_calls=10, max_result_bytes=1000, max_text_bytes=1000, max_parallel=2, **limits
            ),
            send_reply=self.replies.append,
            spill_dir=spill,
        )
        self.n = 0

    def show(self, data: bytes, mime: str | None = None, **frame: Any) -> dict[str, Any]:
        self.n += 1
        base = protocol.image_frame(self.n, self.bridge.token, len(data), mime, None)
        self.bridge.handle({**base, **frame}, [data])
        return self.replies[-1]


def run_in_loop(body: Any) -> Any:
    async def main() -> Any:
        return body()

    return asyncio.run(main())


def test_an_accepted_image_is_kept_in_its_place_among_the_text_blocks() -> None:
    def body() -> None:
        host = Host()
        png, jpeg = encoded("PNG", (5, 4)), encoded("JPEG")
        assert host.show(png, "image/png", alt="x" * 2000) == {
            "comm_id": host.bridge.comm_id,
            "image": 1,
            "ok": True,
        }
        host.bridge.text_blocks.append("a block")
        assert host.show(jpeg)["ok"] is True  # no claimed type: the bytes say what it is
        first, second = host.bridge.images.blocks
        assert (first.mime_type, first.width, first.height) == ("image/png", 5, 4)
        assert first.after_text_blocks == 0 and second.after_text_blocks == 1
        assert first.alt == "x" * protocol.IMAGE_ALT_MAX_BYTES
        assert second.mime_type == "image/jpeg" and second.data == jpeg
        assert host.bridge.images.stats.details() == {
            "images": 2,
            "image_bytes": len(png) + len(jpeg),
        }

    run_in_loop(body)


def test_forged_unknown_and_malformed_images_are_refused() -> None:
    def body() -> None:
        host = Host()
        png = encoded("PNG")
        forged = host.show(png, "image/jpeg")
        assert forged["ok"] is False
        assert forged["error"] == protocol.IMAGE_MISMATCH.format(
            actual="image/png", claimed="image/jpeg"
        )
        unknown = host.show(b"just text", "image/png")
        assert unknown["error"].startswith("image() data is not a PNG, JPEG, GIF, WebP or SVG")
        assert "given as image/png" in unknown["error"]
        assert host.show(png, bytes=len(png) + 1)["error"] == protocol.IMAGE_MALFORMED
        truncated = host.show(png[:20])
        assert truncated["error"] == protocol.IMAGE_BAD_HEADER.format(actual="image/png")
        # A wrong token is refused before anything else and counted as denied.
        assert host.show(png, token="x" * 43)["error"] == protocol.AUTH_FAILED
        assert host.bridge.stats.denied == 1
        host.n -= 1  # a forged frame uses no number up
        # Every answered number is used up; a replay and a gap are refused.
        assert host.show(png)["ok"] is True
        host.n = 1
        assert host.show(png)["error"] == protocol.REPLAYED
        host.n = 10
        assert host.show(png)["error"] == protocol.OUT_OF_ORDER
        assert len(host.bridge.images.blocks) == 1
        # A malformed frame is consumed without a reply.
        before = len(host.replies)
        host.bridge.handle({"type": "image", "token": host.bridge.token, "n": "1"}, [png])
        assert len(host.replies) == before

    run_in_loop(body)


def test_budgets_refuse_later_images_and_keep_earlier_ones() -> None:
    def body() -> None:
        png = encoded("PNG")
        counted = Host(max_images=2)
        assert [counted.show(png)["ok"] for _ in range(2)] == [True, True]
        assert counted.show(png)["error"] == protocol.IMAGE_COUNT_BUDGET.format(limit=2)
        assert len(counted.bridge.images.blocks) == 2

        sized = Host(max_image_bytes=len(png) * 2 + 1)
        assert sized.show(png)["ok"] and sized.show(png)["ok"]
        refused = sized.show(png)
        assert refused["error"] == protocol.IMAGE_BYTES_BUDGET.format(
            size=len(png), remaining=1, limit=len(png) * 2 + 1
        )
        small = encoded("GIF", (1, 1))
        assert len(small) > 1 and sized.show(small)["ok"] is False
        assert sized.bridge.images.stats.image_bytes == 2 * len(png)

    run_in_loop(body)


def test_a_large_image_is_downscaled_and_its_original_kept(tmp_path: Path) -> None:
    async def body() -> Host:
        host = Host(spill=tmp_path, max_image_edge=100)
        big = encoded("PNG", (400, 100))
        host.bridge.handle(protocol.image_frame(1, host.bridge.token, len(big), None, None), [big])
        assert host.replies == []  # answered once the downscale is done
        deadline = asyncio.get_running_loop().time() + 10
        while not host.replies:
            assert asyncio.get_running_loop().time() < deadline
            await asyncio.sleep(0.01)
        assert host.replies[-1]["ok"] is True
        assert host.bridge.images.blocks[0].data != big
        return host

    host = asyncio.run(body())
    [block] = host.bridge.images.blocks
    assert (block.mime_type, block.width, block.height) == ("image/png", 100, 25)
    assert image_types.dimensions(block.data, "image/png") == (100, 25)
    details = host.bridge.images.stats.details()
    assert details["images_downscaled"] == 1
    [original] = details["image_originals"]
    assert Path(original).parent == tmp_path
    assert Path(original).name.startswith("lemon-exec-output-image-")
    assert Path(original).stat().st_mode & 0o777 == 0o600
    assert image_types.dimensions(Path(original).read_bytes(), "image/png") == (400, 100)


def test_without_pillow_a_large_image_is_kept_with_a_note(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(image_scale, "pillow_available", lambda: False)

    def body() -> Host:
        host = Host(max_image_edge=100)
        big = encoded("PNG", (400, 100))
        assert host.show(big)["ok"] is True
        return host

    host = run_in_loop(body)
    assert host.bridge.images.blocks[0].width == 400
    [note] = host.bridge.images.stats.details()["image_notes"]
    assert "not downscaled to max_image_edge 100: Pillow is not installed" in note


def test_svg_and_a_zero_edge_are_never_scaled() -> None:
    def body() -> None:
        host = Host(max_image_edge=10)
        assert host.show(SVG)["ok"] is True
        assert host.bridge.images.blocks[0].data == SVG
        unlimited = Host(max_image_edge=0)
        big = encoded("PNG", (400, 100))
        assert unlimited.show(big)["ok"] is True
        assert unlimited.bridge.images.blocks[0].data == big
        assert "image_notes" not in unlimited.bridge.images.stats.details()

    run_in_loop(body)


def test_a_header_claiming_too_many_pixels_is_never_decoded() -> None:
    assert image_scale.cannot_scale(10_000, 10_000) is not None
    assert image_scale.cannot_scale(1000, 1000) is None
