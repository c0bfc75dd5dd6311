"""The documentation builds with Sphinx + MyST without a single warning (``-W``).

Slow (a full Sphinx build); skipped when the ``docs`` extra (sphinx, myst-parser) is not
installed. The build goes to a temporary folder; it regenerates ``docs/reference/config.md``
from the config traits, which leaves the file unchanged unless a trait changed.
"""

from __future__ import annotations

import importlib.util
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
