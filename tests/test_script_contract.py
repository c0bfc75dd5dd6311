"""What a script sees of its interpreter, in both modes, with real kernels (issue 26, 3/4/8).

- ``sys.argv`` is the script's (``[<script name>]``), never the kernel's ``-f <connection
  file>``; an argparse script with defaults runs; the kernel's own argv is back after the cell.
- every stdin read is the unsupported-input error (``input()``, ``sys.stdin`` text and binary,
  ``readline``, iteration, ``fileinput``); file descriptor 0 is ``/dev/null``, so
  ``os.read(0, n)`` and child processes see end of file instead of waiting.
- ``SystemExit`` in session mode is the spec's "cell error": ``Script raised SystemExit: n``,
  ``exit_code`` n (1 for 0, none or a message), state retained; per-call keeps python3's
  meaning (``sys.exit(0)`` is success).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from support import wait_until

from lemon_exec import ExecuteCode, ExecuteCodeResult, SessionScope

pytestmark = [pytest.mark.timeout(120), pytest.mark.kernel]

MODES = ("per_call", "session")


@pytest.fixture(scope="module")
def facade(per_call_facade: ExecuteCode) -> ExecuteCode:
    return per_call_facade


@pytest.fixture(scope="module")
def run(
    facade: ExecuteCode, tmp_path_factory: pytest.TempPathFactory
) -> Callable[..., ExecuteCodeResult]:
    cwd = tmp_path_factory.mktemp("contract")

    def run_in(mode: str, code: str, session: str = "contract") -> ExecuteCodeResult:
        facade.config.kernel_mode = mode
        scope = SessionScope(session, "agent", str(cwd)) if mode == "session" else None
        try:
            return facade.run_sync(code, scope=scope)
        finally:
            facade.config.kernel_mode = "per_call"

    return run_in


# -- 26.3: sys.argv ------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_argv_is_the_scripts(run: Callable[..., ExecuteCodeResult], mode: str) -> None:
    result = run(mode, "import sys\nprint(sys.argv)")
    assert result.details["exit_code"] == 0, result.content
    name = "script.py" if mode == "per_call" else result.content.strip()[2:-2]
    assert result.content == f"['{name}']\n", result.content
    assert name.endswith(".py") and "-f" not in result.content


@pytest.mark.parametrize("mode", MODES)
def test_argparse_with_defaults_runs(run: Callable[..., ExecuteCodeResult], mode: str) -> None:
    script = (
        "import argparse\n"
        "parser = argparse.ArgumentParser()\n"
        "parser.add_argument('--count', type=int, default=3)\n"
        "parser.add_argument('names', nargs='*', default=['x'])\n"
        "args = parser.parse_args()\n"
        "print(args.count, args.names)\n"
    )
    result = run(mode, script)
    assert result.details["exit_code"] == 0, result.content
    assert result.content == "3 ['x']\n"


def test_kernel_argv_is_restored_after_the_cell(run: Callable[..., ExecuteCodeResult]) -> None:
    # A thread the cell leaves behind reads sys.argv once the cell has ended: the kernel's.
    run(
        "session",
        "import sys, threading, time\nseen = []\n"
        "threading.Thread(target=lambda: (time.sleep(0.3), seen.append(list(sys.argv)))).start()",
        session="argv",
    )
    # No cell may run while the thread reads sys.argv (a cell has its own): no polling here.
    time.sleep(1.0)
    result = run("session", "print(seen[0][1:2], seen[0][2].endswith('.json'))", session="argv")
    assert result.content == "['-f'] True\n", result.content


# -- 26.4: stdin ----------------------------------------------------------------------------------

STDIN_READS = {
    "input": ("input('name? ')", "input() is not supported"),
    "read": ("import sys\nsys.stdin.read()", "reading sys.stdin is not supported"),
    "buffer.read": ("import sys\nsys.stdin.buffer.read()", "reading sys.stdin is not supported"),
    "readline": ("import sys\nsys.stdin.readline()", "reading sys.stdin is not supported"),
    "buffer.readline": (
        "import sys\nsys.stdin.buffer.readline()",
        "reading sys.stdin is not supported",
    ),
    "iterate": (
        "import sys\nfor line in sys.stdin:\n    pass",
        "reading sys.stdin is not supported",
    ),
    "fileinput": (
        "import fileinput\nwith fileinput.input() as lines:\n    list(lines)",
        "reading sys.stdin is not supported",
    ),
    "fileinput-binary": (
        "import fileinput\nwith fileinput.input(mode='rb') as lines:\n    list(lines)",
        "reading sys.stdin is not supported",
    ),
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("read", list(STDIN_READS))
def test_stdin_reads_are_the_unsupported_input_error(
    run: Callable[..., ExecuteCodeResult], mode: str, read: str
) -> None:
    script, what = STDIN_READS[read]
    started = time.monotonic()
    result = run(mode, "kept = 'before'\n" + script + "\nprint('after')", session="stdin")
    assert time.monotonic() - started < 20, "a stdin read must fail, not wait"
    headline = result.content.splitlines()[0]
    assert headline.startswith("Script raised UnsupportedInputError: " + what), result.content
    assert "Read the data from a file" in headline
    assert "after" not in result.content
    assert result.details["exit_code"] == 1
    if mode == "session":
        assert result.details["state_retained"] is True
        assert run(mode, "print(kept)", session="stdin").content == "before\n"


@pytest.mark.parametrize("mode", MODES)
def test_fd0_is_at_end_of_file(run: Callable[..., ExecuteCodeResult], mode: str) -> None:
    script = (
        "import os, subprocess, sys\n"
        "print(repr(os.read(0, 10)))\n"
        "done = subprocess.run(['cat'], capture_output=True, timeout=20)\n"
        "print(done.returncode, repr(done.stdout))\n"
        "print(os.readlink('/proc/self/fd/0'))\n"
    )
    result = run(mode, script)
    assert result.details["exit_code"] == 0, result.content
    assert result.content == "b''\n0 b''\n/dev/null\n"


# -- 26.8: SystemExit ------------------------------------------------------------------------------

SESSION_EXITS = {
    # call: (headline, exit_code)
    "import sys\nsys.exit(0)": ("Script raised SystemExit: 0", 1),
    "import sys\nsys.exit()": ("Script raised SystemExit", 1),
    "exit()": ("Script raised SystemExit", 1),
    "raise SystemExit(3)": ("Script raised SystemExit: 3", 3),
    "import sys\nsys.exit('bad input')": ("Script raised SystemExit: bad input", 1),
}


@pytest.mark.parametrize("call", list(SESSION_EXITS))
def test_session_system_exit_is_a_cell_error(
    run: Callable[..., ExecuteCodeResult], call: str
) -> None:
    head, code = SESSION_EXITS[call]
    result = run("session", f"mark = 1\nprint('before')\n{call}\nmark = 2", session="exit")
    assert result.content.splitlines()[0] == head, result.content
    assert "before" in result.content
    assert result.details["exit_code"] == code
    assert result.details["state_retained"] is True
    assert not result.ok
    after = run("session", "print(mark)", session="exit")
    assert after.details["kernel_reused"] is True
    assert after.content == "1\n"


PER_CALL_EXITS: dict[str, tuple[str, int]] = {
    "import sys\nsys.exit(0)": ("before\n", 0),
    "import sys\nsys.exit(3)": ("Script exited with code 3\n\nbefore\n", 3),
    "import sys\nsys.exit('bad input')": ("Script exited with code 1\n\nbefore\nbad input\n", 1),
}


@pytest.mark.parametrize("call", list(PER_CALL_EXITS))
def test_per_call_system_exit_is_the_process_exit(
    run: Callable[..., ExecuteCodeResult], call: str
) -> None:
    content, code = PER_CALL_EXITS[call]
    result = run("per_call", f"print('before')\n{call}\nprint('after')")
    assert result.content == content
    assert result.details["exit_code"] == code


# -- 25.4: a cell's result carries only that cell's output ----------------------------------------

#: What cell 1 leaves behind: something that writes ~20 lines over ~1 s, after cell 1 ended.
LEFTOVERS = {
    "thread": (
        "import threading, time\n"
        "def chatter():\n"
        "    time.sleep(0.2)\n"
        "    for i in range(20):\n"
        "        print('late thread', i, flush=True)\n"
        "        time.sleep(0.04)\n"
        "threading.Thread(target=chatter, daemon=True).start()\n"
    ),
    "thread-stderr": (
        "import sys, threading, time\n"
        "def chatter():\n"
        "    time.sleep(0.2)\n"
        "    for i in range(20):\n"
        "        sys.stderr.write(f'late stderr {i}\\n')\n"
        "        time.sleep(0.04)\n"
        "threading.Thread(target=chatter, daemon=True).start()\n"
    ),
    "pool": (
        "import concurrent.futures, time\n"
        "pool = concurrent.futures.ThreadPoolExecutor(1)\n"
        "def chatter():\n"
        "    time.sleep(0.2)\n"
        "    for i in range(20):\n"
        "        print('late pool', i, flush=True)\n"
        "        time.sleep(0.04)\n"
        "pool.submit(chatter)\n"
    ),
    "subprocess": (
        "import subprocess\n"
        "child = subprocess.Popen(['sh', '-c', 'sleep 0.2; for i in $(seq 20); do "
        "echo late child $i; echo late child err $i >&2; sleep 0.04; done'])\n"
    ),
    "fork": (
        "import os, sys, time\n"
        "if os.fork() == 0:\n"
        "    time.sleep(0.2)\n"
        "    for i in range(20):\n"
        "        print('late fork', i, flush=True)\n"
        "        time.sleep(0.04)\n"
        "    os._exit(0)\n"
    ),
}


@pytest.mark.parametrize("leftover", list(LEFTOVERS))
def test_late_output_stays_out_of_the_next_cell(
    run: Callable[..., ExecuteCodeResult], leftover: str
) -> None:
    session = f"late-{leftover}"
    first = run("session", LEFTOVERS[leftover] + "print('cell one')\n", session=session)
    assert first.content == "cell one\n", first.content
    assert "late_output_bytes" not in first.details
    # Cell 2 runs while the leftover writes (from 0.2 s after cell 1 to about 1 s).
    second = run(
        "session",
        "import time\nfor i in range(4):\n    print('cell two', i)\n    time.sleep(0.4)",
        session=session,
    )
    assert second.content == "".join(f"cell two {i}\n" for i in range(4)), second.content
    assert second.details["exit_code"] == 0
    assert second.details["late_output_bytes"] > 0, second.details
    # Nothing the leftover wrote reaches a later call either.
    time.sleep(0.5)
    third = run("session", "print('cell three')", session=session)
    assert third.content == "cell three\n", third.content


def test_cell_pipes_are_closed_once_their_writers_are_gone(
    run: Callable[..., ExecuteCodeResult],
) -> None:
    # Every cell gets a pipe of its own; an ended cell's pipe is closed once no leftover
    # child holds it, so a long session does not pile up descriptors.
    count = (
        "import os\n"
        "pipes = 0\n"
        "for fd in os.listdir('/proc/self/fd'):\n"
        "    try:\n"
        "        pipes += os.readlink(f'/proc/self/fd/{fd}').startswith('pipe:')\n"
        "    except OSError:\n"
        "        pass  # the directory listing's own descriptor\n"
        "print(pipes)"
    )
    run("session", "import subprocess\nsubprocess.run(['true'])", session="fds")
    before = int(run("session", count, session="fds").content)
    for _ in range(5):
        run("session", "import subprocess\nsubprocess.Popen(['sleep', '0.3'])", session="fds")
    for _ in range(5):
        run("session", "print('plain cell')", session="fds")
    counts: list[int] = []

    def back_to_before() -> bool:
        # Once the sleeps are over every retired pipe has reached end of file; Popen
        # objects hold no fds once collected.
        run("session", "import gc\ngc.collect()", session="fds")
        counts.append(int(run("session", count, session="fds").content))
        return counts[-1] == before

    assert wait_until(back_to_before, 30, interval=0.2), (before, counts)
