"""``lemon-exec run`` and images: where the files go, their modes, no overwrite.

The parts that need no kernel are tested directly; the end-to-end runs (real ``image()``
calls through the real command) are in ``test_images_front_doors.py``.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from support_images import SVG, png

from lemon_exec._constants import SPILL_PREFIX
from lemon_exec.cli.images import describe, prepare_images_dir, save_images, script_stem
from lemon_exec.errors import RefusedError
from lemon_exec.images import ImageBlock

pytestmark = pytest.mark.timeout(30)

IMAGES = [
    ImageBlock("image/png", png(3, 2), alt="a red patch", width=3, height=2),
    ImageBlock("image/svg+xml", SVG, width=4, height=3, after_text_blocks=1),
]


def test_private_images_are_0600_spill_files(tmp_path: Path) -> None:
    spill = tmp_path / "spill"
    spill.mkdir(mode=0o700)
    paths = save_images(IMAGES, spill, stem="plot", private=True)
    assert [p.parent for p in paths] == [spill, spill]
    assert all(p.name.startswith(SPILL_PREFIX) for p in paths)  # the spill reaper's prefix
    assert [p.suffix for p in paths] == [".png", ".svg"]
    assert [p.read_bytes() for p in paths] == [IMAGES[0].data, IMAGES[1].data]
    assert {stat.S_IMODE(p.stat().st_mode) for p in paths} == {0o600}


def test_a_spill_directory_that_is_not_private_is_refused(tmp_path: Path) -> None:
    spill = tmp_path / "spill"
    spill.mkdir(mode=0o755)
    os.chmod(spill, 0o755)
    with pytest.raises(RefusedError):
        save_images(IMAGES, spill, stem="plot", private=True)
    assert list(spill.iterdir()) == []


def test_named_directory_never_replaces_a_file(tmp_path: Path) -> None:
    target = prepare_images_dir(str(tmp_path / "made" / "here"))
    assert target.is_dir()
    (target / "plot-1.png").write_bytes(b"mine")
    (target / "plot-1-2.png").symlink_to(tmp_path / "elsewhere")
    paths = save_images(IMAGES, target, stem="plot", private=False)
    assert [p.name for p in paths] == ["plot-1-3.png", "plot-2.svg"]
    assert (target / "plot-1.png").read_bytes() == b"mine"
    assert not (tmp_path / "elsewhere").exists()  # the planted link was not written through
    assert paths[0].read_bytes() == IMAGES[0].data


def test_an_unusable_images_dir_is_an_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(OSError):
        prepare_images_dir(str(blocker))


@pytest.mark.parametrize(
    ("filename", "stem"),
    [("plot.py", "plot"), ("-", "stdin"), ("dir/my chart.py", "my_chart"), ("...", "script")],
)
def test_script_stem(filename: str, stem: str) -> None:
    assert script_stem(filename) == stem


def test_describe_names_type_size_alt_and_path() -> None:
    line = describe(1, IMAGES[0], Path("/x/plot-1.png"))
    assert line == "image 1 (image/png, 3x2, 'a red patch'): /x/plot-1.png"
    assert describe(2, IMAGES[1], Path("/x/a.svg")) == "image 2 (image/svg+xml, 4x3): /x/a.svg"
