"""The MCP form of a result's images: ``ImageContent`` blocks, and their metadata.

The blocks follow the one text block (the spec's text stays first and unchanged), in the
order the script showed the images. ``structuredContent`` carries only each image's
metadata, never its bytes: clients that hand the model the structured object (pydantic-ai
when every block is text, the OpenAI Agents SDK with ``use_structured_content``) would
otherwise put megabytes of base64 into the model's text.
"""

from __future__ import annotations

import base64
from typing import Any

from mcp_types import ImageContent

from lemon_exec.images import ImageBlock

__all__ = ["IMAGES_OUTPUT_SCHEMA", "image_content", "image_metadata"]

#: ``structuredContent.images`` in execute_code's output schema (present only with images).
IMAGES_OUTPUT_SCHEMA: dict[str, Any] = {
    "type": "array",
    "description": "Metadata of the images the script showed, in order; the images "
    "themselves are the image blocks of content, in the same order.",
    "items": {
        "type": "object",
        "properties": {
            "mime_type": {"type": "string"},
            "width": {"type": ["integer", "null"]},
            "height": {"type": ["integer", "null"]},
            "alt": {"type": ["string", "null"]},
            "bytes": {"type": "integer", "description": "Size of the image data."},
            "after_text_blocks": {
                "type": "integer",
                "description": "How many text() blocks the script had sent before it.",
            },
        },
        "required": ["mime_type", "width", "height", "alt", "bytes", "after_text_blocks"],
    },
}


def image_content(image: ImageBlock) -> ImageContent:
    """One ``ImageContent`` block: base64 data (standard alphabet, padded) and its MIME type."""
    data = base64.b64encode(image.data).decode("ascii")
    return ImageContent(type="image", data=data, mime_type=image.mime_type)


def image_metadata(image: ImageBlock) -> dict[str, Any]:
    """What ``structuredContent.images`` says of one image: everything but the bytes."""
    return image.metadata()
