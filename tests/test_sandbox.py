"""sandbox = "bwrap": escape attempts from real kernels under bubblewrap, each one blocked.

Every escape test here succeeds against an unsandboxed kernel (the script has the host
user's authority there): run the module with ``LEMON_TEST_SANDBOX=none`` to watch them fail.
The helpers, which run on the host, must keep working from inside.

The escape tests run twice: against kernels forked from the sandboxed fork-server template
(each confines itself after the fork, lemon_exec.template.isolate; every run checks that its
kernel was forked) and against kernels started cold under bwrap (fork_server off).

bubblewrap must be installed (``.ci/run`` installs it); a missing bwrap fails these tests.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support import enabled_config, mcp_call_execute_code, wait_until

import lemon_exec
from lemon_exec import ExecuteCode, ExecuteCodeConfig, SessionScope
from lemon_exec.host.kernels import sandbox as sandboxes
from lemon_exec.host.kernels.local.backend import LocalBackend
from lemon_exec.proc import supervise

pytestmark = [pytest.mark.timeout(90), pytest.mark.bwrap, pytest.mark.kernel]

#: How long the processes of a killed host or template may take to go (a loaded 2-core CI
#: machine included): they must go, not go fast.
GONE_WITHIN_S = 10.0

#: "none" shows that every escape test fails without the sandbox.
SANDBOX = os.environ.get("LEMON_TEST_SANDBOX", "bwrap")
SECRET = "-----BEGIN OPENSSH PRIVATE KEY----- planted-for-the-sandbox-test"
#: Prints FORKED when the kernel running it was forked from a fork-server template: its
#: parent is then the template (unsandboxed) or its namespace's init, a copy of the template.
FORKED_EXPR = (
    "('FORKED' if b'lemon_exec.template.server' in open("
    "'/proc/%d/cmdline' % __import__('os').getppid(), 'rb').read() else 'COLD')"
)
FORKED_PROBE = f"print('KERNEL:', {FORKED_EXPR})\n"
#: Both ways a sandboxed kernel starts, for the escape tests.
BOTH = pytest.mark.parametrize("world", ["forked", "cold"], indirect=True)


def make_config(**overrides: Any) -> ExecuteCodeConfig:
    """An enabled config for this module (see support.enabled_config)."""
    return enabled_config(**{"warm_kernels": 1, "sandbox": SANDBOX, **overrides})


class World:
    """A temporary HOME with a planted key, a project directory (the cwd) and a facade."""

    def __init__(self, root: Path, mode: str) -> None:
        self.root = root
        self.mode = mode
        self.home = root / "home"
        (self.home / ".ssh").mkdir(parents=True)
        (self.home / ".ssh" / "id_rsa").write_text(SECRET)
        (self.home / ".netrc").write_text("machine example.com password " + SECRET)
        self.project = root / "project"
        self.project.mkdir()
        (self.project / "notes.txt").write_text("project notes\n")
        self.private = root / "private"  # hidden from the kernel, readable by the helpers
        self.private.mkdir()
        (self.private / "data.txt").write_text("only through the helpers\n")
        hidden = [*ExecuteCodeConfig().sandbox_hidden, str(self.private)]
        forked = mode == "forked"
        self.tool = ExecuteCode(make_config(sandbox_hidden=hidden, fork_server=forked))

    def run(self, script: str) -> str:
        """Run ``script`` in a per-call kernel, which must have started the world's way."""
        result = self.tool.run_sync(script + "\n" + FORKED_PROBE)
        assert result.details.get("exit_code") == 0, result.content
        assert f"KERNEL: {self.mode.upper()}" in result.content, result.content
        return result.content


def wait_forked(tool: ExecuteCode, scope: SessionScope | None = None) -> None:
    """Wait until kernels come from the fork-server template (they start cold until it is
    ready), and check that the next one in ``scope`` does. Per-call spares started from
    then on are forked too; a session's kernel is forked when the session starts after."""
    tool.run_sync("pass", scope=SessionScope("lsb-warm-up"))  # starts the template
    deadline = time.monotonic() + 60
    while not any(t.ready for t in tool.diagnostics.templates):
        assert time.monotonic() < deadline, "the sandboxed template never became ready"
        time.sleep(0.05)
    out = ""
    while time.monotonic() < deadline:  # a per-call spare started before may be cold
        out = tool.run_sync(FORKED_PROBE, scope=scope).content
        if "KERNEL: FORKED" in out:
            return
        time.sleep(0.1)
    raise AssertionError(f"no kernel was forked from the sandboxed template: {out}")


