"""The kernel image's launcher (lemon_exec/kernel/gateway_launcher.py), driven as Enterprise
Gateway's remote process proxies drive it: this test plays the gateway (an RSA key pair, a
response socket, the comm-socket requests) and talks to the kernel with jupyter_client.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from Cryptodome.Cipher import AES, PKCS1_v1_5
from Cryptodome.PublicKey import RSA
from Cryptodome.Util.Padding import unpad
from jupyter_client.blocking import BlockingKernelClient
from support import pid_gone

from lemon_exec.kernel import gateway_launcher

LAUNCH_TIMEOUT_S = 60


class FakeGateway:
    """The gateway's side of the launch: a key pair and a socket the kernel reports to."""

    def __init__(self) -> None:
        self.key = RSA.generate(1024)
        self.public_key = base64.b64encode(self.key.publickey().export_key("DER")).decode()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(LAUNCH_TIMEOUT_S)
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"

    def receive(self) -> dict[str, Any]:
        conn, _ = self.listener.accept()
        with conn:
            data = b""
            while chunk := conn.recv(65536):
                data += chunk
        payload = json.loads(base64.b64decode(data))
        assert payload["version"] == gateway_launcher.LAUNCHER_VERSION
        aes_key = PKCS1_v1_5.new(self.key).decrypt(base64.b64decode(payload["key"]), None)
        assert aes_key is not None, "the AES key did not decrypt under our RSA key"
        body = AES.new(aes_key, AES.MODE_ECB).decrypt(base64.b64decode(payload["conn_info"]))
        info: dict[str, Any] = json.loads(unpad(body, 16))
        return info

    def request(self, info: dict[str, Any], body: dict[str, Any]) -> None:
        with socket.create_connection((info["ip"], info["comm_port"]), timeout=10) as conn:
            conn.sendall(json.dumps(body).encode())


@pytest.fixture
def launched(
    tmp_path: Any,
) -> Iterator[tuple[subprocess.Popen[bytes], dict[str, Any], FakeGateway]]:
    gateway = FakeGateway()
    env = {
        **os.environ,
        # The pod's variables, as Enterprise Gateway's Kubernetes launcher sets them.
        "KERNEL_ID": "k-1234",
        "RESPONSE_ADDRESS": gateway.address,
        "PUBLIC_KEY": gateway.public_key,
        "PORT_RANGE": "0..0",
        "LEMON_GATEWAY_KERNEL_IP": "127.0.0.1",
        "TMPDIR": str(tmp_path),  # where its connection file goes
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "lemon_exec.kernel.gateway_launcher"],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        info = gateway.receive()
        yield proc, info, gateway
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
        proc.wait(10)
        assert proc.stderr is not None
        proc.stderr.close()
        gateway.listener.close()


def _client(info: dict[str, Any]) -> BlockingKernelClient:
    client = BlockingKernelClient()
    client.load_connection_info(info)  # type: ignore[arg-type]  # a plain dict is accepted
    client.start_channels()
    client.wait_for_ready(timeout=LAUNCH_TIMEOUT_S)
    return client


def _run(client: BlockingKernelClient, code: str, timeout: float = 30) -> tuple[str, str]:
    """(status, stdout) of one execution."""
    out: list[str] = []

    def collect(msg: dict[str, Any]) -> None:
        if msg["msg_type"] == "stream":
            out.append(msg["content"]["text"])

    reply = client.execute_interactive(code, timeout=timeout, output_hook=collect)
    return reply["content"]["status"], "".join(out)


@pytest.mark.slow
@pytest.mark.kernel
def test_reports_encrypted_ports_then_serves_interrupt_and_shutdown(
    launched: tuple[subprocess.Popen[bytes], dict[str, Any], FakeGateway], tmp_path: Path
) -> None:
    proc, info, gateway = launched
    assert info["kernel_id"] == "k-1234"
    assert info["pid"] == proc.pid and info["pgid"] == proc.pid  # its own process group
    assert info["transport"] == "tcp" and info["ip"] == "127.0.0.1"
    client = _client(info)
    try:
        status, out = _run(client, "x = 41\nprint(x + 1)")
        assert (status, out) == ("ok", "42\n")

        # A running cell is interrupted through the comm socket ({"signum": 2}), as the
        # gateway's REST interrupt does for a remote kernel; state survives.
        msg_id = client.execute("import time\nprint('sleeping', flush=True)\ntime.sleep(60)")
        while True:  # until the cell runs
            msg = client.get_iopub_msg(timeout=20)
            if msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "stream":
                break
        gateway.request(info, {"signum": 0})  # the gateway's liveness poll: a no-op
        gateway.request(info, {"signum": 2})
        reply = client.get_shell_msg(timeout=20)
        assert reply["parent_header"]["msg_id"] == msg_id
        assert reply["content"]["ename"] == "KeyboardInterrupt"
        assert _run(client, "print(x)") == ("ok", "41\n")
    finally:
        client.stop_channels()

    gateway.request(info, {"shutdown": 1})
    assert proc.wait(20) is not None
    assert pid_gone(proc.pid)
    assert list(tmp_path.glob("lemon-gateway-kernel-*")) == []  # its key is not left behind


def test_missing_gateway_values_are_a_usage_error() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("KERNEL_ID", "PUBLIC_KEY")}
    env.pop("RESPONSE_ADDRESS", None)
    done = subprocess.run(
        [sys.executable, "-m", "lemon_exec.kernel.gateway_launcher"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "--kernel-id" in done.stderr and "Enterprise Gateway" in done.stderr


@pytest.mark.parametrize("text", ["", "5", "9..2", "1..70000", "a..b"])
def test_bad_port_ranges_are_refused(text: str) -> None:
    with pytest.raises(ValueError):
        gateway_launcher.port_range(text)


def test_port_range_is_honoured() -> None:
    low, high = 41000, 41999
    sock = gateway_launcher.bind_socket("127.0.0.1", (low, high))
    try:
        assert low <= sock.getsockname()[1] <= high
    finally:
        sock.close()
    assert gateway_launcher.port_range("0..0") == (0, 0)
