"""The policy and approval hooks a tool host puts calls to, and how (fail closed).

A policy hook (``policy(call) -> PolicyDecision``, sync or async) sees every valid call; an
approval hook (``async approval(call) -> ApprovalOutcome``, typically a human) the calls that
need approval. A hook that raises, returns something else or times out denies the call with
:class:`~lemon_exec.errors.ToolDenied`; its internals stay in the log, out of the script's view.
"""

from __future__ import annotations

import asyncio
import enum
import inspect
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from lemon_exec.errors import ToolDenied

from ._types import ToolCall

__all__ = [
    "ApprovalHook",
    "ApprovalOutcome",
    "ApprovalRequired",
    "PolicyDecision",
    "PolicyHook",
    "ask_approval",
    "check_policy",
    "needs_approval",
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


async def check_policy(policy: PolicyHook | None, call: ToolCall) -> None:
    """Put ``call`` to the policy hook; :class:`ToolDenied` unless it allows the call."""
    if policy is None:
        return
    try:
        decision = policy(call)
        if inspect.isawaitable(decision):
            decision = await decision
    except Exception:
        # Fail closed, and keep the hook's internals out of the script's view.
        logger.warning("policy hook raised for %s call %s", call.tool, call.call_id, exc_info=True)
        raise ToolDenied(f"{call.tool} denied: policy check failed") from None
    if not isinstance(decision, PolicyDecision):
        logger.warning("policy hook returned %r, not a PolicyDecision", decision)
        raise ToolDenied(f"{call.tool} denied: policy check failed")
    if not decision.allowed:
        raise ToolDenied(f"{call.tool} denied by policy: {decision.reason}")


def needs_approval(approval_required: ApprovalRequired | None, call: ToolCall) -> bool:
    """Whether ``call`` needs approval (``None``: every call does), given an approval hook."""
    if approval_required is None:
        return True
    try:
        return bool(approval_required(call))
    except Exception:
        logger.warning("approval_required raised for %s", call.tool, exc_info=True)
        raise ToolDenied(f"approval for {call.tool} failed") from None


async def ask_approval(
    approval: ApprovalHook,
    call: ToolCall,
    *,
    timeout_s: float | None,
    withdraw: Callable[[asyncio.Future[Any]], None],
) -> None:
    """Ask the approval hook about ``call``; :class:`ToolDenied` unless it was approved.

    ``withdraw`` takes the hook's task when the answer is no longer wanted (timed out, or
    the caller was cancelled).
    """
    outcome = await _wait_for_approval(approval, call, timeout_s, withdraw)
    if outcome is ApprovalOutcome.APPROVED:
        return
    if outcome is ApprovalOutcome.DENIED:
        raise ToolDenied(f"{call.tool} call was denied by the user")
    if outcome is ApprovalOutcome.TIMED_OUT:
        raise ToolDenied(f"approval for {call.tool} timed out")
    raise ToolDenied(f"approval for {call.tool} failed")


async def _wait_for_approval(
    approval: ApprovalHook,
    call: ToolCall,
    timeout_s: float | None,
    withdraw: Callable[[asyncio.Future[Any]], None],
) -> ApprovalOutcome:
    """Run the hook with a timeout; map every kind of failure to an outcome."""
    try:
        pending = approval(call)
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
        done, _ = await asyncio.wait({task}, timeout=timeout_s)
    except asyncio.CancelledError:
        withdraw(task)
        raise
    if not done:
        withdraw(task)
        return ApprovalOutcome.TIMED_OUT
    if task.cancelled():
        return ApprovalOutcome.FAILED
    exc = task.exception()
    if exc is not None:
        logger.warning("approval hook raised for %s", call.tool, exc_info=exc)
        return ApprovalOutcome.FAILED
    return _as_outcome(task.result())


def _as_outcome(value: object) -> ApprovalOutcome:
    """Anything but an :class:`ApprovalOutcome` counts as a failed approval (fail closed)."""
    if isinstance(value, ApprovalOutcome):
        return value
    logger.warning("approval hook returned %r, not an ApprovalOutcome", value)
    return ApprovalOutcome.FAILED
