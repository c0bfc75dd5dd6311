"""image(): what a script may show as an image, as bytes and the type it claims.

``image(obj, format=None, alt=None)`` takes a matplotlib figure (or ``plt`` for the current
figure, or an Axes for its figure), a PIL image, a path to a PNG/JPEG/GIF/WebP/SVG file (or
SVG text), raw bytes, or any object with an IPython ``_repr_png_``/``_repr_jpeg_``/
``_repr_svg_`` (``IPython.display.Image``). matplotlib and Pillow are never imported here:
an object is one of theirs only if its module is loaded already.

In a script cell, IPython's own ``display()`` of an image MIME bundle (a figure under the
inline backend, ``IPython.display.Image``, ``plt.show()``) goes the same way
(:func:`route_displays`): it is the same channel, so the same budgets, order and checks
apply, and the host sees one kind of image, write-through. Outside a host run (an ordinary
cell in JupyterLab) image() displays the image inline instead.
"""

from __future__ import annotations

import base64
import io
import os
import sys
from typing import Any

from lemon_exec.kernel import cells, script
from lemon_exec.kernel.bridge import ToolError
from lemon_exec.wire import image_types, protocol, text_budget

#: ``format=`` short names and the MIME types they mean.
FORMATS = {
    "png": image_types.PNG,
    "jpeg": image_types.JPEG,
    "jpg": image_types.JPEG,
    "gif": image_types.GIF,
    "webp": image_types.WEBP,
    "svg": image_types.SVG,
}
_SUFFIXES = {f".{name}": mime for name, mime in FORMATS.items()}
#: What a figure or a PIL image is saved as, by MIME type (their own format names).
_SAVE_AS = {
    image_types.PNG: "png",
    image_types.JPEG: "jpeg",
    image_types.GIF: "gif",
    image_types.WEBP: "webp",
    image_types.SVG: "svg",
}
#: IPython display methods tried on other objects, in order, with the type each gives.
_REPRS = (
    ("_repr_png_", image_types.PNG),
    ("_repr_jpeg_", image_types.JPEG),
    ("_repr_svg_", image_types.SVG),
)
#: Image types in a display() bundle, in the order one is picked.
_BUNDLE_ORDER = (
    image_types.PNG,
    image_types.JPEG,
    image_types.WEBP,
    image_types.GIF,
    image_types.SVG,
)
_KINDS = (
    "a matplotlib figure (or plt), a PIL image, a path to a PNG/JPEG/GIF/WebP/SVG file, or bytes"
)


def mime_of(format: str | None) -> str | None:
    """The MIME type ``format=`` names (``"png"``, ``"image/png"``, ...); ToolError if none."""
    if format is None:
        return None
    name = str(format).strip().lower()
    if name in image_types.MIME_TYPES:
        return name
    mime = FORMATS.get(name.removeprefix("image/").removesuffix("+xml"))
    if mime is None:
        raise ToolError(f"image(): unknown format {format!r}; use png, jpeg, gif, webp or svg")
    return mime


def alt_text(alt: object) -> str | None:
    if alt is None:
        return None
    text = text_budget.normalize_text(alt)
    return text_budget.truncate_utf8(text, protocol.IMAGE_ALT_MAX_BYTES)


def to_image(obj: object, format: str | None = None) -> tuple[bytes, str | None]:
    """The bytes of ``obj`` as an image and the type claimed for them (None: the host sniffs).

    Raises ToolError for what cannot be shown (and OSError for a path that cannot be read).
    """
    mime = mime_of(format)
    if isinstance(obj, bytes | bytearray | memoryview):
        return bytes(obj), mime
    if isinstance(obj, str) and obj.lstrip().startswith("<"):
        return obj.encode("utf-8", "replace"), mime or image_types.SVG  # SVG text
    if isinstance(obj, str | os.PathLike):
        return _read_file(os.fspath(obj), mime)
    figure = _figure(obj)
    if figure is not None:
        wanted = mime or image_types.PNG
        return _save(figure.savefig, wanted, "matplotlib", bbox_inches="tight"), wanted
    pil = sys.modules.get("PIL.Image")
    if pil is not None and isinstance(obj, pil.Image):
        wanted = mime or image_types.PNG
        return _save_pil(obj, wanted), wanted
    for method, repr_mime in _REPRS:
        if (mime is None or mime == repr_mime) and callable(getattr(obj, method, None)):
            data = _repr_bytes(getattr(obj, method)())
            if data is not None:
                return data, repr_mime
    raise ToolError(f"image() cannot show a {type(obj).__name__}: pass {_KINDS}")


