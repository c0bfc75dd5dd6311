"""Session runs: a call in its session's persistent kernel, or per-call when it cannot be.

The call's cell request is made here and handed to the session registry
(:mod:`~lemon_exec.host.sessions.registry`), which queues it, starts or reuses the kernel
and runs it; the registry's answer (or why it could not run the call) becomes the result.
A call that cannot run in its session before any code started (no scope, no capacity, the
kernel would not start) runs isolated per-call instead, saying so in its first line.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from lemon_exec.config import ExecuteCodeConfig
from lemon_exec.errors import SessionBusyError
from lemon_exec.host.run.calls import Call
from lemon_exec.host.run.per_call import PerCallRuns
from lemon_exec.host.run.requests import CellRequests
from lemon_exec.host.run.results import build_result, fallback_note, left_queue, lost_line, refusal
from lemon_exec.host.sessions.entries import Fallback, SessionKey
from lemon_exec.host.sessions.owners import new_owner_id
from lemon_exec.host.sessions.queue import OwnerGone, QueueLeft
from lemon_exec.host.sessions.registry import SessionRegistry
from lemon_exec.result import ExecuteCodeResult
from lemon_exec.scope import SessionScope
from lemon_exec.telemetry import Telemetry

OWNER_CLOSED_WHILE_QUEUED = (
    "execute_code: the session owner was closed while this call was queued; nothing ran"
)


class SessionRuns:
    """Runs calls in session kernels; owns the owner ids of calls made without ``attach``."""

    def __init__(
        self,
        config: ExecuteCodeConfig,
        registry: SessionRegistry,
        per_call: PerCallRuns,
        requests: CellRequests,
        telemetry: Telemetry,
    ) -> None:
        self.config = config
        self.registry = registry
        self.per_call = per_call
        self.requests = requests
        self.telemetry = telemetry
        #: The owner ``run(scope=...)`` uses when the caller did not ``attach`` one.
        self._default_owners: dict[SessionScope, int] = {}

    async def run(self, call: Call, owner_id: int | None) -> ExecuteCodeResult:
        """Run one call in session mode, falling back to per-call only before code starts."""
        details = {**call.details, "mode": "session"}
        scope = call.scope
        reason: str | None = None
        if scope is None or not scope.complete:
            reason = "missing_session_scope"
        else:
            key = SessionKey.build(scope, call.cwd, call.interpreter, self.config.enabled_helpers)
            if owner_id is None:
                owner_id = self._default_owner(scope, key)
            request = self.requests.for_call(call, chdir=False, cwd=Path(key.cwd))
            try:
                run = await self.registry.execute(
                    owner_id,
                    key,
                    request,
                    reset=call.reset,
                    abort=call.abort,
                    interpreter=call.interpreter,
                )
            except Fallback as fb:
                reason = fb.reason
            except SessionBusyError as exc:
                busy = {**details, "persistent": True, "state_retained": True, "busy": True}
                return refusal(str(exc), busy)
            except QueueLeft as left:
                return left_queue(left.why, left.where, call.timeout_ms, details)
            except OwnerGone:
                # The spec's "caller death" row: state_retained false, though nothing ran.
                gone = {**details, "persistent": True, "state_retained": False}
                return refusal(OWNER_CLOSED_WHILE_QUEUED, {**gone, "never_started": True})
            else:
                lost = run.details.get("kernel_lost_reason")
                return build_result(
                    run.cell,
                    timeout_ms=call.timeout_ms,
                    details={**details, **run.details},
                    tainted=run.tainted,
                    lead=lost_line(lost) if lost else None,
                )
        self.telemetry.emit("session.fallback", {}, {"reason": reason})
        fallback = {
            **details,
            "persistent": False,
            "fallback_reason": reason,
            "kernel_reused": False,
        }
        return await self.per_call.run(replace(call, details=fallback), [fallback_note(reason)])

    def _default_owner(self, scope: SessionScope, key: SessionKey) -> int:
        """The owner id for ``scope`` when the caller did not ``attach`` one.

        Keyed by the canonical directory (the session key's), so ``/d``, ``/d/``, ``./d``, a
        symlink to it and ``/d/x/..`` are one owner: otherwise each spelling would co-own
        the one kernel, and a reset through one would fork instead of resetting it.
        """
        canonical = SessionScope(scope.session_id, scope.agent_id, key.cwd)
        owner_id = self._default_owners.get(canonical)
        if owner_id is None:
            owner_id = self._default_owners[canonical] = new_owner_id()
        return owner_id
