"""A blank python_path: python3 on PATH when it has ipykernel, else the host's interpreter.

Desktop apps start ``/abs/path/.venv/bin/lemon-exec mcp`` with a bare PATH, and people run
``.venv/bin/python agent.py`` without activating the venv. The hosts here are real
subprocesses started that way: the venv's python by absolute path, a PATH whose ``python3``
has no ipykernel (a shim running this interpreter with ``-I -S``: no site-packages at all), or
no ``python3`` at all.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.kernel

#: The host: one execute_code call with the default (blank) python_path, result as JSON.
HOST = """
import json, sys
from lemon_exec import ExecuteCode, ExecuteCodeConfig
facade = ExecuteCode(ExecuteCodeConfig(enabled=True, warm_kernels=0))
result = facade.run_sync("import sys\\ntext(sys.executable)")
facade.close()
print(json.dumps({"content": result.content, "details": result.details}))
"""


def _shim_dir(tmp_path: Path) -> Path:
    """A directory whose ``python3`` is this interpreter without site-packages."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    shim = bindir / "python3"
    shim.write_text(f'#!/bin/sh\nexec {sys.executable} -I -S "$@"\n')
    shim.chmod(0o755)
    lacks = subprocess.run([str(shim), "-c", "import ipykernel"], capture_output=True)
    assert lacks.returncode != 0, "the shim python3 must not have ipykernel"
    return bindir


def _run_host(tmp_path: Path, path: str) -> dict[str, Any]:
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith("LEMON_EXECUTE_CODE_") and name not in ("VIRTUAL_ENV", "PATH")
    }
    env["PATH"] = path
    done = subprocess.run(
        [os.path.abspath(sys.executable), "-c", HOST],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.slow
def test_python3_without_ipykernel_falls_back_to_the_host_interpreter(tmp_path: Path) -> None:
    bindir = _shim_dir(tmp_path)
    out = _run_host(tmp_path, f"{bindir}:/usr/bin:/bin")
    host = os.path.abspath(sys.executable)
    details = out["details"]
    assert details["exit_code"] == 0, out["content"]
    assert out["content"] == f"Script result (text()):\n{host}"
    assert details["python"] == host
    assert details["python_fallback"] == (
        f"python3 on PATH ({bindir / 'python3'}) has no ipykernel; "
        f"the kernel runs under the host's interpreter {host}"
    )


@pytest.mark.slow
def test_no_python3_on_path_falls_back_to_the_host_interpreter(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    out = _run_host(tmp_path, str(empty))
    host = os.path.abspath(sys.executable)
    assert out["details"]["exit_code"] == 0, out["content"]
    assert out["details"]["python"] == host
    assert out["details"]["python_fallback"].startswith("no python3 on PATH;")


@pytest.mark.slow
def test_python3_with_ipykernel_on_path_is_used_as_the_spec_says(tmp_path: Path) -> None:
    # PATH's python3 has ipykernel (this venv's): no fallback, details name it.
    venv_bin = Path(os.path.abspath(sys.executable)).parent
    assert (venv_bin / "python3").exists()
    out = _run_host(tmp_path, f"{venv_bin}:/usr/bin:/bin")
    assert out["details"]["exit_code"] == 0, out["content"]
    assert out["details"]["python"] == str(venv_bin / "python3")
    assert "python_fallback" not in out["details"]
