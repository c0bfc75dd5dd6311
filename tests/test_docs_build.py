"""The documentation builds with Sphinx + MyST without a single warning (``-W``).

Slow (a full Sphinx build); skipped when the ``docs`` extra (sphinx, myst-parser) is not
installed. The build goes to a temporary folder and writes nothing in the checkout: the
configuration reference is generated from the config traits in memory, over the tracked
placeholder ``docs/reference/config.md``.
"""

from __future__ import annotations

import hashlib
import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

DOCS = Path(__file__).resolve().parents[1] / "docs"


def test_docs_build_without_warnings(tmp_path: Path) -> None:
    pytest.importorskip("sphinx")
    pytest.importorskip("myst_parser")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "sphinx",
            "-W",
            "--keep-going",
            "-q",
            "-b",
            "html",
            "-d",
            str(tmp_path / "doctrees"),
            str(DOCS),
            str(tmp_path / "html"),
        ],
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )
    assert proc.returncode == 0, f"sphinx-build failed:\n{proc.stdout}\n{proc.stderr}"
    for page in (
        "index",
        "getting-started",
        "modes",
        "inspection",
        "notebooks",
        "security",
        "reference/config",
    ):
        assert (tmp_path / "html" / f"{page}.html").is_file(), page


def _build(src: Path, out: Path) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "sphinx", "-W", "-q", "-b", "html"]
    return subprocess.run(
        [*command, "-d", str(out / "doctrees"), str(src), str(out / "html")],
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )


def _digests(root: Path) -> dict[str, str]:
    return {
        str(path.relative_to(root)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(root.rglob("*"))
        if path.is_file() and "_build" not in path.parts and "__pycache__" not in path.parts
    }


def test_docs_build_writes_no_source_file(tmp_path: Path) -> None:
    # A copy of docs/ whose configuration reference is out of date, as a checkout's is after
    # a setting changes: the build must render the current settings without rewriting it.
    pytest.importorskip("sphinx")
    pytest.importorskip("myst_parser")
    src = tmp_path / "docs"
    shutil.copytree(DOCS, src, ignore=shutil.ignore_patterns("_build", "__pycache__"))
    (src / "reference" / "config.md").write_text("# Configuration reference\n\nstale\n")
    before = _digests(src)
    proc = _build(src, tmp_path / "out")
    assert proc.returncode == 0, f"sphinx-build failed:\n{proc.stdout}\n{proc.stderr}"
    assert _digests(src) == before, "the docs build rewrote a source file"
    from lemon_exec.config import ExecuteCodeConfig

    html = (tmp_path / "out" / "html" / "reference" / "config.html").read_text()
    for name in ExecuteCodeConfig.class_traits(config=True):
        assert f'id="config-{name.replace("_", "-")}"' in html, name


def test_config_reference_lists_every_setting() -> None:
    pytest.importorskip("sphinx")
    spec = importlib.util.spec_from_file_location("lemon_exec_docs_conf", DOCS / "conf.py")
    assert spec is not None and spec.loader is not None
    conf = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conf)
    from lemon_exec.config import ENV_PREFIX, ExecuteCodeConfig

    text = conf.render_config_reference()
    for name, trait in ExecuteCodeConfig.class_traits(config=True).items():
        assert f"## `{name}`" in text
        assert f"`{ENV_PREFIX}{name.upper()}`" in text
        assert " ".join((trait.help or "").split()) in text
