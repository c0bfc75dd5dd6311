"""Protocol faults end a call at once; huge messages and forked children fail cleanly.

Issue 11, item 6 and its neighbours, with real kernels started by the ``ExecuteCode`` facade:

- a kernel whose messages fail their signature check (its session key replaced), that
  puts garbage frames on IOPub, writes bytes out of framing to its host link or shuts that
  link down ends the call within a second as a protocol fault, its state discarded
  (per_call and session; a session's next call gets a fresh kernel);
- the kernel itself refuses to publish an IOPub message over the host's per-message limit:
  a short note takes its place and the rest of the cell's output arrives;
- a helper, text() or notify() called in a child made by ``os.fork()`` raises ToolError at
  once instead of waiting forever for a reply that cannot come.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
from support import pid_gone

from lemon_exec import ExecuteCode, ExecuteCodeConfig, ExecuteCodeResult, SessionScope
from lemon_exec.wire.limits import MAX_MESSAGE_BYTES

pytestmark = [pytest.mark.timeout(120), pytest.mark.kernel]

#: A long timeout: a fault must end the call long before it.
TIMEOUT_MS = 30_000
#: The bound the issue asks for (within a second), with slack for a loaded 2-core machine.
FAULT_WITHIN_S = 3.0

FAULTS = {
    # Every later message of the kernel is signed with a key the host does not know.
    "bad-signature": "get_ipython().kernel.session.key = b'x'\nprint('after')\n",
    # Frames that are no Jupyter message at all; the script would go on for 20 s.
    "garbage-frames": (
        "import time\n"
        "get_ipython().kernel.iopub_socket.send_multipart([b'garbage', b'frames'])\n"
        "time.sleep(20)\n"
    ),
    # Bytes that are not in the host link's framing, written to the link itself.
    "link-garbage": (
        "import time\n"
        "from lemon_exec.kernel.app import LemonKernelApp\n"
        "LemonKernelApp.instance().host_link._sock.sendall(b'\\xff' * 64)\n"
        "time.sleep(20)\n"
    ),
    # The host link shut down by the script while the kernel lives on: nothing more can
    # arrive. (A bare close() of the descriptor sends nothing while the kernel's reader
    # thread still waits on it: the call then ends at its timeout, like any script that
    # stops talking.)
    "link-closed": (
        "import socket, time\n"
        "from lemon_exec.kernel.app import LemonKernelApp\n"
        "LemonKernelApp.instance().host_link._sock.shutdown(socket.SHUT_RDWR)\n"
        "time.sleep(20)\n"
    ),
}
#: What the headline says is wrong, per fault.
WHY = {
    "bad-signature": "failed its signature check",
    "garbage-frames": "was malformed",
    "link-garbage": "the kernel's link to the host is out of step",
    "link-closed": "the kernel closed its link to the host",
}


@pytest.fixture(scope="module")
def facade() -> Iterator[ExecuteCode]:
    config = ExecuteCodeConfig(
        enabled=True, warm_kernels=0, python_path=sys.executable, timeout_ms=TIMEOUT_MS
    )
    with ExecuteCode(config) as ec:
        yield ec


def run(ec: ExecuteCode, code: str, scope: SessionScope | None = None) -> ExecuteCodeResult:
    ec.config.kernel_mode = "session" if scope is not None else "per_call"
    try:
        return ec.run_sync(code, timeout_ms=TIMEOUT_MS, scope=scope)
    finally:
        ec.config.kernel_mode = "per_call"


def wait_gone(pid: int, within: float = 10.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if pid_gone(pid):
            return True
        time.sleep(0.05)
    return False


def assert_fault(result: ExecuteCodeResult, took: float) -> None:
    assert took < FAULT_WITHIN_S, f"reported after {took:.2f} s (timeout {TIMEOUT_MS} ms)"
    assert result.content.startswith("Script ended: protocol fault"), result.content[:300]
    assert "the kernel was discarded" in result.content.splitlines()[0]
    assert result.details["protocol_fault"] is True
    assert result.details["exit_code"] is None
    assert not result.ok


# -- A: protocol faults ------------------------------------------------------------------------


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_per_call_protocol_fault_ends_the_call_at_once(facade: ExecuteCode, fault: str) -> None:
    started = time.monotonic()
    result = run(facade, FAULTS[fault])
    assert_fault(result, time.monotonic() - started)
    assert result.details["state_retained"] is False
    assert WHY[fault] in result.content.splitlines()[0], result.content


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_session_protocol_fault_discards_the_kernel(
    facade: ExecuteCode, tmp_path: Any, fault: str
) -> None:
    scope = SessionScope(f"fault-{fault}", "agent", cwd=str(tmp_path))
    first = run(facade, "import os\nkept = 1\nprint(os.getpid())", scope)
    assert first.details["exit_code"] == 0, first.content
    pid = int(first.content)

    started = time.monotonic()
    result = run(facade, FAULTS[fault], scope)
    assert_fault(result, time.monotonic() - started)
    assert result.details["state_retained"] is False
    assert wait_gone(pid), f"the faulted kernel {pid} is still running"

    after = run(facade, "import os\nprint(os.getpid(), 'kept' in globals())", scope)
    assert after.details["exit_code"] == 0, after.content
    assert after.details["kernel_reused"] is False
    assert after.details["kernel_lost_reason"] == "protocol_fault"
    assert after.content.startswith("[Session state was lost before this call")
    new_pid, kept = after.content.splitlines()[-1].split()
    assert int(new_pid) != pid and kept == "False"


# -- B: the kernel refuses to publish an over-limit message ------------------------------------

HUGE_MIB = MAX_MESSAGE_BYTES // 2**20 + 8

HUGE = {
    "display": (
        "from IPython.display import display\n"
        f"display({{'text/plain': 'x' * ({HUGE_MIB} * 2**20)}}, raw=True)\n",
        f"[display output of {HUGE_MIB}.0 MiB was not sent: over the "
        f"{MAX_MESSAGE_BYTES // 2**20} MiB per-message limit]",
    ),
    "comm": (
        "from comm import create_comm\n"
        "c = create_comm(target_name='nobody')\n"
        f"c.send({{'blob': 'x' * ({HUGE_MIB} * 2**20)}})\n",
        f"[comm message of {HUGE_MIB}.0 MiB was not sent: over the "
        f"{MAX_MESSAGE_BYTES // 2**20} MiB per-message limit]",
    ),
}


@pytest.mark.parametrize("kind", sorted(HUGE))
def test_kernel_refuses_an_over_limit_message(
    facade: ExecuteCode, tmp_path: Any, kind: str
) -> None:
    code, note = HUGE[kind]
    scope = SessionScope(f"huge-{kind}", "agent", cwd=str(tmp_path))
    script = "print('before')\n" + code + "print('after')\ntext('done')\nkept = 1\n"
    result = run(facade, script, scope)
    assert result.details["exit_code"] == 0, result.content[:500]
    assert result.details["state_retained"] is True
    assert "done" in result.content
    diagnostics = result.content.split("Diagnostics (stdout/stderr, not the result):\n")[1]
    assert diagnostics == f"before\n{note}\nafter\n", diagnostics
    # The host never had to refuse anything: no connection was dropped.
    assert "from the kernel was dropped" not in result.content
    # The kernel is healthy and kept its state.
    again = run(facade, "print(kept)", scope)
    assert again.details["kernel_reused"] is True
    assert again.content == "1\n"


def test_host_still_refuses_a_message_that_bypasses_the_kernel_cap(facade: ExecuteCode) -> None:
    # The host's own limit stays as a backstop: a script can write to the socket itself.
    script = (
        "import time\n"
        "from ipykernel.iostream import IOPubThread\n"
        "k = get_ipython().kernel\n"
        f"data = {{'data': {{'text/plain': 'x' * ({HUGE_MIB} * 2**20)}}, 'metadata': {{}}}}\n"
        "msg = k.session.msg('display_data', data, parent=k.get_parent('shell'))\n"
        "IOPubThread.send_multipart(k.iopub_thread, k.session.serialize(msg, ident=b'x'))\n"
        "time.sleep(0.5)\n"
        "print('after')\n"
    )
    result = run(facade, script)
    assert result.details["exit_code"] == 0, result.content[:500]
    assert f"[a {HUGE_MIB}.0 MiB message from the kernel was dropped" in result.content or (
        "[a message from the kernel was dropped" in result.content
    ), result.content[:500]
    assert "after" in result.content


# -- C: helpers in a forked child ------------------------------------------------------------

FORK_CHILD = """
import os
pid = os.fork()
if pid == 0:
    lines = []
    for name, call in (("read", lambda: read("x")), ("text", lambda: text("t")),
                       ("notify", lambda: notify("n"))):
        try:
            call()
            lines.append(f"{name}: no error")
        except ToolError as exc:
            lines.append(f"{name}: ToolError: {exc}")
        except BaseException as exc:
            lines.append(f"{name}: {exc!r}")
    lines.append(f"child {os.getpid()}")
    with open(CHILD_FILE, "w") as fh:
        fh.write("\\n".join(lines))
    os._exit(0)
