"""The default kernel interpreter: ``python3`` on PATH, else the host's own Python.

The spec's rule for a blank ``python_path`` is "python3 on PATH". Desktop apps start
``/abs/path/.venv/bin/lemon-exec mcp`` with a bare PATH, and ``.venv/bin/python agent.py``
runs without activating the venv: then ``python3`` on PATH is the system Python, usually
without ipykernel, and every call would fail. So the rule is kept when that interpreter has
ipykernel, and otherwise the host's interpreter (``sys.executable``) runs the kernels when it
has ipykernel; :func:`fallback_note` says when that happened, for the result's details.

Whether an interpreter has ipykernel is probed once per path and process (a subprocess of
some 30 ms, or none when PATH's python3 is the host's own).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import threading

from lemon_exec.errors import InterpreterError

__all__ = ["default_python", "fallback_note", "has_ipykernel"]

# Bounds the one-time probe of PATH's python3 (it runs on the caller's thread).
_PROBE_TIMEOUT_S = 10.0
_PROBE = "import importlib.util as u, sys; sys.exit(0 if u.find_spec('ipykernel') else 1)"

_lock = threading.Lock()
_probed: dict[str, bool] = {}
# Interpreter chosen as the fallback -> why, for the details of the calls that use it.
_notes: dict[str, str] = {}


def default_python() -> str:
    """The absolute path of the interpreter a blank ``python_path`` means.

    ``python3`` on PATH when it has ipykernel; else ``sys.executable`` when it has ipykernel;
    else PATH's ``python3`` all the same (its kernel start then says ipykernel is missing).
    Raises :class:`InterpreterError` when there is neither a ``python3`` on PATH nor a host
    interpreter with ipykernel.
    """
    found = shutil.which("python3")
    on_path = os.path.abspath(found) if found is not None else None
    if on_path is not None and has_ipykernel(on_path):
        return on_path
    host = _host_python()
    if host is not None and host != on_path and has_ipykernel(host):
        why = (
            f"python3 on PATH ({on_path}) has no ipykernel"
            if on_path is not None
            else "no python3 on PATH"
        )
        with _lock:
            _notes[host] = f"{why}; the kernel runs under the host's interpreter {host}"
        return host
    if on_path is None:
        raise InterpreterError(
            "execute_code: no python3 interpreter found on PATH; install Python 3 or "
            "set python_path / LEMON_EXECUTE_CODE_PYTHON_PATH to an interpreter"
        )
    return on_path


def fallback_note(interpreter: str) -> str | None:
    """Why ``interpreter`` was chosen instead of PATH's python3, or None if it was not."""
    with _lock:
        return _notes.get(interpreter)


def has_ipykernel(interpreter: str) -> bool:
    """Whether ``interpreter`` can import ipykernel (probed once per path and process)."""
    with _lock:
        known = _probed.get(interpreter)
    if known is not None:
        return known
    answer = importlib.util.find_spec("ipykernel") is not None
    if not _is_host(interpreter):
        probed = _probe(interpreter)
        if probed is None:  # timed out: say no this time, ask again next time
            return False
        answer = probed
    with _lock:
        _probed[interpreter] = answer
    return answer


def _host_python() -> str | None:
    return os.path.abspath(sys.executable) if sys.executable else None


def _is_host(interpreter: str) -> bool:
    # Same directory and same file: the host's own environment. Symlinks are not resolved on
    # purpose: a venv's python3 links to the base interpreter, whose packages differ.
    host = _host_python()
    if host is None or os.path.dirname(host) != os.path.dirname(interpreter):
        return False
    try:
        return os.path.samefile(host, interpreter)
    except OSError:
        return False


def _probe(interpreter: str) -> bool | None:
    try:
        done = subprocess.run(
            [interpreter, "-c", _PROBE],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=_PROBE_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return None
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0
