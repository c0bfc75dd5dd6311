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


class Build:
    """One Sphinx build of a copy of docs/ (``src``) into ``out``, and what it printed."""

    def __init__(self, root: Path) -> None:
        # The copy's configuration reference is out of date, as a checkout's is after a
        # setting changes: the build must render the current settings without rewriting it.
        self.src = root / "docs"
        self.out = root / "out"
        shutil.copytree(DOCS, self.src, ignore=shutil.ignore_patterns("_build", "__pycache__"))
        (self.src / "reference" / "config.md").write_text("# Configuration reference\n\nstale\n")
        self.sources_before = _digests(self.src)
        command = [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html"]
        self.proc = subprocess.run(
            [*command, "-d", str(self.out / "doctrees"), str(self.src), str(self.out / "html")],
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


@pytest.fixture(scope="module")
def build(tmp_path_factory: pytest.TempPathFactory) -> Build:
    """The one (slow) build both build tests look at."""
    pytest.importorskip("sphinx")
    pytest.importorskip("myst_parser")
    return Build(tmp_path_factory.mktemp("docs-build"))


def test_docs_build_without_warnings(build: Build) -> None:
    assert build.proc.returncode == 0, (
        f"sphinx-build failed:\n{build.proc.stdout}\n{build.proc.stderr}"
    )
    for page in (
        "index",
        "getting-started",
        "modes",
        "inspection",
        "notebooks",
        "security",
        "reference/config",
    ):
        assert (build.out / "html" / f"{page}.html").is_file(), page


def test_docs_build_writes_no_source_file(build: Build) -> None:
    assert build.proc.returncode == 0, build.proc.stderr
    assert _digests(build.src) == build.sources_before, "the docs build rewrote a source file"
    from lemon_exec.config import ExecuteCodeConfig

    html = (build.out / "html" / "reference" / "config.html").read_text()
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
