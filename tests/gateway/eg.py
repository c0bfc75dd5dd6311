"""A real Jupyter Enterprise Gateway on loopback for the gateway tests, and a cuttable proxy.

Enterprise Gateway 3.x pins ``jupyter_client<7``, so it lives in a venv of its own
(``LEMON_TEST_EG_VENV``, default ``<repo>/.ci-eg-venv``). When that venv has no gateway it
is created here (:mod:`support_venv`); if that fails the tests fail (never skip) with the
command that fixes it.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from support_venv import ensure_own_venv

from lemon_exec.host.kernels.kernelspec import KERNEL_NAME, kernel_json

REPO = Path(__file__).resolve().parents[2]
VENV_ENV = "LEMON_TEST_EG_VENV"
EG_REQUIREMENT = "jupyter_enterprise_gateway>=3,<4"
#: How long the gateway may take to answer after it was started.
START_TIMEOUT_S = 60.0


def venv_path() -> Path:
    return Path(os.environ.get(VENV_ENV) or REPO / ".ci-eg-venv")


def ensure_eg_venv() -> Path:
    """The gateway's executable, installing the gateway into its venv first if needed."""
    venv = venv_path()
    ensure_own_venv(
        venv,
        EG_REQUIREMENT,
        what="Jupyter Enterprise Gateway",
        env_name=VENV_ENV,
        provides="bin/jupyter-enterprisegateway",
    )
    return venv / "bin" / "jupyter-enterprisegateway"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class EnterpriseGateway:
    """A running gateway: its URL and token, and REST calls the tests check with."""

    url: str
    token: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def request(self, method: str, path: str, token: str | None = None) -> Any:
        req = urllib.request.Request(
            self.url + path,
            method=method,
            headers={"Authorization": f"token {self.token if token is None else token}"},
        )
        with urllib.request.urlopen(req, timeout=10) as response:
            body = response.read()
        return json.loads(body) if body else None

    def kernel_ids(self) -> set[str]:
        return {k["id"] for k in self.request("GET", "/api/kernels")}

    def wait_no_kernels(self, timeout: float = 15.0) -> set[str]:
        """Wait until the gateway runs no kernel; the ids still running after ``timeout``."""
        deadline = time.monotonic() + timeout
        while (left := self.kernel_ids()) and time.monotonic() < deadline:
            time.sleep(0.1)
        return left

    def log_tail(self, limit: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-limit:]
        except OSError:
            return ""


#: A kernelspec started the way a Kubernetes pod starts the kernel image: through the
#: gateway's remote launcher protocol (lemon_exec/kernel/gateway_launcher.py), here by the
#: distributed process proxy, which runs a loopback host's command without ssh.
REMOTE_KERNEL_NAME = "lemon-python-remote"
#: A kernelspec whose kernel sleeps this long before Python starts (deadline tests).
SLOW_KERNEL_NAME = "lemon-python-slow"
SLOW_START_S = 6


def write_kernelspec(data_dir: Path) -> None:
    """The lemon-python kernelspecs, run by this interpreter, under ``data_dir``."""
    spec_dir = data_dir / "kernels" / KERNEL_NAME
    spec_dir.mkdir(parents=True)
    (spec_dir / "kernel.json").write_text(json.dumps(kernel_json(sys.executable)))
    remote = {
        "argv": [
            sys.executable, "-m", "lemon_exec.kernel.gateway_launcher",
            "--kernel-id", "{kernel_id}", "--port-range", "{port_range}",
            "--response-address", "{response_address}", "--public-key", "{public_key}",
            "--ip", "127.0.0.1",
        ],
        "display_name": "lemon-python (remote launcher)",
        "language": "python",
        "metadata": {
            "lemon_protocol": 1,
            "process_proxy": {
                "class_name": (
                    "enterprise_gateway.services.processproxies.distributed.DistributedProcessProxy"
                ),
                "config": {"remote_hosts": "127.0.0.1"},
            },
        },
    }  # fmt: skip
    spec_dir = data_dir / "kernels" / REMOTE_KERNEL_NAME
    spec_dir.mkdir(parents=True)
    (spec_dir / "kernel.json").write_text(json.dumps(remote))
    slow = kernel_json(sys.executable)
    slow["argv"] = ["/bin/sh", "-c", f'sleep {SLOW_START_S}; exec "$0" "$@"', *slow["argv"]]
    slow["display_name"] = "lemon-python (slow to start)"
    spec_dir = data_dir / "kernels" / SLOW_KERNEL_NAME
    spec_dir.mkdir(parents=True)
    (spec_dir / "kernel.json").write_text(json.dumps(slow))


