"""What a forked kernel does at start (issue 17): nothing the fork-server template could do.

The template imports every module a kernel imports while it initialises (kernel/app.py's
PRELOAD_MODULES), so a forked kernel shares those pages instead of importing its own copy;
and the host's ``-f FILE`` command line is taken without building traitlets' argparse parser.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any, NoReturn

import pytest

from lemon_exec.kernel.app import LemonKernelApp

_INIT_AFTER_PRELOAD = r"""
import json, os, sys
from lemon_exec.kernel.lean import skip_optional_modules
skip_optional_modules()
from lemon_exec.kernel import app
app.preload()
before = set(sys.modules)
os.environ["LEMON_EXEC_MANAGED"] = "1"
out = os.dup(1)  # the kernel app captures fds 1 and 2
kernel_app = app.LemonKernelApp.instance()
kernel_app.initialize(["-f", sys.argv[1]])
new = sorted(m for m in set(sys.modules) - before if sys.modules[m] is not None)
from ipykernel import ipkernel
report = {
    "modules": new,
    "kernel_modules": len(kernel_app.kernel._kernel_modules),
    "sys_restored": ipkernel.sys is sys,
}
os.write(out, b"\nREPORT " + json.dumps(report).encode())
os._exit(0)
"""


@pytest.fixture(scope="module")
def started(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """What a kernel initialised after the template's preload reports (see above)."""
    tmp_path = tmp_path_factory.mktemp("start-cost")
    connection_file = tmp_path / "kernel.json"
    connection_file.write_text(
        json.dumps(
            {
                "transport": "ipc",
                "ip": str(tmp_path / "k"),
                "shell_port": 1,
                "iopub_port": 2,
                "stdin_port": 3,
                "control_port": 4,
                "hb_port": 5,
                "key": "secret",
                "signature_scheme": "hmac-sha256",
            }
        )
    )
    done = subprocess.run(
        [sys.executable, "-c", _INIT_AFTER_PRELOAD, str(connection_file)],
        capture_output=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    report: dict[str, Any] = json.loads(done.stdout.rsplit(b"\nREPORT ", 1)[1])
    return report


@pytest.mark.kernel
def test_a_kernel_imports_nothing_at_start_after_the_template_preloaded(
    started: dict[str, Any],
) -> None:
    # A module named here is imported by every forked kernel: add it to PRELOAD_MODULES.
    assert started["modules"] == []


@pytest.mark.kernel
def test_a_kernel_without_debugger_does_not_walk_every_module_at_start(
    started: dict[str, Any],
) -> None:
    # IPythonKernel lists every module's file for its debugger: ~5 ms per kernel, and it
    # copies the pages of ~500 module objects shared with the template. No debugpy, no list.
    assert started["kernel_modules"] == 0
    assert started["sys_restored"]  # ipykernel's own module sees the real sys again


def test_the_hosts_command_line_skips_the_parser(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_parser(*_args: object, **_kwargs: object) -> NoReturn:
        raise AssertionError("traitlets' command-line parser was built")

    app = LemonKernelApp()
    monkeypatch.setattr(app, "_create_loader", no_parser)
    app.parse_command_line(["-f", "/run/kernel-1.json"])
    assert app.connection_file == "/run/kernel-1.json"
    assert app.extra_args == []


def test_any_other_command_line_goes_through_traitlets() -> None:
    app = LemonKernelApp()
    app.parse_command_line(["-f", "/run/kernel-2.json", "--IPKernelApp.log_level=10"])
    assert app.connection_file == "/run/kernel-2.json"
    assert app.log_level == 10
