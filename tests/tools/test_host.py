"""ToolHost: validation, policy hook, approval hook, withdrawal, tool errors."""

from __future__ import annotations

import asyncio
import pathlib
import threading
from typing import Any, cast

import pytest

from lemon_exec.errors import ToolDenied, ToolFailure
from lemon_exec.tools import (
    ApprovalOutcome,
    PolicyDecision,
    ToolCall,
    ToolHost,
    ToolRegistry,
)

pytestmark = pytest.mark.timeout(10)

CWD = pathlib.Path("/")


class Recorder:
    """A registry with an async ``rec(a, b=None)`` tool that records every run."""

    def __init__(self) -> None:
        self.runs: list[dict[str, Any]] = []
        self.registry = ToolRegistry()

        async def rec(params: dict[str, Any], call: ToolCall) -> str:
            self.runs.append(params)
            return f"ran {params['a']}"

        self.registry.register_function(
            "rec", rec, parameters=("a", "b"), required=("a",), param_types={"a": str, "b": int}
        )


def call(tool: str = "rec", **params: Any) -> ToolCall:
    return ToolCall(tool, params if params else {"a": "x"}, CWD, 1)


def run(host: ToolHost, c: ToolCall) -> str:
    return asyncio.run(host.invoke(c))


# -- validation ----------------------------------------------------------------------------------


def test_happy_path() -> None:
    rec = Recorder()
    assert run(ToolHost(rec.registry), call(a="hi", b=2)) == "ran hi"
    assert rec.runs == [{"a": "hi", "b": 2}]


def test_unknown_tool() -> None:
    with pytest.raises(ToolFailure, match=r"^unknown tool: nope$"):
        run(ToolHost(Recorder().registry), call("nope"))


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"a": "x", "x": 1}, "rec() got an unexpected keyword argument 'x'"),
        ({}, "rec() missing 1 required positional argument: 'a'"),
        ({"a": None}, "rec() missing 1 required positional argument: 'a'"),
        ({"a": 1}, "rec() argument 'a' must be str, not int"),
        ({"a": "x", "b": "2"}, "rec() argument 'b' must be int, not str"),
        ({"a": "x", "b": True}, "rec() argument 'b' must be int, not bool"),
        ({"a": "x", 3: 1}, "rec() keywords must be strings"),
    ],
)
def test_param_validation(params: dict, message: str) -> None:
    rec = Recorder()
    with pytest.raises(ToolFailure) as info:
        run(ToolHost(rec.registry), ToolCall("rec", params, CWD, 1))
    assert str(info.value) == message
    assert not isinstance(info.value, ToolDenied)
    assert rec.runs == []


def test_params_must_be_a_dict() -> None:
    with pytest.raises(ToolFailure, match=r"rec\(\) params must be a dict, not list"):
        run(ToolHost(Recorder().registry), ToolCall("rec", ["x"], CWD, 1))  # type: ignore[arg-type]


def test_missing_several_required_mirrors_python() -> None:
    registry = ToolRegistry()
    registry.register_function(
        "t", lambda p, c: "", parameters=("a", "b", "c"), required=("a", "b", "c")
    )
    with pytest.raises(ToolFailure) as info:
        run(ToolHost(registry), ToolCall("t", {"b": 1}, CWD, 1))
    assert str(info.value) == "t() missing 2 required positional arguments: 'a' and 'c'"
    with pytest.raises(ToolFailure) as info:
        run(ToolHost(registry), ToolCall("t", {}, CWD, 1))
    assert str(info.value) == "t() missing 3 required positional arguments: 'a', 'b', and 'c'"


def test_none_for_an_optional_param_is_accepted() -> None:
    rec = Recorder()
    assert run(ToolHost(rec.registry), call(a="x", b=None)) == "ran x"


# -- the tool itself -----------------------------------------------------------------------------


