"""The tool host: validate a call, ask the policy and approval hooks, run the tool.

Every failure becomes a :class:`~lemon_exec.errors.ToolFailure` (or its subclass
:class:`~lemon_exec.errors.ToolDenied`), whose message the script sees as a ``ToolError``.
Hooks fail closed: a hook that raises, returns garbage or times out denies the call.
"""

from __future__ import annotations

import asyncio
import enum
import inspect
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from lemon_exec.errors import ToolDenied, ToolFailure

from ._registry import ToolRegistry
from ._types import ToolCall, ToolSpec
from ._validate import validate_params

__all__ = [
    "ApprovalHook",
    "ApprovalOutcome",
    "ApprovalRequired",
    "PolicyDecision",
    "PolicyHook",
    "ToolHost",
]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PolicyDecision:
    """A policy hook's verdict on one call."""

    allowed: bool
    reason: str = ""

    @classmethod
    def allow(cls) -> PolicyDecision:
        """Let the call proceed (to approval, if required, then to the tool)."""
        return cls(True, "")

    @classmethod
    def deny(cls, reason: str) -> PolicyDecision:
        """Refuse the call; ``reason`` is shown to the script."""
        return cls(False, reason)


class ApprovalOutcome(enum.Enum):
    """What the approval hook (typically: a human) answered."""

    APPROVED = "approved"
    DENIED = "denied"
    TIMED_OUT = "timed_out"
    FAILED = "failed"


#: ``policy(call) -> PolicyDecision`` (sync or async). Sync hooks run on the event loop, so they
#: must be quick.
PolicyHook = Callable[[ToolCall], PolicyDecision | Awaitable[PolicyDecision]]
#: ``async def approval(call) -> ApprovalOutcome``.
ApprovalHook = Callable[[ToolCall], Awaitable[ApprovalOutcome]]
#: ``approval_required(call) -> bool``: does this call need approval?
ApprovalRequired = Callable[[ToolCall], bool]


