"""Host death leaves nothing behind: kernels, their setsid and double-fork daemons, templates.

Real hosts in subprocesses, killed with SIGKILL (or SIGTERM while inside ``run_sync``); real
kernels whose scripts start daemons that leave the kernel's process group. Every process a
test saw is SIGKILLed in a ``finally``, so a failing test leaks nothing either.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import mcp_call_execute_code, pid_gone, wait_for_value, wait_until

from lemon_exec import ExecuteCode, ExecuteCodeConfig
from lemon_exec.host.disk import hygiene
from lemon_exec.host.disk.external import EXTERNAL_DIR_ENV
from lemon_exec.host.disk.runtime_base import runtime_dir_of
from lemon_exec.host.disk.stale_roots import sweep_stale_roots
from lemon_exec.proc import supervise
from lemon_exec.scope import SessionScope

pytestmark = pytest.mark.kernel

#: The bound the issue sets for "host SIGKILLed -> everything gone", with slack for CI.
GONE_WITHIN_S = 3.0


def daemon_script(pid_file: Path, *, block: bool) -> str:
    """Starts a setsid ``sleep`` and a classic double-fork daemon, writes all PIDs."""
    return textwrap.dedent(
        f"""
        import os, subprocess, time
        setsid = subprocess.Popen(["sleep", "1000"], start_new_session=True)
        r, w = os.pipe()
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                os.write(w, str(os.getpid()).encode())
                os.execvp("sleep", ["sleep", "1001"])
            os._exit(0)
        os.close(w)
        daemon = int(os.read(r, 64))
        os.wait()
        with open({str(pid_file) + ".tmp"!r}, "w") as fh:
            fh.write(f"{{os.getpid()}} {{os.getppid()}} {{setsid.pid}} {{daemon}}")
        os.rename({str(pid_file) + ".tmp"!r}, {str(pid_file)!r})
        {"time.sleep(1000)" if block else ""}
        """
    )


def read_pids(
    path: Path, within: float = 60.0, host: subprocess.Popen[bytes] | None = None
) -> list[int]:
    def written() -> list[int] | None:
        assert host is None or host.poll() is None, "the host exited early"
        return [int(p) for p in path.read_text().split()] if path.exists() else None

    return wait_for_value(written, within, f"pids written to {path}")


def all_gone(pids: set[int], within: float = GONE_WITHIN_S) -> set[int]:
    """The PIDs still running after ``within`` seconds (zombies count as gone)."""
    wait_until(lambda: all(pid_gone(p) for p in pids), within)
    return {p for p in pids if not pid_gone(p)}


def below(pid: int) -> set[int]:
    return set(supervise.descendants(pid))


@pytest.fixture
def reap() -> Iterator[set[int]]:
    """PIDs added here are SIGKILLed after the test, pass or fail."""
    pids: set[int] = set()
    yield pids
    for pid in pids:
        if not pid_gone(pid):
            supervise.kill_tree(pid)


# -- a host in a subprocess ------------------------------------------------------------------

HOST = r"""
import os, sys, time
from pathlib import Path
from lemon_exec import ExecuteCode, ExecuteCodeConfig
from lemon_exec.scope import SessionScope

mode, fork, base, probe, script = sys.argv[1:6]
config = ExecuteCodeConfig(
    enabled=True, kernel_mode=mode, fork_server=fork == "on", warm_kernels=0
)
tool = ExecuteCode(config, staging_base=base)

def scope(name):
    return SessionScope(name) if mode == "session" else None

# With the fork server on, wait until kernels are forked (the first starts cold).
for i in range(40):
    probe_script = f"import os\nwith open({probe!r}, 'w') as fh:\n    fh.write(str(os.getppid()))"
    tool.run_sync(probe_script, scope=scope(f"p{i}"))
    if fork == "off" or int(Path(probe).read_text()) != os.getpid():
        break
    time.sleep(0.25)