def test_sync_tool_runs_in_a_worker_thread() -> None:
    seen: list[threading.Thread] = []
    registry = ToolRegistry()

    def sync_tool(params: dict, c: ToolCall) -> str:
        seen.append(threading.current_thread())
        return "sync"

    registry.register_function("s", sync_tool, parameters=())
    assert run(ToolHost(registry), ToolCall("s", {}, CWD, 1)) == "sync"
    assert seen and seen[0] is not threading.main_thread()


def test_unexpected_exception_becomes_toolfailure() -> None:
    registry = ToolRegistry()

    def boom(params: dict, c: ToolCall) -> str:
        raise ValueError("boom")

    registry.register_function("boom", boom, parameters=())
    with pytest.raises(ToolFailure) as info:
        run(ToolHost(registry), ToolCall("boom", {}, CWD, 1))
    assert str(info.value) == "boom failed: ValueError: boom"
    assert isinstance(info.value.__cause__, ValueError)


def test_toolfailure_from_a_tool_passes_through() -> None:
    registry = ToolRegistry()
    original = ToolFailure("custom message")

    async def fails(params: dict, c: ToolCall) -> str:
        raise original

    registry.register_function("f", fails, parameters=())
    with pytest.raises(ToolFailure) as info:
        run(ToolHost(registry), ToolCall("f", {}, CWD, 1))
    assert info.value is original


def test_non_str_result_is_a_failure() -> None:
    registry = ToolRegistry()
    # Any: the wrong return type is the point of the test.
    registry.register_function("n", cast(Any, lambda p, c: 42), parameters=())
    with pytest.raises(ToolFailure, match="n failed: returned int instead of str"):
        run(ToolHost(registry), ToolCall("n", {}, CWD, 1))


# -- policy --------------------------------------------------------------------------------------


def test_policy_allow_runs_the_tool() -> None:
    rec = Recorder()
    seen: list[ToolCall] = []

    def policy(c: ToolCall) -> PolicyDecision:
        seen.append(c)
        return PolicyDecision.allow()

    c = call()
    assert run(ToolHost(rec.registry, policy=policy), c) == "ran x"
    assert seen == [c] and len(rec.runs) == 1


def test_async_policy_deny() -> None:
    rec = Recorder()

    async def policy(c: ToolCall) -> PolicyDecision:
        return PolicyDecision.deny("no rec today")

    with pytest.raises(ToolDenied) as info:
        run(ToolHost(rec.registry, policy=policy), call())
    assert str(info.value) == "rec denied by policy: no rec today"
    assert rec.runs == []


@pytest.mark.parametrize("kind", ["raises", "garbage"])
def test_policy_failure_fails_closed(kind: str) -> None:
    rec = Recorder()

    def policy(c: ToolCall) -> Any:
        if kind == "raises":
            raise RuntimeError("secret internals")
        return True

    with pytest.raises(ToolDenied) as info:
        run(ToolHost(rec.registry, policy=policy), call())
    assert str(info.value) == "rec denied: policy check failed"
    assert "secret" not in str(info.value)
    assert rec.runs == []


def test_policy_runs_after_validation_and_before_approval() -> None:
    rec = Recorder()
    order: list[str] = []

    def policy(c: ToolCall) -> PolicyDecision:
        order.append("policy")
        return PolicyDecision.deny("stop")

    async def approval(c: ToolCall) -> ApprovalOutcome:
        order.append("approval")
        return ApprovalOutcome.APPROVED

    host = ToolHost(rec.registry, policy=policy, approval=approval)
    with pytest.raises(ToolFailure, match="unexpected keyword"):
        run(host, call(a="x", zzz=1))
    assert order == []
    with pytest.raises(ToolDenied):
        run(host, call())
    assert order == ["policy"]
    assert rec.runs == []


# -- approval ------------------------------------------------------------------------------------


def test_approval_approved_runs_the_tool() -> None:
    rec = Recorder()
    asked: list[int] = []

    async def approval(c: ToolCall) -> ApprovalOutcome:
        asked.append(c.call_id)
        return ApprovalOutcome.APPROVED

    assert run(ToolHost(rec.registry, approval=approval), call()) == "ran x"
    assert asked == [1] and len(rec.runs) == 1


