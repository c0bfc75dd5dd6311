"""The host's image channel: check, charge and keep the images a script shows.

An ``image`` frame (docs/comm-protocol.md §4) carries its bytes as the message's one binary
buffer. :class:`ImageFrames` takes each one after the host bridge authenticated it: its
number must be the next, its buffer the size the frame states, its type the one its magic
bytes say (a claimed type that differs is refused, never believed), and it must fit the
run's budgets (``max_images``, ``max_image_bytes``: the bytes as sent). An accepted image is
kept as an :class:`~lemon_exec.images.ImageBlock`, in its place among the text() blocks, and
answered at once: write-through, so images shown before a timeout are in the result.

An image whose longer edge is over ``max_image_edge`` is downscaled with Pillow
(:mod:`.image_scale`) in a worker thread, and answered when that is done; its original is
kept in the spill directory. Without Pillow (an optional extra) it is kept as it is, and the
result's details say so. SVG is untrusted text: only sniffed and its size read, never scaled.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from lemon_exec.details import Details
from lemon_exec.host.cell import image_scale
from lemon_exec.images import ImageBlock
from lemon_exec.wire import image_types, protocol, text_budget
from lemon_exec.wire.frame_fields import bad_fields

log = logging.getLogger(__name__)

#: Defaults of the settings of the same names (lemon_exec.config).
DEFAULT_MAX_IMAGES = 8
DEFAULT_MAX_IMAGE_BYTES = 5 * 2**20
DEFAULT_MAX_IMAGE_EDGE = 1568


@dataclass(frozen=True)
class ImageLimits:
    max_images: int = DEFAULT_MAX_IMAGES
    #: Total bytes of images per run, as the script sent them (before any downscaling).
    max_image_bytes: int = DEFAULT_MAX_IMAGE_BYTES
    #: Longest edge in pixels an image keeps; longer ones are downscaled. 0: never.
    max_image_edge: int = DEFAULT_MAX_IMAGE_EDGE


@dataclass
class ImageStats:
    """The image accounting of one cell, reported in the result's details."""

    images: int = 0
    image_bytes: int = 0
    downscaled: int = 0
    originals: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def details(self) -> Details:
        if not self.images:
            return {}
        out: Details = {"images": self.images, "image_bytes": self.image_bytes}
        if self.downscaled:
            out["images_downscaled"] = self.downscaled
        if self.originals:
            out["image_originals"] = list(self.originals)
        if self.notes:
            out["image_notes"] = list(self.notes)
        return out


