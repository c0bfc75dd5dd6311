"""Kernel-side faults: no TCP listener in a kernel, and exit()/quit() end a script only.

Issue 10, items 1 and 4, with real kernels started by the ``ExecuteCode`` facade:

- a kernel, cold-started or forked by the fork server, holds no TCP socket at all (ipykernel's
  IOPub "pipe" for forked children used to listen on ``tcp://127.0.0.1:<random>``, where any
  local user could write into a running script's output), and output of child processes
  (``os.system``, ``subprocess``, a ``multiprocessing`` fork child) still reaches the result;
- ``exit(n)``, ``quit(n)`` and ``sys.exit(n)`` end the script with ``Script exited with code
  n`` (``exit()`` and ``quit()``: the ordinary success result), and nothing after them runs;
- a session kernel survives ``quit()`` in a script, and ``exit``/``quit()`` typed in a
  console attached to it (jupyter_client, as jupyter console sends it, and jupyter console
  itself), keeping its state for the agent's next call.
"""

from __future__ import annotations

import inspect
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support import index_row, pid_gone

from lemon_exec import ExecuteCode, ExecuteCodeConfig, ExecuteCodeResult, SessionScope

pytestmark = [pytest.mark.timeout(120), pytest.mark.kernel]


def tcp_sockets(pid: int | str = "self") -> list[str]:
    """The TCP sockets (any state, IPv4 or IPv6) that process ``pid`` holds open.

    A socket's inode appears both as a ``socket:[inode]`` link in ``/proc/PID/fd`` and in
    the ``inode`` column of ``/proc/PID/net/tcp{,6}``; matching the two finds the process's
    own TCP sockets among everything in its network namespace.
    """
    import os
    from pathlib import Path

    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:  # closed meanwhile
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    found = []
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[9] in inodes:  # local address, state (0A = LISTEN)
                found.append(f"{table} {fields[1]} state={fields[3]}")
    return found


#: A script that reports its own TCP sockets and whether a fork-server template forked it.
PROBE = (
    inspect.getsource(tcp_sockets)
    + """
import os
parent = open(f"/proc/{os.getppid()}/cmdline", "rb").read()
print("FORKED" if b"lemon_exec.template.server" in parent else "COLD")
print("TCP", tcp_sockets())
"""
)

#: Output of child processes, in the order a terminal shows it.
CHILDREN = """
import multiprocessing, os, subprocess, sys
print("py-1", flush=True)
os.system("echo from-system")
subprocess.run(["echo", "from-subprocess"], check=True)
subprocess.run([sys.executable, "-c", "import sys; print('child-stderr', file=sys.stderr)"])
child = multiprocessing.get_context("fork").Process(target=print, args=("fork-child",))
child.start()
child.join()
print("py-2")
"""
CHILDREN_OUT = "py-1\nfrom-system\nfrom-subprocess\nchild-stderr\nfork-child\npy-2\n"


def make_facade(**settings: Any) -> ExecuteCode:
    values: dict[str, Any] = {
        "enabled": True,
        "warm_kernels": 0,
        "python_path": sys.executable,
        "timeout_ms": 30_000,
        **settings,
    }
    return ExecuteCode(ExecuteCodeConfig(**values))


@pytest.fixture(scope="module")
def per_call() -> Iterator[ExecuteCode]:
    facade = make_facade(kernel_mode="per_call")
    yield facade
    facade.close()


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ExecuteCode, Any]]:
    facade = make_facade(kernel_mode="session")
    cwd = tmp_path_factory.mktemp("faults")
    yield facade, lambda name: SessionScope(name, "agent", str(cwd))
    facade.close()


# -- item 1: no TCP socket in a kernel ----------------------------------------------------------


def _probe_until(facade: ExecuteCode, start: str, attempts: int = 40) -> ExecuteCodeResult:
    """Run PROBE until a kernel started the ``start`` way (FORKED or COLD) ran it."""
    for _ in range(attempts):
        result = facade.run_sync(PROBE)
        assert result.details["exit_code"] == 0, result.content
        if result.content.startswith(start):
            return result
        time.sleep(0.2)  # the fork server is still importing the kernel's modules
    raise AssertionError(f"no {start} kernel after {attempts} calls: {result.content!r}")


