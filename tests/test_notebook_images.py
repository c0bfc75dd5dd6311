"""Images of scenario calls as notebook outputs: first on results built by hand (no kernel).

Then real runs: ``image()`` calls through ``run_scenario`` and through the pytest plugin.
"""

from __future__ import annotations

import base64
import copy
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook
from support_images import SVG, png

from lemon_exec.images import ImageBlock
from lemon_exec.notebooks.normalize import Normalizer
from lemon_exec.notebooks.runner import (
    CallRecord,
    CellOptions,
    ScenarioResult,
    compare_outputs,
    run_scenario_sync,
    stored_record,
    write_outputs,
)

pytestmark = pytest.mark.timeout(30)

IMAGES = [
    ImageBlock("image/png", png(3, 2), alt="a red patch", width=3, height=2, after_text_blocks=1),
    ImageBlock("image/svg+xml", SVG, width=4, height=3, after_text_blocks=2),
]


def _scenario(images: list[ImageBlock]) -> tuple[nbformat.NotebookNode, ScenarioResult]:
    nb = new_notebook(cells=[new_code_cell("text('first')\nimage(...)\ntext('second')")])
    call = CallRecord(
        cell_index=0,
        execution_count=1,
        source=nb.cells[0].source,
        options=CellOptions.from_metadata({}, "cell 0"),
        content="Script result (text()):\nfirst\nsecond",
        details={"exit_code": 0, "text_blocks": 2},
        trust="trusted",
        notify=[],
        images=images,
    )
    normalizer = Normalizer({}, [])
    return nb, ScenarioResult(None, Path.cwd(), [call], [normalizer.record(call.record())])


@pytest.mark.parametrize("normalized", [False, True])
def test_images_are_display_data_after_the_result(normalized: bool) -> None:
    nb, result = _scenario(IMAGES)
    write_outputs(nb, result, normalized=normalized)
    nbformat.validate(nb)

    kinds = [
        (o["output_type"], (o.get("metadata") or {}).get("lemon", {}).get("output"))
        for o in nb.cells[0].outputs
    ]
    assert kinds == [
        ("execute_result", "result"),
        ("display_data", "image"),
        ("display_data", "image"),
        ("display_data", "record"),
    ]
    first, second = nb.cells[0].outputs[1:3]
    assert base64.b64decode(first["data"]["image/png"]) == IMAGES[0].data
    assert first["data"]["text/plain"] == "a red patch"
    assert first["metadata"]["image/png"] == {"width": 3, "height": 2}
    assert first["metadata"]["lemon"]["image"]["after_text_blocks"] == 1
    assert second["data"]["image/svg+xml"] == SVG.decode()
    assert second["data"]["text/plain"] == "<image/svg+xml 4x3>"
    assert second["metadata"]["lemon"]["image"]["after_text_blocks"] == 2
    assert "2 images" in nb.cells[0].outputs[0]["data"]["text/markdown"]


def test_a_written_notebook_matches_its_own_run_after_a_round_trip(tmp_path: Path) -> None:
    nb, result = _scenario(IMAGES)
    write_outputs(nb, result, normalized=True)
    path = tmp_path / "scenario.ipynb"
    nbformat.write(nb, str(path))
    again = nbformat.read(str(path), as_version=4)

    stored = stored_record(again.cells[0])
    assert stored is not None
    assert [image["mime_type"] for image in stored["images"]] == ["image/png", "image/svg+xml"]
    assert compare_outputs(again, result) == []


def test_an_image_more_or_less_is_a_mismatch() -> None:
    nb, result = _scenario(IMAGES)
    write_outputs(nb, result, normalized=True)
    _, fewer = _scenario(IMAGES[:1])
    problems = compare_outputs(copy.deepcopy(nb), fewer)
    assert len(problems) == 1 and "differs" in problems[0]
    _, none = _scenario([])
    assert compare_outputs(copy.deepcopy(nb), none) != []


def test_results_without_images_keep_their_old_shape() -> None:
    nb, result = _scenario([])
    write_outputs(nb, result, normalized=True)
    assert [o["output_type"] for o in nb.cells[0].outputs] == ["execute_result", "display_data"]
    assert "images" not in result.calls[0].record()
    assert compare_outputs(nb, result) == []


# --- real scenario runs ----------------------------------------------------------------------

PNG = png(5, 4)
SHOW = (
    "import base64\n"
    "text('before')\n"
    f"image(base64.b64decode({base64.b64encode(PNG).decode()!r}), format='png', alt='a patch')\n"
    "text('after')\n"
)
PIL_CELL = "from PIL import Image\nimage(Image.new('RGB', (6, 2), 'blue'), alt='blue')\n"


@pytest.mark.kernel
@pytest.mark.timeout(120)
def test_run_scenario_puts_real_images_into_the_notebook(tmp_path: Path) -> None:
    nb = new_notebook(
        metadata={"lemon": {}},
        cells=[new_code_cell(SHOW), new_code_cell("text('no picture')"), new_code_cell(PIL_CELL)],
    )
    result = run_scenario_sync(nb)
    write_outputs(nb, result, normalized=True)
    nbformat.validate(nb)

    def images(cell: int) -> list[tuple[str, str]]:
        return [
            (next(k for k in o["data"] if k.startswith("image/")), o["data"]["text/plain"])
            for o in nb.cells[cell].outputs
            if o["output_type"] == "display_data" and "text/plain" in o["data"]
            and o["metadata"].get("lemon", {}).get("output") == "image"
        ]  # fmt: skip

    assert images(0) == [("image/png", "a patch")]
    assert images(1) == []
    assert images(2) == [("image/png", "blue")]
    shown = nb.cells[0].outputs[1]
    assert base64.b64decode(shown["data"]["image/png"]) == PNG
    assert shown["metadata"]["lemon"]["image"]["after_text_blocks"] == 1
    assert nb.cells[2].outputs[1]["metadata"]["image/png"] == {"width": 6, "height": 2}
    assert result.calls[0].details["images"] == 1
    assert compare_outputs(nb, result) == []


def _pytest_in(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.slow
@pytest.mark.kernel
@pytest.mark.timeout(300)
def test_the_pytest_plugin_stores_and_compares_images(tmp_path: Path) -> None:
    folder = tmp_path / "notebooks"
    folder.mkdir()
    path = folder / "pictures.ipynb"
    nbformat.write(new_notebook(metadata={"lemon": {}}, cells=[new_code_cell(SHOW)]), path)

    regen = _pytest_in(tmp_path, "--lemon-regen")
    assert regen.returncode == 0, regen.stdout + regen.stderr
    stored = nbformat.read(path, as_version=4)
    nbformat.validate(stored)
    kinds = [o["output_type"] for o in stored.cells[0].outputs]
    assert kinds == ["execute_result", "display_data", "display_data"]
    assert base64.b64decode(stored.cells[0].outputs[1]["data"]["image/png"]) == PNG

    check = _pytest_in(tmp_path)
    assert check.returncode == 0, check.stdout + check.stderr

    stored.cells[0].source = SHOW.replace("alt='a patch'", "alt='another'")
    nbformat.write(stored, path)
    changed = _pytest_in(tmp_path)
    assert changed.returncode == 1
    assert "Results differ from the stored outputs" in changed.stdout
    assert '"alt": "another"' in changed.stdout
