"""Keep kernels lean: skip optional modules a script kernel does not need.

ipykernel imports debugpy for its debugger (the lemon-python spec declares
``debugger: false``) and IPython imports jedi for completion (IPython's own completer is
used without it). Together they are ~200 modules and ~15 MiB per kernel, paid by every
per-call run. ``LEMON_EXEC_KERNEL_FULL=1`` keeps them, e.g. for a kernel opened in JupyterLab.
"""

from __future__ import annotations

import os
import sys

OPTIONAL_MODULES = ("debugpy", "jedi")


def skip_optional_modules() -> None:
    """Make the optional modules unimportable in this process (before ipykernel loads)."""
    if os.environ.get("LEMON_EXEC_KERNEL_FULL") == "1":
        return
    for name in OPTIONAL_MODULES:
        sys.modules.setdefault(name, None)  # type: ignore[arg-type]  # import → ImportError


def restore_optional_modules() -> None:
    """Let scripts import them again once ipykernel and IPython have made their choice."""
    for name in OPTIONAL_MODULES:
        if name in sys.modules and sys.modules[name] is None:
            del sys.modules[name]
