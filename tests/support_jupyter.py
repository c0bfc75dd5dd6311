"""A Jupyter Server (or JupyterLab) subprocess on loopback that lists lemon_exec's external
kernels, set up as docs/inspection.md says; shared by the Jupyter Server and JupyterLab tests."""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from websockets.sync.client import connect


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ExternalKernelServer:
    """``python -m <app>`` (``jupyter_server`` or ``jupyterlab``) that sees the external
    kernels linked into ``external``, with lemon_exec's kernel manager and extension."""

    def __init__(
        self,
        tmp: Path,
        external: Path,
        *,
        app: str = "jupyter_server",
        options: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.port = free_port()
        self.token = secrets.token_hex(16)
        self.base = f"http://127.0.0.1:{self.port}"
        self.log = tmp / f"{app}.log"
        environ = {
            **os.environ,
            "JUPYTER_RUNTIME_DIR": str(tmp / "runtime"),
            "JUPYTER_CONFIG_DIR": str(tmp / "config"),
            **(env or {}),
        }
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                app,
                "--no-browser",
                "--allow-root",
                "--ip=127.0.0.1",
                f"--port={self.port}",
                f"--IdentityProvider.token={self.token}",
                f"--ServerApp.root_dir={tmp}",
                "--ServerApp.allow_external_kernels=True",
                f"--ServerApp.external_connection_dir={external}",
                "--ServerApp.kernel_manager_class=lemon_exec.viewer.LemonMappingKernelManager",
                "--ServerApp.jpserver_extensions={'lemon_exec.viewer': True}",
                *options,
            ],
            env=environ,
            stdout=subprocess.DEVNULL,
            stderr=open(self.log, "wb"),  # noqa: SIM115 - closed with the process
            start_new_session=True,
        )
        deadline = time.monotonic() + 60
        while True:
            try:
                self.request("GET", "/api/status")
                return
            except (OSError, urllib.error.URLError):
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(self.log.read_text()[-3000:]) from None
                time.sleep(0.2)

    def request(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        """(status, decoded JSON or None) of one authenticated request."""
        data = json.dumps(body).encode() if body is not None else b""
        req = urllib.request.Request(
            self.base + path,
            method=method,
            headers={"Authorization": f"token {self.token}"},
            data=data if method in ("POST", "PATCH") else None,
        )
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                raw = resp.read()
                return resp.status, json.loads(raw) if raw else None
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            return exc.code, json.loads(raw) if raw else None

    def ws(self, kernel_id: str) -> Any:
        url = f"ws://127.0.0.1:{self.port}/api/kernels/{kernel_id}/channels"
        return connect(url, additional_headers={"Authorization": f"token {self.token}"})

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
