"""The images of a scenario call as cell outputs: one ``display_data`` each, and back.

Each image becomes a ``display_data`` output holding the image under its MIME type (base64
for the raster types, the document itself for SVG, as nbformat stores them) and its alt text
as ``text/plain``, so Jupyter shows the picture and a text-only reader the description. Its
``metadata`` gives the size under the MIME type (the Jupyter convention front ends size the
picture by) and, under ``lemon``, the image's metadata: what a later run compares (MIME type,
size, alt text, place among the ``text()`` blocks; never the bytes, which differ between
matplotlib and zlib versions for the same picture).
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from typing import Any

from nbformat import NotebookNode
from nbformat.v4 import new_output

from lemon_exec.images import ImageBlock
from lemon_exec.notebooks.options import METADATA_KEY

__all__ = ["IMAGE_OUTPUT", "image_metadata", "image_outputs", "stored_images"]

#: The ``metadata.lemon.output`` value of an image output.
IMAGE_OUTPUT = "image"

_SVG = "image/svg+xml"


def image_metadata(image: ImageBlock) -> dict[str, Any]:
    """The comparable description of one image (its record in ``CallRecord.record()``):
    its length is left out, since the same chart's bytes differ between library versions."""
    return {key: value for key, value in image.metadata().items() if key != "bytes"}


def image_outputs(
    images: Sequence[ImageBlock], described: Sequence[Mapping[str, Any]]
) -> list[NotebookNode]:
    """One ``display_data`` output per image, in the order the script showed them.

    ``described`` is each image's metadata as the record being written holds it (normalised
    or not); the pictures are ``images``.
    """
    outputs: list[NotebookNode] = []
    for image, meta in zip(images, described, strict=True):
        if image.mime_type == _SVG:
            payload = image.data.decode("utf-8", errors="replace")
        else:
            payload = base64.b64encode(image.data).decode("ascii")
        size = {key: value for key in ("width", "height") if (value := meta.get(key)) is not None}
        metadata: dict[str, Any] = {METADATA_KEY: {"output": IMAGE_OUTPUT, "image": dict(meta)}}
        if size:
            metadata[image.mime_type] = size
        outputs.append(
            new_output(
                "display_data",
                data={image.mime_type: payload, "text/plain": _plain(meta)},
                metadata=metadata,
            )
        )
    return outputs


def stored_images(cell: NotebookNode) -> list[dict[str, Any]]:
    """The image metadata a cell's outputs hold (as :func:`image_outputs` wrote it)."""
    found: list[dict[str, Any]] = []
    for output in cell.get("outputs") or []:
        marker = (output.get("metadata") or {}).get(METADATA_KEY) or {}
        if marker.get("output") == IMAGE_OUTPUT and isinstance(marker.get("image"), Mapping):
            found.append(dict(marker["image"]))
    return found


def _plain(meta: Mapping[str, Any]) -> str:
    """The alt text, else what the image is (``<image/png 640x480>``)."""
    alt = meta.get("alt")
    if alt:
        return str(alt)
    width, height = meta.get("width"), meta.get("height")
    size = f" {width}x{height}" if width is not None and height is not None else ""
    return f"<{meta.get('mime_type')}{size}>"
