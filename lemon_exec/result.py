"""The public value type of one execute_code result: ``content``, ``details``, ``trust`` and
``images``.

Its assembly (headline, layout, notices, the envelope) lives in ``lemon_exec.host.run.results``;
the keys of ``details`` are declared in :class:`lemon_exec.details.Details`. This module
imports nothing from the host side.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from lemon_exec.details import Details, outcome_of
from lemon_exec.images import ImageBlock

__all__ = ["ExecuteCodeResult", "Trust"]

Trust = Literal["trusted", "untrusted"]


@dataclass
class ExecuteCodeResult:
    """One execute_code result: ``content`` for the model, ``details`` for the runtime."""

    content: str
    details: Details = field(default_factory=lambda: Details())
    trust: Trust = "trusted"
    #: The images the script showed (``image()``, or ``display()`` of an image), in order.
    images: list[ImageBlock] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when the script ran to completion with exit code 0."""
        return outcome_of(self.details) == "ok"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready; ``images`` (base64) is present only when the script showed any."""
        out: dict[str, Any] = {
            "content": self.content,
            "details": self.details,
            "trust": self.trust,
        }
        if self.images:
            out["images"] = [image.to_dict() for image in self.images]
        return out
