"""The built wheel: MIT licence file, py.typed, the kernelspec, the JupyterLab extension, no GPL."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from email.parser import HeaderParser
from pathlib import Path

import pytest

import lemon_exec

REPO = Path(lemon_exec.__file__).resolve().parents[1]

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
         "--disable-pip-version-check", "--wheel-dir", str(out), str(REPO)],
        check=True, capture_output=True, timeout=110,
    )  # fmt: skip
    (built,) = out.glob("lemon_exec-*.whl")
    return zipfile.ZipFile(built)


def _metadata(wheel: zipfile.ZipFile) -> list[tuple[str, str]]:
    (name,) = [n for n in wheel.namelist() if n.endswith(".dist-info/METADATA")]
    return HeaderParser().parsestr(wheel.read(name).decode()).items()


def test_wheel_ships_the_mit_licence_and_py_typed(wheel: zipfile.ZipFile) -> None:
    names = wheel.namelist()
    assert "lemon_exec/py.typed" in names
    (licence,) = [n for n in names if n.endswith(".dist-info/licenses/LICENSE")]
    text = wheel.read(licence).decode()
    assert text.startswith("MIT License\n")
    assert "Copyright (c) 2026 the lemon_exec authors" in text
    metadata = _metadata(wheel)
    assert ("License-Expression", "MIT") in metadata
    assert any(n.endswith("data/share/jupyter/kernels/lemon-python/kernel.json") for n in names)


def test_runtime_dependencies_have_no_gpl_converter(wheel: zipfile.ZipFile) -> None:
    # html2text is GPL-3.0-or-later; webfetch converts HTML with markdownify (MIT).
    runtime = [
        value.split(";")[0].strip()
        for key, value in _metadata(wheel)
        if key == "Requires-Dist" and "extra ==" not in value
    ]
    assert not [r for r in runtime if r.lower().startswith("html2text")]
    assert any(r.startswith("markdownify") for r in runtime)


def test_wheel_ships_the_jupyterlab_extension_prebuilt(
    wheel: zipfile.ZipFile, tmp_path: Path
) -> None:
    """JupyterLab finds the extension in an installed wheel; its sources stay out."""
    names = wheel.namelist()
    assert not [n for n in names if n.startswith("lemon_exec/labextension")], names
    share = [n for n in names if "/share/jupyter/labextensions/lemon-exec-jupyterlab/" in n]
    (manifest,) = [n for n in share if n.endswith("lemon-exec-jupyterlab/package.json")]
    load = json.loads(wheel.read(manifest))["jupyterlab"]["_build"]["load"]
    assert any(n.endswith(f"lemon-exec-jupyterlab/{load}") for n in share), share

    # Lay out the wheel's data files as an install does (pip install --prefix would also
    # uninstall this environment's lemon_exec).
    data = tmp_path / "share" / "jupyter"
    for name in share:
        target = data / name.split("/share/jupyter/", 1)[1]
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(wheel.read(name))
    listed = subprocess.run(
        [sys.executable, "-m", "jupyterlab.labextensions", "list"],
        env={**os.environ, "JUPYTER_PATH": str(data)},
        capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    # `list` prints each labextensions directory, then the extensions found in it.
    section = (listed.stdout + listed.stderr).split(str(data / "labextensions"))[1]
    entry = section.split("\n")[1]
    assert "lemon-exec-jupyterlab v0.1.0" in entry and "enabled" in entry and "OK" in entry, (
        listed.stdout + listed.stderr
    )
