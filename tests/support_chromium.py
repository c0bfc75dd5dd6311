"""A real headless Chromium for UI tests, driven over the DevTools Protocol (no browser download).

``ensure()`` installs Debian's ``chromium`` when it is missing and the test runs as root with
apt-get (as ``.ci/run`` does); otherwise the test fails at once with one line naming the
missing piece and the command that installs it. :class:`Browser` starts Chromium with a fresh
profile and speaks CDP over its websocket (the ``websockets`` client the other tests use).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
import support_debian
from websockets.sync.client import connect

PACKAGE = "chromium"

FLAGS = [
    "--headless",
    "--no-sandbox",  # as root, Chromium refuses to start with its own sandbox
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1280,800",
    "--remote-debugging-port=0",
]


def executable() -> str:
    """Chromium's path: installed now if it is missing and we may, else the test fails."""
    problem = support_debian.provide("chromium", PACKAGE)
    found = shutil.which("chromium")
    if found and not problem:
        return found
    pytest.fail(
        f"chromium is missing and this browser test needs it ({problem}); "
        f"install it with: {support_debian.install_command(PACKAGE)}",
        pytrace=False,
    )


class Browser:
    """One headless Chromium showing ``url``; :meth:`evaluate` runs JavaScript in the page."""

    def __init__(self, url: str) -> None:
        self._profile = tempfile.mkdtemp(prefix="lemon-chromium-")
        self.proc = subprocess.Popen(
            [executable(), *FLAGS, f"--user-data-dir={self._profile}", url],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        self._next_id = 0
        try:
            self._ws = connect(self._page_socket(), max_size=None, open_timeout=30)
        except BaseException:
            self.close()
            raise

    def _page_socket(self) -> str:
        # With port 0 Chromium picks a free port and writes it to the profile.
        active = Path(self._profile) / "DevToolsActivePort"
        deadline = time.monotonic() + 30
        while True:
            if self.proc.poll() is not None:
                raise AssertionError(f"chromium exited with {self.proc.returncode}")
            assert time.monotonic() < deadline, "chromium did not open its DevTools port"
            lines = active.read_text().split("\n") if active.is_file() else []
            if len(lines) >= 2 and lines[0].isdigit():
                break
            time.sleep(0.1)
        browser = connect(f"ws://127.0.0.1:{lines[0]}{lines[1]}", open_timeout=30)
        try:
            while True:  # the page target appears once the URL starts loading
                targets = _call(browser, 1, "Target.getTargets")["targetInfos"]
                pages = [t for t in targets if t["type"] == "page"]
                if pages:
                    return f"ws://127.0.0.1:{lines[0]}/devtools/page/{pages[0]['targetId']}"
                assert time.monotonic() < deadline, targets
                time.sleep(0.1)
        finally:
            browser.close()

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        self._next_id += 1
        return _call(self._ws, self._next_id, method, **params)

    def evaluate(self, expression: str) -> Any:
        """The value of ``expression`` (awaited if it is a promise); a JS exception fails."""
        result = self.call(
            "Runtime.evaluate", expression=expression, awaitPromise=True, returnByValue=True
        )
        if "exceptionDetails" in result:
            raise AssertionError(f"{expression!r} raised {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 30, what: str = "") -> Any:
        """Poll ``expression`` until it is truthy; its value."""
        deadline = time.monotonic() + timeout
        while True:
            value = self.evaluate(expression)
            if value:
                return value
            assert time.monotonic() < deadline, f"timed out waiting for {what or expression}"
            time.sleep(0.2)

    def screenshot(self, path: Path) -> None:
        data = self.call("Page.captureScreenshot", format="png")["data"]
        path.write_bytes(base64.b64decode(data))

    def close(self) -> None:
        ws = getattr(self, "_ws", None)
        if ws is not None:
            ws.close()
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, 15)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, 9)
                self.proc.wait(10)
        shutil.rmtree(self._profile, ignore_errors=True)


def _call(ws: Any, call_id: int, method: str, **params: Any) -> dict[str, Any]:
    ws.send(json.dumps({"id": call_id, "method": method, "params": params}))
    while True:
        msg = json.loads(ws.recv(timeout=60))
        if msg.get("id") == call_id:
            if "error" in msg:
                raise AssertionError(f"{method}: {msg['error']}")
            result: dict[str, Any] = msg["result"]
            return result
