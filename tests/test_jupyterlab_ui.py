"""JupyterLab shows the person why Restart and Interrupt were refused (issue 28, item 3).

A real ``jupyter lab`` (with lemon_exec.viewer's kernel manager and server extension, and the
lemon-exec-jupyterlab extension the package installs) serves an agent's live session kernel
as an external kernel; a notebook in real headless Chromium is attached to it. While the
agent's script runs, the person restarts (through JupyterLab's "Restart Kernel?" dialog) and
interrupts the kernel: both are refused by the server (HTTP 409), JupyterLab now shows the
server's reason as a notification, and "Restart Kernel and Run All Cells" does not go on to
run the person's cells. The agent's script finishes; Shut Down then only forgets the kernel
in JupyterLab, and the agent's state is kept.

Screenshots of both notifications are saved in the test's temp directory, and also in
``$LEMON_TEST_SCREENSHOT_DIR`` when that is set.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from support_chromium import Browser
from support_jupyter import ExternalKernelServer

from lemon_exec import ExecuteCode, ExecuteCodeConfig, SessionScope
from lemon_exec.host.disk.external import EXTERNAL_DIR_ENV
from lemon_exec.kernel.lemon_kernel import AGENT_CELL_NOT_INTERRUPTIBLE
from lemon_exec.viewer import RESTART_REFUSED

pytestmark = [pytest.mark.timeout(240), pytest.mark.slow, pytest.mark.kernel]

#: The agent's script runs until the test creates this file (at most 120 s).
HOLD = (
    "import os, time\n"
    "t = time.monotonic()\n"
    "while not os.path.exists({flag!r}) and time.monotonic() - t < 120:\n"
    "    time.sleep(0.05)\n"
    "text(agent_var['answer'])"
)

#: The person's one cell: "Restart Kernel and Run All Cells" must not run it when refused.
CELL: dict[str, Any] = {
    "cell_type": "code",
    "id": "person",
    "metadata": {},
    "source": "print('the person ran this')",
    "outputs": [],
    "execution_count": None,
}
#: The person's second cell, which they interrupt themselves.
SLEEPER: dict[str, Any] = {
    **CELL,
    "id": "sleeper",
    "source": "import time\nprint('sleeping', flush=True)\ntime.sleep(60)",
}
FIRST_CELL = "window.jupyterapp.shell.currentWidget.content.widgets[0].model"
#: The text of the second cell's outputs.
SLEEPER_OUT = (
    "JSON.stringify(window.jupyterapp.shell.currentWidget.content.widgets[1].model.outputs"
    ".toJSON())"
)

#: Closes every notification toast.
CLOSE_TOASTS = "document.querySelectorAll('.jp-Notification-Toast-Close').forEach(b => b.click())"
#: Accepts the open dialog (true), or false while there is none.
ACCEPT_DIALOG = (
    "(b => b ? (b.click(), true) : false)(document.querySelector('.jp-Dialog .jp-mod-accept'))"
)

#: The notebook's kernel connection in the page.
KERNEL = "window.jupyterapp.shell.currentWidget.sessionContext.session.kernel"

#: The text of every notification toast on the page.
TOASTS = "[...document.querySelectorAll('.Toastify__toast')].map(t => t.innerText).join('\\n')"


class Lab(ExternalKernelServer):
    """A ``jupyter lab`` subprocess on loopback that sees external kernels in ``external``."""

    def __init__(self, tmp: Path, external: Path) -> None:
        # Answer JupyterLab's "notified about official Jupyter news?" toast: no.
        settings = tmp / "lab-settings" / "@jupyterlab" / "apputils-extension"
        settings.mkdir(parents=True)
        (settings / "notification.jupyterlab-settings").write_text('{"fetchNews": "false"}')
        super().__init__(
            tmp,
            external,
            app="jupyterlab",
            options=[
                # window.jupyterapp: the test runs JupyterLab's own commands.
                "--LabApp.expose_app_in_browser=True",
                # No news or update toasts beside the one under test.
                "--LabApp.news_url=None",
                "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
            ],
            env={
                "JUPYTERLAB_SETTINGS_DIR": str(tmp / "lab-settings"),
                "JUPYTERLAB_WORKSPACES_DIR": str(tmp / "lab-workspaces"),
            },
        )


def _session_host() -> ExecuteCode:
    return ExecuteCode(
        ExecuteCodeConfig(
            enabled=True,
            kernel_mode="session",
            warm_kernels=0,
            python_path=sys.executable,
            timeout_ms=180_000,
        )
    )


def _save(browser: Browser, tmp: Path, name: str) -> None:
    shot = tmp / name
    browser.screenshot(shot)
    if os.environ.get("LEMON_TEST_SCREENSHOT_DIR"):
        shutil.copy(shot, Path(os.environ["LEMON_TEST_SCREENSHOT_DIR"]) / name)


def test_jupyterlab_shows_why_restart_and_interrupt_were_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    external = tmp_path / "external"
    external.mkdir(mode=0o700)
    monkeypatch.setenv(EXTERNAL_DIR_ENV, str(external))
    flag = tmp_path / "release-the-agent"
    tool = _session_host()
    lab: Lab | None = None
    browser: Browser | None = None
    agent = threading.Thread()
    try:
        scope = SessionScope("lab", "agent", tmp_path)
        first = tool.run_sync("agent_var = {'answer': 42}\ntext('ready')", scope=scope)
        assert first.content == "Script result (text()):\nready", first.content
        lab = Lab(tmp_path, external)
        status, kernels = lab.request("GET", "/api/kernels")
        assert status == 200 and len(kernels) == 1, kernels
        kid = kernels[0]["id"]

        # The person's notebook, attached to the agent's kernel.
        (tmp_path / "view.ipynb").write_text(
            json.dumps(
                {"cells": [CELL, SLEEPER], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
            )
        )
        status, session = lab.request(
            "POST",
            "/api/sessions",
            {"path": "view.ipynb", "type": "notebook", "name": "", "kernel": {"id": kid}},
        )
        assert status == 201 and session["kernel"]["id"] == kid, (status, session)

        browser = Browser(f"{lab.base}/lab/tree/view.ipynb?token={lab.token}")
        browser.wait_for(
            "window.jupyterapp?.shell.currentWidget?.sessionContext?.session?.kernel?.id"
            f" === {kid!r}",
            timeout=90,
            what="the notebook attached to the agent's kernel",
        )
        # Connected, and the kernel's status known (idle), before the agent's script starts.
        browser.wait_for(
            f"{KERNEL}.connectionStatus === 'connected' && {KERNEL}.status === 'idle'",
            what="the notebook's kernel connection",
        )
        plugins = browser.evaluate("window.jupyterapp.listPlugins()")
        assert "lemon-exec-jupyterlab:refusals" in plugins

        results: list[Any] = []
        agent = threading.Thread(
            target=lambda: results.append(tool.run_sync(HOLD.format(flag=str(flag)), scope=scope))
        )
        agent.start()
        browser.wait_for(f"{KERNEL}.status === 'busy'", what="the agent's script to run")

        # Restart, the way a person does it: the command asks "Restart Kernel?" first.
        browser.evaluate("void window.jupyterapp.commands.execute('notebook:restart-run-all')")
        browser.wait_for(ACCEPT_DIALOG, what="the Restart Kernel? dialog")
        expected = "Restart refused: " + RESTART_REFUSED
        browser.wait_for(f"({TOASTS}).includes({expected!r})", what="the restart refusal")
        browser.wait_for("!document.querySelector('.jp-Dialog')", what="the dialog to close")
        time.sleep(0.5)  # the toast's entry animation ends
        _save(browser, tmp_path, "jupyterlab-refusal-restart.png")
        # The kernel was not touched, and its status says so (not "restarting").
        assert browser.evaluate(f"{KERNEL}.status") == "busy"
        # Refused, so JupyterLab does not go on to run all cells on the agent's kernel.
        time.sleep(1.0)
        cell = browser.evaluate(f"[{FIRST_CELL}.executionState, {FIRST_CELL}.executionCount]")
        assert cell == ["idle", None], cell

        # Interrupt during the agent's script (the toolbar's ■ runs this command).
        browser.evaluate(CLOSE_TOASTS)
        browser.wait_for(f"!({TOASTS})", what="the restart toast to go")
        browser.evaluate("void window.jupyterapp.commands.execute('notebook:interrupt-kernel')")
        expected = "Interrupt refused: " + AGENT_CELL_NOT_INTERRUPTIBLE
        browser.wait_for(f"({TOASTS}).includes({expected!r})", what="the interrupt refusal")
        time.sleep(0.5)
        _save(browser, tmp_path, "jupyterlab-refusal-interrupt.png")
        assert agent.is_alive(), "the agent's script ended before the refusals were checked"

        # The agent's script goes on to its end, with its state.
        flag.touch()
        agent.join(60)
        assert results and results[0].content == "Script result (text()):\n42", results

        # The person's own running cell: a refused restart leaves it (its output still
        # reaches the notebook), and it is theirs to interrupt, with no refusal.
        browser.evaluate(CLOSE_TOASTS)
        browser.wait_for(f"!({TOASTS})", what="the interrupt toast to go")
        browser.evaluate("void window.jupyterapp.commands.execute('notebook:run-all-cells')")
        browser.wait_for(f"{SLEEPER_OUT}.includes('sleeping')", what="the person's cell to run")
        browser.evaluate("void window.jupyterapp.commands.execute('notebook:restart-kernel')")
        browser.wait_for(ACCEPT_DIALOG, what="the Restart Kernel? dialog")
        browser.wait_for(f"({TOASTS}).includes('Restart refused')", what="the restart refusal")
        browser.evaluate(CLOSE_TOASTS)
        browser.wait_for(f"!({TOASTS})", what="the restart toast to go")
        browser.evaluate("void window.jupyterapp.commands.execute('notebook:interrupt-kernel')")
        browser.wait_for(f"{SLEEPER_OUT}.includes('KeyboardInterrupt')", what="the interrupt")
        assert browser.evaluate(TOASTS) == ""

        # Shut Down from the notebook forgets the kernel here; it keeps running for the agent.
        browser.evaluate("window.jupyterapp.commands.execute('notebook:shutdown-kernel')")
        browser.wait_for(
            "!window.jupyterapp.shell.currentWidget.sessionContext.session",
            what="the notebook to leave the kernel",
        )
        assert lab.request("GET", "/api/kernels") == (200, [])
        after = tool.run_sync("text(agent_var['answer'] + 1)", scope=scope)
        assert after.content == "Script result (text()):\n43"
        assert after.details["state_retained"] is True
    finally:
        flag.touch()
        if agent.ident is not None:
            agent.join(60)
        if browser is not None:
            browser.close()
        if lab is not None:
            lab.stop()
        tool.close()


def test_missing_chromium_without_root_stops_with_one_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import support_chromium
    import support_debian

    monkeypatch.setattr(support_debian.shutil, "which", lambda name: None)
    monkeypatch.setattr(support_debian.os, "geteuid", lambda: 1000)
    with pytest.raises(pytest.fail.Exception) as failed:
        support_chromium.executable()
    assert str(failed.value) == (
        "chromium is missing and this browser test needs it (not root); "
        "install it with: sudo apt-get install chromium"
    )