os.waitpid(pid, 0)
text(open(CHILD_FILE).read())
"""


def test_helpers_in_a_forked_child_fail_fast(facade: ExecuteCode, tmp_path: Any) -> None:
    started = time.monotonic()
    result = run(facade, f"CHILD_FILE = {str(tmp_path / 'child.txt')!r}\n" + FORK_CHILD)
    took = time.monotonic() - started
    assert result.details["exit_code"] == 0, result.content
    assert took < 10, f"took {took:.1f} s"
    lines = result.content.split("Script result (text()):\n")[1].strip().splitlines()
    child = lines[-1].split()[1]
    expected = (
        "ToolError: helpers, text() and notify() work only in the kernel process, not in a "
        f"forked child (pid {child})"
    )
    assert lines[:3] == [f"{name}: {expected}" for name in ("read", "text", "notify")], lines


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["per_call", "session"])
def test_huge_script_is_not_echoed_into_its_result(
    facade: ExecuteCode, tmp_path: Any, mode: str
) -> None:
    # Issue 25 item 11: a script over the per-message limit runs; the kernel's echo of its
    # code (execute_input) is not output, so no note about it reaches the result.
    filler = "# " + "x" * 1022 + "\n"
    script = "print('ran')\n" + filler * (HUGE_MIB * 1024) + "text('done')\n"
    assert len(script) > MAX_MESSAGE_BYTES
    scope = SessionScope("huge-script", "agent", cwd=str(tmp_path)) if mode == "session" else None
    result = run(facade, script, scope)
    assert result.details["exit_code"] == 0, result.content[:500]
    assert result.content == (
        "Script result (text()):\ndone\n\nDiagnostics (stdout/stderr, not the result):\nran\n"
    ), result.content[:500]
