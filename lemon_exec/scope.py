"""SessionScope: who is calling, for session-mode kernel keys."""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class SessionScope:
    """The caller's identity for session mode.

    ``session_id`` is the persisted session id (stable across turns and resume, never a run
    or tool-call id); ``agent_id`` the agent/profile id; ``cwd`` the working directory
    scripts run in (default: the host's current directory). Subagents have their own
    session ids, so they never share a kernel with their parent.
    """

    session_id: str
    agent_id: str = "default"
    cwd: str | os.PathLike[str] | None = None

    @property
    def complete(self) -> bool:
        """Whether the scope identifies a session (else session mode falls back)."""
        return bool(self.session_id) and bool(self.agent_id)
