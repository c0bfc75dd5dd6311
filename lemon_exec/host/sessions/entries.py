"""What the session registry keeps per kernel: the key a kernel is shared by, the entry that
holds one kernel slot for a key (or a fork of it), and what a session run hands back.

- **key** (:class:`SessionKey`): session id, agent id, canonical cwd, canonical interpreter,
  helper set and protocol version. The kernel id shown to people is an HMAC of it under a
  per-host salt.
- **entry** (:class:`SessionKernel`): the kernel, its phase, owners, FIFO queue
  (:mod:`~lemon_exec.host.sessions.queue`), and why state was last lost.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lemon_exec.config import canonical_python
from lemon_exec.host.cell.execute import CellResult
from lemon_exec.host.kernels.backend import KernelHandle
from lemon_exec.host.sessions.queue import Ticket
from lemon_exec.scope import SessionScope
from lemon_exec.wire import protocol


class Fallback(Exception):
    """Session mode cannot run this call; run it per-call instead (before any code started)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class SessionKey:
    session_id: str
    agent_id: str
    cwd: str
    interpreter: str
    helpers: tuple[str, ...]
    protocol: int = protocol.PROTOCOL_VERSION

    @classmethod
    def build(
        cls, scope: SessionScope, cwd: Path, interpreter: str, helpers: tuple[str, ...]
    ) -> SessionKey:
        return cls(
            str(scope.session_id),
            str(scope.agent_id),
            str(Path(cwd).resolve()),
            interpreter_identity(interpreter),
            helpers,
        )

    def kernel_id(self, salt: bytes, fork: int) -> str:
        """An opaque id, safe as a file name, that reveals nothing of the key."""
        material = repr((self, fork)).encode("utf-8", "surrogatepass")
        return hmac.new(salt, material, hashlib.sha256).hexdigest()[:20]


@dataclass(eq=False)  # identity semantics: entries live in sets
class SessionKernel:
    key: SessionKey
    kernel_id: str
    fork: int
    kernel: KernelHandle | None = None
    phase: str = "empty"  # empty | starting | idle | running | stopping
    owners: set[int] = field(default_factory=set)
    queue: deque[Ticket] = field(default_factory=deque)
    active: Ticket | None = None
    created: float = field(default_factory=time.monotonic)
    last_used: float = field(default_factory=time.monotonic)
    cells_run: int = 0
    lost_reason: str | None = None  # why the previous kernel's state is gone
    interpreter: str = ""  # the path to launch: a venv's python must not be resolved
    # The live kernel's state may hold untrusted data (a call fetched web content): every
    # later result from it is untrusted. Only a new kernel (reset, crash, eviction) clears it.
    tainted: bool = False

    @property
    def busy(self) -> bool:
        return (
            self.active is not None
            or bool(self.queue)
            or self.phase in ("starting", "running", "stopping")
        )

    @property
    def holds_kernel(self) -> bool:
        return self.kernel is not None or self.phase == "starting"

    @property
    def evictable(self) -> bool:
        """Idle with nothing active or queued: its kernel may be stopped (LRU, reaping)."""
        return (
            self.kernel is not None
            and self.phase == "idle"
            and self.active is None
            and not self.queue
        )


@dataclass
class SessionRun:
    cell: CellResult
    details: dict[str, Any]
    tainted: bool = False  # the kernel held untrusted data before this cell ran


def interpreter_identity(interpreter: str) -> str:
    """The interpreter part of a key: its canonical path, plus the venv it runs in.

    A venv's ``bin/python`` is a symlink to the base interpreter; resolved alone it would
    share a key (and a kernel) with the base install, whose packages differ.
    """
    canonical = canonical_python(interpreter)
    venv = Path(os.path.abspath(interpreter)).parent.parent
    if (venv / "pyvenv.cfg").is_file():
        return f"{canonical} (venv {venv.resolve()})"
    return canonical
