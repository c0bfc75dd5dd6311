"""Which interpreter runs the kernels: the configured ``python_path``, made absolute.

A blank ``python_path`` is left to :mod:`lemon_exec.interpreter` (``python3`` on PATH, or
the host's own interpreter); a configured one must exist and be executable.
"""

from __future__ import annotations

import os

from lemon_exec.config._defaults import ENV_PREFIX
from lemon_exec.errors import InterpreterError
from lemon_exec.interpreter import default_python

_PYTHON_HINT = f"set python_path (or {ENV_PREFIX}PYTHON_PATH) to"


def resolve_python(configured: str, cwd: str | os.PathLike[str] | None = None) -> str:
    """The absolute path of the interpreter ``configured`` names (see
    :meth:`ExecuteCodeConfig.resolve_python <lemon_exec.config.ExecuteCodeConfig.resolve_python>`).

    Raises :class:`~lemon_exec.errors.InterpreterError` when no usable interpreter is found.
    """
    if not configured.strip():
        # python3 on PATH, or the host's interpreter when that one lacks ipykernel.
        return default_python()

    path = os.path.expanduser(configured)
    if not os.path.isabs(path):
        base = os.fspath(cwd) if cwd is not None else os.getcwd()
        path = os.path.join(base, path)
    path = os.path.abspath(path)
    if not os.path.exists(path):
        raise InterpreterError(
            f"execute_code: python_path not found: {path}; "
            f"{_PYTHON_HINT} an existing Python interpreter"
        )
    if not os.path.isfile(path) or not os.access(path, os.X_OK):
        raise InterpreterError(
            f"execute_code: python_path is not executable: {path}; "
            f"{_PYTHON_HINT} an executable Python interpreter"
        )
    return path


def canonical_python(path: str | os.PathLike[str]) -> str:
    """Return ``path`` absolute with every symlink resolved: one interpreter, one key.

    Used to key session kernels, so ``/usr/bin/python3`` and the ``python3.11`` it points
    to share a session.
    """
    return os.path.realpath(os.path.abspath(os.fspath(path)))