@contextlib.contextmanager
def running_gateway(workdir: Path, *options: str) -> Iterator[EnterpriseGateway]:
    """Start a gateway on a free loopback port with a random token; stop it afterwards.

    ``options`` replace the defaults below that set the same option."""
    exe = ensure_eg_venv()
    data_dir = workdir / "share" / "jupyter"
    write_kernelspec(data_dir)
    kernels_dir = workdir / "kernels"  # the kernels' working directory
    kernels_dir.mkdir()
    port, token = free_port(), secrets.token_hex(16)
    env = {
        **os.environ,
        "JUPYTER_PATH": str(data_dir),
        "JUPYTER_RUNTIME_DIR": str(workdir / "runtime"),
        "JUPYTER_DATA_DIR": str(workdir / "data"),
    }
    argv = [
        str(exe),
        "--ip=127.0.0.1",
        f"--port={port}",
        "--port_retries=0",
        f"--EnterpriseGatewayApp.auth_token={token}",
        "--EnterpriseGatewayApp.unauthorized_users=set()",  # CI runs as root
        "--EnterpriseGatewayApp.list_kernels=True",
        # Kernels get only these variables from the gateway's environment (plus KERNEL_*):
        # PATH for subprocesses, and the leak check's marker (tests/conftest.py).
        "--EnterpriseGatewayApp.inherited_envs=['PATH','HOME','LEMON_EXEC_TEST_SESSION']",
        # Notice a dead kernel process within 0.5 s (default 3 s): the crash tests wait on it.
        "--KernelRestarter.time_to_dead=0.5",
        "--RemoteKernelManager.shutdown_wait_time=2.0",
    ]
    # traitlets keeps the first of two settings of one option: the caller's replace ours.
    keys = {option.split("=", 1)[0] for option in options}
    argv = [arg for arg in argv if arg.split("=", 1)[0] not in keys] + list(options)
    log_path = workdir / "eg.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            argv, cwd=kernels_dir, env=env, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    gateway = EnterpriseGateway(f"http://127.0.0.1:{port}", token, process, log_path)
    try:
        _wait_ready(gateway)
        yield gateway
    finally:
        _stop(process)


def _wait_ready(gateway: EnterpriseGateway) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        if gateway.process.poll() is not None:
            pytest.fail(f"Enterprise Gateway exited at startup:\n{gateway.log_tail()}")
        try:
            specs = gateway.request("GET", "/api/kernelspecs")
        except (OSError, urllib.error.URLError):
            if time.monotonic() > deadline:
                pytest.fail(f"Enterprise Gateway did not answer:\n{gateway.log_tail()}")
            time.sleep(0.1)
            continue
        assert KERNEL_NAME in specs["kernelspecs"], specs
        return


def _stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM (the gateway shuts its kernels down), then SIGKILL the group if needed."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(5)


class CuttableProxy:
    """A TCP proxy on loopback in front of the gateway whose live connections can be cut.

    New connections keep being accepted after :meth:`cut`, so the host's shutdown request
    still reaches the gateway: only the websocket of the running call is lost.
    """

    def __init__(self, target_port: int) -> None:
        self._target = ("127.0.0.1", target_port)
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._server.getsockname()[1])
        self._lock = threading.Lock()
        self._conns: list[socket.socket] = []
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._server.accept()
                upstream = socket.create_connection(self._target)
            except OSError:
                continue
            with self._lock:
                self._conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                dst.sendall(data)
        for sock in (src, dst):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def cut(self) -> int:
        """Reset every live connection; returns how many there were."""
        with self._lock:
            conns, self._conns = self._conns, []
        for sock in conns:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        return len(conns) // 2

    def close(self) -> None:
        self._closed = True
        self.cut()
        self._server.close()