tool.run_sync(Path(script).read_text(), scope=scope("main"), timeout_ms=600_000)
"""


@pytest.fixture
def base() -> Iterator[Path]:
    """A short staging base (ipc socket paths must fit in 107 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="lhd-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def start_host(tmp_path: Path, base: Path, mode: str, fork: str) -> subprocess.Popen[bytes]:
    host_py = tmp_path / "host.py"
    host_py.write_text(HOST)
    script = tmp_path / "script.py"
    script.write_text(daemon_script(tmp_path / "pids", block=True))
    argv = [
        sys.executable,
        str(host_py),
        mode,
        fork,
        str(base),
        str(tmp_path / "probe"),
        str(script),
    ]
    # Session kernels are published for Jupyter Server: links to their connection files.
    env = {**os.environ, EXTERNAL_DIR_ENV: str(tmp_path / "external")}
    return subprocess.Popen(argv, cwd=tmp_path, env=env)


def connection_files(base: Path) -> list[Path]:
    """The keys of the hosts whose staging roots are in ``base`` (in their runtime dirs)."""
    return [k for r in base.glob("lemon-exec-*") for k in runtime_dir_of(r).glob("kernel-*.json")]


def names(root: Path) -> set[str]:
    return {p.name for p in root.iterdir()}


@pytest.mark.slow
@pytest.mark.parametrize(
    ("mode", "fork", "signum"),
    [
        ("per_call", "on", signal.SIGKILL),
        ("per_call", "off", signal.SIGKILL),
        ("session", "on", signal.SIGKILL),
        ("session", "off", signal.SIGKILL),
        ("per_call", "off", signal.SIGTERM),  # run_sync on the main thread: no handler ran
    ],
)
def test_killed_host_leaves_no_process_and_no_key(
    tmp_path: Path, base: Path, reap: set[int], mode: str, fork: str, signum: int
) -> None:
    host = start_host(tmp_path, base, mode, fork)
    reap.add(host.pid)
    try:
        kernel, kernel_parent, setsid_daemon, double_fork_daemon = read_pids(
            tmp_path / "pids", within=30, host=host
        )
        reap.update({kernel, setsid_daemon, double_fork_daemon})
        everything = below(host.pid)
        reap.update(everything)
        assert {kernel, setsid_daemon, double_fork_daemon} <= everything
        # The double-fork daemon was adopted by the kernel (a subreaper), not by init.
        assert supervise._stat_fields(double_fork_daemon)[1] == str(kernel)  # type: ignore[index]
        if fork == "on":
            assert kernel_parent != host.pid, "the kernel should have been forked by a template"
        else:
            assert kernel_parent == host.pid
        assert connection_files(base)
        links = tmp_path / "external"
        if mode == "session":
            assert list(links.iterdir()), "the session kernel was not published"

        host.send_signal(signum)
        host.wait(10)
        assert not all_gone(everything), "processes outlived the killed host"
        deadline = time.monotonic() + GONE_WITHIN_S
        while connection_files(base) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not connection_files(base), "a connection file (with its key) outlived the host"
        (root,) = base.glob("lemon-exec-*")
        if fork == "on":
            # The template did the dead host's teardown: spill files (24 h) and the owner
            # marker stay, with the index; workspaces and runtime files are gone.
            deadline = time.monotonic() + GONE_WITHIN_S
            while len(names(root)) > 3 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert names(root) <= {"owner", "kernels.json", "spill"}
            runtime = runtime_dir_of(root)
            assert wait_until(lambda: not runtime.exists(), GONE_WITHIN_S), (
                "the runtime directory (keys, sockets, logs) outlived the host"
            )
            if mode == "session":  # the published links dangled: the teardown removed them
                assert wait_until(lambda: not list(links.iterdir()), GONE_WITHIN_S)
        with ExecuteCode(ExecuteCodeConfig(enabled=True), staging_base=base) as tool:
            tool.run_sync("pass")
        if fork == "on":  # only empty known parts were left: the next start removed it
            assert not root.exists()
        else:  # spec: a non-empty stale root is never traversed or removed
            assert (root / "owner").exists() and not connection_files(base)
    finally:
        if host.poll() is None:
            host.kill()
            host.wait()


# -- runs and sessions end their descendants -------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("fork", [True, False])
def test_per_call_run_end_kills_its_daemons(tmp_path: Path, reap: set[int], fork: bool) -> None:
    config = ExecuteCodeConfig(enabled=True, fork_server=fork, warm_kernels=0)
    with ExecuteCode(config) as tool:
        result = tool.run_sync(daemon_script(tmp_path / "pids", block=False))
        assert not result.details.get("error"), result.content
        kernel, _parent, *daemons = read_pids(tmp_path / "pids", within=1)
        reap.update({kernel, *daemons})
        assert not all_gone({kernel, *daemons}), "a per-call run's daemons outlived it"


@pytest.mark.slow
def test_session_reset_kills_its_daemons(tmp_path: Path, reap: set[int]) -> None:
    config = ExecuteCodeConfig(enabled=True, kernel_mode="session")
    scope = SessionScope("daemons", cwd=tmp_path)
    with ExecuteCode(config) as tool:
        tool.run_sync(daemon_script(tmp_path / "pids", block=False), scope=scope)
        kernel, _parent, *daemons = read_pids(tmp_path / "pids", within=1)
        reap.update({kernel, *daemons})
        time.sleep(0.5)
        assert not any(pid_gone(p) for p in daemons), "a session keeps its daemons while alive"
        tool.run_sync("pass", scope=scope, reset=True)
        assert not all_gone({kernel, *daemons}), "a reset session's daemons survived"


# -- lemon-exec mcp over stdio ---------------------------------------------------------------


@pytest.mark.slow
def test_killed_stdio_mcp_server_leaves_nothing(tmp_path: Path, reap: set[int]) -> None:
    argv = [sys.executable, "-m", "lemon_exec", "mcp"]
    server = subprocess.Popen(
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=tmp_path, text=True
    )
    reap.add(server.pid)
    try:
        mcp_call_execute_code(server, daemon_script(tmp_path / "pids", block=False))
        kernel, _parent, *daemons = read_pids(tmp_path / "pids", within=1)
        reap.update({kernel, *daemons})
        everything = below(server.pid) | {kernel, *daemons}
        reap.update(everything)
        server.kill()
        server.wait(10)
        assert not all_gone(everything), "processes outlived the killed MCP server"
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()


# -- the next start sweeps what survived -----------------------------------------------------


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_next_start_kills_recorded_survivors_but_never_a_reused_pid(
    tmp_path: Path, reap: set[int], reap_dirs: list[Path]
) -> None:
    root = tmp_path / f"lemon-exec-dead{uuid.uuid4().hex[:8]}"
    root.mkdir(mode=0o700)
    runtime = runtime_dir_of(root)
    runtime.mkdir(mode=0o700)
    reap_dirs.append(runtime)
    key_file = runtime / "kernel-x.json"
    key_file.write_text('{"key": "secret"}')
    owner = _dead_pid()
    (root / "owner").write_text(json.dumps({"pid": owner, "created": 0, "version": 1}))
    (root / "owner").chmod(0o600)
    survivor = subprocess.Popen(["sleep", "1000"], start_new_session=True)
    stranger = subprocess.Popen(["sleep", "1000"], start_new_session=True)
    reap.update({survivor.pid, stranger.pid})
    try:
        survivor_start = supervise.start_time(survivor.pid)
        stranger_start = supervise.start_time(stranger.pid)
        assert survivor_start is not None and stranger_start is not None
        index = {
            "pid": owner,
            "host_start": 1,
            "kernels": [{"connection_file": str(key_file)}],
            "processes": [
                {"pid": survivor.pid, "start": survivor_start},
                # Same PID, other start time: a reused PID, not ours to kill.
                {"pid": stranger.pid, "start": stranger_start + 1},
            ],
        }
        fd = os.open(root / "kernels.json", os.O_WRONLY | os.O_CREAT, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump(index, fh)

        assert hygiene.sweep_dead_hosts(tmp_path) == 1
        survivor.wait(5)
        assert stranger.poll() is None
        assert not key_file.exists(), "the dead host's key file should be gone"
        # The root is left to the staging sweep, which removes it once empty (it is now).
        assert sweep_stale_roots(tmp_path) == 1
        assert not root.exists()
    finally:
        for proc in (survivor, stranger):
            proc.kill()
            proc.wait()
