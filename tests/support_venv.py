"""Outside programs whose pins our test venv cannot hold, each in a venv of its own.

Enterprise Gateway pins ``jupyter_client<7``; LangChain's MCP adapters pin ``mcp<2``. Each
venv is kept between runs and made on first use, under a file lock so that parallel runs do
not race; if that fails the test fails (never skips) with the command that fixes it.
"""

from __future__ import annotations

import fcntl
import subprocess
import sys
from pathlib import Path

import pytest

#: Written after an install whose package puts no file of its own to look for in the venv.
MARKER = ".lemon-installed"


def ensure_own_venv(
    venv: Path, requirement: str, *, what: str, env_name: str, provides: str | None = None
) -> Path:
    """``venv`` with ``requirement`` installed (installing it first if needed); its python.

    ``provides``: a file, relative to the venv, that the requirement installs (its presence
    says it is there); without one, :data:`MARKER` is written once the install succeeded.
    ``what`` names the program and ``env_name`` the variable that points elsewhere, in the
    failure's message.
    """
    ready = venv / (provides or MARKER)
    if ready.exists():
        return venv / "bin" / "python"
    hint = (
        f"create it with `python3 -m venv {venv} && {venv}/bin/pip install "
        f"'{requirement}'` (or point {env_name} at a venv that has it)"
    )
    try:
        venv.parent.mkdir(parents=True, exist_ok=True)
        with open(venv.with_name(venv.name + ".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # another run may be installing it right now
            if not ready.exists():
                _install(venv, requirement)
                if provides is None:
                    ready.write_text("")
    except (OSError, subprocess.SubprocessError) as exc:
        pytest.fail(f"{what} is not installed in {venv} and installing it failed ({exc}); {hint}")
    if not ready.exists():
        pytest.fail(f"no {ready.name} in {venv}; {hint}")
    return venv / "bin" / "python"


def _install(venv: Path, requirement: str) -> None:
    if not (venv / "bin" / "python").exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", requirement]
    subprocess.run(pip, check=True, timeout=900)
