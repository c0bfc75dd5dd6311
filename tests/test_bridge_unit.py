"""HostBridge on its own, with a fake reply channel (pure logic; no kernel).

Every behaviour here is also checked end to end with real kernels in ``test_bridge.py``;
these cover the edges that are awkward to reach from a script (a tool that ignores
cancellation, exact ordering of the checks, frames after the end of the cell).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from support import text_frame_bytes

from lemon_exec.errors import ToolDenied, ToolFailure
from lemon_exec.host.cell.host_bridge import (
    ACK_AFTER_S,
    BridgeLimits,
    HostBridge,
    new_token,
)
from lemon_exec.tools import PolicyDecision, ToolCall, ToolHost, ToolRegistry, ToolSpec
from lemon_exec.wire import protocol
from lemon_exec.wire.frame_fields import bad_fields
from lemon_exec.wire.protocol import AUTH_FAILED, REPLAYED

pytestmark = pytest.mark.timeout(20)

LIMITS = BridgeLimits(max_calls=5, max_result_bytes=100, max_text_bytes=1000, max_parallel=2)


class Harness:
    """A bridge whose tools are ``echo`` (returns its ``value``), ``slow``, ``boom`` and
    ``quick`` (sync, and its inline predicate says it may run on the spot)."""

    def __init__(
        self,
        limits: BridgeLimits = LIMITS,
        *,
        policy: Any = None,
        on_notify: Callable[[str], None] | None = None,
    ) -> None:
        self.replies: list[dict[str, Any]] = []
        self.notified = 0  # the last notify number sent
        self.acks: list[Any] = []  # call ids acknowledged on receipt (before the answer)
        self.active = 0
        self.max_active = 0
        self.release = asyncio.Event()
        self.stubborn = False
        registry = ToolRegistry()
        registry.register_function("echo", self._echo, parameters=("value",))
        registry.register_function("slow", self._slow, parameters=("value",))
        registry.register_function("boom", self._boom, parameters=("value",))
        registry.register(
            ToolSpec(
                name="quick",
                func=self._quick,
                description="",
                parameters=("value",),
                inline=lambda params, call: True,
            )
        )
        self.quick_calls = 0
        self.bridge = HostBridge(
            tool_host=ToolHost(registry, policy=policy),
            enabled_tools=("echo", "slow", "boom", "quick"),
            cwd=Path("."),
            limits=limits,
            send_reply=self._record,
            on_notify=on_notify,
        )

    def _record(self, content: dict[str, Any]) -> None:
        if "ack" in content:
            self.acks.append(content["ack"])
        else:
            self.replies.append(content)

    async def _echo(self, params: dict[str, Any], call: ToolCall) -> str:
        return str(params.get("value", ""))

    async def _boom(self, params: dict[str, Any], call: ToolCall) -> str:
        raise ToolFailure("boom failed: on purpose")

    def _quick(self, params: dict[str, Any], call: ToolCall) -> Any:
        self.quick_calls += 1
        value = params.get("value")
        if value == "raise":
            raise ValueError("bad value")
        if value == "int":
            return 7
        return f"quick {value}"

    async def _slow(self, params: dict[str, Any], call: ToolCall) -> str:
        self.active += 1
        self.max_active = max(self.max_active, self.active)
        try:
            while True:
                try:
                    await self.release.wait()
                    return "slow done"
                except asyncio.CancelledError:
                    if not self.stubborn:
                        raise
        finally:
            self.active -= 1

    def call(
        self, call_id: Any, tool: str = "echo", token: str | None = None, **params: Any
    ) -> None:
        self.bridge.handle(
            {
                "type": "call",
                "id": call_id,
                "tool": tool,
                "params": params,
                "token": self.bridge.token if token is None else token,
            }
        )

    def text(self, n: Any, text: Any, token: str | None = None) -> None:
        self.bridge.handle(
            {
                "type": "text",
                "n": n,
                "text": text,
                "token": self.bridge.token if token is None else token,
            }
        )

    def notify(self, msg: Any, token: str | None = None, n: Any = None) -> None:
        if n is None:  # numbered as the kernel numbers them
            self.notified += 1
            n = self.notified
        self.bridge.handle(
            {
                "type": "notify",
                "n": n,
                "msg": msg,
                "token": self.bridge.token if token is None else token,
            }
        )

    def reply_for(self, call_id: Any) -> dict[str, Any]:
        found = [r for r in self.replies if r.get("id") == call_id]
        assert len(found) == 1, (call_id, self.replies)
        return found[0]

    async def settle(self) -> None:
        for _ in range(20):
            await asyncio.sleep(0)


def run(body: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(body())  # type: ignore[arg-type]


def test_token_is_256_bits_url_safe() -> None:
    tokens = {new_token() for _ in range(50)}
    assert len(tokens) == 50
    for token in tokens:
        assert len(token) == protocol.TOKEN_LENGTH == 43
        assert set(token) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")


def test_authentication_before_size_lookup_and_budget() -> None:
    async def body() -> None:
        h = Harness(
            BridgeLimits(max_calls=1, max_result_bytes=100, max_text_bytes=100, max_parallel=1)
        )
        h.call(1, "nope", token="wrong", value="x" * 300_000)  # bad token AND oversized/unknown
        h.call(2, token=None)
        h.bridge.handle({"type": "call", "id": 3, "tool": "echo", "params": {}})  # no token
        h.call(4, token="\udcff")  # undecodable token compares safely
        await h.settle()
        assert h.reply_for(1)["error"] == AUTH_FAILED
        assert h.reply_for(3)["error"] == AUTH_FAILED
        assert h.reply_for(4)["error"] == AUTH_FAILED
        assert h.reply_for(2) == {"comm_id": h.bridge.comm_id, "id": 2, "ok": True, "content": ""}
        s = h.bridge.stats
        assert (s.calls, s.denied, s.errors) == (1, 3, 0)

    run(body)


def test_replay_unknown_malformed_oversized() -> None:
    async def body() -> None:
        h = Harness()
        h.call(1, value="a")
        h.call(1, value="b")  # replay
        h.call(2, "rm")  # unknown tool: a slot is spent
        h.call(2, "rm")  # replayed too
        h.call(3, value="x" * protocol.FRAME_CAP_BYTES)  # oversized
        h.call(3, value="ok")  # the oversized frame did not burn id 3
        for bad in ("4", 0, -1, 2.0, True, None):
            h.call(bad)
        h.bridge.handle({"type": "call", "id": 5, "token": h.bridge.token, "tool": 7, "params": []})
        await h.settle()
        by_id = [(r["id"], r.get("error") or r.get("content")) for r in h.replies]
        assert by_id[:6] == [
            (1, REPLAYED),
            (2, "unknown tool: rm"),
            (2, REPLAYED),
            (3, f"rpc frame too large (max {protocol.FRAME_CAP_BYTES} bytes)"),
            ("4", "rpc request malformed: id must be a positive integer"),
            (0, "rpc request malformed: id must be a positive integer"),
        ]
        assert h.reply_for(5)["error"].startswith("rpc request malformed: tool must be")
        contents = {r["id"]: r["content"] for r in h.replies if r["ok"]}
        assert contents == {1: "a", 3: "ok"}
        assert h.acks == []  # answered at once: no ack needed
        s = h.bridge.stats
        assert (s.calls, s.errors, s.denied) == (4, 2, 0)  # 1, 2 (unknown), 3, 5 (malformed)
        assert s.tools == {"echo"}

    run(body)


def test_call_cap_and_result_budget_edges() -> None:
    async def body() -> None:
        h = Harness(
            BridgeLimits(max_calls=3, max_result_bytes=10, max_text_bytes=100, max_parallel=4)
        )
        h.call(1, value="123456")  # 6 bytes
        await h.settle()
        h.call(2, value="12345")  # 5 > 4 remaining: refused, not charged
        await h.settle()
        h.call(3, value="1234")  # exactly at the edge
        await h.settle()
        h.call(4, value="")  # the fourth call
        await h.settle()
        assert h.reply_for(1)["ok"] and h.reply_for(3)["ok"]
        assert h.reply_for(2)["error"] == (
            "rpc result budget exceeded: this result is 5 bytes, 4 of max_rpc_result_bytes "
            "(10) remain"
        )
        assert h.reply_for(4)["error"] == "rpc call limit exceeded (max 3 calls per script)"
        s = h.bridge.stats
        assert (s.calls, s.errors, s.result_bytes) == (3, 2, 10)

    run(body)


def test_denied_and_failed_tools_are_answered() -> None:
    async def body() -> None:
        def policy(call: ToolCall) -> PolicyDecision:
            return (
                PolicyDecision.deny("nope")
                if call.params.get("value") == "x"
                else (PolicyDecision.allow())
            )

        h = Harness(policy=policy)
        h.call(1, value="x")
        h.call(2, "boom")
        await h.settle()
        assert h.reply_for(1)["error"] == "echo denied by policy: nope"
        assert h.reply_for(2)["error"] == "boom failed: on purpose"
        s = h.bridge.stats
        assert (s.calls, s.denied, s.errors) == (2, 1, 1)
        assert issubclass(ToolDenied, ToolFailure)

    run(body)


def test_parallel_dispatch_bounded_and_cancelled_at_close() -> None:
    async def body() -> None:
        h = Harness()
        for i in range(1, 5):
            h.call(i, "slow")
        await h.settle()
        assert (h.active, h.max_active) == (2, 2)  # max_parallel = 2
        assert h.bridge.in_flight == 4
        await h.bridge.aclose()
        assert h.bridge.in_flight == 0
        assert h.replies == []  # nothing answered after the end of the cell
        s = h.bridge.stats
        assert (s.calls, s.errors) == (4, 4)  # two in flight, two waiting for a slot
        assert not s.accounting_loss
        h.call(5)  # frames after close are ignored
        await h.settle()
        assert h.replies == [] and s.calls == 4

    run(body)


def test_a_call_still_running_is_acknowledged_before_its_answer() -> None:
    """The kernel bounds only the wait for an ack or an answer: a slow call gets an ack."""

    async def body() -> None:
        h = Harness()
        h.call(1, "slow")
        await asyncio.sleep(ACK_AFTER_S / 2)
        assert h.acks == []  # a call that answers quickly costs no ack
        await asyncio.sleep(ACK_AFTER_S)
        assert (h.acks, h.replies) == ([1], [])  # still running: acknowledged, once
        h.release.set()
        await h.settle()
        assert h.reply_for(1)["content"] == "slow done"
        assert h.acks == [1]

    run(body)


def test_close_does_not_hang_on_a_tool_that_ignores_cancellation() -> None:
    async def body() -> None:
        h = Harness()
        h.stubborn = True
        h.call(1, "slow")
        await h.settle()
        loop = asyncio.get_running_loop()
        started = loop.time()
        await asyncio.wait_for(h.bridge.aclose(), 5)
        assert loop.time() - started < 2
        assert h.bridge.stats.accounting_loss  # its outcome can no longer be proven
        assert h.bridge.stats.details()["rpc_accounting_loss"] is True
        h.release.set()  # let the stubborn tool finish; its answer is never sent
        await h.settle()
        assert h.replies == []

    run(body)


def test_text_frames_budget_and_order() -> None:
    async def body() -> None:
        nul = "\0" * 50
        edge = text_frame_bytes(1, nul) + text_frame_bytes(2, "\ufffd")
        h = Harness(
            BridgeLimits(max_calls=5, max_result_bytes=10, max_text_bytes=edge, max_parallel=1)
        )
        h.text(1, "x", token="bad")
        h.text(1, nul)
        h.text(1, "again")  # replay
        h.text(3, "skipped")
        h.text("2", "bad n")  # malformed: consumed, no reply
        h.text(2, 42)  # malformed: consumed, no reply
        h.text(2, "\ud800")  # lone surrogate: charged as U+FFFD, exactly at the edge
        h.text(3, "")  # nothing left
        big = "y" * (protocol.FRAME_CAP_BYTES + 1)
        h.text(3, big)
        assert [(r["n"], r["ok"], r.get("error")) for r in h.replies] == [
            (1, False, AUTH_FAILED),
            (1, True, None),
            (1, False, REPLAYED),
            (3, False, "rpc request malformed: text blocks must be numbered in order"),
            (2, True, None),
            (3, False, f"text() budget exceeded (max_text_bytes {edge})"),
            (3, False, f"rpc frame too large (max {protocol.FRAME_CAP_BYTES} bytes)"),
        ]
        assert h.bridge.text_blocks == [nul, "\ufffd"]
        assert h.bridge.stats.text_bytes == edge
        assert h.bridge.stats.denied == 1

    run(body)


def test_notify_cap_truncation_and_malformed() -> None:
    async def body() -> None:
        got: list[str] = []
        h = Harness(on_notify=got.append)
        h.notify("forged", token="bad", n=1)
        h.notify({"not": "a string"}, n=1)
        h.notify("z" * (protocol.FRAME_CAP_BYTES + 10), n=1)  # oversized frame: dropped
        h.bridge.handle({"type": "notify", "token": h.bridge.token})
        h.notify("\u20ac" * 2000)
        for i in range(100):
            h.notify(f"m{i}")
        assert len(got) == 64
        assert got[0] == "notify: " + "\u20ac" * 1365  # the 4 KiB cap is on the message
        assert got[1:] == [f"notify: m{i}" for i in range(63)]
        assert h.bridge.stats.notifications == 64
        assert h.bridge.stats.denied == 0
        assert h.replies == []  # fire-and-forget

    run(body)


def test_frame_fields_by_type_and_range() -> None:
    """Pure logic: the field table of every frame kind (wire/frame_fields.py)."""
    token = "t" * 43
    call = {"type": "call", "id": 1, "token": token, "tool": "read", "params": {}}
    text = {"type": "text", "n": 1, "token": token, "text": "x"}
    notify = {"type": "notify", "n": 64, "token": token, "msg": "m"}
    assert bad_fields("call", call) == []
    assert bad_fields("text", text) == [] and bad_fields("text", {**text, "more": True}) == []
    assert bad_fields("notify", notify) == []
    for value in (True, False, 0, -1, 1.0, "1", None, 2**63, [1]):
        assert bad_fields("call", {**call, "id": value}) == ["id"], value
        assert bad_fields("text", {**text, "n": value}) == ["n"], value
        assert bad_fields("notify", {**notify, "n": value}) == ["n"], value
    assert bad_fields("notify", {**notify, "n": 65}) == ["n"]
    assert bad_fields("text", {**text, "more": 1}) == ["more"]
    assert bad_fields("text", {**text, "more": None}) == ["more"]
    assert bad_fields("call", {**call, "params": []}) == ["params"]
    assert bad_fields("call", {**call, "tool": 1}) == ["tool"]
    assert bad_fields("notify", {**notify, "msg": b"m"}) == ["msg"]
    assert bad_fields("notify", {**notify, "token": None}) == ["token"]
    assert bad_fields("text", {**text, "extra": 1, "aa": 2}) == ["aa", "extra"]
    assert bad_fields("notify", {"type": "notify", "token": token}) == ["n", "msg"]


def test_a_notify_number_is_delivered_once() -> None:
    async def body() -> None:
        got: list[str] = []
        h = Harness(on_notify=got.append)
        h.notify("first", n=2)
        h.notify("replay", n=2)
        h.notify("earlier", n=1)  # threads may send their numbers out of order
        h.notify("string n", n="3")
        h.notify("bool n", n=True)
        assert got == ["notify: first", "notify: earlier"]
        assert h.bridge.stats.notifications == 2

    run(body)


def test_notify_callback_failure_is_contained() -> None:
    async def body() -> None:
        def broken(_msg: str) -> None:
            raise RuntimeError("callback bug")

        h = Harness(on_notify=broken)
        h.notify("a")
        h.call(1, value="still works")
        await h.settle()
        assert h.reply_for(1)["content"] == "still works"
        assert h.bridge.stats.notifications == 1
        assert not h.bridge.stats.accounting_loss

    run(body)


def test_dispatcher_fault_marks_accounting_loss() -> None:
    async def body() -> None:
        h = Harness()

        def broken_send(_content: dict[str, Any]) -> None:
            raise RuntimeError("socket gone")

        h.bridge._send_reply = broken_send
        h.call(1, "nope")  # answered inside the claim: the send fails
        assert h.bridge.stats.accounting_loss
        assert h.bridge.stats.details()["rpc_accounting_loss"] is True

    run(body)


def test_non_dict_and_unknown_frames_are_ignored() -> None:
    async def body() -> None:
        h = Harness()
        for frame in ("{not json", ["call", 1], None, 42, {"type": "mystery"}, {}):
            h.bridge.handle(frame)
        await h.settle()
        assert h.replies == []
        s = h.bridge.stats
        assert (s.calls, s.denied, s.errors, s.notifications) == (0, 0, 0, 0)
        assert not s.accounting_loss

    run(body)


def test_an_inline_call_is_answered_before_handle_returns() -> None:
    async def body() -> None:
        h = Harness()
        h.call(1, "quick", value="a")
        # No await in between: answered from the frame's own callback, no task left behind.
        assert h.reply_for(1) == {
            "comm_id": h.bridge.comm_id,
            "id": 1,
            "ok": True,
            "content": "quick a",
        }
        assert h.bridge.in_flight == 0 and h.acks == []
        h.call(2, "quick", value="raise")
        h.call(3, "quick", value="int")
        assert h.reply_for(2)["error"] == "quick failed: ValueError: bad value"
        assert h.reply_for(3)["error"] == "quick failed: returned int instead of str"
        h.call(4, "quick", value="x" * 200)  # over the 100-byte result budget: refused
        assert "rpc result budget exceeded" in h.reply_for(4)["error"]
        s = h.bridge.stats
        assert (s.calls, s.errors, s.result_bytes) == (4, 3, len("quick a"))

    run(body)


def test_an_inline_call_waits_its_turn_when_every_slot_is_taken() -> None:
    async def body() -> None:
        h = Harness()  # max_parallel = 2
        h.call(1, "slow")
        h.call(2, "slow")
        await h.settle()
        h.call(3, "quick", value="b")
        await h.settle()
        assert h.quick_calls == 0 and h.replies == []  # the parallel bound holds for it too
        h.release.set()
        await h.settle()
        assert h.reply_for(3)["content"] == "quick b"
        assert h.reply_for(1)["content"] == "slow done"

    run(body)


def test_with_a_policy_hook_an_inline_call_goes_through_the_hook() -> None:
    async def body() -> None:
        seen: list[Any] = []

        async def policy(call: ToolCall) -> PolicyDecision:
            seen.append(call.params.get("value"))
            return (
                PolicyDecision.deny("no")
                if call.params.get("value") == "d"
                else PolicyDecision.allow()
            )

        h = Harness(policy=policy)
        h.call(1, "quick", value="c")
        h.call(2, "quick", value="d")
        assert h.replies == []  # an async hook may wait: the call runs as a task
        await h.settle()
        assert seen == ["c", "d"]
        assert h.reply_for(1)["content"] == "quick c"
        assert h.reply_for(2)["error"] == "quick denied by policy: no"
        assert h.quick_calls == 1

    run(body)
