"""docs/security.md's main claims, checked on a real host while its kernels are alive.

A host runs in a subprocess with its own ``TMPDIR``: a session kernel, a per-call run that
waits for a go-file (so its kernel stays alive), a warm spare, fork-server templates and a
tool worker (the run calls ``grep``). While they live, the test reads ``/proc``:

- no process of the host's tree (host included) holds a TCP or UDP socket;
- every listening Unix socket of the tree lies in its host's 0700 runtime directory under
  the fixed runtime base ``/tmp/lemon-exec.<uid>/`` (0700, ours), named as its staging root;
- every directory of the staging root and of the runtime directory is 0700, every file
  0600, all ours; sockets only in the runtime directory, one symlink (``pypath/lemon_exec``);
- no connection-file key appears on a command line or in an environment, and environments
  are readable by the owner only;

then that a clean close leaves no process and at most ``owner`` + ``spill/``. The MCP test
checks that ``lemon-exec mcp --http`` listens on loopback only and answers 401 without the
token, which it does not show on its command line.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import secrets
import signal
import stat
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import wait_until

from lemon_exec.cli.mcp import TOKEN_ENV
from lemon_exec.host.disk.runtime_base import runtime_dir_of

pytestmark = [pytest.mark.timeout(120), pytest.mark.kernel]

_HOST = textwrap.dedent(
    """
    import asyncio, json, os, sys
    from pathlib import Path
    import lemon_exec
    from lemon_exec import ExecuteCode, ExecuteCodeConfig, SessionScope

    flags = Path(sys.argv[1])
    PER_CALL = '''
    import os, pathlib, time
    grep("Execute.ode", {package!r})  # regex syntax: never inline, a worker process
    print("x" * 100_000)  # more than max_output_bytes: a spill file
    pathlib.Path({flags!r}, "per_call").write_text(str(os.getpid()))
    while not os.path.exists(pathlib.Path({flags!r}, "go")):
        time.sleep(0.05)
    text("done")
    '''
    SESSION = '''
    import os, subprocess
    subprocess.Popen(["sleep", "300"], start_new_session=True)
    text(str(os.getpid()))
    '''

    async def main() -> None:
        per_call = ExecuteCode(ExecuteCodeConfig(enabled=True, timeout_ms=100_000))
        session = ExecuteCode(ExecuteCodeConfig(enabled=True, kernel_mode="session"))
        result = await session.run(SESSION, scope=SessionScope("security-doc", cwd=str(flags)))
        assert result.ok, result.content
        run = asyncio.create_task(per_call.run(
            PER_CALL.format(flags=str(flags), package=os.path.dirname(lemon_exec.__file__))
        ))
        while not (flags / "per_call").exists() and not run.done():
            await asyncio.sleep(0.05)
        (flags / "ready").write_text("")
        result = await run
        assert result.ok and "done" in result.content, result.content
        await per_call.aclose()
        await session.aclose()

    asyncio.run(main())
    """
)


def _tree(root: int) -> set[int]:
    """``root`` and every process descended from it, by parent links in ``/proc``."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                text = Path("/proc", entry, "stat").read_text()
            except OSError:
                continue
            parents[int(entry)] = int(text.rsplit(")", 1)[1].split()[1])
    tree = {root}
    grew = True
    while grew:
        grew = False
        for pid, ppid in parents.items():
            if ppid in tree and pid not in tree:
                tree.add(pid)
                grew = True
    return tree


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:  # closed meanwhile
            continue
        match = re.fullmatch(r"socket:\[(\d+)\]", target)
        if match:
            inodes.add(match.group(1))
    return inodes


def _inet_inodes(pid: int) -> dict[str, str]:
    """``inode -> "tcp 0100007F:1F90 st=0A"`` for every TCP/UDP socket in ``pid``'s namespace."""
    found = {}
    for kind in ("tcp", "tcp6", "udp", "udp6"):
        path = Path(f"/proc/{pid}/net/{kind}")
        for line in path.read_text().splitlines()[1:]:
            cols = line.split()
            found[cols[9]] = f"{kind} {cols[1]} st={cols[3]}"
    return found