class ImageFrames:
    """One cell's images: :meth:`take` each authenticated frame, :meth:`close` at the end."""

    def __init__(
        self,
        limits: ImageLimits,
        spill_dir: Path | None,
        reply: Callable[[dict[str, Any]], None],
    ) -> None:
        self.limits = limits
        self.stats = ImageStats()
        #: The images kept, in the order shown.
        self.blocks: list[ImageBlock] = []
        self._spill_dir = spill_dir
        self._reply = reply
        self._next = 1  # the number the next image must carry
        self._scaling: dict[int, asyncio.Future[Any]] = {}  # block index -> its downscale
        self._closed = False

    def take(self, data: dict[str, Any], buffers: Sequence[bytes], text_blocks: int) -> None:
        """Check, charge and keep one image frame (authenticated by the caller), and answer it.

        ``text_blocks``: how many text() blocks the host has accepted so far (its place).
        """
        if bad_fields(protocol.IMAGE, data):
            return  # malformed: consumed, not counted (the kernel never sends one)
        if text_budget.frame_size(data) > protocol.FRAME_CAP_BYTES:
            return
        n: int = data["n"]
        if n != self._next:
            error = protocol.REPLAYED if n < self._next else protocol.OUT_OF_ORDER
            self._reply(protocol.image_reply(n, error))
            return
        self._next = n + 1  # answered either way: a refused image uses its number up
        error, block = self._check(data, buffers, text_blocks)
        if block is None:
            self._reply(protocol.image_reply(n, error))
            return
        self.stats.images += 1
        self.stats.image_bytes += len(block.data)
        self.blocks.append(block)
        if not self._start_downscale(n, len(self.blocks) - 1):
            self._reply(protocol.image_reply(n))

    def _check(
        self, data: dict[str, Any], buffers: Sequence[bytes], text_blocks: int
    ) -> tuple[str, ImageBlock | None]:
        """The block an image frame makes, or the error it is refused with."""
        if len(buffers) != 1 or len(buffers[0]) != data["bytes"]:
            return protocol.IMAGE_MALFORMED, None
        raw = bytes(buffers[0])
        limits = self.limits
        if self.stats.images >= limits.max_images:
            return protocol.IMAGE_COUNT_BUDGET.format(limit=limits.max_images), None
        remaining = limits.max_image_bytes - self.stats.image_bytes
        if len(raw) > remaining:
            return protocol.IMAGE_BYTES_BUDGET.format(
                size=len(raw), remaining=remaining, limit=limits.max_image_bytes
            ), None
        claimed = data.get("mime")
        actual = image_types.sniff(raw)
        if actual is None:
            given = f" (it was given as {claimed})" if claimed else ""
            return protocol.IMAGE_UNKNOWN.format(claimed=given), None
        if claimed is not None and claimed != actual:
            return protocol.IMAGE_MISMATCH.format(actual=actual, claimed=claimed), None
        size = image_types.dimensions(raw, actual)
        if actual != image_types.SVG and (size is None or 0 in size):
            return protocol.IMAGE_BAD_HEADER.format(actual=actual), None
        alt = data.get("alt")
        if alt is not None:
            alt = text_budget.truncate_utf8(
                text_budget.normalize_text(alt), protocol.IMAGE_ALT_MAX_BYTES
            )
        width, height = size if size is not None else (None, None)
        return "", ImageBlock(actual, raw, alt, width, height, text_blocks)

    # -- downscaling -----------------------------------------------------------------------

    def _start_downscale(self, n: int, index: int) -> bool:
        """Start downscaling block ``index`` when it is over the edge; False if it is not."""
        block = self.blocks[index]
        edge = self.limits.max_image_edge
        if not edge or block.mime_type == image_types.SVG or block.width is None:
            return False
        assert block.height is not None
        if max(block.width, block.height) <= edge:
            return False
        why_not = image_scale.cannot_scale(block.width, block.height)
        if why_not is not None:
            self.stats.notes.append(
                f"image {index + 1} ({block.width}x{block.height}) was kept at full size, "
                f"not downscaled to max_image_edge {edge}: {why_not}"
            )
            return False
        loop = asyncio.get_running_loop()
        future = loop.run_in_executor(
            None, image_scale.downscale, block.data, block.mime_type, edge
        )
        self._scaling[index] = future
        future.add_done_callback(lambda done: self._downscaled(n, index, done))
        return True

    def _downscaled(self, n: int, index: int, done: asyncio.Future[Any]) -> None:
        self._scaling.pop(index, None)
        if self._closed:
            return  # close() noted it; the original stays in the result
        original = self.blocks[index]
        scaled: image_scale.Scaled | None = None
        if not done.cancelled():
            if done.exception() is not None:
                log.warning("image downscale failed", exc_info=done.exception())
            else:
                scaled = done.result()
        if scaled is None:
            self.stats.notes.append(
                f"image {index + 1} ({original.width}x{original.height}) was kept at full "
                "size: Pillow could not read it to downscale it"
            )
        else:
            self.blocks[index] = replace(
                original,
                mime_type=scaled.mime_type,
                data=scaled.data,
                width=scaled.width,
                height=scaled.height,
            )
            self.stats.downscaled += 1
            path = image_scale.keep_original(self._spill_dir, original.data, original.mime_type)
            if path is not None:
                self.stats.originals.append(str(path))
        self._reply(protocol.image_reply(n))

    def close(self) -> None:
        """The cell ended: downscales still running are abandoned (the originals stay)."""
        self._closed = True
        for index in sorted(self._scaling):
            block = self.blocks[index]
            self.stats.notes.append(
                f"image {index + 1} ({block.width}x{block.height}) was kept at full size: "
                "the run ended before it was downscaled"
            )
        self._scaling.clear()
