"""Every IOPub message a kernel sends over its life has an id of its own.

The bridge's comm frames and the kernel's own messages (status, stream, execute_input,
execute_result, ...) take their ids from one counter: the kernel's Session. A bridge that
counted on a copy of it would send ids the kernel sends again later, and a client that
keys messages by id (a notebook front end, a recorder) would mix them up.

The kernel here runs without a lemon_exec host: its bridge frames then travel on the
public IOPub socket, where this test reads them next to every other message, and the test
answers them on the control channel as a host would (docs/comm-protocol.md §3).
"""

from __future__ import annotations

import json
import secrets
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from jupyter_client import BlockingKernelClient, KernelManager
from jupyter_client.kernelspec import KernelSpecManager

from lemon_exec.wire import protocol

pytestmark = [pytest.mark.timeout(120)]

#: Several lemon cells that each send bridge frames (a helper call, text(), notify()) between
#: prints, then ordinary cells with output and a result: the kernel's own messages follow
#: the frames, which is where a second counter would repeat ids.
SCRIPTS = (
    "print('one')\nnotify('working')\ntext('first block')\nprint(read('a.txt'))\n",
    "for i in range(3):\n    print(i)\n    text(f'block {i}')\nnotify('done')\n",
    "print(ls('.'))\ntext('last')\n",
)
#: The bridge frames SCRIPTS send: a notify, a text and a call; 3 texts and a notify; 2.
FRAMES = 3 + 4 + 2
ORDINARY = ("print('plain')\n21 * 2", "import sys\nprint('err', file=sys.stderr)\n'x' * 3")


@pytest.fixture
def kernel(tmp_path: Path) -> Iterator[BlockingKernelClient]:
    """A lemon-python kernel of this checkout with no host attached, and a client on all its
    channels (a kernelspec of its own: whichever one is installed may run other code)."""
    spec = tmp_path / "kernels" / "lemon-ids"
    spec.mkdir(parents=True)
    argv = [sys.executable, "-m", "lemon_exec.kernel", "-f", "{connection_file}"]
    (spec / "kernel.json").write_text(
        json.dumps({"argv": argv, "display_name": "lemon ids", "language": "python"})
    )
    specs = KernelSpecManager(kernel_dirs=[str(spec.parent)])
    km = KernelManager(kernel_name="lemon-ids", kernel_spec_manager=specs)
    km.start_kernel()
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=60)
        yield kc
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def _cell_meta(comm_id: str) -> dict[str, Any]:
    return {
        protocol.CELL_METADATA_KEY: {
            "v": protocol.PROTOCOL_VERSION,
            "token": secrets.token_urlsafe(protocol.TOKEN_BYTES),
            "comm_id": comm_id,
            "max_text_bytes": 65536,
            "filename": "script.py",
        }
    }


def _answer(kc: BlockingKernelClient, comm_id: str, frame: dict[str, Any]) -> None:
    """Reply to a bridge frame on the control channel, as the host does."""
    if frame.get("type") == protocol.CALL:
        content = {"comm_id": comm_id, "id": frame["id"], "ok": True, "content": "answer"}
    elif frame.get("type") == protocol.TEXT and not frame.get("more"):
        content = {"comm_id": comm_id, "n": frame["n"], "ok": True}
    else:
        return  # notify: fire-and-forget
    kc.control_channel.send(kc.session.msg(protocol.REPLY_MSG_TYPE, content))


def _run(
    kc: BlockingKernelClient, code: str, seen: list[dict[str, Any]], lemon: bool
) -> dict[str, Any]:
    """Execute ``code`` and read IOPub until its idle status; every message lands in ``seen``."""
    comm_id = secrets.token_hex(16)
    msg = kc.session.msg(
        "execute_request",
        {"code": code, "silent": False, "store_history": True, "allow_stdin": False},
        metadata=_cell_meta(comm_id) if lemon else {},
    )
    kc.shell_channel.send(msg)
    request = msg["header"]["msg_id"]
    deadline = time.monotonic() + 60
    while True:
        assert time.monotonic() < deadline, f"the cell never went idle: {code!r}"
        try:
            got = kc.get_iopub_msg(timeout=1)
        except Exception:  # queue.Empty: nothing yet
            continue
        seen.append(got)
        mine = got["parent_header"].get("msg_id") == request
        if mine and got["msg_type"] == "comm_msg":
            _answer(kc, comm_id, got["content"]["data"])
        if mine and got["msg_type"] == "status" and got["content"]["execution_state"] == "idle":
            break
    while True:  # replies to earlier requests (wait_for_ready's kernel_info) come first
        reply = kc.get_shell_msg(timeout=30)
        if reply["parent_header"].get("msg_id") == request:
            return dict(reply["content"])


def test_comm_frames_and_kernel_messages_never_share_an_id(kernel: BlockingKernelClient) -> None:
    seen: list[dict[str, Any]] = []
    for _round in range(2):
        for script in SCRIPTS:
            reply = _run(kernel, script, seen, lemon=True)
            assert reply["status"] == "ok", reply
            assert reply[protocol.CELL_METADATA_KEY]["kind"] == "ok", reply
        for code in ORDINARY:
            assert _run(kernel, code, seen, lemon=False)["status"] == "ok"

    kinds = {m["msg_type"] for m in seen}
    # The kinds that share the counter all took part: frames, and the kernel's own output.
    assert {"comm_msg", "status", "stream", "execute_input", "execute_result"} <= kinds
    assert sum(m["msg_type"] == "comm_msg" for m in seen) == 2 * FRAMES
    ids = [m["header"]["msg_id"] for m in seen]
    repeated = sorted({i for i in ids if ids.count(i) > 1})
    assert not repeated, f"{len(repeated)} message ids sent twice, e.g. {repeated[:5]}"
