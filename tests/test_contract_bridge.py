"""Issue 11, the bridge's share of the contract: text() from threads, notify() partial updates,
batch() failures in input order, and text() blocks larger than one protocol frame.

Real kernels (one shared session-mode facade) except for the reassembly edges, which drive a
HostBridge directly with hand-made frames (pure logic).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from support import configured, text_frame_bytes

from lemon_exec import ExecuteCode, SessionScope
from lemon_exec.host.cell.host_bridge import BridgeLimits, HostBridge
from lemon_exec.host.run.results import DIAGNOSTICS_HEADER, TEXT_HEADER
from lemon_exec.tools import ToolHost, ToolRegistry
from lemon_exec.wire import protocol, text_budget

pytestmark = [pytest.mark.timeout(60), pytest.mark.kernel]

MIB = 1 << 20


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("contract-bridge")
    (root / "a.txt").write_text("hello\n")
    return root


@pytest.fixture(scope="module")
def scope(work: Path) -> SessionScope:
    return SessionScope("contract-bridge", "agent", cwd=str(work))


@pytest.fixture(scope="module")
def ec(session_facade: ExecuteCode) -> ExecuteCode:
    return session_facade


def run(ec: ExecuteCode, scope: SessionScope, script: str, **kwargs: Any) -> Any:
    return ec.run_sync(script, scope=scope, **kwargs)


def blocks_of(content: str) -> list[str]:
    """The text() section of a result, one entry per line (tests emit one-line blocks)."""
    assert TEXT_HEADER in content, content
    section = content.split(TEXT_HEADER + "\n", 1)[1]
    section = section.split("\n\n" + DIAGNOSTICS_HEADER, 1)[0]
    return section.rstrip("\n").split("\n")


def last_json(content: str) -> Any:
    return json.loads(content.strip().splitlines()[-1])


# -- 1. text() from threads --------------------------------------------------------------------

THREADS_SCRIPT = """
import threading
start = threading.Barrier(16)
errors = []
def worker(i):
    start.wait()
    for k in range(2):
        try:
            text(f"t{i}-{k}")
        except ToolError as e:
            errors.append(str(e))
threads = [threading.Thread(target=worker, args=(i,)) for i in range(16)]
for t in threads:
    t.start()
for t in threads:
    t.join()