@pytest.mark.parametrize("start", ["FORKED", "COLD"])
def test_per_call_kernel_holds_no_tcp_socket(per_call: ExecuteCode, start: str) -> None:
    facade = per_call if start == "FORKED" else make_facade(fork_server=False)
    try:
        result = _probe_until(facade, start)
    finally:
        if facade is not per_call:
            facade.close()
    assert result.content == f"{start}\nTCP []\n"


def test_session_kernel_holds_no_tcp_socket(session: tuple[ExecuteCode, Any]) -> None:
    facade, scope = session
    result = facade.run_sync("import os\nprint(os.getpid())", scope=scope("tcp"))
    pid = int(result.content)
    assert tcp_sockets(pid) == []
    # Also after the kernel has run child processes (ipykernel set its pipe up lazily once).
    after = facade.run_sync(CHILDREN, scope=scope("tcp"))
    assert after.content == CHILDREN_OUT
    assert tcp_sockets(pid) == []


def test_two_facades_fork_from_their_own_templates(
    per_call: ExecuteCode, session: tuple[ExecuteCode, Any]
) -> None:
    # Fork servers sit in a process-wide registry; two engines once shared the id "PID-1",
    # so one facade's kernels were forked by the other's template (its environment, its
    # event loop: "Queue ... is bound to a different event loop").
    facade, scope = session
    script = PROBE + "print('TEMPLATE', os.getppid())\n"
    templates = set()
    for run in (per_call.run_sync, lambda code: facade.run_sync(code, scope=scope("tpl"))):
        for _ in range(40):
            result = run(script)
            assert result.details["exit_code"] == 0, result.content
            if result.content.startswith("FORKED"):
                templates.add(result.content.split("TEMPLATE ")[1].strip())
                break
            time.sleep(0.2)
        else:
            raise AssertionError(f"no forked kernel: {result.content!r}")
    assert len(templates) == 2, templates


def test_child_process_output_reaches_the_result(per_call: ExecuteCode) -> None:
    result = per_call.run_sync(CHILDREN)
    assert result.details["exit_code"] == 0
    assert result.content == CHILDREN_OUT


def test_fork_child_writes_are_not_duplicated_or_lost(per_call: ExecuteCode) -> None:
    # The parent's unsent buffer is copied into the child; only the parent may send it.
    script = (
        "import multiprocessing, sys\n"
        "sys.stdout.write('parent-before ')\n"
        "def work(i):\n    print('child', i)\n"
        "ctx = multiprocessing.get_context('fork')\n"
        "procs = [ctx.Process(target=work, args=(i,)) for i in range(3)]\n"
        "for p in procs:\n    p.start()\n    p.join()\n"
        "print('parent-after')\n"
    )
    result = per_call.run_sync(script)
    assert result.details["exit_code"] == 0, result.content
    lines = result.content.replace("parent-before ", "parent-before\n").splitlines()
    assert sorted(lines) == sorted(
        ["parent-before", "child 0", "child 1", "child 2", "parent-after"]
    ), result.content
    assert lines[-1] == "parent-after"


# -- item 4: exit() and quit() end the script ---------------------------------------------------


EXITS = {
    "exit(3)": 3,
    "quit(4)": 4,
    "import sys\nsys.exit(5)": 5,
    "exit()": 0,
    "quit()": 0,
    "raise SystemExit": 0,
}


@pytest.mark.parametrize("call", list(EXITS))
def test_exit_ends_the_script_with_its_code(per_call: ExecuteCode, call: str) -> None:
    code = EXITS[call]
    result = per_call.run_sync(f"print('before')\n{call}\nprint('after')")
    assert result.details["exit_code"] == code, result.content
    if code:
        assert result.content == f"Script exited with code {code}\n\nbefore\n"
    else:
        assert result.content == "before\n"