class ToolHost:
    """Runs tool calls for scripts, guarded by an optional policy hook and approval hook.

    Args:
        registry: the tools this host offers.
        policy: checked for every valid call; a denial raises :class:`ToolDenied`.
        approval: asked for calls that need approval (see ``approval_required``).
        approval_required: which calls need approval. ``None`` means: every call when an
            ``approval`` hook is given, none otherwise. Giving it without ``approval`` is a
            configuration error (``ValueError``).
        approval_timeout_s: how long to wait for the approval hook (``None``: forever).
    """

    def __init__(
        self,
        registry: ToolRegistry,
        *,
        policy: PolicyHook | None = None,
        approval: ApprovalHook | None = None,
        approval_required: ApprovalRequired | None = None,
        approval_timeout_s: float | None = 300.0,
    ) -> None:
        if approval_required is not None and approval is None:
            raise ValueError("approval_required was given without an approval hook")
        if approval_timeout_s is not None and approval_timeout_s <= 0:
            raise ValueError("approval_timeout_s must be positive (or None for no timeout)")
        self.registry = registry
        self._policy = policy
        self._approval = approval
        self._approval_required = approval_required
        self._approval_timeout_s = approval_timeout_s
        # Withdrawn hook tasks that ignored cancellation; kept referenced until they finish so
        # they are neither garbage-collected mid-flight nor reported as "never retrieved".
        self._orphans: set[asyncio.Future[Any]] = set()

    def names(self) -> list[str]:
        """The tools this host offers, in registration order."""
        return self.registry.names()

    def describe(self, name: str) -> dict[str, Any]:
        """A JSON-friendly description of tool ``name``, for the schema/helper generator.

        Keys: ``name``, ``description``, ``parameters``, ``required``, ``defaults``,
        ``types`` (type names per parameter) and ``signature`` (e.g.
        ``"read(path, offset=None, limit=None)"``). Raises ``KeyError`` for an unknown name.
        """
        spec = self.registry.get(name)
        if spec is None:
            raise KeyError(f"unknown tool: {name}")
        return {
            "name": spec.name,
            "description": spec.description,
            "parameters": list(spec.parameters),
            "required": list(spec.required),
            "defaults": dict(spec.defaults),
            "types": {k: _type_label(v) for k, v in spec.param_types.items()},
            "signature": _signature(spec),
        }

    async def invoke(self, call: ToolCall) -> str:
        """Run one call and return the tool's text.

        Raises :class:`ToolFailure` (or :class:`ToolDenied`) with the message for the script.
        If the awaiting task is cancelled while approval is pending, the approval is withdrawn:
        the hook's task is cancelled, ``CancelledError`` propagates, and the tool never runs.
        """
        spec = self.registry.get(call.tool)
        if spec is None:
            raise ToolFailure(f"unknown tool: {call.tool}")
        params = validate_params(spec, call.params)
        await self._check_policy(call)
        if self._needs_approval(call):
            await self._ask_approval(call)
        return await self._run(spec, params, call)

    # -- policy ------------------------------------------------------------------------------

    async def _check_policy(self, call: ToolCall) -> None:
        if self._policy is None:
            return
        try:
            decision = self._policy(call)
            if inspect.isawaitable(decision):
                decision = await decision
        except Exception:
            # Fail closed, and keep the hook's internals out of the script's view.
            logger.warning(
                "policy hook raised for %s call %s", call.tool, call.call_id, exc_info=True
            )
            raise ToolDenied(f"{call.tool} denied: policy check failed") from None
        if not isinstance(decision, PolicyDecision):
            logger.warning("policy hook returned %r, not a PolicyDecision", decision)
            raise ToolDenied(f"{call.tool} denied: policy check failed")
        if not decision.allowed:
            raise ToolDenied(f"{call.tool} denied by policy: {decision.reason}")

    # -- approval ----------------------------------------------------------------------------

    def _needs_approval(self, call: ToolCall) -> bool:
        if self._approval is None:
            return False
        if self._approval_required is None:
            return True
        try:
            return bool(self._approval_required(call))
        except Exception:
            logger.warning("approval_required raised for %s", call.tool, exc_info=True)
            raise ToolDenied(f"approval for {call.tool} failed") from None

    async def _ask_approval(self, call: ToolCall) -> None:
        outcome = await self._wait_for_approval(call)
        if outcome is ApprovalOutcome.APPROVED:
            return
        if outcome is ApprovalOutcome.DENIED:
            raise ToolDenied(f"{call.tool} call was denied by the user")
        if outcome is ApprovalOutcome.TIMED_OUT:
            raise ToolDenied(f"approval for {call.tool} timed out")
        raise ToolDenied(f"approval for {call.tool} failed")

    async def _wait_for_approval(self, call: ToolCall) -> ApprovalOutcome:
        """Run the hook with a timeout; map every kind of failure to an outcome."""
        assert self._approval is not None
        try:
            pending = self._approval(call)
        except Exception:
            logger.warning("approval hook raised for %s", call.tool, exc_info=True)
            return ApprovalOutcome.FAILED
        if not inspect.isawaitable(pending):
            return _as_outcome(pending)
        task = asyncio.ensure_future(pending)
        try:
            # asyncio.wait (not wait_for) never returns the hook's result once we have been
            # cancelled, even if the hook finished in the same loop iteration, and it never
            # waits for a hook that ignores cancellation. That is what makes withdrawal final.
            done, _ = await asyncio.wait({task}, timeout=self._approval_timeout_s)
        except asyncio.CancelledError:
            self._withdraw(task)
            raise
        if not done:
            self._withdraw(task)
            return ApprovalOutcome.TIMED_OUT
        if task.cancelled():
            return ApprovalOutcome.FAILED
        exc = task.exception()
        if exc is not None:
            logger.warning("approval hook raised for %s", call.tool, exc_info=exc)
            return ApprovalOutcome.FAILED
        return _as_outcome(task.result())

    def _withdraw(self, task: asyncio.Future[Any]) -> None:
        """Cancel a pending approval; whatever it answers later is discarded."""
        task.cancel()
        if task.done():
            self._forget_orphan(task)  # it answered just too late
        else:
            self._orphans.add(task)
            task.add_done_callback(self._forget_orphan)

    def _forget_orphan(self, task: asyncio.Future[Any]) -> None:
        self._orphans.discard(task)
        if not task.cancelled():
            task.exception()  # mark retrieved; the answer itself is deliberately dropped

    # -- the tool ----------------------------------------------------------------------------

    async def _run(self, spec: ToolSpec, params: dict[str, Any], call: ToolCall) -> str:
        try:
            if inspect.iscoroutinefunction(spec.func):
                result = await spec.func(params, call)
            elif _runs_inline(spec, params, call):
                result = spec.func(params, call)
            else:
                # Sync tools do blocking I/O; a thread keeps the event loop (and every other
                # running script) responsive.
                result = await asyncio.to_thread(spec.func, params, call)
                if inspect.isawaitable(result):
                    result = await result
        except ToolFailure:
            raise
        except Exception as e:
            logger.warning("tool %s raised", spec.name, exc_info=True)
            raise ToolFailure(f"{spec.name} failed: {type(e).__name__}: {e}") from e
        if not isinstance(result, str):
            raise ToolFailure(
                f"{spec.name} failed: returned {type(result).__name__} instead of str"
            )
        return result


def _runs_inline(spec: ToolSpec, params: dict[str, Any], call: ToolCall) -> bool:
    if spec.inline is None:
        return False
    try:
        return bool(spec.inline(params, call))
    except Exception:  # the predicate is an optimisation; when in doubt, use a thread
        return False


def _as_outcome(value: object) -> ApprovalOutcome:
    """Anything but an :class:`ApprovalOutcome` counts as a failed approval (fail closed)."""
    if isinstance(value, ApprovalOutcome):
        return value
    logger.warning("approval hook returned %r, not an ApprovalOutcome", value)
    return ApprovalOutcome.FAILED


def _type_label(expected: type | tuple[type, ...]) -> str:
    types = expected if isinstance(expected, tuple) else (expected,)
    return " | ".join(t.__name__ for t in types)


def _signature(spec: ToolSpec) -> str:
    parts = []
    for p in spec.parameters:
        if p in spec.required:
            parts.append(p)
        else:
            parts.append(f"{p}={spec.defaults.get(p)!r}")
    return f"{spec.name}({', '.join(parts)})"