text("main")
print("errors", len(errors), errors[:2])
"""


def test_text_from_sixteen_threads_delivers_every_block(
    ec: ExecuteCode, scope: SessionScope
) -> None:
    for _ in range(3):  # the race was intermittent: a few rounds make it near-certain
        result = run(ec, scope, THREADS_SCRIPT)
        assert result.details["exit_code"] == 0, result.content
        assert "errors 0 []" in result.content, result.content
        assert result.details["text_blocks"] == 33
        blocks = blocks_of(result.content)
        assert blocks[-1] == "main"
        assert sorted(blocks[:-1]) == sorted(f"t{i}-{k}" for i in range(16) for k in range(2))
        for i in range(16):  # each thread's blocks arrive in the order it emitted them
            assert blocks.index(f"t{i}-0") < blocks.index(f"t{i}-1")


def test_a_refused_block_does_not_poison_later_blocks(ec: ExecuteCode, scope: SessionScope) -> None:
    # The host refuses block 2 (the script lies to its own kernel-side budget); blocks 3 and 4,
    # one of them from a thread, must still arrive.
    script = (
        "import threading\n"
        "from lemon_exec.kernel import cells\n"
        "b = cells.STATE.bridge\n"
        "text('first')\n"
        "real = b._max_text_bytes\n"
        "b._max_text_bytes = 10 * real\n"
        "try:\n    text('x' * (real + 100))\nexcept ToolError as e:\n    print('refused', e)\n"
        "b._max_text_bytes = real\n"
        "t = threading.Thread(target=text, args=('from a thread',))\n"
        "t.start(); t.join()\n"
        "text('last')\n"
    )
    with configured(ec, max_text_bytes=4096):
        result = run(ec, scope, script)
    assert result.details["exit_code"] == 0, result.content
    assert "refused text() budget exceeded" in result.content
    assert blocks_of(result.content) == ["first", "from a thread", "last"]


# -- 2. notify() partial updates ---------------------------------------------------------------


@pytest.mark.parametrize("mode", ["session", "per_call"])
def test_on_update_gets_the_spec_partial_update(
    ec: ExecuteCode, scope: SessionScope, mode: str
) -> None:
    updates: list[str] = []
    with configured(ec, kernel_mode=mode):
        run(ec, scope, "notify('one')\nnotify(2)\ntext('done')", on_update=updates.append)
    assert updates == ["notify: one", "notify: 2"]


def test_partial_update_caps_the_message_not_the_prefix() -> None:
    got: list[str] = []
    bridge = _bridge(on_notify=got.append)
    bridge.handle({"type": "notify", "n": 1, "token": bridge.token, "msg": "\u20ac" * 2000})
    assert got == ["notify: " + "\u20ac" * 1365]  # 4095 bytes of message, then the prefix


# -- 3. batch() failures in input order --------------------------------------------------------


def test_batch_runs_valid_items_and_raises_the_first_failure(
    ec: ExecuteCode, scope: SessionScope, work: Path
) -> None:
    missing = str(work / "missing.txt")
    script = (
        "import json\n"
        "out = []\n"
        f"for calls in ([('read', {{'path': {missing!r}}}), ('nope', {{}})],\n"
        "              [('nope', {}), ('read', {'path': 'a.txt'})],\n"
        "              [('read', {'path': 'a.txt'}), ('read', 'a.txt'), ('read', {'paht': 1}),\n"
        "               ('ls', {'path': '.'})]):\n"
        "    try:\n        batch(calls)\n        out.append(None)\n"
        "    except ToolError as e:\n        out.append(str(e))\n"
        "print(json.dumps(out))\n"
    )
    result = run(ec, scope, script)
    assert result.details["exit_code"] == 0, result.content
    first, second, third = last_json(result.content)
    assert first.startswith("read: no such file"), first  # item 0 ran and failed first
    assert second == "batch() item 0: unknown or disabled helper 'nope'"
    assert third == "batch() item 1: params must be a dict, got str"
    # Every valid item ran: 1 + 1 + 2 (the wrong keyword fails in the kernel, before a call).
    assert result.details["rpc_calls"] == 4
    assert result.details["rpc_errors"] == 1


# -- 5. text() blocks larger than one frame ----------------------------------------------------


def test_large_text_block_is_chunked_and_charged_once(ec: ExecuteCode, scope: SessionScope) -> None:
    script = (
        "from lemon_exec.kernel import cells\n"
        "big = 'x' * 300_000\n"
        "text(big)\n"
        "text('small')\n"
        "try:\n    text('y' * 800_000)\nexcept ToolError as e:\n    print('refused', e)\n"
        "print('kernel_bytes', cells.STATE.bridge._text_bytes)\n"
    )
    with configured(ec, max_text_bytes=MIB):
        result = run(ec, scope, script)
    assert result.details["exit_code"] == 0, result.content
    assert result.details["text_blocks"] == 2
    assert blocks_of(result.content) == ["x" * 300_000, "small"]
    assert "refused text() budget exceeded" in result.content
    charged = text_frame_bytes(1, "x" * 300_000) + text_frame_bytes(2, "small")
    assert f"kernel_bytes {charged}\n" in result.content


def test_large_mixed_block_round_trips_exactly(ec: ExecuteCode, scope: SessionScope) -> None:
    # Escapes six-fold (NUL), astral characters (a surrogate pair in JSON), quotes, newlines
    # and a lone surrogate (delivered as U+FFFD): splitting must cut none of them.
    script = (
        "import random\n"
        "rng = random.Random(11)\n"
        "alphabet = ['a', '\\0', '\\U0001f600', '\"', '\\\\', '\\n', '\\u00e9', '\\ud800', 'z']\n"
        "block = ''.join(rng.choice(alphabet) for _ in range(150_000))\n"
        "text(block)\n"
        "import hashlib\n"
        "fixed = block.replace('\\ud800', '\\ufffd')\n"
        "print('sha', hashlib.sha256(fixed.encode()).hexdigest(), len(fixed))\n"
    )
    with configured(ec, max_text_bytes=4 * MIB):
        result = run(ec, scope, script)
    assert result.details["exit_code"] == 0, result.content
    sha_line = [line for line in result.content.splitlines() if line.startswith("sha ")][-1]
    _, digest, length = sha_line.split()
    section = result.content.split(TEXT_HEADER + "\n", 1)[1]
    delivered = section[: int(length)]
    assert hashlib.sha256(delivered.encode()).hexdigest() == digest
    assert result.details["text_blocks"] == 1


# -- reassembly on the host, frame by frame (pure logic) ---------------------------------------


class _RecordingBridge(HostBridge):
    """A HostBridge that keeps the replies it sent to the kernel."""

    replies: list[dict[str, Any]]


def _bridge(max_text_bytes: int = MIB, on_notify: Any = None) -> _RecordingBridge:
    replies: list[dict[str, Any]] = []
    bridge = _RecordingBridge(
        tool_host=ToolHost(ToolRegistry()),
        enabled_tools=(),
        cwd=Path("."),
        limits=BridgeLimits(
            max_calls=1, max_result_bytes=1, max_text_bytes=max_text_bytes, max_parallel=1
        ),
        send_reply=replies.append,
        on_notify=on_notify,
    )
    bridge.replies = replies
    return bridge


def _frame(bridge: HostBridge, n: Any, text: Any, **extra: Any) -> dict[str, Any]:
    return {"type": "text", "n": n, "token": bridge.token, "text": text, **extra}


def test_host_reassembles_continuation_frames_and_charges_one_block() -> None:
    async def body() -> None:
        bridge = _bridge()
        bridge.handle(_frame(bridge, 1, "ab\0", more=True))
        bridge.handle(_frame(bridge, 1, "\ud800c", more=True))
        assert bridge.replies == []  # continuation frames are not acknowledged
        bridge.handle(_frame(bridge, 1, "d"))
        assert bridge.replies == [{"comm_id": bridge.comm_id, "n": 1, "ok": True}]
        assert bridge.text_blocks == ["ab\0\ufffdcd"]
        assert bridge.stats.text_bytes == text_frame_bytes(1, "ab\0\ufffdcd")
        bridge.handle(_frame(bridge, 2, "next"))
        assert bridge.text_blocks[-1] == "next"

    asyncio.run(body())


def test_host_refuses_an_over_budget_chunked_block_and_keeps_going() -> None:
    async def body() -> None:
        bridge = _bridge(max_text_bytes=100)
        for _ in range(5):
            bridge.handle(_frame(bridge, 1, "x" * 30, more=True))
        bridge.handle(_frame(bridge, 1, "x"))
        assert [(r["n"], r["ok"]) for r in bridge.replies] == [(1, False)]
        assert "budget exceeded" in bridge.replies[0]["error"]
        assert bridge.text_blocks == []
        assert bridge.stats.text_bytes == 0
        bridge.handle(_frame(bridge, 1, "replayed"))
        assert bridge.replies[-1]["error"] == protocol.REPLAYED
        bridge.handle(_frame(bridge, 2, "fits"))
        assert bridge.replies[-1] == {"comm_id": bridge.comm_id, "n": 2, "ok": True}
        assert bridge.text_blocks == ["fits"]

    asyncio.run(body())


def test_host_ignores_malformed_continuation_flags() -> None:
    async def body() -> None:
        bridge = _bridge()
        for flag in ("yes", 1, None):
            bridge.handle(_frame(bridge, 1, "bad", more=flag))
        assert bridge.replies == [] and bridge.text_blocks == []
        bridge.handle(_frame(bridge, 1, "good", more=False))  # false: the last frame
        assert bridge.text_blocks == ["good"]

    asyncio.run(body())


def test_kernel_chunks_fit_the_frame_cap_and_cost_adds_up() -> None:
    text = ('a\0\U0001f600"\\\n\u00e9' * 60_000) + "tail"
    token = "t" * protocol.TOKEN_LENGTH
    frames = list(text_budget.text_frames(7, token, text))
    assert len(frames) > 1
    assert all(text_budget.frame_size(f) <= protocol.FRAME_CAP_BYTES for f in frames)
    assert all(f.get("more") is True for f in frames[:-1]) and "more" not in frames[-1]
    assert "".join(f["text"] for f in frames) == text
    assert text_budget.text_cost(7, len(json.dumps(text))) == text_frame_bytes(7, text)