def test_session_kernel_survives_quit_in_a_script(session: tuple[ExecuteCode, Any]) -> None:
    facade, scope = session
    first = facade.run_sync("x = 1\nquit()\nx = 2", scope=scope("quit"))
    # In session mode a SystemExit is a cell error (docs/modes.md), the state kept.
    assert first.content == "Script raised SystemExit", first.content
    assert first.details["exit_code"] == 1
    time.sleep(0.5)  # IPython's quit() stopped the kernel's event loop 0.1 s later
    second = facade.run_sync("text(str(x))", scope=scope("quit"))
    assert second.content == "Script result (text()):\n1"
    assert second.details["kernel_reused"] is True
    assert second.details["kernel_id"] == first.details["kernel_id"]
    exited = facade.run_sync("x = 3\nexit(7)", scope=scope("quit"))
    assert exited.details["exit_code"] == 7
    third = facade.run_sync("text(str(x))", scope=scope("quit"))
    assert third.content == "Script result (text()):\n3"
    assert third.details["kernel_reused"] is True


# -- exit typed in a console attached to a managed session kernel ------------------------------


def _connection_file(kernel_id: str) -> str:
    return str(index_row(kernel_id)["connection_file"])


def _agent_kernel(facade: ExecuteCode, scope: SessionScope) -> tuple[int, str]:
    result = facade.run_sync("import os\nstate = 'kept'\nprint(os.getpid())", scope=scope)
    assert result.details["exit_code"] == 0, result.content
    return int(result.content), _connection_file(result.details["kernel_id"])


def _assert_alive_with_state(facade: ExecuteCode, scope: SessionScope, pid: int) -> None:
    time.sleep(0.5)  # ipykernel stops the event loop 0.1 s after an exit it accepts
    assert not pid_gone(pid), "the session kernel died"
    after = facade.run_sync("import os\ntext(f'{state} {os.getpid()}')", scope=scope)
    assert after.content == f"Script result (text()):\nkept {pid}"
    assert after.details["kernel_reused"] is True


@pytest.mark.parametrize("typed", ["exit", "quit()"])
def test_console_exit_leaves_the_managed_kernel_running(
    session: tuple[ExecuteCode, Any], typed: str
) -> None:
    from jupyter_client import BlockingKernelClient

    facade, scope = session
    pid, connection_file = _agent_kernel(facade, scope("console-" + typed))
    kc = BlockingKernelClient()
    kc.load_connection_file(connection_file)
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=30)
        out: list[str] = []

        def hook(msg: dict[str, Any]) -> None:
            if msg["msg_type"] == "stream":
                out.append(msg["content"]["text"])

        reply = kc.execute_interactive(typed, output_hook=hook, timeout=30)["content"]
        assert reply["status"] == "ok", reply
        asks = [p for p in reply.get("payload", []) if p.get("source") == "ask_exit"]
        assert len(asks) == 1, reply
        # What jupyter console does next: detach if the kernel is kept, else shut it down.
        keep = asks[0].get("keepkernel")
        if not keep:
            shutdown = kc.shutdown(restart=False, reply=True, timeout=15)["content"]
            assert shutdown["status"] == "error", shutdown
    finally:
        kc.stop_channels()
    _assert_alive_with_state(facade, scope("console-" + typed), pid)
    # The console is told to detach only, and the person is told why.
    assert keep is True
    assert "keeps running" in "".join(out)


@pytest.mark.slow
def test_jupyter_console_exit_detaches(session: tuple[ExecuteCode, Any]) -> None:
    import jupyter_console  # noqa: F401  # a missing console must fail, not skip

    facade, scope = session
    pid, connection_file = _agent_kernel(facade, scope("real-console"))
    exe = shutil.which("jupyter")
    cmd = [exe] if exe else [sys.executable, "-m", "jupyter"]
    proc = subprocess.run(
        [*cmd, "console", "--existing", connection_file, "--simple-prompt"],
        input="print('console sees', state)\nexit\n",
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert "console sees kept" in proc.stdout, proc.stdout + proc.stderr
    _assert_alive_with_state(facade, scope("real-console"), pid)
    assert "keeps running" in proc.stdout, proc.stdout
    assert "keeping kernel alive" in proc.stdout, proc.stdout


def test_tcp_probe_sees_a_listener() -> None:
    # The probe itself must be able to fail: a listening socket of ours shows up.
    import socket

    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        assert any(s.endswith("state=0A") for s in tcp_sockets(os.getpid()))
    assert Path("/proc/self/net/tcp").exists()
