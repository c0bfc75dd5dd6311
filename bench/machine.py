"""What machine and software a run measured (put in every report)."""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

from lemon_exec import ExecuteCodeConfig


def machine_info(interpreter: str) -> dict[str, Any]:
    """Cores, Python, platform and package versions (put in every report)."""
    import lemon_exec

    cpu_model = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    mem_total_mib = None
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_total_mib = int(line.split()[1]) // 1024
    real = os.path.realpath(interpreter)
    return {
        "cores": os.cpu_count(),
        "usable_cores": len(os.sched_getaffinity(0))
        if hasattr(os, "sched_getaffinity")
        else os.cpu_count(),
        "cpu_model": cpu_model,
        "mem_total_mib": mem_total_mib,
        "python": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "jupyter_client": _version("jupyter_client"),
        "ipykernel": _version("ipykernel"),
        "pyzmq": _version("pyzmq"),
        "lemon_exec": lemon_exec.__version__,
        "kernel_interpreter": interpreter,
        "kernel_interpreter_is_script": _is_script(real),
        "loadavg_start": loadavg(),
        "lemon_exec_git": _git_state(),
        "config_defaults": {
            key: getattr(ExecuteCodeConfig(), key)
            for key in ("warm_kernels", "fork_server")
            if key in ExecuteCodeConfig.class_trait_names()
        },
    }


def _git_state() -> dict[str, Any] | None:
    """The commit of the lemon_exec checkout and whether its tree has changes (read-only)."""
    import lemon_exec

    root = Path(lemon_exec.__file__).resolve().parents[1]
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=root,
            text=True,
            capture_output=True,
            timeout=10,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root,
            text=True,
            capture_output=True,
            timeout=10,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return {"commit": head, "modified_files": len(dirty.splitlines())}


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _is_script(path: str) -> bool:
    """True when ``path`` is a shell script (e.g. a pyenv shim), not a binary."""
    try:
        with open(path, "rb") as fh:
            return fh.read(2) == b"#!"
    except OSError:
        return False


def loadavg() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []
