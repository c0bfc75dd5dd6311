"""Tests of the MCP server (``lemon_exec.mcp``) and the ``lemon-exec mcp`` command.

Why this file does more than mark a package: ``tests/`` has no ``__init__.py``, so pytest's
default (prepend) import mode puts ``tests/`` on ``sys.path`` and imports this folder as the
top-level package ``mcp`` -- the name of the MCP SDK. Left alone, every later ``import mcp``
in the test process (ours, lemon_exec's, other folders') would get this folder instead of the
SDK. So, when imported as ``mcp``, this module loads the real SDK in its own place and adds
this folder to the SDK package's ``__path__``, so that pytest still finds ``mcp.conftest`` and
``mcp.test_*`` here. Limitation: if something imports the SDK before pytest collects this
folder (e.g. a plugin at start-up), this file never runs and ``mcp.conftest`` is not found;
``--import-mode=importlib`` avoids the problem altogether.
"""

from __future__ import annotations

import importlib
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))

if __name__ == "mcp":  # imported under the SDK's name (see above)
    _TESTS = os.path.dirname(_HERE)
    del sys.modules["mcp"]
    _saved_path = sys.path[:]
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _TESTS]
    try:
        _sdk = importlib.import_module("mcp")
    finally:
        sys.path[:] = _saved_path
    if _HERE not in _sdk.__path__:
        _sdk.__path__.append(_HERE)
    # The import system returns whatever sys.modules holds once this module has run.
    sys.modules["mcp"] = _sdk
