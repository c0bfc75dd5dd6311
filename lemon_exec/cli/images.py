"""Where ``lemon-exec run`` puts the images a script showed, and the line it prints for each.

By default the images go to the run's spill directory (0700, inside the command's private
staging root, beside the output spill file), each as
``lemon-exec-output-<random>-image-<n>.<ext>``, mode 0600: the spill files' prefix, so they
outlive the command like a spill file does and the spill reaper of a later run removes them
24 hours after they were written. With ``--images-dir DIR`` they go to DIR instead (made if
missing), as ``<script name>-<n>.<ext>`` with the user's usual permissions; a file that is
already there is never replaced: the image takes the next free name (``<name>-<n>-2.<ext>``).

Each saved image is reported on stderr, like ``notify()`` lines, so stdout keeps carrying
exactly the script's output and its result, whatever a caller parses out of it.
"""

from __future__ import annotations

import os
import re
import secrets
from collections.abc import Sequence
from pathlib import Path

from lemon_exec._constants import SPILL_PREFIX
from lemon_exec.images import ImageBlock
from lemon_exec.proc.private_fs import check_private_dir, create_new_file, write_private_file

__all__ = ["describe", "prepare_images_dir", "save_images", "script_stem"]

#: File name extension of each MIME type the host accepts.
_EXTENSIONS = {
    "image/png": "png",
    "image/jpeg": "jpg",
    "image/gif": "gif",
    "image/webp": "webp",
    "image/svg+xml": "svg",
}
#: How many names ``<name>-<n>-<k>.<ext>`` are tried before giving up on one image.
_MAX_ATTEMPTS = 1000


def script_stem(filename: str) -> str:
    """The name images of ``filename`` are called after (``plot.py`` -> ``plot``)."""
    stem = "stdin" if filename == "-" else Path(filename).stem
    # Only what is safe in any file name; a script called "-" or ".py" still gets a name.
    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", stem).strip("._") or "script"
    return stem


def prepare_images_dir(path: str) -> Path:
    """``--images-dir``: the directory, made (with its parents) when missing.

    Raises ``OSError`` when it cannot be made or is not a writable directory, so the command
    can refuse before the script runs.
    """
    directory = Path(path).expanduser()
    directory.mkdir(parents=True, exist_ok=True)
    if not os.access(directory, os.W_OK | os.X_OK):
        raise PermissionError(f"{directory} is not writable")
    return directory.resolve()


def save_images(
    images: Sequence[ImageBlock], directory: Path, *, stem: str, private: bool
) -> list[Path]:
    """Write each image to a new file in ``directory``; return the paths, in order.

    ``private``: ``directory`` is the spill directory; it is checked (0700, ours) first and the
    files are 0600 under the spill prefix. Raises ``OSError`` (or ``RefusedError``) on the
    first image that cannot be written; the ones before it stay.
    """
    paths: list[Path] = []
    if private:
        check_private_dir(directory)
        run = secrets.token_hex(6)
    for n, image in enumerate(images, start=1):
        ext = _EXTENSIONS.get(image.mime_type, "bin")
        if private:
            name = f"{SPILL_PREFIX}{run}-image-{n}.{ext}"
            paths.append(write_private_file(directory, name, image.data))
        else:
            paths.append(_write_new(directory, f"{stem}-{n}", ext, image.data))
    return paths


def describe(n: int, image: ImageBlock, path: Path) -> str:
    """The stderr line of one saved image: ``image 1 (image/png, 640x480, "alt"): PATH``."""
    facts = [image.mime_type]
    if image.width is not None and image.height is not None:
        facts.append(f"{image.width}x{image.height}")
    if image.alt:
        alt = " ".join(image.alt.split())
        facts.append(repr(alt if len(alt) <= 60 else alt[:57] + "..."))
    return f"image {n} ({', '.join(facts)}): {path}"


def _write_new(directory: Path, base: str, ext: str, data: bytes) -> Path:
    """Create a new file ``base.ext`` (else ``base-2.ext``, ...) holding ``data``."""
    for attempt in range(1, _MAX_ATTEMPTS + 1):
        path = directory / (f"{base}.{ext}" if attempt == 1 else f"{base}-{attempt}.{ext}")
        try:
            # An existing file, or a symlink planted at the name, is never written through;
            # the umask gives the user's usual permissions.
            create_new_file(path, data, 0o666)
        except FileExistsError:
            continue
        return path
    raise FileExistsError(f"{directory / base}.{ext} and {_MAX_ATTEMPTS - 1} other names exist")