@pytest.mark.parametrize(
    ("outcome", "message"),
    [
        (ApprovalOutcome.DENIED, "rec call was denied by the user"),
        (ApprovalOutcome.TIMED_OUT, "approval for rec timed out"),
        (ApprovalOutcome.FAILED, "approval for rec failed"),
        ("yes", "approval for rec failed"),  # not an ApprovalOutcome: fail closed
    ],
)
def test_approval_refusals(outcome: Any, message: str) -> None:
    rec = Recorder()

    async def approval(c: ToolCall) -> Any:
        return outcome

    with pytest.raises(ToolDenied) as info:
        run(ToolHost(rec.registry, approval=approval), call())
    assert str(info.value) == message
    assert rec.runs == []


def test_approval_hook_raising_is_failed() -> None:
    rec = Recorder()

    async def approval(c: ToolCall) -> ApprovalOutcome:
        raise RuntimeError("ui crashed")

    with pytest.raises(ToolDenied) as info:
        run(ToolHost(rec.registry, approval=approval), call())
    assert str(info.value) == "approval for rec failed"
    assert rec.runs == []


def test_approval_timeout_cancels_the_hook() -> None:
    rec = Recorder()
    hook_cancelled = []

    async def approval(c: ToolCall) -> ApprovalOutcome:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            hook_cancelled.append(True)
            raise
        return ApprovalOutcome.APPROVED

    async def main() -> None:
        host = ToolHost(rec.registry, approval=approval, approval_timeout_s=0.05)
        with pytest.raises(ToolDenied) as info:
            await host.invoke(call())
        assert str(info.value) == "approval for rec timed out"
        await asyncio.sleep(0)  # let the hook observe its cancellation

    asyncio.run(main())
    assert hook_cancelled == [True]
    assert rec.runs == []


def test_approval_required_selects_calls() -> None:
    rec = Recorder()
    asked: list[str] = []

    async def approval(c: ToolCall) -> ApprovalOutcome:
        asked.append(c.params["a"])
        return ApprovalOutcome.DENIED

    host = ToolHost(
        rec.registry, approval=approval, approval_required=lambda c: c.params["a"] == "risky"
    )
    assert run(host, call(a="safe")) == "ran safe"
    with pytest.raises(ToolDenied):
        run(host, call(a="risky"))
    assert asked == ["risky"]
    assert [r["a"] for r in rec.runs] == ["safe"]


def test_approval_required_raising_fails_closed() -> None:
    rec = Recorder()

    async def approval(c: ToolCall) -> ApprovalOutcome:
        return ApprovalOutcome.APPROVED

    def required(c: ToolCall) -> bool:
        raise RuntimeError("bad predicate")

    host = ToolHost(rec.registry, approval=approval, approval_required=required)
    with pytest.raises(ToolDenied, match="approval for rec failed"):
        run(host, call())
    assert rec.runs == []


def test_no_approval_hook_means_no_approval() -> None:
    rec = Recorder()
    assert run(ToolHost(rec.registry), call()) == "ran x"


def test_bad_host_configuration() -> None:
    registry = Recorder().registry
    with pytest.raises(ValueError, match="without an approval hook"):
        ToolHost(registry, approval_required=lambda c: True)
    with pytest.raises(ValueError, match="positive"):
        ToolHost(registry, approval_timeout_s=0)


# -- withdrawal on cancellation ------------------------------------------------------------------


