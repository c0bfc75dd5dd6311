"""What a caller passes besides the script: who is calling, how it stops a run, and what the
script is called.

Public types a caller holds: :class:`SessionScope`, :data:`AbortSignal` and
:class:`ScriptSource` (all re-exported by :mod:`lemon_exec`).
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeAlias

#: What ``abort=`` accepts: setting the event stops the script (a ``threading.Event`` serves
#: ``run_sync`` callers on other threads).
AbortSignal: TypeAlias = asyncio.Event | threading.Event


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


@dataclass(frozen=True)
class ScriptSource:
    """How the script presents itself, for runtimes that run a file (``lemon-exec run``).

    ``filename`` is the name tracebacks show (session mode numbers its cells instead:
    ``cell1.py``, ...); ``argv`` becomes ``sys.argv`` in the script (None leaves it alone).
    The model never sets these: they are not part of the tool's input schema.
    """

    filename: str = "script.py"
    argv: Sequence[str] | None = None

    def argv_tuple(self) -> tuple[str, ...] | None:
        return None if self.argv is None else tuple(str(a) for a in self.argv)
