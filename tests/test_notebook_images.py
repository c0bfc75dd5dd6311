"""Images of scenario calls as notebook outputs, on results built by hand (no kernel).

The end-to-end runs (real ``image()`` calls through ``run_scenario`` and the pytest plugin)
are in ``test_images_front_doors.py``.
"""

from __future__ import annotations

import base64
import copy
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