@pytest.mark.parametrize("stubborn", [False, True], ids=["polite-hook", "stubborn-hook"])
def test_cancel_during_approval_withdraws_it(stubborn: bool) -> None:
    """The cell ends while the user is still deciding; a later "approved" must not run the tool."""
    rec = Recorder()
    events: list[str] = []

    async def main() -> None:
        answer: asyncio.Future[ApprovalOutcome] = asyncio.get_running_loop().create_future()
        asked = asyncio.Event()
        hook_done = asyncio.Event()

        async def approval(c: ToolCall) -> ApprovalOutcome:
            asked.set()
            try:
                while True:
                    try:
                        return await asyncio.shield(answer)
                    except asyncio.CancelledError:
                        events.append("hook saw withdrawal")
                        if not stubborn or len(events) > 1:
                            raise
                        # A stubborn hook ignores the withdrawal (once, so that asyncio.run
                        # can still shut down if this test fails) and answers anyway.
            finally:
                hook_done.set()

        host = ToolHost(rec.registry, approval=approval)
        task = asyncio.create_task(host.invoke(call()))
        await asked.wait()
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=2)
        assert task in done, "invoke() did not end promptly when cancelled"
        assert task.cancelled()
        answer.set_result(ApprovalOutcome.APPROVED)  # the user clicks "approve" afterwards
        await asyncio.wait_for(hook_done.wait(), 2)
        for _ in range(10):
            await asyncio.sleep(0)

    asyncio.run(main())
    assert events == ["hook saw withdrawal"]
    assert rec.runs == []


@pytest.mark.parametrize("spins", range(6))
def test_approval_racing_cancellation_never_runs_after_cancel(spins: int) -> None:
    """Release the answer and cancel within a few loop iterations of each other."""
    rec = Recorder()
    outcome: list[str] = []

    async def main() -> None:
        gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        asked = asyncio.Event()

        async def approval(c: ToolCall) -> ApprovalOutcome:
            asked.set()
            await gate
            return ApprovalOutcome.APPROVED

        task = asyncio.create_task(ToolHost(rec.registry, approval=approval).invoke(call()))
        await asked.wait()
        gate.set_result(None)
        for _ in range(spins):
            await asyncio.sleep(0)
        task.cancel()
        try:
            await task
            outcome.append("completed")
        except asyncio.CancelledError:
            outcome.append("cancelled")
        for _ in range(10):
            await asyncio.sleep(0)

    asyncio.run(main())
    if outcome == ["cancelled"]:
        assert rec.runs == []  # cancelled while waiting for approval: withdrawn for good
    else:
        assert outcome == ["completed"] and len(rec.runs) == 1


@pytest.mark.parametrize(
    ("predicate", "inline"),
    [
        (None, False),
        (lambda p, c: True, True),
        (lambda p, c: False, False),
        (lambda p, c: 1 / 0, False),
    ],
    ids=["no-predicate", "true", "false", "raises"],
)
def test_sync_tools_run_inline_only_when_their_predicate_says_so(
    predicate: Any, inline: bool
) -> None:
    from lemon_exec.tools import ToolSpec

    def where(params: dict[str, Any], call: ToolCall) -> str:
        return threading.current_thread().name

    registry = ToolRegistry()
    registry.register(ToolSpec(name="where", func=where, inline=predicate))

    async def main() -> tuple[str, str]:
        loop_thread = threading.current_thread().name
        ran_in = await ToolHost(registry).invoke(
            ToolCall(tool="where", params={}, cwd=CWD, call_id=1)
        )
        return loop_thread, ran_in

    loop_thread, ran_in = asyncio.run(main())
    assert (ran_in == loop_thread) is inline


def test_read_is_inline_for_small_files_only(tmp_path: pathlib.Path) -> None:
    from lemon_exec.tools._read import INLINE_MAX_BYTES, is_small_file

    small, big = tmp_path / "small.txt", tmp_path / "big.txt"
    small.write_text("x")
    big.write_text("x" * (INLINE_MAX_BYTES + 1))
    call = ToolCall(tool="read", params={}, cwd=tmp_path, call_id=1)
    assert is_small_file({"path": "small.txt"}, call)
    assert not is_small_file({"path": "big.txt"}, call)
    assert not is_small_file({"path": "."}, call)
