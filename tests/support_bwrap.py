"""The test session's bubblewrap: installed when a selected test needs it, or a clear stop.

The README's test command must work on a fresh machine that has no bubblewrap. A session
whose selection includes a ``bwrap``-marked test installs Debian's ``bubblewrap`` itself when
it runs as root with apt-get (as ``.ci/run`` does); otherwise it stops at once with one line
that names the missing piece and the command that installs it, instead of failing every
sandbox test one by one.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

#: Debian's package, and the command that installs it.
PACKAGE = "bubblewrap"
INSTALL = f"sudo apt-get install {PACKAGE}  (Fedora: sudo dnf install {PACKAGE})"
_APT_TIMEOUT_S = 600


def ensure(config: pytest.Config) -> None:
    """Make ``bwrap`` available for this session, or end the session with one line."""
    if shutil.which("bwrap"):
        return
    problem = _install(config) if _can_install() else "not root, or no apt-get"
    if shutil.which("bwrap"):
        return
    problem = problem or "apt-get install finished, but bwrap is not on PATH"
    pytest.exit(
        f"bubblewrap (bwrap) is missing and the selected sandbox tests need it ({problem}); "
        f"install it with: {INSTALL}",
        returncode=pytest.ExitCode.USAGE_ERROR,
    )


def _can_install() -> bool:
    return os.geteuid() == 0 and shutil.which("apt-get") is not None


def _install(config: pytest.Config) -> str:
    """Install bubblewrap with apt-get; "" when that worked, else what went wrong."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(f"bwrap is missing: installing Debian's {PACKAGE} with apt-get")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for command in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", PACKAGE]):
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
