"""The licence check that .ci/run applies to the runtime dependency tree (.ci/licences.py)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def licences() -> ModuleType:
    spec = importlib.util.spec_from_file_location("licences", REPO / ".ci" / "licences.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("expression", "ok"),
    [
        ("MIT", True),
        ("Apache-2.0 OR BSD-3-Clause", True),
        ("BSD License", True),
        ("LGPL-2.1-or-later OR MIT", True),
        ("GPL-3.0-or-later", False),  # html2text
        ("GNU General Public License v3 (GPLv3)", False),
        ("MIT AND GPL-2.0-only", False),
        ("AGPL-3.0", False),
        ("UNKNOWN", False),
        ("Proprietary", False),
    ],
)
def test_allowed(licences: ModuleType, expression: str, ok: bool) -> None:
    assert licences.allowed(expression) is ok


def test_the_installed_tree_is_permissive_and_complete(licences: ModuleType) -> None:
    found = licences.tree("lemon_exec", ["mcp", "notebook"])
    # The direct dependencies and some of theirs are walked, the test tools are not.
    assert {"jupyter-client", "ipykernel", "pyzmq", "markdownify", "mcp", "nbclient"} <= set(found)
    assert {"ipython", "tornado", "beautifulsoup4"} <= set(found)
    assert "pytest" not in found and "html2text" not in found
    done = subprocess.run(
        [sys.executable, str(REPO / ".ci" / "licences.py")], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
