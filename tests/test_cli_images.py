"""``lemon-exec run`` and images: where the files go, their modes, no overwrite.

The parts that need no kernel are tested directly first; then real ``image()`` calls through
the real command.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

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


# --- the real command ----------------------------------------------------------------------------

_BIN = os.path.dirname(sys.executable)
PNG = png(5, 4)
SHOW_PNG = (
    "import base64\n"
    "print('drawn')\n"
    "text('before')\n"
    f"image(base64.b64decode({base64.b64encode(PNG).decode()!r}), format='png', alt='a patch')\n"
    "text('after')\n"
)
#: stdout of SHOW_PNG: the same as it would be without the image.
STDOUT = "drawn\n\nScript result (text()):\nbefore\nafter\n"


@pytest.fixture
def run_cli(tmp_path: Path, leak_watch: Any) -> Callable[..., subprocess.CompletedProcess[str]]:
    """``run_cli(*args, script=...)``: ``lemon-exec run`` in ``tmp_path``, to completion."""

    def _run(*args: str, script: str = SHOW_PNG) -> subprocess.CompletedProcess[str]:
        (tmp_path / "plot.py").write_text(script)
        command = shutil.which("lemon-exec", path=_BIN)
        argv = [command] if command else [sys.executable, "-m", "lemon_exec"]
        env = {k: v for k, v in os.environ.items() if not k.startswith("LEMON_EXECUTE_CODE_")}
        env["PATH"] = _BIN + os.pathsep + env.get("PATH", "")
        proc = subprocess.Popen(
            [*argv, "run", *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd=tmp_path,
        )
        leak_watch.add_pid(proc.pid)
        out, err = proc.communicate(timeout=60)
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)

    return _run


def _saved(stderr: str) -> list[Path]:
    """The paths the command reported on stderr, in order."""
    return [
        Path(line.split("): ", 1)[1])
        for line in stderr.splitlines()
        if line.startswith("lemon-exec: image ")
    ]


@pytest.mark.kernel
def test_images_go_beside_the_spill_files_and_stdout_is_unchanged(
    run_cli: Callable[..., subprocess.CompletedProcess[str]],
) -> None:
    done = run_cli("plot.py")
    assert done.returncode == 0, done.stderr
    assert done.stdout == STDOUT
    (path,) = _saved(done.stderr)
    try:
        assert f"lemon-exec: image 1 (image/png, 5x4, 'a patch'): {path}" in done.stderr
        assert path.read_bytes() == PNG  # kept after the command exited
        assert path.parent.name == "spill" and path.name.startswith(SPILL_PREFIX)
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    finally:
        path.unlink(missing_ok=True)


@pytest.mark.kernel
def test_images_dir_keeps_earlier_files_and_a_real_chart(
    run_cli: Callable[..., subprocess.CompletedProcess[str]], tmp_path: Path
) -> None:
    chart = (
        "import matplotlib\nmatplotlib.use('Agg')\nimport matplotlib.pyplot as plt\n"
        "fig, ax = plt.subplots(figsize=(2, 1.5), dpi=40)\nax.plot([1, 2, 3], [1, 4, 9])\n"
        "image(fig, alt='squares')\ntext('drawn')\n"
    )
    first = run_cli("--images-dir", "plots", "plot.py")
    second = run_cli("--images-dir", "plots", "plot.py", script=chart)
    assert first.returncode == 0 and second.returncode == 0, (first.stderr, second.stderr)
    assert _saved(first.stderr) == [tmp_path / "plots" / "plot-1.png"]
    assert _saved(second.stderr) == [tmp_path / "plots" / "plot-1-2.png"]
    assert (tmp_path / "plots" / "plot-1.png").read_bytes() == PNG
    assert (tmp_path / "plots" / "plot-1-2.png").read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    assert "'squares'" in second.stderr


@pytest.mark.kernel
def test_json_carries_the_images_base64_and_writes_no_file(
    run_cli: Callable[..., subprocess.CompletedProcess[str]], tmp_path: Path
) -> None:
    done = run_cli("--json", "plot.py")
    assert done.returncode == 0, done.stderr
    payload = json.loads(done.stdout)
    (image,) = payload["images"]
    assert base64.b64decode(image.pop("data"), validate=True) == PNG
    assert image == {
        "mime_type": "image/png", "alt": "a patch", "width": 5, "height": 4,
        "after_text_blocks": 1,
    }  # fmt: skip
    assert _saved(done.stderr) == []
    both = run_cli("--json", "--images-dir", "out", "plot.py")
    assert "images" in json.loads(both.stdout)
    assert _saved(both.stderr) == [tmp_path / "out" / "plot-1.png"]


@pytest.mark.kernel
def test_an_image_shown_before_a_timeout_is_saved(
    run_cli: Callable[..., subprocess.CompletedProcess[str]], tmp_path: Path
) -> None:
    script = SHOW_PNG + "import time\ntime.sleep(60)\n"
    done = run_cli("--timeout-ms", "3000", "--images-dir", "out", "plot.py", script=script)
    assert done.returncode == 1
    assert _saved(done.stderr) == [tmp_path / "out" / "plot-1.png"]
    assert (tmp_path / "out" / "plot-1.png").read_bytes() == PNG


def test_an_images_dir_that_cannot_be_made_is_a_usage_error(
    run_cli: Callable[..., subprocess.CompletedProcess[str]], tmp_path: Path
) -> None:
    (tmp_path / "taken").write_text("a file")
    done = run_cli("--images-dir", "taken/sub", "plot.py")
    assert done.returncode == 2
    assert "--images-dir taken/sub" in done.stderr
