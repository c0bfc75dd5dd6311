"""The public value type of one image a script showed: :class:`ImageBlock`.

A script shows an image with the pre-imported ``image()`` helper (or IPython's ``display()``
of an object with an image MIME bundle); the host checks it, charges it to the run's image
budget and keeps it on :attr:`ExecuteCodeResult.images <lemon_exec.ExecuteCodeResult>`, in
the order shown. Like ``result.py``, this module imports nothing from the host side.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any

__all__ = ["ImageBlock"]


@dataclass(frozen=True)
class ImageBlock:
    """One image of a result: its bytes, what they are, and where it stands among the text."""

    #: The MIME type, as checked from the bytes themselves (``image/png``, ``image/jpeg``,
    #: ``image/gif``, ``image/webp`` or ``image/svg+xml``), never as the script claimed it.
    mime_type: str
    data: bytes
    #: The script's description of the image (``image(..., alt=...)``), for the model.
    alt: str | None = None
    width: int | None = None
    height: int | None = None
    #: How many ``text()`` blocks the script had sent before this image: its place among them.
    after_text_blocks: int = 0

    def metadata(self) -> dict[str, Any]:
        """Everything but the bytes: what the MCP server's structured content and the
        notebook scenarios record of an image (``bytes`` is the data's length)."""
        return {
            "mime_type": self.mime_type,
            "width": self.width,
            "height": self.height,
            "alt": self.alt,
            "bytes": len(self.data),
            "after_text_blocks": self.after_text_blocks,
        }

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: ``data`` base64-encoded (standard alphabet, padded)."""
        return {
            "mime_type": self.mime_type,
            "data": base64.b64encode(self.data).decode("ascii"),
            "alt": self.alt,
            "width": self.width,
            "height": self.height,
            "after_text_blocks": self.after_text_blocks,
        }
