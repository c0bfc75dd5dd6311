"""lemon_exec: a fast, well-behaved execute_code tool for AI agent runtimes, on Jupyter kernels.

The public names are the ``TYPE_CHECKING`` imports below, the one list of them: type checkers
and IDEs read it as it stands, and at run time ``__all__`` and each name's module are read from
it (this file's own source, with :mod:`ast`) the first time a name is asked for. Names load
lazily: the kernel process imports ``lemon_exec.kernel`` under possibly another interpreter,
and must not pull in the host side (jupyter_client, traitlets) just because this package's
``__init__`` ran.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:  # the public names (``from module import Name as Name``: re-exported)
    from lemon_exec.config import ExecuteCodeConfig as ExecuteCodeConfig
    from lemon_exec.errors import ConfigError as ConfigError
    from lemon_exec.errors import InterpreterError as InterpreterError
    from lemon_exec.errors import JobExpiredError as JobExpiredError
    from lemon_exec.errors import KernelError as KernelError
    from lemon_exec.errors import KernelStartError as KernelStartError
    from lemon_exec.errors import LemonExecError as LemonExecError
    from lemon_exec.errors import RefusedError as RefusedError
    from lemon_exec.errors import SessionBusyError as SessionBusyError
    from lemon_exec.errors import ToolDenied as ToolDenied
    from lemon_exec.errors import ToolFailure as ToolFailure
    from lemon_exec.facade import ExecuteCode as ExecuteCode
    from lemon_exec.images import ImageBlock as ImageBlock
    from lemon_exec.jobs import Job as Job
    from lemon_exec.jobs import JobPoll as JobPoll
    from lemon_exec.result import ExecuteCodeResult as ExecuteCodeResult
    from lemon_exec.scope import AbortSignal as AbortSignal
    from lemon_exec.scope import ScriptSource as ScriptSource
    from lemon_exec.scope import SessionScope as SessionScope
    from lemon_exec.session import SessionOwner as SessionOwner
    from lemon_exec.telemetry import Telemetry as Telemetry
    from lemon_exec.tools import ApprovalOutcome as ApprovalOutcome
    from lemon_exec.tools import PolicyDecision as PolicyDecision
    from lemon_exec.tools import ToolCall as ToolCall
    from lemon_exec.tools import ToolHost as ToolHost
    from lemon_exec.tools import ToolRegistry as ToolRegistry
    from lemon_exec.tools import default_registry as default_registry

_exports: dict[str, str] | None = None  # public name -> its module, read from the block above


def _public_names() -> dict[str, str]:
    global _exports
    if _exports is None:
        import ast

        with open(__file__, encoding="utf-8") as source:
            tree = ast.parse(source.read(), __file__)
        names = {
            alias.asname or alias.name: line.module
            for node in tree.body
            if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"
            for line in node.body
            if isinstance(line, ast.ImportFrom) and line.module
            for alias in line.names
        }
        if not names:
            raise RuntimeError(f"{__file__} has no TYPE_CHECKING block of public names")
        _exports = names  # one assignment: a thread that reads it sees all of it or nothing
    return _exports


def __getattr__(name: str) -> Any:
    if name == "__all__":
        value: Any = sorted([*_public_names(), "__version__"])
    else:
        module = _public_names().get(name)
        if module is None:
            raise AttributeError(f"module 'lemon_exec' has no attribute {name!r}")
        from importlib import import_module

        value = getattr(import_module(module), name)
    globals()[name] = value  # cache: __getattr__ runs once per name
    return value


def __dir__() -> list[str]:
    return list(__getattr__("__all__"))
