"""lemon_exec: a fast, well-behaved execute_code tool for AI agent runtimes, on Jupyter kernels.

The public surface is ``__all__``. Names load lazily: the kernel process imports
``lemon_exec.kernel`` under possibly another interpreter, and must not pull in the host side
(jupyter_client, traitlets) just because this package's ``__init__`` ran.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    "ExecuteCode": "lemon_exec.facade",
    "ExecuteCodeConfig": "lemon_exec.config",
    "ExecuteCodeResult": "lemon_exec.result",
    "SessionScope": "lemon_exec.scope",
    "SessionOwner": "lemon_exec.session",
    "AbortSignal": "lemon_exec.scope",
    "ScriptSource": "lemon_exec.scope",
    "Telemetry": "lemon_exec.telemetry",
    "ToolCall": "lemon_exec.tools",
    "ToolRegistry": "lemon_exec.tools",
    "ToolHost": "lemon_exec.tools",
    "PolicyDecision": "lemon_exec.tools",
    "ApprovalOutcome": "lemon_exec.tools",
    "default_registry": "lemon_exec.tools",
    "LemonExecError": "lemon_exec.errors",
    "ConfigError": "lemon_exec.errors",
    "RefusedError": "lemon_exec.errors",
    "KernelError": "lemon_exec.errors",
    "KernelStartError": "lemon_exec.errors",
    "InterpreterError": "lemon_exec.errors",
    "SessionBusyError": "lemon_exec.errors",
    "ToolFailure": "lemon_exec.errors",
    "ToolDenied": "lemon_exec.errors",
}

__all__ = [
    "AbortSignal",
    "ApprovalOutcome",
    "ConfigError",
    "ExecuteCode",
    "ExecuteCodeConfig",
    "ExecuteCodeResult",
    "InterpreterError",
    "KernelError",
    "KernelStartError",
    "LemonExecError",
    "PolicyDecision",
    "RefusedError",
    "ScriptSource",
    "SessionBusyError",
    "SessionOwner",
    "SessionScope",
    "Telemetry",
    "ToolCall",
    "ToolDenied",
    "ToolFailure",
    "ToolHost",
    "ToolRegistry",
    "__version__",
    "default_registry",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'lemon_exec' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # cache: __getattr__ runs once per name
    return value


def __dir__() -> list[str]:
    return __all__


if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    from lemon_exec.config import ExecuteCodeConfig
    from lemon_exec.errors import (
        ConfigError,
        InterpreterError,
        KernelError,
        KernelStartError,
        LemonExecError,
        RefusedError,
        SessionBusyError,
        ToolDenied,
        ToolFailure,
    )
    from lemon_exec.facade import ExecuteCode
    from lemon_exec.result import ExecuteCodeResult
    from lemon_exec.scope import AbortSignal, ScriptSource, SessionScope
    from lemon_exec.session import SessionOwner
    from lemon_exec.telemetry import Telemetry
    from lemon_exec.tools import (
        ApprovalOutcome,
        PolicyDecision,
        ToolCall,
        ToolHost,
        ToolRegistry,
        default_registry,
    )
