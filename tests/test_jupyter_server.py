"""Viewers never stall or destroy the agent's work (issue 12, items 4 and 5).

- A real Jupyter Server (a ``jupyter server`` subprocess on loopback, with a token) lists a
  live session kernel as an external kernel (the host links its connection file into the
  server's ``external_connection_dir``); a viewer reads the agent's variable over the kernel
  websocket; Interrupt, Restart and Shut Down answer clearly (never 500) and leave the
  agent's state alone; after the host stops, ``GET /api/kernels`` is 200 without the kernel.
- A subscriber on the kernel's public IOPub that never reads does not slow the agent: it
  prints 50 MB and calls ``text()`` and its call completes.
- A bridge frame that gets no answer fails the helper with a clear error within the ack
  timeout instead of hanging the script.
"""

from __future__ import annotations

import json
import os
import secrets
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import zmq
from support import index_row
from support_jupyter import ExternalKernelServer

from lemon_exec import ExecuteCode, ExecuteCodeConfig, SessionScope
from lemon_exec.host.disk.external import EXTERNAL_DIR_ENV
from lemon_exec.viewer import RESTART_REFUSED
from lemon_exec.wire import protocol

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow, pytest.mark.kernel]

AGENT_SETUP = "agent_var = {'answer': 42}\ntext('ready')"


def _send_execute(ws: Any, code: str) -> str:
    msg_id = uuid.uuid4().hex
    ws.send(
        json.dumps(
            {
                "header": {
                    "msg_id": msg_id,
                    "msg_type": "execute_request",
                    "username": "viewer",
                    "session": uuid.uuid4().hex,
                    "version": "5.3",
                    "date": "2024-01-01T00:00:00Z",
                },
                "parent_header": {},
                "metadata": {},
                "content": {"code": code, "silent": False, "allow_stdin": False},
                "channel": "shell",
            }
        )
    )
    return msg_id


def _collect(ws: Any, msg_id: str, timeout: float = 30) -> tuple[str, dict[str, Any]]:
    """Stream output and the execute_reply content of ``msg_id``."""
    out: list[str] = []
    deadline = time.monotonic() + timeout
    reply: dict[str, Any] | None = None
    idle = False
    while not (reply is not None and idle):
        msg = json.loads(ws.recv(timeout=max(0.1, deadline - time.monotonic())))
        if msg.get("parent_header", {}).get("msg_id") != msg_id:
            continue
        if msg["msg_type"] == "stream":
            out.append(msg["content"]["text"])
        elif msg["msg_type"] == "execute_reply":
            reply = msg["content"]
        elif msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            idle = True
    return "".join(out), reply


