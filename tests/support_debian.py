"""Debian packages a test needs, installed by the test session itself, or a one-line stop.

The README's test command must work on a fresh machine, which has neither bubblewrap (the
sandbox tests) nor chromium (the JupyterLab test). Run as root with apt-get (as ``.ci/run``
is), a missing package is installed with ``apt-get``; otherwise the session (or the test)
stops at once with one line that names the missing piece and the command that installs it,
instead of failing test after test.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from typing import Any

import pytest

_APT_TIMEOUT_S = 600


def install_command(package: str) -> str:
    return f"sudo apt-get install {package}"


def provide(binary: str, package: str, *, announce: Any = None) -> str:
    """Make ``binary`` available (installing ``package`` when we may); "" when it is, else
    why not. ``announce``: a terminal reporter to say an installation starts."""
    if shutil.which(binary):
        return ""
    if os.geteuid() != 0:
        return "not root"
    if not shutil.which("apt-get"):
        return "no apt-get"
    if announce is not None:
        announce.write_line(f"{binary} is missing: installing Debian's {package} with apt-get")
    problem = _apt_install(package)
    if shutil.which(binary):
        return ""
    return problem or f"apt-get installed {package}, but {binary} is not on PATH"


def ensure_for_session(config: pytest.Config, binary: str, package: str, needed_by: str) -> None:
    """:func:`provide`, ending the whole session with one line when it cannot."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    problem = provide(binary, package, announce=reporter)
    if problem:
        pytest.exit(
            f"{binary} ({package}) is missing and {needed_by} need it ({problem}); "
            f"install it with: {install_command(package)}",
            returncode=pytest.ExitCode.USAGE_ERROR,
        )


def _apt_install(package: str) -> str:
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for command in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", package]):
        try:
            done = subprocess.run(
                command,
                capture_output=True,
                text=True,
                env=env,
                timeout=_APT_TIMEOUT_S,
                stdin=subprocess.DEVNULL,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"{' '.join(command)} failed: {exc}"
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            return f"{' '.join(command)} exited with {done.returncode}: {last}"
    return ""