def _read_file(path: str | bytes, mime: str | None) -> tuple[bytes, str | None]:
    name = os.fsdecode(path)
    with open(path, "rb") as file:
        size = os.fstat(file.fileno()).st_size
        if size > protocol.MAX_IMAGE_BYTES:
            raise ToolError(
                f"image(): {name} is {size} bytes, more than one image may be "
                f"({protocol.MAX_IMAGE_BYTES})"
            )
        data = file.read(protocol.MAX_IMAGE_BYTES + 1)
    suffix = os.path.splitext(name)[1].lower()
    return data, mime or _SUFFIXES.get(suffix)


def _figure(obj: object) -> Any:
    """The matplotlib figure ``obj`` stands for (a Figure, ``plt``, an Axes), else None."""
    figure_module = sys.modules.get("matplotlib.figure")
    if figure_module is None:
        return None
    if obj is sys.modules.get("matplotlib.pyplot"):
        return sys.modules["matplotlib.pyplot"].gcf()
    figure_class = getattr(figure_module, "FigureBase", figure_module.Figure)
    if isinstance(obj, figure_class):
        return obj
    owner = getattr(obj, "figure", None)  # an Axes, an Artist
    if isinstance(owner, figure_class) and not isinstance(obj, type):
        return owner
    return None


def _save(save: Any, mime: str, who: str, **options: Any) -> bytes:
    buffer = io.BytesIO()
    try:
        save(buffer, format=_SAVE_AS[mime], **options)
    except (ValueError, OSError, KeyError) as exc:
        raise ToolError(f"image(): {who} cannot save this image as {mime}: {exc}") from None
    return buffer.getvalue()


def _save_pil(picture: Any, mime: str) -> bytes:
    if mime == image_types.SVG:
        raise ToolError("image(): a PIL image cannot be saved as SVG; use png or jpeg")
    if mime == image_types.JPEG and picture.mode not in ("RGB", "L", "CMYK"):
        picture = picture.convert("RGB")  # JPEG has no alpha channel or palette
    return _save(picture.save, mime, "Pillow")


def _repr_bytes(value: object) -> bytes | None:
    if isinstance(value, tuple) and value:  # (data, metadata)
        value = value[0]
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8", "replace")
    return None


# -- display() of image bundles ----------------------------------------------------------


def image_in_bundle(data: object) -> tuple[bytes, str] | None:
    """The image a display() MIME bundle carries (bytes, type), if it carries one."""
    if not isinstance(data, dict):
        return None
    for mime in _BUNDLE_ORDER:
        payload = data.get(mime)
        if isinstance(payload, bytes):
            return payload, mime
        if isinstance(payload, str):
            if mime == image_types.SVG:
                return payload.encode("utf-8", "replace"), mime
            try:
                return base64.b64decode(payload), mime  # IPython sends the others base64
            except ValueError:
                return None
    return None


def route_displays(shell: Any) -> None:
    """In a script cell, display() of an image shows it as image() does (idempotent).

    Only for the script's own threads while it runs; ordinary cells, and threads of ended
    cells, publish as IPython always does. The rest of such a bundle (its ``text/plain``
    repr) is not published: the image is what was shown.
    """
    publisher = getattr(shell, "display_pub", None)
    if publisher is None or getattr(publisher, "_lemon_routes_images", False):
        return
    publish = publisher.publish

    def routed_publish(data: Any, metadata: Any = None, *args: Any, **kwargs: Any) -> Any:
        bridge = cells.STATE.bridge
        if (
            bridge is not None
            and script.in_script()
            and cells.thread_generation() == bridge.generation
        ):
            found = image_in_bundle(data)
            if found is not None:
                bridge.image(found[0], found[1], None)
                return None
        return publish(data, metadata, *args, **kwargs)

    publisher.publish = routed_publish
    publisher._lemon_routes_images = True


def display_inline(data: bytes, mime: str | None, alt: str | None) -> None:
    """image() without a host run: show the image in the front end (an ordinary cell)."""
    from IPython.display import publish_display_data

    actual = image_types.sniff(data) or mime
    if actual not in image_types.MIME_TYPES:
        raise ToolError(protocol.IMAGE_UNKNOWN.format(claimed=""))
    payload: str = (
        data.decode("utf-8", "replace")
        if actual == image_types.SVG
        else base64.b64encode(data).decode("ascii")
    )
    bundle = {actual: payload, "text/plain": alt or f"<{actual} image, {len(data)} bytes>"}
    publish_display_data(bundle)  # type: ignore[no-untyped-call]