@pytest.fixture
def external(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    directory = tmp_path / "external"
    directory.mkdir(mode=0o700)
    monkeypatch.setenv(EXTERNAL_DIR_ENV, str(directory))
    return directory


def _session_host(**overrides: Any) -> ExecuteCode:
    settings: dict[str, Any] = {
        "enabled": True,
        "kernel_mode": "session",
        "warm_kernels": 0,
        "python_path": sys.executable,
        "timeout_ms": 60_000,
        **overrides,
    }
    config = ExecuteCodeConfig(**settings)
    return ExecuteCode(config)


def test_jupyter_server_commands_on_a_live_session_kernel(tmp_path: Path, external: Path) -> None:
    tool = _session_host()
    server: ExternalKernelServer | None = None
    closed = False
    try:
        scope = SessionScope("viewer", "agent", tmp_path)
        first = tool.run_sync(AGENT_SETUP, scope=scope)
        assert first.content == "Script result (text()):\nready", first.content
        links = list(external.iterdir())
        assert len(links) == 1 and links[0].name.startswith("lemon-"), links
        server = ExternalKernelServer(
            tmp_path, external, env={"JUPYTER_DATA_DIR": str(tmp_path / "data")}
        )

        status, kernels = server.request("GET", "/api/kernels")
        assert status == 200 and len(kernels) == 1, kernels
        kid = kernels[0]["id"]
        assert kernels[0]["name"] == "lemon-python"
        assert kernels[0]["lemon_exec"] == {"restart_refused": RESTART_REFUSED}

        with server.ws(kid) as ws:
            out, reply = _collect(ws, _send_execute(ws, "print(agent_var['answer'])"))
            assert (out, reply["status"]) == ("42\n", "ok")

            # Interrupt with nothing running: nothing to stop, and nothing is stopped.
            assert server.request("POST", f"/api/kernels/{kid}/interrupt")[0] == 204

            # Interrupt during the viewer's own cell stops that cell.
            msg_id = _send_execute(ws, "import time\nprint('sleeping', flush=True)\ntime.sleep(60)")
            deadline = time.monotonic() + 30
            while True:  # wait until the cell runs
                msg = json.loads(ws.recv(timeout=30))
                if msg.get("parent_header", {}).get("msg_id") == msg_id and (
                    msg["msg_type"] == "stream"
                ):
                    break
                assert time.monotonic() < deadline
            assert server.request("POST", f"/api/kernels/{kid}/interrupt")[0] == 204
            _, reply = _collect(ws, msg_id)
            assert reply["status"] == "error" and reply["ename"] == "KeyboardInterrupt"

        # Interrupt during the agent's script is refused, clearly, and the script goes on.
        results: list[Any] = []
        worker = threading.Thread(
            target=lambda: results.append(
                tool.run_sync(
                    "import time\ntime.sleep(1.5)\ntext(agent_var['answer'])", scope=scope
                )
            )
        )
        worker.start()
        time.sleep(0.7)
        status, body = server.request("POST", f"/api/kernels/{kid}/interrupt")
        worker.join(60)
        assert status == 409, (status, body)
        assert "agent's script" in body["message"]
        assert results[0].content == "Script result (text()):\n42", results[0].content

        # Restart is refused (it would destroy the agent's state).
        status, body = server.request("POST", f"/api/kernels/{kid}/restart")
        assert status == 409, (status, body)
        assert "cannot be restarted" in body["message"]

        # Shut Down forgets the kernel in the server; it keeps running for the agent.
        assert server.request("DELETE", f"/api/kernels/{kid}")[0] == 204
        status, kernels = server.request("GET", "/api/kernels")
        assert (status, kernels) == (200, [])
        after = tool.run_sync("text(agent_var['answer'] + 1)", scope=scope)
        assert after.content == "Script result (text()):\n43"
        assert after.details["state_retained"] is True

        # The host stops the kernel: its link goes, and the server's list stays healthy.
        tool.close()
        closed = True
        assert list(external.iterdir()) == []
        status, kernels = server.request("GET", "/api/kernels")
        assert (status, kernels) == (200, [])
    finally:
        if not closed:
            tool.close()
        if server is not None:
            server.stop()


def test_a_subscriber_that_never_reads_does_not_stall_the_agent(tmp_path: Path) -> None:
    """A SUB on the kernel's public IOPub, never read, while the agent floods 50 MB."""
    tool = _session_host()
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.RCVHWM, 1)
    sub.setsockopt(zmq.RCVBUF, 4096)
    sub.setsockopt(zmq.LINGER, 0)
    try:
        scope = SessionScope("flood", "agent", tmp_path)
        first = tool.run_sync(AGENT_SETUP, scope=scope)
        info = json.loads(Path(_connection_file(tool, first)).read_text())
        sub.connect(f"{info['transport']}://{info['ip']}-{info['iopub_port']}")
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        time.sleep(0.5)  # the subscription reaches the kernel
        started = time.monotonic()
        result = tool.run_sync(
            # 6,400 flushed messages of 8 KiB: far more than the socket queues hold.
            "chunk = 'x' * 8191 + '\\n'\n"
            "for _ in range(6400):\n    print(chunk, end='', flush=True)\n"
            "text(agent_var['answer'])",
            scope=scope,
        )
        elapsed = time.monotonic() - started
        assert result.content.startswith("Script result (text()):\n42"), result.content[:300]
        assert result.details["state_retained"] is True
        assert elapsed < 60, elapsed
    finally:
        sub.close()
        ctx.term()
        tool.close()


def _connection_file(tool: ExecuteCode, result: Any) -> str:
    return str(index_row(result.details["kernel_id"], phase=None)["connection_file"])


def test_a_lost_bridge_frame_fails_the_helper_instead_of_hanging() -> None:
    """A kernel whose 'host' never answers a call: the helper fails within the ack timeout."""
    from jupyter_client import KernelManager

    km = KernelManager(kernel_name="lemon-python")
    km.start_kernel(env={**os.environ, protocol.ACK_TIMEOUT_ENV: "2"})
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=60)
        meta = {
            protocol.CELL_METADATA_KEY: {
                "v": protocol.PROTOCOL_VERSION,
                "token": secrets.token_urlsafe(protocol.TOKEN_BYTES),
                "comm_id": secrets.token_hex(16),
                "helpers": ["read"],
                "max_text_bytes": 65536,
                "filename": "script.py",
            }
        }
        code = (
            "import time\nt = time.monotonic()\n"
            "for f in (lambda: read('a.txt'), lambda: text('block')):\n"
            "    try:\n        f()\n    except ToolError as e:\n"
            "        print(f'{type(e).__name__}: {e} after {time.monotonic() - t:.0f}s')\n"
            "        t = time.monotonic()\n"
        )
        msg = kc.session.msg(
            "execute_request",
            {"code": code, "silent": False, "store_history": False, "allow_stdin": False},
            metadata=meta,
        )
        kc.shell_channel.send(msg)
        out: list[str] = []
        deadline = time.monotonic() + 30
        while True:
            assert time.monotonic() < deadline, f"the script hangs: {''.join(out)!r}"
            try:
                iopub = kc.get_iopub_msg(timeout=1)
            except Exception:
                continue
            if iopub["parent_header"].get("msg_id") != msg["header"]["msg_id"]:
                continue
            if iopub["msg_type"] == "stream":
                out.append(iopub["content"]["text"])
            if iopub["msg_type"] == "status" and iopub["content"]["execution_state"] == "idle":
                break
        lost = "no reply from the host within 2 s: the {} frame was lost on its way to the host"
        assert "".join(out).splitlines() == [
            f"ToolError: {lost.format('call')}; try again after 2s",
            f"ToolError: {lost.format('text')}; try again after 2s",
        ]
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
