"""The public value type of one execute_code result: ``content``, ``details`` and ``trust``.

Its assembly (headline, layout, notices, the envelope) lives in ``lemon_exec.host.run.results``;
the keys of ``details`` are declared in :class:`lemon_exec.details.Details`. This module
imports nothing from the host side.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from lemon_exec.details import Details, outcome_of

__all__ = ["ExecuteCodeResult", "Trust"]

Trust = Literal["trusted", "untrusted"]


@dataclass
class ExecuteCodeResult:
    """One execute_code result: ``content`` for the model, ``details`` for the runtime."""

    content: str
    details: Details = field(default_factory=lambda: Details())
    trust: Trust = "trusted"

    @property
    def ok(self) -> bool:
        """True when the script ran to completion with exit code 0."""
        return outcome_of(self.details) == "ok"

    def to_dict(self) -> dict[str, Any]:
        return {"content": self.content, "details": self.details, "trust": self.trust}
