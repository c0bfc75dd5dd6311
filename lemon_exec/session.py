"""SessionOwner: a caller's handle on a session kernel (from ``ExecuteCode.attach``).

Public: runtimes hold it. The facade makes it around an owner id and the facade's own runner
(:class:`lemon_exec.host.run.runner.Runner`, never the facade itself), so an owner's call runs
exactly as a facade call does; see docs/modes.md for co-ownership.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lemon_exec.host.run.calls import CallArgs
from lemon_exec.host.run.runner import Runner
from lemon_exec.jobs import Job, SyncCall
from lemon_exec.result import ExecuteCodeResult
from lemon_exec.scope import AbortSignal, ScriptSource, SessionScope


class SessionOwner:
    """A handle that (co-)owns a session kernel; from :meth:`ExecuteCode.attach`.

    ``await owner.run(script, ...)`` runs in the owner's kernel (the same arguments as
    :meth:`ExecuteCode.run`, less ``scope``: the owner's own is used); ``await
    owner.start(script, ...)`` runs it there as a background job (:meth:`ExecuteCode.start`);
    ``await
    owner.aclose()`` (or ``close()``) detaches: queued calls are removed, an active call is
    aborted and its kernel discarded, and a kernel left without owners stops at once.
    Dropping the handle (garbage collection) detaches it too.
    """

    def __init__(
        self, runner: Runner, scope: SessionScope, owner_id: int, call_sync: SyncCall
    ) -> None:
        self.scope = scope
        self.owner_id = owner_id
        self._runner = runner
        self._call_sync = call_sync  # the facade's: a job's sync twins run on its loop
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    async def run(
        self,
        script: Any,
        *,
        timeout_ms: Any = None,
        reset: Any = False,
        on_update: Callable[[str], None] | None = None,
        abort: AbortSignal | None = None,
        on_output: Callable[[str], None] | None = None,
        source: ScriptSource | None = None,
    ) -> ExecuteCodeResult:
        """Run one script in this owner's session kernel (see :meth:`ExecuteCode.run`)."""
        args = CallArgs(
            script,
            timeout_ms=timeout_ms,
            reset=reset,
            scope=self.scope,
            on_update=on_update,
            abort=abort,
            on_output=on_output,
            source=source or ScriptSource(),
        )
        return await self._runner.run(args, owner=self)

    async def start(
        self,
        script: Any,
        *,
        timeout_ms: Any = None,
        reset: Any = False,
        on_update: Callable[[str], None] | None = None,
        on_output: Callable[[str], None] | None = None,
        source: ScriptSource | None = None,
    ) -> Job:
        """Start one script in this owner's session kernel as a background job.

        The arguments are :meth:`run`'s (less ``abort``: the job's ``cancel()`` is its
        abort); see :meth:`ExecuteCode.start`. Closing the owner while its job runs aborts
        the job, as it aborts an active call.
        """
        args = CallArgs(
            script,
            timeout_ms=timeout_ms,
            reset=reset,
            scope=self.scope,
            on_update=on_update,
            on_output=on_output,
            source=source or ScriptSource(),
        )
        return Job(self._runner.start(args, owner=self), self._call_sync)

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            await self._runner.detach(self.owner_id)

    def close(self) -> None:
        """Detach without awaiting (the kernel, if ownerless, stops in the background)."""
        if not self._closed:
            self._closed = True
            self._runner.detach_soon(self.owner_id)
