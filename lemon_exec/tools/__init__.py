"""The host side of the script helpers ``read``, ``grep``, ``find``, ``ls`` and ``webfetch``.

A script's helper call arrives as a :class:`ToolCall`; a :class:`ToolHost` validates it against
the :class:`ToolRegistry`, asks the optional policy and approval hooks, runs the tool and
returns its text. Failures are :class:`~lemon_exec.errors.ToolFailure` /
:class:`~lemon_exec.errors.ToolDenied`, whose message the script sees as ``ToolError``.
See ``docs/tools.md``.
"""

from ._hooks import ApprovalHook, ApprovalOutcome, ApprovalRequired, PolicyDecision, PolicyHook
from ._host import ToolHost
from ._registry import ToolRegistry, default_registry
from ._types import ToolCall, ToolFunc, ToolSpec

__all__ = [
    "ApprovalHook",
    "ApprovalOutcome",
    "ApprovalRequired",
    "PolicyDecision",
    "PolicyHook",
    "ToolCall",
    "ToolFunc",
    "ToolHost",
    "ToolRegistry",
    "ToolSpec",
    "default_registry",
]