@pytest.fixture(scope="module")
def world(request: pytest.FixtureRequest) -> Iterator[World]:
    """A World whose per-call kernels are forked from the template ("forked", the default
    path) or started cold under bwrap ("cold")."""
    mode = getattr(request, "param", "forked")
    root = Path(tempfile.mkdtemp(prefix="lsb-", dir="/var/tmp"))  # outside /tmp and the cwd
    saved_home, saved_cwd = os.environ.get("HOME"), os.getcwd()
    os.environ["HOME"] = str(root / "home")
    made: World | None = None
    try:
        made = World(root, mode)
        os.chdir(made.project)  # per-call kernels' view: the host's working directory
        if mode == "forked":
            wait_forked(made.tool)
        yield made
    finally:
        if made is not None:
            made.tool.close()
        os.chdir(saved_cwd)
        if saved_home is None:
            os.environ.pop("HOME", None)
        else:
            os.environ["HOME"] = saved_home
        shutil.rmtree(root, ignore_errors=True)


def attempt(action: str) -> str:
    """A script that prints OK:<result> or BLOCKED:<exception type> for ``action``."""
    return (
        "try:\n"
        f"    print('OK:', {action})\n"
        "except Exception as exc:\n"
        "    print('BLOCKED:', type(exc).__name__, exc)\n"
    )


@BOTH
def test_planted_ssh_key_is_hidden(world: World) -> None:
    out = world.run(
        attempt("open(os.path.expanduser('~/.ssh/id_rsa')).read()").replace(
            "try:", "import os\ntry:", 1
        )
    )
    assert SECRET not in out
    assert "BLOCKED: FileNotFoundError" in out
    out = world.run(
        attempt("open(os.path.expanduser('~/.netrc')).read()").replace("try:", "import os\ntry:", 1)
    )
    assert SECRET not in out


@BOTH
def test_writes_land_only_in_the_cwd_and_private_tmp(world: World) -> None:
    outside = world.root / "outside.txt"
    out = world.run(attempt(f"open({str(outside)!r}, 'w').write('escaped')"))
    assert "BLOCKED" in out, out
    assert not outside.exists()
    # The working directory is writable (sandbox_cwd = "rw"), /tmp is private.
    marker = f"lsb-{uuid.uuid4().hex}"
    out = world.run(
        f"open('made-inside.txt', 'w').write('hi')\nopen('/tmp/{marker}', 'w').write('x')\n"
        "print('wrote')"
    )
    assert (world.project / "made-inside.txt").read_text() == "hi"
    assert not Path("/tmp", marker).exists()


@BOTH
def test_host_loopback_service_is_unreachable(world: World) -> None:
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    accepted: list[object] = []

    def serve() -> None:
        server.settimeout(15)
        try:
            conn, _ = server.accept()
            accepted.append(conn)
            conn.close()
        except OSError:
            pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        script = "import socket\n" + attempt(
            f"socket.create_connection(('127.0.0.1', {port}), timeout=5).close()"
        )
        out = world.run(script)
        assert "BLOCKED" in out, out
        assert accepted == []
    finally:
        server.close()
        thread.join(5)


@BOTH
def test_host_pid_cannot_be_signalled_or_seen(world: World) -> None:
    host = os.getpid()
    out = world.run("import os\n" + attempt(f"os.kill({host}, 0)"))
    assert "BLOCKED: ProcessLookupError" in out, out
    out = world.run(
        "import os\nprint('SEEN' if os.path.exists('/proc/%d' % " + f"{host}) else 'NOT')"
    )
    assert "NOT" in out


@BOTH
def test_another_kernels_connection_file_is_unreadable(world: World) -> None:
    other = ExecuteCode(make_config(kernel_mode="session", warm_kernels=0))
    try:
        other.run_sync("x = 1", scope=SessionScope("lsb-other"))
        files = [str(k.connection_file) for k in other.diagnostics.kernels]
        assert files and all(Path(f).exists() for f in files)
        for path in files:
            out = world.run(attempt(f"open({path!r}).read()"))
            assert "BLOCKED" in out and '"key"' not in out, out
        # Nor the runtime directory of this facade's own spare kernel.
        runtime_dir = world.tool.diagnostics.runtime_dir
        assert runtime_dir is not None
        listing = world.run("import os\n" + attempt(f"os.listdir({str(runtime_dir)!r})"))
        # Its own runtime directory (named by its id) is all it sees of the staging root.
        assert "OK:" in listing and "kernel-" not in listing, listing
    finally:
        other.close()


