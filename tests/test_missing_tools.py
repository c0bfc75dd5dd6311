"""The README's test command on a machine without bubblewrap, as a user who cannot install
it: the session stops before any test runs, with one line naming the missing piece and the
command that installs it (tests/support_debian.py), instead of a failure per sandbox test."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.timeout(120)]

ROOT = Path(__file__).resolve().parents[1]

#: Loaded into the inner session with ``-p``: it runs as a user who is not root.
_NOT_ROOT = "import os\nos.geteuid = lambda: 1000\n"


def test_a_session_without_bubblewrap_stops_at_once_with_one_line(tmp_path: Path) -> None:
    (tmp_path / "not_root.py").write_text(_NOT_ROOT)
    empty = tmp_path / "bin"  # PATH: the venv's interpreter, and no bwrap anywhere
    empty.mkdir()
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{empty}",
        "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
    }
    started = time.monotonic()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "not_root",
            "-p",
            "no:cacheprovider",
            "-q",
            "tests/test_sandbox.py",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=100,
        check=False,
    )
    took = time.monotonic() - started
    out = done.stdout + done.stderr
    assert done.returncode == pytest.ExitCode.USAGE_ERROR, out
    line = (
        "bwrap (bubblewrap) is missing and the sandbox tests need it (not root); "
        "install it with: sudo apt-get install bubblewrap"
    )
    assert line in out, out
    assert " passed" not in out and " failed" not in out, out  # nothing ran
    assert took < 60, took  # at collection, not after a failure per test