def inet_sockets(pid: int) -> list[str]:
    """The TCP and UDP sockets (any state, IPv4 or IPv6) that process ``pid`` holds."""
    table = _inet_inodes(pid)
    return [table[inode] for inode in _socket_inodes(pid) if inode in table]


def listening_unix_paths(pid: int) -> list[str]:
    """Paths of the listening (``__SO_ACCEPTCON``) Unix sockets that ``pid`` holds."""
    mine = _socket_inodes(pid)
    paths = []
    for line in Path(f"/proc/{pid}/net/unix").read_text().splitlines()[1:]:
        cols = line.split()
        if len(cols) >= 8 and cols[6] in mine and int(cols[3], 16) & 0x10000:
            paths.append(cols[7])
    return paths


def test_the_socket_probes_see_what_they_look_for(tmp_path: Path) -> None:
    # The probes must be able to fail: a UDP socket and a listening Unix socket of ours show.
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
        udp.bind(("127.0.0.1", 0))
        assert any(s.startswith("udp ") for s in inet_sockets(os.getpid()))
    with socket.socket(socket.AF_UNIX) as unix:
        unix.bind(str(tmp_path / "s"))
        unix.listen()
        assert str(tmp_path / "s") in listening_unix_paths(os.getpid())


@pytest.fixture
def live_host(
    tmp_path: Path, short_tmp: Path
) -> Iterator[tuple[subprocess.Popen[bytes], Path, Path]]:
    """``(process, flags dir, TMPDIR)`` of a host whose per-call run waits for ``flags/go``."""
    flags = tmp_path / "flags"
    base = short_tmp
    flags.mkdir()
    script = tmp_path / "host.py"
    script.write_text(_HOST)
    proc = subprocess.Popen(
        [sys.executable, str(script), str(flags)],
        env={**os.environ, "TMPDIR": str(base)},
        stderr=subprocess.PIPE,
    )
    try:
        if not wait_until(lambda: (flags / "ready").exists() or proc.poll() is not None, 60):
            raise AssertionError("the host did not get its kernels ready within 60 s")
        assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
        yield proc, flags, base
    finally:
        (flags / "go").write_text("")
        try:
            proc.wait(30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(5)


@pytest.mark.slow
def test_a_live_host_is_as_the_security_page_says(
    live_host: tuple[subprocess.Popen[bytes], Path, Path],
) -> None:
    proc, flags, base = live_host
    tree = _tree(proc.pid)
    cmdlines = {pid: Path(f"/proc/{pid}/cmdline").read_bytes() for pid in tree}
    kernels = {p for p, c in cmdlines.items() if b"lemon_exec.kernel\0-f" in c}
    templates = {p for p, c in cmdlines.items() if b"lemon_exec.template.server" in c}
    workers = {p for p, c in cmdlines.items() if b"_workerproc" in c}
    # The session kernel and the per-call one (each direct, or forked: then its command
    # line is its template's), a tool worker, and the session script's setsid child.
    assert len(kernels | templates) >= 3, cmdlines
    assert workers, cmdlines
    assert int((flags / "per_call").read_text()) in tree

    # Sockets: no TCP/UDP anywhere in the tree; listening Unix sockets only in the runtime
    # directories, under the fixed per-user base (never under TMPDIR: every sandbox masks it).
    roots = sorted(base.glob("lemon-exec-*"))
    assert len(roots) == 2, roots  # one per facade (engine)
    runtime_base = Path(f"/tmp/lemon-exec.{os.getuid()}")
    st = os.lstat(runtime_base)
    assert stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid()
    assert stat.S_IMODE(st.st_mode) == 0o700
    runtimes = [runtime_dir_of(root) for root in roots]
    listening: list[str] = []
    for pid in tree:
        assert inet_sockets(pid) == [], (pid, cmdlines[pid])
        listening += listening_unix_paths(pid)
    assert listening, "no kernel socket found"
    for socket_path in listening:
        runtime = Path(socket_path).parent
        assert runtime in runtimes, socket_path
        assert stat.S_IMODE(os.lstat(runtime).st_mode) == 0o700, socket_path
    # Five per kernel (the Jupyter channels). The host link listens only until its kernel
    # has connected: then its path is gone and only the connected pair remains.
    assert len(listening) % 5 == 0 and len(listening) >= 10, listening
    assert not [p for p in listening if p.endswith("-host")], listening
    assert not [p for r in runtimes for p in r.glob("*-host")], "a host link path was left"

    # Files: 0700 directories, 0600 files, ours; sockets only in runtime/; one symlink.
    keys: list[bytes] = []
    for root in [*roots, *runtimes]:
        assert stat.S_IMODE(os.lstat(root).st_mode) == 0o700
        for dirpath, dirnames, filenames in os.walk(root):
            for name in dirnames + filenames:
                path = Path(dirpath, name)
                st = os.lstat(path)
                assert st.st_uid == os.getuid(), path
                mode = stat.S_IMODE(st.st_mode)
                if stat.S_ISDIR(st.st_mode):
                    assert mode == 0o700, f"{path}: {oct(mode)}"
                elif stat.S_ISREG(st.st_mode):
                    assert mode == 0o600, f"{path}: {oct(mode)}"
                elif stat.S_ISSOCK(st.st_mode):
                    assert root in runtimes, path
                else:
                    assert stat.S_ISLNK(st.st_mode), path
                    assert path.relative_to(root) == Path("pypath/lemon_exec"), path
        for connection in root.glob("kernel-*.json"):
            keys.append(json.loads(connection.read_text())["key"].encode())
    assert len(keys) >= 2, roots
    assert list(base.glob("lemon-exec-*/spill/lemon-exec-output-*")), "no spill file"

    # Secrets: no key on a command line or in an environment; environments owner-only.
    for pid in tree:
        environ = Path(f"/proc/{pid}/environ")
        assert stat.S_IMODE(environ.stat().st_mode) == 0o400, pid
        exposed = cmdlines[pid] + environ.read_bytes()
        assert not [k for k in keys if k in exposed], (pid, cmdlines[pid])

    # A clean close: no process left, at most the owner marker and spill files.
    (flags / "go").write_text("")
    assert proc.wait(30) == 0, proc.stderr.read().decode() if proc.stderr else ""
    others = tree - {proc.pid}
    assert wait_until(lambda: not any(_running(pid) for pid in others), 5), [
        cmdlines[pid] for pid in others if _running(pid)
    ]
    for root in base.glob("lemon-exec-*"):
        assert {p.name for p in root.iterdir()} <= {"owner", "spill"}, root
    assert not [r for r in runtimes if r.exists()], "a runtime directory outlived its host"


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.slow
def test_mcp_http_listens_on_loopback_behind_a_token(tmp_path: Path, short_tmp: Path) -> None:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = int(probe.getsockname()[1])
    token = secrets.token_urlsafe(24)
    exe = Path(sys.executable).with_name("lemon-exec")
    argv = [str(exe)] if exe.exists() else [sys.executable, "-m", "lemon_exec"]
    proc = subprocess.Popen(
        [*argv, "mcp", "--http", f"127.0.0.1:{port}"],
        cwd=tmp_path,
        env={**os.environ, TOKEN_ENV: token, "TMPDIR": str(short_tmp)},
        stderr=subprocess.DEVNULL,
    )
    try:
        assert wait_until(lambda: _listening(proc.pid, port) or proc.poll() is not None, 30)
        assert proc.poll() is None, proc.returncode
        # Only a loopback TCP listener, and no UDP socket.
        sockets = inet_sockets(proc.pid)
        assert sockets == [f"tcp 0100007F:{port:04X} st=0A"], sockets
        assert token.encode() not in Path(f"/proc/{proc.pid}/cmdline").read_bytes()
        assert stat.S_IMODE(os.stat(f"/proc/{proc.pid}/environ").st_mode) == 0o400

        assert _post(port, None) == 401
        assert _post(port, "Bearer " + "x" * len(token)) == 401
        assert _post(port, "Bearer " + token) == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(5)


def _listening(pid: int, port: int) -> bool:
    try:
        return any(f":{port:04X} st=0A" in s for s in inet_sockets(pid))
    except OSError:
        return False


def _post(port: int, authorization: str | None) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-03-26",
            "capabilities": {},
            "clientInfo": {"name": "security-doc", "version": "1"},
        },
    }
    headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
    if authorization is not None:
        headers["Authorization"] = authorization
    try:
        conn.request("POST", "/mcp", json.dumps(body), headers)
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()
