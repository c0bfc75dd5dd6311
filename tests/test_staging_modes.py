"""Every object of a live host's staging root and runtime directory is owner-only (issue 26
item 7).

Directories 0700, files and Unix sockets 0600: the kernels' ipc sockets in the runtime
directory (under the runtime base, /tmp/lemon-exec.<uid>/) included, whose mode zmq takes
from the umask (it was 0755 under the usual 022), and the host's link socket. Symlinks have
no mode of their own on Linux; the only one is ``pypath/lemon_exec`` (docs/security.md).
Checked while a script runs, with a spare waiting, in per-call and session mode, for forked
and cold kernels, under the host's usual umask.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import stat
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from lemon_exec import ExecuteCode, ExecuteCodeConfig, SessionScope
from lemon_exec.host.disk.runtime_base import runtime_dir_of
from lemon_exec.host.kernels.local.link_end import LinkEnd

pytestmark = [pytest.mark.timeout(120), pytest.mark.kernel]

#: Prints how the kernel running it was started.
PROBE = """
import os
parent = open(f"/proc/{os.getppid()}/cmdline", "rb").read()
print("FORKED" if b"lemon_exec.template.server" in parent else "COLD")
"""


@pytest.fixture
def short_base() -> Iterator[Path]:
    """A staging base short enough for ipc socket paths, with the usual umask."""
    path = Path(tempfile.mkdtemp(prefix="lsm-", dir="/tmp"))
    old = os.umask(0o022)
    try:
        yield path
    finally:
        os.umask(old)
        shutil.rmtree(path, ignore_errors=True)


def modes(root: Path) -> dict[str, tuple[str, int]]:
    """(kind, permission bits) of everything under ``root``, by relative path."""
    found = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                continue  # removed while we walked (a socket the host stopped listening on)
            if stat.S_ISDIR(st.st_mode):
                kind = "dir"
            elif stat.S_ISSOCK(st.st_mode):
                kind = "socket"
            elif stat.S_ISLNK(st.st_mode):
                kind = "symlink"
            else:
                kind = "file"
            found[os.path.relpath(path, root)] = (kind, stat.S_IMODE(st.st_mode))
    return found


def wrong_modes(found: dict[str, tuple[str, int]]) -> dict[str, str]:
    expected = {"dir": 0o700, "file": 0o600, "socket": 0o600}
    wrong = {}
    for path, (kind, mode) in found.items():
        if kind == "symlink":
            if not path.endswith("/pypath/lemon_exec"):
                wrong[path] = "unexpected symlink"
        elif mode != expected[kind]:
            wrong[path] = f"{kind} {mode:#o}"
    return wrong


#: What the running script reports after PROBE: its umask, which must be the host's.
UMASK = "mask = os.umask(0)\nos.umask(mask)\nprint(oct(mask))\n"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("mode", "start", "sandbox"),
    [
        ("per_call", "FORKED", "none"),
        ("per_call", "COLD", "none"),
        ("session", "FORKED", "none"),
        ("session", "COLD", "none"),
        # Inside bwrap a kernel's parent is the namespace's init: PROBE cannot tell.
        ("per_call", "", "bwrap"),
        ("session", "", "bwrap"),
    ],
)
def test_staging_objects_are_owner_only_while_kernels_run(
    short_base: Path, tmp_path: Path, mode: str, start: str, sandbox: str
) -> None:
    config = ExecuteCodeConfig(
        enabled=True,
        kernel_mode=mode,
        warm_kernels=1,
        python_path=sys.executable,
        fork_server=start != "COLD",
        sandbox=sandbox,
        timeout_ms=30_000,
    )
    scope = SessionScope("modes", "agent", str(tmp_path)) if mode == "session" else None

    async def main() -> dict[str, tuple[str, int]]:
        facade = ExecuteCode(config, staging_base=short_base)
        try:
            for _ in range(60):  # until a kernel started the way this case checks runs it
                result = await facade.run(PROBE, scope=scope)
                assert result.details["exit_code"] == 0, result.content
                if result.content.strip() == start or not start:
                    break
                await asyncio.sleep(0.2)
                if mode == "session":  # a fresh kernel, from the template once it is ready
                    await facade.run("", scope=scope, reset=True)
            # The cell runs on for 1.5 s after its output reaches the host.
            printed = asyncio.Event()
            running = asyncio.create_task(
                facade.run(
                    PROBE + UMASK + "import sys, time\nsys.stdout.flush()\ntime.sleep(1.5)\n",
                    scope=scope,
                    on_output=lambda _chunk: printed.set(),
                )
            )
            await asyncio.wait_for(printed.wait(), 60)
            found = modes(short_base)
            # Keys and sockets live in the host's runtime directory under the runtime base.
            for root in short_base.iterdir():
                runtime = runtime_dir_of(root)
                found |= {f"runtime:{k}": v for k, v in modes(runtime).items()}
                found[f"runtime:{runtime.name}"] = ("dir", stat.S_IMODE(runtime.stat().st_mode))
            result = await running
            kind, umask = result.content.split()
            assert kind == start or not start, result.content
            assert umask == "0o22", "the script must run under the host's umask"
            return found
        finally:
            await facade.aclose()

    found = asyncio.run(main())
    sockets = [path for path, (kind, _mode) in found.items() if kind == "socket"]
    # The running kernel's five (and in per-call mode a waiting spare's).
    assert len(sockets) >= 5, sorted(found)
    assert wrong_modes(found) == {}


def test_host_link_socket_is_created_owner_only(short_base: Path) -> None:
    # The host's end of a kernel's link (runtime/k-<id>-ipc-host): bound under umask 022.
    path = short_base / "k-0-ipc-host"
    link = LinkEnd(path)
    try:
        st = os.lstat(path)
        assert stat.S_ISSOCK(st.st_mode)
        assert stat.S_IMODE(st.st_mode) == 0o600
    finally:
        link.close()


def test_a_kernel_never_writes_back_a_connection_file_removed_under_it(tmp_path: Path) -> None:
    """A forked kernel still starting when its template was killed lost its connection file
    to its parent watch, then wrote it back: jupyter_client set the sticky bit on runtime/
    (1700), and the host refused every later call ("could not create a private workspace")."""
    from jupyter_client.session import Session

    from lemon_exec.kernel.app import LemonKernelApp

    runtime = tmp_path / "runtime"
    runtime.mkdir(mode=0o700)
    connection = runtime / "kernel-x.json"
    info = {
        "ip": str(runtime / "k"),
        "transport": "ipc",
        "key": "secret",
        "signature_scheme": "hmac-sha256",
        "shell_port": 1,
        "iopub_port": 2,
        "stdin_port": 3,
        "control_port": 4,
        "hb_port": 5,
    }
    fd = os.open(connection, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump(info, fh)
    app = LemonKernelApp(connection_file=str(connection))
    app.init_connection_file()  # the host's file, loaded
    app.session = Session(key=b"secret")
    connection.unlink()  # its parent watch (or the host) removed the key
    app.write_connection_file()
    assert not connection.exists(), "the removed connection file was written back"
    assert stat.S_IMODE(runtime.stat().st_mode) == 0o700