def _processes_with(token: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = Path("/proc", entry, "cmdline").read_bytes()
        except OSError:
            continue
        if token.encode() in argv:
            found.append(int(entry))
    return found


def _wait_gone(token: str, within: float = 5.0) -> list[int]:
    """The processes whose command line holds ``token`` ``within`` seconds from now (killed)."""
    wait_until(lambda: not _processes_with(token), within)
    left = _processes_with(token)
    for pid in left:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    return left


@BOTH
@pytest.mark.parametrize("ending", ["returns", "kernel_killed"])
def test_setsid_daemon_does_not_outlive_the_call(world: World, ending: str) -> None:
    # Unsandboxed, a kernel that dies of SIGKILL (here: its own script kills it) leaves its
    # setsid daemon to init when no fork-server template adopts it; in the sandbox the
    # daemon dies with the kernel's PID namespace either way.
    token = f"{uuid.uuid4().int % 10**6 + 10**6}"
    marker = world.project / f"started-{token}"
    script = (
        "import os, subprocess\n"
        f"p = subprocess.Popen(['sleep', '{token}'], start_new_session=True)\n"
        f"open({marker.name!r}, 'w').write(str(p.pid))\n"  # output may die with the kernel
    )
    if ending == "kernel_killed":
        script += "os.kill(os.getpid(), 9)\n"
    result = world.tool.run_sync(script)
    assert marker.exists(), result.content
    marker.unlink()
    if ending == "kernel_killed":  # reported as killed by SIGKILL, as without the sandbox
        assert result.details.get("exit_code") == -9, result.details
    assert _wait_gone(token) == []


HOST = """
import sys, time
from pathlib import Path
from lemon_exec import ExecuteCode, ExecuteCodeConfig
fork = sys.argv[3] == "forked"
tool = ExecuteCode(ExecuteCodeConfig(
    enabled=True, warm_kernels=0, python_path=sys.executable, sandbox=sys.argv[1],
    fork_server=fork, timeout_ms=600_000,
))
if fork:  # the script's kernel is then forked from the (sandboxed) template
    tool.run_sync("pass")
    deadline = time.monotonic() + 60
    while not any(t.ready for t in tool.diagnostics.templates) and time.monotonic() < deadline:
        time.sleep(0.05)
tool.run_sync(Path(sys.argv[2]).read_text())
"""


@pytest.mark.slow
@pytest.mark.parametrize("start", ["forked", "cold"])
def test_killed_host_takes_its_sandboxes_along(world: World, start: str) -> None:
    token = f"{uuid.uuid4().int % 10**6 + 10**6}"
    ready = world.project / f"ready-{token}"
    script = world.project / f"daemon-{token}.py"
    script.write_text(
        "import subprocess, time\n"
        f"subprocess.Popen(['sleep', '{token}'], start_new_session=True)\n"
        + f"open({str(ready)!r}, 'w').write({FORKED_EXPR})\n"
        + "time.sleep(1000)\n"
    )
    host = subprocess.Popen(
        [sys.executable, "-c", HOST, SANDBOX, str(script), start], cwd=world.project
    )
    below: list[int] = []
    try:
        assert wait_until(lambda: ready.exists() or host.poll() is not None, 60)
        assert host.poll() is None, "the host exited early"
        assert wait_until(lambda: ready.read_text() != "", 5)
        assert start.upper() in ready.read_text()
        # bwrap, its init, the kernel, the daemon (forked: and the template, its bwrap)
        below = supervise.descendants(host.pid)
        assert len(below) >= 3 if SANDBOX == "bwrap" else below
        host.kill()
        host.wait(10)
        # Gone with the host, not left running; how fast is the benchmark's business.
        assert _wait_gone(token, within=GONE_WITHIN_S) == []
        wait_until(lambda: not [pid for pid in below if _running(pid)], GONE_WITHIN_S)
        assert not [pid for pid in below if _running(pid)]
    finally:
        with contextlib.suppress(OSError):
            host.kill()
        host.wait(10)
        _wait_gone(token, within=0)
        for pid in below:  # a failing test leaks nothing either
            if _running(pid):
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
        ready.unlink(missing_ok=True)
        script.unlink(missing_ok=True)


def _running(pid: int) -> bool:
    try:
        state = Path("/proc", str(pid), "stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


@BOTH
def test_helpers_still_reach_the_host(world: World) -> None:
    hidden = world.private / "data.txt"
    out = world.run(
        attempt(f"open({str(hidden)!r}).read()")
        + f"print('HELPER:', read({str(hidden)!r}))\n"
        + "print('LS:', ls('.'))\n"
    )
    assert "BLOCKED: FileNotFoundError" in out, out
    assert "HELPER:" in out and "only through the helpers" in out, out
    assert "notes.txt" in out


@BOTH
def test_interrupt_and_timeout_still_work(world: World) -> None:
    result = world.tool.run_sync(
        "import time\nprint('start', flush=True)\ntime.sleep(60)", timeout_ms=1500
    )
    assert result.details.get("timed_out") is True, result.details
    # The next call runs normally in a fresh sandboxed kernel.
    assert "2" in world.run("print(1 + 1)")


def test_session_mode_read_only_cwd(world: World, tmp_path: Path) -> None:
    project = Path(tempfile.mkdtemp(prefix="lsb-ro-", dir="/var/tmp"))
    (project / "in.txt").write_text("readable")
    tool = ExecuteCode(make_config(kernel_mode="session", warm_kernels=0, sandbox_cwd="ro"))
    try:
        scope = SessionScope("lsb-ro", cwd=str(project))
        first = tool.run_sync("print(open('in.txt').read())\nx = 41", scope=scope)
        assert "readable" in first.content, first.content
        second = tool.run_sync(
            attempt("open('out.txt', 'w').write('no')") + "print(x + 1)", scope=scope
        )
        assert "BLOCKED" in second.content and "42" in second.content, second.content
        assert not (project / "out.txt").exists()
        # An abort interrupts the cell: SIGINT reaches the kernel through bwrap (which
        # ignores it) as a KeyboardInterrupt the script sees.
        abort = threading.Event()
        timer = threading.Timer(1.0, abort.set)
        timer.start()
        third = tool.run_sync(
            "import time\nprint('waiting', flush=True)\ntry:\n    time.sleep(60)\n"
            "except KeyboardInterrupt:\n    print('KBI', flush=True)\n    raise\n",
            scope=scope,
            abort=abort,
        )
        timer.cancel()
        assert "KBI" in third.content, third.content
        assert "3" in tool.run_sync("print(1 + 2)", scope=scope).content
    finally:
        tool.close()
        shutil.rmtree(project, ignore_errors=True)


@pytest.mark.parametrize("start", ["forked", "cold"])
def test_sandbox_network_true_keeps_the_hosts_network(world: World, start: str) -> None:
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    forked = start == "forked"
    tool = ExecuteCode(make_config(warm_kernels=0, sandbox_network=True, fork_server=forked))
    try:
        if forked:
            wait_forked(tool)
        script = "import socket\n" + attempt(
            f"socket.create_connection(('127.0.0.1', {port}), timeout=5).close()"
        )
        out = tool.run_sync(script + FORKED_PROBE).content
        assert "OK:" in out and f"KERNEL: {start.upper()}" in out, out
    finally:
        tool.close()
        server.close()


def test_a_sandbox_that_cannot_start_is_refused(
    monkeypatch: pytest.MonkeyPatch, world: World
) -> None:
    sandboxes._probe.cache_clear()
    monkeypatch.setenv("PATH", str(world.root))  # no bwrap on PATH
    try:
        tool = ExecuteCode(make_config(sandbox="bwrap", warm_kernels=0))
        try:
            result = tool.run_sync("print('RAN' + 'MARK')")
        finally:
            tool.close()
    finally:
        monkeypatch.undo()
        sandboxes._probe.cache_clear()
    assert "RANMARK" not in result.content
    assert "bubblewrap" in result.content and "apt-get install bubblewrap" in result.content


def test_an_unknown_sandbox_is_refused(world: World) -> None:
    tool = ExecuteCode(make_config(sandbox="bwarp", warm_kernels=0))
    try:
        result = tool.run_sync("print('RAN' + 'MARK')")
    finally:
        tool.close()
    assert "RANMARK" not in result.content
    assert "unknown sandbox 'bwarp'" in result.content


def test_cli_run_sandbox_flag(world: World) -> None:
    script = world.project / "peek.py"
    script.write_text("import os\n" + attempt("open(os.path.expanduser('~/.ssh/id_rsa')).read()"))
    env = {**os.environ, "HOME": str(world.home)}
    env.pop("LEMON_EXECUTE_CODE_SANDBOX", None)
    command = [sys.executable, "-m", "lemon_exec", "run"]
    sandboxed = subprocess.run(
        [*command, "--sandbox", str(script)], capture_output=True, text=True, env=env, timeout=60
    )
    assert "BLOCKED: FileNotFoundError" in sandboxed.stdout, sandboxed
    plain = subprocess.run(
        [*command, str(script)], capture_output=True, text=True, env=env, timeout=60
    )
    assert SECRET in plain.stdout, plain  # the flag is what hides it
    script.unlink()


def test_mcp_server_sandbox_flag(world: World) -> None:
    env = {**os.environ, "HOME": str(world.home)}
    env.pop("LEMON_EXECUTE_CODE_SANDBOX", None)
    server = subprocess.Popen(
        [sys.executable, "-m", "lemon_exec", "mcp", "--sandbox"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        cwd=world.project,
        env=env,
        text=True,
    )
    assert server.stdin is not None
    try:
        script = "import os\n" + attempt("open(os.path.expanduser('~/.ssh/id_rsa')).read()")
        reply = mcp_call_execute_code(server, script)
        text = json.dumps(reply)
        assert "BLOCKED: FileNotFoundError" in text and SECRET not in text, text
    finally:
        server.stdin.close()
        try:
            server.wait(15)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def _argv(cwd: Path, staging_root: Path, writable: bool = True) -> list[str]:
    spec = sandboxes.SandboxSpec(kind="bwrap", cwd_writable=writable)
    return sandboxes.kernel_argv_prefix(
        spec,
        bwrap="bwrap",
        cwd=cwd,
        kernel_dir=staging_root / "runtime" / "k",
        staging_root=staging_root,
        pypath=staging_root / "pypath",
    )


def _mounts(argv: list[str]) -> list[tuple[str, str]]:
    """(option, target) of each mount in a bwrap argv, in order."""
    found = []
    for i, word in enumerate(argv):
        if word in ("--bind", "--ro-bind"):
            found.append((word, argv[i + 2]))
        elif word in ("--tmpfs", "--dev", "--proc"):
            found.append((word, argv[i + 1]))
    return found


def test_a_writable_root_cwd_is_refused() -> None:
    with pytest.raises(Exception, match="working directory is /"):
        _argv(Path("/"), Path("/tmp/lemon-exec-x"))
    mounts = _mounts(_argv(Path("/"), Path("/tmp/lemon-exec-x"), writable=False))
    assert ("--bind", "/") not in mounts and mounts[0] == ("--ro-bind", "/")


def test_a_cwd_above_tmpdir_never_uncovers_it(monkeypatch: pytest.MonkeyPatch) -> None:
    # A cwd outside /tmp that contains $TMPDIR: bound first, so that the masks cover it.
    cwd = Path(tempfile.mkdtemp(prefix="lsb-", dir="/var/tmp"))
    try:
        base = cwd / "base"
        (base / "lemon-exec-mine").mkdir(parents=True)
        monkeypatch.setenv("TMPDIR", str(base))
        mounts = _mounts(_argv(cwd, base / "lemon-exec-mine"))
        cwd_at = mounts.index(("--bind", str(cwd)))
        for later in (("--dev", "/dev"), ("--proc", "/proc"), ("--tmpfs", str(base))):
            assert mounts.index(later) > cwd_at, (later, mounts)
        assert mounts.index(("--tmpfs", str(base / "lemon-exec-mine"))) > cwd_at
    finally:
        shutil.rmtree(cwd, ignore_errors=True)


def test_a_cwd_that_is_tmpdir_sees_no_other_hosts_root(
    world: World, short_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TMPDIR", str(short_tmp))
    other = ExecuteCode(make_config(kernel_mode="session", warm_kernels=0, sandbox="none"))
    tool = ExecuteCode(make_config(kernel_mode="session", warm_kernels=0))
    try:
        other.run_sync("x = 1", scope=SessionScope("lsb-peer"))
        files = [str(k.connection_file) for k in other.diagnostics.kernels]
        assert files and Path(files[0]).exists()
        scope = SessionScope("lsb-tmpdir", cwd=str(short_tmp))
        out = tool.run_sync(attempt(f"open({files[0]!r}).read()"), scope=scope).content
        assert "BLOCKED" in out and '"key"' not in out, out
    finally:
        tool.close()
        other.close()


def test_the_longest_allowed_tmpdir_still_fits_the_sandboxed_sockets(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    from lemon_exec.host.disk.staging_base import MAX_SOCKET_BASE_BYTES

    parent = Path(tempfile.mkdtemp(prefix="lsb-", dir="/tmp"))
    try:
        longest = parent / ("d" * (MAX_SOCKET_BASE_BYTES - len(str(parent)) - 1))
        longest.mkdir()
        assert len(str(longest)) == MAX_SOCKET_BASE_BYTES
        monkeypatch.setenv("TMPDIR", str(longest))
        tool = ExecuteCode(make_config(warm_kernels=0))
        try:
            result = tool.run_sync("print(6 * 7)")
        finally:
            tool.close()
        assert "42" in result.content, result.content
    finally:
        shutil.rmtree(parent, ignore_errors=True)


@BOTH
def test_a_per_call_run_sees_its_own_working_directory(world: World) -> None:
    """A sandbox's view is fixed when its kernel starts, so spares are kept per directory: a
    per-call run whose scope names another directory reads and writes there, not in the
    host's directory that the first spares were started for."""
    other = world.root / "other-project"
    other.mkdir(exist_ok=True)
    (other / "input.txt").write_text("from the other project\n")
    scope = SessionScope("lsb-cwd", cwd=str(other))
    script = (
        "import os\n"
        "print(open('input.txt').read().strip(), os.getcwd())\n"
        "open('out.txt', 'w').write('written')\n"
    )
    for _ in range(2):  # cold for that directory, then (usually) its own spare
        result = world.tool.run_sync(script, scope=scope)
        assert result.details.get("exit_code") == 0, result.content
        assert f"from the other project {other}" in result.content
    assert (other / "out.txt").read_text() == "written"
    # The host's own directory still works, and its spares were kept.
    assert "project notes" in world.run("print(open('notes.txt').read())")


def test_an_interpreter_and_package_under_tmp_are_bound_back(tmp_path: Path) -> None:
    """A checkout and venv under /tmp (where CI may clone) stay visible, read-only, after the
    private /tmp is mounted; nothing else under /tmp comes back."""
    venv = Path(tempfile.mkdtemp(prefix="lsb-venv-", dir="/tmp"))
    try:
        (venv / "bin").mkdir()
        (venv / "bin" / "python").symlink_to(sys.executable)
        (venv / "pyvenv.cfg").write_text(f"home = {Path(sys.executable).parent}\n")
        runtime = sandboxes.runtime_paths(str(venv / "bin" / "python"))
        assert venv in runtime
        spec = sandboxes.SandboxSpec(kind="bwrap")
        staging_root = Path("/tmp/lemon-exec-x")
        mounts = _mounts(
            sandboxes.kernel_argv_prefix(
                spec,
                bwrap="bwrap",
                cwd=tmp_path,
                kernel_dir=staging_root / "runtime" / "k",
                staging_root=staging_root,
                pypath=staging_root / "pypath",
                runtime=runtime,
            )
        )
        masked = mounts.index(("--tmpfs", "/tmp"))
        assert mounts.index(("--ro-bind", str(venv))) > masked, mounts
        # Only what a mask would hide is bound again: a package outside /tmp is not.
        package = Path(lemon_exec.__file__).resolve().parent
        bound_again = ("--ro-bind", str(package)) in mounts
        assert bound_again == package.is_relative_to("/tmp"), mounts
    finally:
        shutil.rmtree(venv, ignore_errors=True)


# -- the fork server inside the sandbox --------------------------------------------------------


@pytest.fixture
def local_backends(monkeypatch: pytest.MonkeyPatch) -> list[LocalBackend]:
    """Every local kernel backend made while the test runs (to probe its template sandbox)."""
    made: list[LocalBackend] = []
    make_backend = LocalBackend.__init__

    def recorded(self: LocalBackend, *args: Any, **kwargs: Any) -> None:
        make_backend(self, *args, **kwargs)
        made.append(self)

    monkeypatch.setattr(LocalBackend, "__init__", recorded)
    return made


def _template_of(tool: ExecuteCode) -> tuple[int, list[Any]]:
    """The PID of the tool's sandboxed template (bwrap's child) and its live kernels."""
    servers = [t for t in tool.diagnostics.templates if t.ready]
    assert len(servers) == 1, "no ready fork server"
    server = servers[0]
    assert server.sandboxed == (SANDBOX == "bwrap")
    assert server.pid is not None
    below = supervise.children(server.pid)  # bwrap's one child is the template
    template = below[0] if SANDBOX == "bwrap" else server.pid
    return template, list(tool.diagnostics.kernels)


def _parent(pid: int) -> int:
    return int(Path("/proc", str(pid), "stat").read_text().rsplit(")", 1)[1].split()[1])


def test_sandboxed_kernels_and_spares_are_forked_from_the_template(world: World) -> None:
    """Per-call kernels and the warm spare (world.tool keeps one) are the template's
    children, and each is confined: its /proc shows only its own namespace."""
    out = world.run(
        "import os\nprint('PROCS:', sorted(p for p in os.listdir('/proc') if p.isdigit()))"
    )
    assert "PROCS: ['1', '2'" in out or SANDBOX == "none", out
    deadline = time.monotonic() + 30
    parents: dict[int, int] = {}
    while not parents and time.monotonic() < deadline:  # the spare replacing the one used
        template, kernels = _template_of(world.tool)
        for kernel in kernels:  # the used kernel may be going away meanwhile: left out
            with contextlib.suppress(OSError, TypeError):
                parents[kernel.pid] = _parent(kernel.pid)
        time.sleep(0.1)
    assert parents, "no warm spare"
    assert set(parents.values()) == {template}, (parents, template)


def test_two_kernels_forked_from_one_template_cannot_reach_each_other(world: World) -> None:
    tool = ExecuteCode(make_config(kernel_mode="session", warm_kernels=0))
    a, b = SessionScope("lsb-fork-a"), SessionScope("lsb-fork-b")
    own = (
        "import os\nfrom ipykernel.connect import get_connection_file\n"
        "print('CONN:', get_connection_file())\n"
        "open('/tmp/lsb-' + SESSION, 'w').close()\n"
    )
    try:
        wait_forked(tool, a)
        assert "KERNEL: FORKED" in tool.run_sync(FORKED_PROBE, scope=b).content
        conn = {}
        for scope in (a, b):
            mine = own.replace("SESSION", repr(scope.session_id))
            out = tool.run_sync(mine, scope=scope).content
            conn[scope.session_id] = out.split("CONN:", 1)[1].split()[0]
        template, kernels = _template_of(tool)
        by_file = {str(k.connection_file): k for k in kernels}
        assert set(conn.values()) <= set(by_file), (conn, list(by_file))
        for path in conn.values():  # both from the one template
            assert _parent(by_file[path].pid) == template
        other = by_file[conn[b.session_id]]
        other_pids = [other.pid, *supervise.descendants(other.pid)]
        work = tool.diagnostics.work_dir
        assert work is not None
        script = (
            "import os\n"
            + attempt(f"open({conn[b.session_id]!r}).read()")
            + attempt(f"os.listdir({os.path.dirname(conn[b.session_id])!r})")
            + attempt(f"os.listdir({str(work)!r})")
            + attempt("os.listdir('/tmp')")
            + "".join(attempt(f"os.kill({pid}, 0)") for pid in other_pids)
            + "".join(attempt(f"os.listdir('/proc/{pid}/root')") for pid in other_pids)
        )
        out = tool.run_sync(script, scope=a).content
        assert '"key"' not in out and "BLOCKED: FileNotFoundError" in out, out
        lines = [line for line in out.splitlines() if line.startswith(("OK:", "BLOCKED:"))]
        # Its own /tmp holds its own file, not the other kernel's.
        listings = [line for line in lines if line.startswith("OK:")]
        assert len(listings) == 1 and "lsb-lsb-fork-a" in listings[0], out
        assert "lsb-lsb-fork-b" not in out, out
        assert out.count("BLOCKED: ProcessLookupError") == len(other_pids), out
        # Its connection file, its directory, the workspaces, the other's /proc entries.
        assert out.count("BLOCKED: FileNotFoundError") == 3 + len(other_pids), out
    finally:
        tool.close()


def test_kernels_die_with_their_template(world: World) -> None:
    tool = ExecuteCode(make_config(kernel_mode="session", warm_kernels=0))
    scope = SessionScope("lsb-template-dies")
    try:
        wait_forked(tool, scope)
        template, kernels = _template_of(tool)
        kernels = [k for k in kernels if _parent(k.pid) == template]  # not the warm-up's
        tree = [p for k in kernels for p in (k.pid, *supervise.descendants(k.pid))]
        assert len(tree) >= 3 if SANDBOX == "bwrap" else tree  # outer, init, kernel
        os.kill(template, signal.SIGKILL)
        wait_until(lambda: not [p for p in tree if _running(p)], GONE_WITHIN_S)
        assert not [p for p in tree if _running(p)]
        # The session hears its kernel was killed; then it runs in a new kernel.
        result = tool.run_sync("print(6 * 7)", scope=scope)
        if "42" not in result.content:
            assert result.details.get("exit_code") == -9, result.content
            result = tool.run_sync("print(6 * 7)", scope=scope)
        assert "42" in result.content, result.content
    finally:
        tool.close()


def test_a_sandboxed_template_forks_only_self_confining_kernels(
    world: World, local_backends: list[LocalBackend]
) -> None:
    """A plain fork request (no sandbox of its own) is refused by a sandboxed template: the
    host then starts that kernel cold under bwrap, never in the template's open view. And a
    template whose children cannot confine themselves never says it is ready."""
    import asyncio

    from lemon_exec.template.client import ForkServer

    if SANDBOX == "none":
        pytest.fail("needs the sandbox")

    async def plain_request(sandbox: Any) -> str:
        server = ForkServer(
            "lsb-probe", sys.executable, dict(os.environ), os.getcwd(), sandbox=sandbox
        )
        try:
            await server.start()
            assert await server.wait_ready()
            try:
                await server.fork(["-f", "/nonexistent.json"], dict(os.environ), "/", None)
            except OSError as exc:
                return str(exc)
            return "forked"
        finally:
            await server.aclose()

    async def template_ready(sandbox: Any) -> bool:
        server = ForkServer(
            "lsb-broken", sys.executable, dict(os.environ), os.getcwd(), sandbox=sandbox
        )
        try:
            await server.start()
            return await server.wait_ready()
        finally:
            await server.aclose()

    tool = ExecuteCode(make_config(warm_kernels=0))
    try:
        wait_forked(tool)
        [backend] = local_backends
        sandbox = backend._template_sandbox(sys.executable)
        assert sandbox is not None
        refused = asyncio.run(plain_request(sandbox))
        # A template whose children cannot confine themselves (here: the probe kernel's
        # working directory is gone) never becomes ready: kernels then start cold.
        launcher, probe, split = sandbox
        at = probe.index("--chdir") + 1
        broken = [*probe[:at], "/nonexistent-lsb", *probe[at + 1 :]]
        ready = asyncio.run(template_ready((launcher, broken, split)))
    finally:
        tool.close()
    assert "forks only kernels with a sandbox" in refused, refused
    assert ready is False


def test_isolation_options_are_never_weaker_than_bwraps() -> None:
    from lemon_exec.template import isolate

    staging = Path("/tmp/lemon-exec-x")
    argv = [*_argv(Path("/var/tmp"), staging), sys.executable, "-m", "lemon_exec.kernel"]
    split = sandboxes.split_kernel_argv(argv)
    assert split is not None and split[1] == [sys.executable, "-m", "lemon_exec.kernel"]
    plan = isolate.parse(split[0])
    assert not plan.network and plan.chdir == "/var/tmp"
    assert ("proc", "", "/proc") in plan.mounts and ("tmpfs", "", str(staging)) in plan.mounts
    for required in ("--unshare-pid", "--unshare-ipc", "--die-with-parent"):
        weaker = [o for o in split[0] if o != required]
        with pytest.raises(isolate.IsolationError):
            isolate.parse(weaker)
    with pytest.raises(isolate.IsolationError):
        isolate.parse([*split[0], "--share-net"])
    assert sandboxes.split_kernel_argv([sys.executable, "-m", "lemon_exec.kernel"]) is None


@pytest.mark.slow
def test_limits_hold_for_kernels_forked_into_the_sandbox(world: World) -> None:
    """The host places a forked kernel's whole tree (outer process, init, kernel) under its
    limits by the PID it knows: a fork bomb is contained, an allocation over the memory
    limit kills the script, and the host carries on."""
    tool = ExecuteCode(make_config(warm_kernels=1, kernel_memory_mb=256, kernel_max_processes=40))
    try:
        wait_forked(tool)
        script = (
            FORKED_PROBE
            + "print(open('/proc/self/cgroup').read())\n"
            + "import os\nkids = []\ntry:\n    for _ in range(200):\n        pid = os.fork()\n"
            "        if pid == 0:\n            __import__('time').sleep(30)\n"
            "            os._exit(0)\n        kids.append(pid)\n"
            "except OSError as exc:\n"
            "    print('FORK STOPPED after', len(kids), type(exc).__name__)\n"
            "for pid in kids:\n    os.kill(pid, 9)\n"
        )
        # A spare started cold before the template was ready may still be in the pool.
        for _ in range(3):
            result = tool.run_sync(script)
            if "KERNEL: FORKED" in result.content:
                break
        assert "KERNEL: FORKED" in result.content, result.content
        assert "FORK STOPPED after" in result.content, result.content
        assert f"lemon-{os.getpid()}/k-" in result.content, result.content
        killed = tool.run_sync(FORKED_PROBE + "data = b'x' * 2**31\nprint('allocated')")
        assert killed.content.startswith("Script killed: memory limit (256 MB) exceeded."), (
            killed.content
        )
        assert "42" in tool.run_sync("print(6 * 7)").content
    finally:
        tool.close()


@BOTH
def test_a_sandboxed_kernels_exit_status_is_its_own(world: World) -> None:
    """Through bwrap (cold) or the outer process and init (forked), a kernel's exit code and
    the signal that killed it reach the host as they are."""
    for script, expected in (("os._exit(3)", 3), ("os.kill(os.getpid(), 15)", -15)):
        result = world.tool.run_sync(f"import os\n{script}\n")
        assert result.details.get("exit_code") == expected, (script, result.details)


def test_a_bind_source_swapped_for_a_symlink_is_refused(
    world: World, local_backends: list[LocalBackend]
) -> None:
    """The host hands a forked kernel resolved paths; a script that can write where one lies
    (its working directory) could swap it for a symlink before the next kernel binds it. The
    kernel then refuses to start rather than bind what the link names into its view."""
    import asyncio

    from lemon_exec.template.client import ForkServer

    if SANDBOX == "none":
        pytest.fail("needs the sandbox")
    link = Path(tempfile.mkdtemp(prefix="lsb-link-", dir="/tmp")) / "venv"
    # Relative: it resolves inside the template's view (an absolute one would not resolve
    # at all there), to a hidden directory, were it followed.
    link.symlink_to(os.path.relpath(world.private, link.parent))

    async def start_with_link(sandbox: Any) -> tuple[int | None, str]:
        server = ForkServer(
            "lsb-link", sys.executable, dict(os.environ), os.getcwd(), sandbox=sandbox
        )
        read_end, write_end = os.pipe()
        try:
            await server.start()
            assert await server.wait_ready()
            probe = sandbox[1]
            at = probe.index("--chdir")
            options = [*probe[:at], "--ro-bind", str(link), str(link), *probe[at:]]
            argv = ["-f", "/nonexistent.json"]
            pid = await server.fork(argv, dict(os.environ), "/", write_end, options)
            os.close(write_end)
            write_end = -1
            deadline = time.monotonic() + 10
            while server.exit_status(pid) is None and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            return server.exit_status(pid), os.read(read_end, 65536).decode()
        finally:
            if write_end >= 0:
                os.close(write_end)
            os.close(read_end)
            await server.aclose()

    tool = ExecuteCode(make_config(warm_kernels=0))
    try:
        wait_forked(tool)
        [backend] = local_backends
        sandbox = backend._template_sandbox(sys.executable)
        assert sandbox is not None
        status, stderr = asyncio.run(start_with_link(sandbox))
    finally:
        tool.close()
        shutil.rmtree(link.parent, ignore_errors=True)
    assert status == 70 and "is not a resolved path" in stderr, (status, stderr)
