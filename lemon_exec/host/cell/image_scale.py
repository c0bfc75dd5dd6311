"""Downscaling an image to the run's ``max_image_edge`` with Pillow, and keeping its original.

Pillow is optional (the ``images`` extra): without it images are kept as they are, and the
image channel says so in the result's details. It is imported only when an image needs
scaling. An image is decoded only when its header says it has at most
:data:`MAX_DECODE_PIXELS` pixels, so a small file that claims a huge canvas (a decompression
bomb) is never expanded in the host's memory.
"""

from __future__ import annotations

import importlib.util
import io
import logging
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from lemon_exec._constants import SPILL_PREFIX
from lemon_exec.wire import image_types

log = logging.getLogger(__name__)

#: Largest image (width x height) the host decodes to downscale it: 64 megapixels (256 MiB
#: as RGBA). Larger ones are kept as they are.
MAX_DECODE_PIXELS = 64_000_000

#: What a downscaled image is saved as: its own type, but GIF (its first frame) as PNG.
_SAVE_AS = {
    image_types.PNG: ("PNG", image_types.PNG),
    image_types.JPEG: ("JPEG", image_types.JPEG),
    image_types.WEBP: ("WEBP", image_types.WEBP),
    image_types.GIF: ("PNG", image_types.PNG),
}
_SUFFIX = {
    image_types.PNG: ".png",
    image_types.JPEG: ".jpg",
    image_types.GIF: ".gif",
    image_types.WEBP: ".webp",
    image_types.SVG: ".svg",
}


@dataclass(frozen=True)
class Scaled:
    mime_type: str
    data: bytes
    width: int
    height: int


def pillow_available() -> bool:
    return importlib.util.find_spec("PIL") is not None


def cannot_scale(width: int, height: int) -> str | None:
    """Why an image of this size cannot be downscaled here, or None when it can."""
    if width * height > MAX_DECODE_PIXELS:
        return f"it has more than {MAX_DECODE_PIXELS // 1_000_000} megapixels to decode"
    if not pillow_available():
        return "Pillow is not installed (pip install 'lemon_exec[images]')"
    return None


def downscale(data: bytes, mime_type: str, edge: int) -> Scaled:
    """``data`` with its longer edge cut to ``edge`` pixels (aspect kept); runs in a thread.

    Raises what Pillow raises for an image it cannot read.
    """
    from PIL import Image

    with Image.open(io.BytesIO(data)) as picture:
        if picture.width * picture.height > MAX_DECODE_PIXELS:  # the header lied to sniffing
            raise ValueError("too many pixels to decode")
        picture.draft("RGB", (edge, edge))  # JPEG: decode at a reduced scale directly
        picture.thumbnail((edge, edge), Image.Resampling.LANCZOS)
        pil_format, mime = _SAVE_AS[mime_type]
        out: Image.Image = picture
        if pil_format == "JPEG" and out.mode not in ("RGB", "L", "CMYK"):
            out = out.convert("RGB")
        elif pil_format != "JPEG" and out.mode == "P":
            out = out.convert("RGBA")  # a palette image resampled: keep its colours exact
        buffer = io.BytesIO()
        options = {"quality": 90} if pil_format in ("JPEG", "WEBP") else {}
        out.save(buffer, format=pil_format, **options)
        return Scaled(mime, buffer.getvalue(), out.width, out.height)


def keep_original(spill_dir: Path | None, data: bytes, mime_type: str) -> Path | None:
    """Write a downscaled image's original to a new private file in ``spill_dir``.

    The name has the spill prefix, so the spill reaper removes it with the run's output.
    None when there is no spill directory or the file cannot be written.
    """
    if spill_dir is None:
        return None
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    name = f"{SPILL_PREFIX}image-{secrets.token_hex(8)}{_SUFFIX.get(mime_type, '')}"
    path = spill_dir / name
    try:
        fd = os.open(path, flags | getattr(os, "O_CLOEXEC", 0), 0o600)
        with os.fdopen(fd, "wb") as file:
            file.write(data)
    except OSError as exc:
        log.warning("execute_code: cannot keep an image's original: %s", exc)
        return None
    return path
