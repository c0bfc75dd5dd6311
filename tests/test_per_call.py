"""Per-call execute_code end to end: real kernels, real files, real signals.

Most tests share one module-scoped facade (``tool``) with a warm spare, so a call usually
claims a kernel that is already running. After every test the facade's workspace directory
must be empty and at most the warm spare may still be running.
"""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from support import enabled_config, wait_until

from lemon_exec import ExecuteCode, ExecuteCodeConfig, ExecuteCodeResult, SessionScope
from lemon_exec.details import Details
from lemon_exec.facade import (
    ALREADY_ABORTED,
    BAD_RESET,
    BAD_TIMEOUT,
    DISABLED,
    MISSING_SCRIPT,
)

pytestmark = [pytest.mark.timeout(60), pytest.mark.kernel]

TIMEOUT_MS = 10_000
WARM = 1
ALWAYS_DETAILS = (
    "mode",
    "exit_code",
    "truncated",
    "duration_ms",
    "persistent",
    "reset_performed",
    "state_retained",
)
# A first line that tells the test which kernel process ran the script.
PID_LINE = "import os\nprint(f'PID={os.getpid()}', flush=True)\n"


def spare_ready(facade: ExecuteCode, seconds: float = 30.0) -> None:
    """Wait for a ready spare, so a short timeout_ms is not spent on a kernel start."""
    if not facade.diagnostics.started:
        assert facade.run_sync("pass").ok  # starts the pool
    assert wait_until(lambda: facade.diagnostics.spares >= 1, seconds), "no spare got ready"


def make_config(**overrides: Any) -> ExecuteCodeConfig:
    """An enabled config for this module (see support.enabled_config)."""
    return enabled_config(**{"timeout_ms": TIMEOUT_MS, **overrides})


@pytest.fixture(scope="module")
def tool() -> Iterator[ExecuteCode]:
    facade = ExecuteCode(make_config(warm_kernels=WARM))
    try:
        yield facade
    finally:
        facade.close()


@pytest.fixture
def own_tool() -> Iterator[Callable[..., ExecuteCode]]:
    """``own_tool(config=None, **facade_kwargs)``: a facade for one test, closed after it."""
    made: list[ExecuteCode] = []

    def _make(config: ExecuteCodeConfig | None = None, **kwargs: Any) -> ExecuteCode:
        facade = ExecuteCode(config if config is not None else make_config(), **kwargs)
        made.append(facade)
        return facade

    yield _make
    for facade in made:
        facade.close()


@pytest.fixture(autouse=True)
def _nothing_left(request: pytest.FixtureRequest, session_kernels: Callable[..., set[int]]):
    """After each test: no workspace left, and no kernel beyond the shared warm spare."""
    yield
    if "tool" not in request.fixturenames:
        return
    facade: ExecuteCode = request.getfixturevalue("tool")
    diagnostics = facade.diagnostics
    work_dir = diagnostics.work_dir
    if work_dir is not None:  # removed in the background (the disk worker), soon after
        assert wait_until(lambda: not list(work_dir.iterdir()), 10), "a workspace was left"
    # Spares (more than WARM for a while after back-to-back runs) and spares still starting
    # are the pool's; any other kernel is a used one still running.

    def used() -> set[int]:
        return session_kernels(host=os.getpid()) - set(diagnostics.spare_pids)

    def starting() -> int:
        return diagnostics.spares_starting

    deadline = time.monotonic() + 4.0
    settled = False  # a start may end between the two looks: look again
    while not settled and time.monotonic() < deadline:
        settled = len(used()) <= starting()
        if not settled:
            time.sleep(0.05)
    assert settled, f"a used kernel is still running: {sorted(used())}"


def pid_of(result: ExecuteCodeResult) -> int:
    for line in result.content.splitlines():
        if line.startswith("PID="):
            return int(line[4:])
    raise AssertionError(f"no PID line in {result.content!r}")


def check_details(result: ExecuteCodeResult) -> Details:
    details = result.details
    missing = [key for key in ALWAYS_DETAILS if key not in details]
    assert not missing, f"details lack {missing}: {details}"
    assert details["mode"] == "per_call"
    assert details["persistent"] is False
    assert details["reset_performed"] is False
    assert details["state_retained"] is False
    assert isinstance(details["duration_ms"], int)
    assert details["duration_ms"] >= 0
    assert isinstance(details["truncated"], bool)
    assert result.trust == "trusted"
    return details


def mode_of(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


# --- success, output and the script as one unit --------------------------------------------------


def test_success_prints_output(tool: ExecuteCode) -> None:
    result = tool.run_sync("print('hello')\nprint('world')")
    assert result.content == "hello\nworld\n"
    assert result.ok
    details = check_details(result)
    assert details["exit_code"] == 0
    assert details["truncated"] is False
    assert "full_output_path" not in details


def test_no_output_says_so(tool: ExecuteCode) -> None:
    result = tool.run_sync("x = 1")
    assert result.content == "(script produced no output)"
    assert check_details(result)["exit_code"] == 0


@pytest.mark.parametrize("script", ["1+1", "x = 41\nx + 1", "'a string'"])
def test_last_expression_is_not_displayed(tool: ExecuteCode, script: str) -> None:
    result = tool.run_sync(script)
    assert result.content == "(script produced no output)"
    assert result.ok


def test_stdout_and_stderr_are_merged_in_order(tool: ExecuteCode) -> None:
    script = (
        "import sys\n"
        "for i in range(3):\n"
        "    print(f'out {i}')\n"
        "    print(f'err {i}', file=sys.stderr)\n"
        "sys.stdout.write('no newline|')\n"
        "sys.stderr.write('then stderr\\n')\n"
    )
    result = tool.run_sync(script)
    expected = "".join(f"out {i}\nerr {i}\n" for i in range(3)) + "no newline|then stderr\n"
    assert result.content == expected


def test_output_is_sanitized(tool: ExecuteCode) -> None:
    result = tool.run_sync(r"print('\x1b[31mred\x1b[0m\tcol\x07umn\r\nnext')")
    assert result.content == "red\tcolumn\nnext\n"


def test_cwd_is_the_callers_cwd(
    tool: ExecuteCode, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "data.txt").write_text("from the caller's directory\n")
    monkeypatch.chdir(tmp_path)
    result = tool.run_sync("import os\nprint(os.getcwd())\nprint(open('data.txt').read(), end='')")
    cwd, data = result.content.splitlines()
    assert os.path.realpath(cwd) == os.path.realpath(tmp_path)
    assert data == "from the caller's directory"


def test_scope_cwd_is_used_in_per_call_mode(tool: ExecuteCode, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    scope = SessionScope("session-1", cwd=elsewhere)
    result = tool.run_sync("import os\nprint(os.getcwd())", scope=scope)
    assert os.path.realpath(result.content.strip()) == os.path.realpath(elsewhere)
    assert check_details(result)["persistent"] is False


def test_reset_is_accepted_but_redundant(tool: ExecuteCode) -> None:
    result = tool.run_sync("print('ran')", reset=True)
    assert result.content == "ran\n"
    assert check_details(result)["reset_performed"] is False


def test_every_call_gets_a_fresh_kernel(tool: ExecuteCode, wait_gone: Callable[..., bool]) -> None:
    first = tool.run_sync(
        PID_LINE + "import sys\nsecret = 42\nsys.lemon_flag = 1\nos.environ['LEMON_T'] = '1'\n"
    )
    second = tool.run_sync(
        PID_LINE + "import sys\n"
        "print('secret' in globals(), hasattr(sys, 'lemon_flag'), 'LEMON_T' in os.environ)"
    )
    assert first.ok and second.ok
    assert pid_of(first) != pid_of(second)
    assert second.content.splitlines()[1] == "False False False"
    assert wait_gone(pid_of(first)), "the first call's kernel outlived its run"
    assert wait_gone(pid_of(second))


# --- files on disk -------------------------------------------------------------------------------


def test_workspace_connection_file_and_root_are_private(tool: ExecuteCode, tmp_path: Path) -> None:
    started = tmp_path / "started"
    release = tmp_path / "release"
    script = (
        "import os, time\n"
        "from ipykernel.connect import get_connection_file\n"
        f"open({str(started)!r}, 'w').write(get_connection_file())\n"
        f"deadline = time.monotonic() + 8\n"
        f"while not os.path.exists({str(release)!r}) and time.monotonic() < deadline:\n"
        "    time.sleep(0.01)\n"
        "print('released')\n"
    )
    results: list[ExecuteCodeResult] = []
    runner = threading.Thread(target=lambda: results.append(tool.run_sync(script)))
    runner.start()
    try:
        deadline = time.monotonic() + 8
        while not (started.exists() and started.read_text()) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert started.exists(), "the script did not start"
        staging = tool.diagnostics
        root, runtime_dir = staging.staging_root, staging.runtime_dir
        spill_dir, work_dir = staging.spill_dir, staging.work_dir
        assert root is not None and runtime_dir is not None
        assert spill_dir is not None and work_dir is not None
        for directory in (root, runtime_dir, spill_dir, work_dir):
            # jupyter_client adds the sticky bit to the connection file's directory.
            assert mode_of(directory) & 0o777 == 0o700, directory
        assert mode_of(root / "owner") == 0o600
        workspaces = list(work_dir.iterdir())
        assert len(workspaces) == 1, workspaces
        assert mode_of(workspaces[0]) == 0o700
        assert [p.name for p in workspaces[0].iterdir()] == ["script.py"]
        assert mode_of(workspaces[0] / "script.py") == 0o600
        assert (workspaces[0] / "script.py").read_text() == script
        connection_file = Path(started.read_text())
        assert connection_file.parent == runtime_dir
        assert mode_of(connection_file) == 0o600
        for path in runtime_dir.glob("kernel-*"):
            assert mode_of(path) == 0o600, path
    finally:
        release.touch()
        runner.join(15)
    assert results and results[0].content == "released\n"


def test_five_megabytes_of_output_are_truncated_and_spilled(tool: ExecuteCode) -> None:
    # 100,000 lines of 50 bytes: exactly 5,000,000 bytes of ASCII.
    script = "for i in range(100_000):\n    print(f'{i:07d} ' + 'x' * 41)\n"
    expected = "".join(f"{i:07d} " + "x" * 41 + "\n" for i in range(100_000))
    assert len(expected) == 5_000_000
    result = tool.run_sync(script)
    details = check_details(result)
    assert details["exit_code"] == 0
    assert details["truncated"] is True
    spill = Path(details["full_output_path"])
    cap = tool.config.max_output_bytes
    head, tail = cap * 2 // 5, cap - cap * 2 // 5
    omitted = len(expected) - head - tail
    assert result.content == (
        expected[:head]
        + f"\n... [{omitted} bytes truncated] ...\n"
        + expected[-tail:]
        + f"[Full output saved to: {spill}]"
    )
    assert spill.parent == tool.diagnostics.spill_dir
    assert spill.name.startswith("lemon-exec-output-")
    assert mode_of(spill) == 0o600
    assert spill.read_text() == expected


# --- failures ------------------------------------------------------------------------------------


def test_uncaught_exception(tool: ExecuteCode) -> None:
    result = tool.run_sync("print('before')\nraise RuntimeError('it broke')\n")
    assert result.content.startswith("Script raised RuntimeError: it broke\n\nbefore\n")
    assert 'File "script.py", line 2, in <module>' in result.content
    assert result.content.rstrip().endswith("RuntimeError: it broke")
    assert check_details(result)["exit_code"] == 1
    assert not result.ok


def test_traceback_has_exact_lines_and_only_script_frames(tool: ExecuteCode) -> None:
    script = "\n".join(
        [
            "def inner():",
            "    raise ValueError('deep')",
            "",
            "",
            "def outer():",
            "    inner()",
            "",
            "",
            "outer()",
            "",
        ]
    )
    result = tool.run_sync(script)
    expected = (
        "Traceback (most recent call last):\n"
        '  File "script.py", line 9, in <module>\n'
        "    outer()\n"
        '  File "script.py", line 6, in outer\n'
        "    inner()\n"
        '  File "script.py", line 2, in inner\n'
        "    raise ValueError('deep')\n"
        "ValueError: deep\n"
    )
    assert result.content == "Script raised ValueError: deep\n\n" + expected
    assert result.details["exit_code"] == 1


@pytest.mark.parametrize("end", ["", "\n"])
def test_traceback_carets_are_python_s_own(tool: ExecuteCode, tmp_path: Path, end: str) -> None:
    """The caret line under the failing expression is the one Python itself prints for the
    same file, also when the script's last line has no newline."""
    script = 'values = {"a": 1}\nprint(values["missing"])' + end
    path = tmp_path / "script.py"
    path.write_text(script)
    native = subprocess.run(
        [sys.executable, path.name], cwd=tmp_path, capture_output=True, text=True, check=False
    ).stderr.replace(str(path), path.name)
    result = tool.run_sync(script)
    assert native.startswith("Traceback (most recent call last):\n"), native
    expected = "Script raised KeyError: 'missing'\n\n" + native
    assert result.content.rstrip("\n") == expected.rstrip("\n"), result.content


def test_syntax_error_reports_its_line(tool: ExecuteCode) -> None:
    result = tool.run_sync("x = 1\ny = 2\nif x\n    print(y)\n")
    assert result.content.startswith("Script raised SyntaxError: ")
    assert 'File "script.py", line 3' in result.content
    assert "    if x\n" in result.content
    assert check_details(result)["exit_code"] == 1


@pytest.mark.parametrize(
    ("script", "what"),
    [
        ("name = input('name? ')\n", "input()"),
        ("import sys\ndata = sys.stdin.read()\n", "reading sys.stdin"),
        ("import getpass\npw = getpass.getpass()\n", "getpass()"),
    ],
)
def test_stdin_reads_are_refused_explicitly(tool: ExecuteCode, script: str, what: str) -> None:
    started = time.monotonic()
    result = tool.run_sync(script)
    assert time.monotonic() - started < 5, "a stdin read must fail, not wait"
    headline = result.content.splitlines()[0]
    assert headline.startswith("Script raised ")
    assert f"{what} is not supported" in headline
    assert "Read the data from a file" in headline  # tells the model what to do instead
    assert 'File "script.py", line ' in result.content
    assert check_details(result)["exit_code"] == 1


def test_system_exit_nonzero(tool: ExecuteCode) -> None:
    result = tool.run_sync("import sys\nprint('bye')\nsys.exit(3)\n")
    assert result.content == "Script exited with code 3\n\nbye\n"
    assert check_details(result)["exit_code"] == 3
    assert not result.ok


@pytest.mark.parametrize("script", ["raise SystemExit(0)", "import sys\nsys.exit()"])
def test_system_exit_zero_is_success(tool: ExecuteCode, script: str) -> None:
    result = tool.run_sync(script)
    assert result.content == "(script produced no output)"
    assert check_details(result)["exit_code"] == 0
    assert result.ok


def test_os_exit_is_reported_quickly(
    tool: ExecuteCode, tmp_path: Path, wait_gone: Callable[..., bool]
) -> None:
    pid_file = tmp_path / "pid"
    script = f"import os\nopen({str(pid_file)!r}, 'w').write(str(os.getpid()))\nos._exit(7)\n"
    started = time.monotonic()
    result = tool.run_sync(script)
    assert time.monotonic() - started < 5, "a dead kernel must be noticed, not waited on"
    assert result.content.startswith("Script exited with code 7\n")
    details = check_details(result)
    assert details["exit_code"] == 7
    assert details.get("crashed") is True
    assert not result.ok
    assert wait_gone(int(pid_file.read_text()))


def test_segfault_is_reported(tool: ExecuteCode) -> None:
    result = tool.run_sync(PID_LINE + "import ctypes\nctypes.string_at(0)\n")
    assert result.content.startswith("Script exited with code ")
    assert result.details.get("crashed") is True
    assert result.details["exit_code"] != 0
    assert not result.ok


# --- timeouts and aborts -------------------------------------------------------------------------

_LOOP = "print('partial output', flush=True)\nwhile True:\n    pass\n"


@pytest.mark.parametrize(
    "prelude",
    [
        "",
        "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\n",
        "import signal\nfor s in (signal.SIGINT, signal.SIGTERM):\n"
        "    signal.signal(s, signal.SIG_IGN)\n",
    ],
    ids=["plain-loop", "ignores-sigint", "ignores-sigint-and-sigterm"],
)
def test_timeout_kills_the_kernel_and_keeps_partial_output(
    tool: ExecuteCode, wait_gone: Callable[..., bool], prelude: str
) -> None:
    spare_ready(tool)  # the 1 s count the kernel's start too: not a cold one on a busy host
    started = time.monotonic()
    result = tool.run_sync(PID_LINE + prelude + _LOOP, timeout_ms=1000)
    elapsed = time.monotonic() - started
    assert result.content.startswith("Script timed out after 1000ms.\n")
    assert "partial output\n" in result.content
    details = check_details(result)
    assert details["timed_out"] is True
    assert details["exit_code"] is None
    assert not result.ok
    assert 1.0 <= elapsed < 4.5, elapsed  # 1 s budget + at most one 1 s grace, plus slack
    assert wait_gone(pid_of(result), 4.0), "the timed-out kernel is still running"


def test_text_blocks_survive_a_timeout(tool: ExecuteCode) -> None:
    spare_ready(tool)
    result = tool.run_sync("text('found 3 things')\nwhile True:\n    pass\n", timeout_ms=1000)
    assert result.content.startswith("Script timed out after 1000ms.\n")
    assert "Script result (text()):\nfound 3 things" in result.content


def test_abort_during_a_run(tool: ExecuteCode, wait_gone: Callable[..., bool]) -> None:
    abort = threading.Event()
    timers: list[threading.Timer] = []

    def on_update(message: str) -> None:
        if message == "notify: running":  # the script is under way: abort it shortly
            timer = threading.Timer(0.2, abort.set)
            timers.append(timer)
            timer.start()

    script = PID_LINE + "text('first block')\nnotify('running')\nimport time\ntime.sleep(30)\n"
    started = time.monotonic()
    result = tool.run_sync(script, abort=abort, on_update=on_update)
    assert time.monotonic() - started < 5
    assert timers, "the notify() message never arrived"
    assert result.content.startswith("Script cancelled.\n")
    assert "Script result (text()):\nfirst block" in result.content
    assert "PID=" in result.content
    details = check_details(result)
    assert details["cancelled"] is True
    assert details["exit_code"] is None
    assert wait_gone(pid_of(result), 4.0)


def test_timeout_ms_is_clamped_up_to_one_second(tool: ExecuteCode) -> None:
    result = tool.run_sync("while True:\n    pass\n", timeout_ms=1)
    assert result.content.startswith("Script timed out after 1000ms.")
    assert result.details["duration_ms"] >= 1000


def test_timeout_ms_is_clamped_down_to_the_config(own_tool: Callable[..., ExecuteCode]) -> None:
    facade = own_tool(make_config(timeout_ms=1500))
    started = time.monotonic()
    result = facade.run_sync("while True:\n    pass\n", timeout_ms=600_000)
    assert result.content.startswith("Script timed out after 1500ms.")
    assert 1.5 <= time.monotonic() - started < 5


# --- refusals ------------------------------------------------------------------------------------


def refused(result: ExecuteCodeResult, text: str) -> None:
    assert result.content == text
    assert result.details["error"] is True
    assert result.details["exit_code"] is None
    assert not result.ok


def test_disabled_is_refused(own_tool: Callable[..., ExecuteCode]) -> None:
    facade = own_tool(make_config(enabled=False))
    refused(facade.run_sync("print('must not run')"), DISABLED)
    assert not facade.diagnostics.started  # nothing was started for a disabled tool


@pytest.mark.parametrize("script", [None, "", "   \n\t", 42, b"print(1)"])
def test_missing_script_is_refused(tool: ExecuteCode, script: Any) -> None:
    refused(tool.run_sync(script), MISSING_SCRIPT)


@pytest.mark.parametrize("reset", ["yes", 1, None, "true"])
def test_non_boolean_reset_is_refused(tool: ExecuteCode, reset: Any) -> None:
    refused(tool.run_sync("print('must not run')", reset=reset), BAD_RESET)


@pytest.mark.parametrize("timeout_ms", [True, "1000", [1000]])
def test_non_integer_timeout_is_refused(tool: ExecuteCode, timeout_ms: Any) -> None:
    refused(tool.run_sync("print('must not run')", timeout_ms=timeout_ms), BAD_TIMEOUT)


def test_already_aborted_call_is_refused(tool: ExecuteCode) -> None:
    abort = threading.Event()
    abort.set()
    refused(tool.run_sync("print('must not run')", abort=abort), ALREADY_ABORTED)


def test_python_path_not_found(own_tool: Callable[..., ExecuteCode], tmp_path: Path) -> None:
    missing = tmp_path / "no-such-python"
    result = own_tool(make_config(python_path=str(missing))).run_sync("print(1)")
    assert result.content.startswith(f"execute_code: python_path not found: {missing};")
    assert "LEMON_EXECUTE_CODE_PYTHON_PATH" in result.content  # names the fix
    assert result.details["error"] is True


@pytest.mark.parametrize("kind", ["file-without-x-bit", "directory"])
def test_python_path_not_executable(
    own_tool: Callable[..., ExecuteCode], tmp_path: Path, kind: str
) -> None:
    target = tmp_path / "python3"
    if kind == "directory":
        target.mkdir()
    else:
        target.write_text("#!/bin/sh\n")
        target.chmod(0o644)
    result = own_tool(make_config(python_path=str(target))).run_sync("print(1)")
    assert result.content.startswith(f"execute_code: python_path is not executable: {target};")
    assert result.details["error"] is True


def test_relative_python_path_resolves_against_cwd(
    own_tool: Callable[..., ExecuteCode], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    result = own_tool(make_config(python_path="bin/python3")).run_sync("print(1)")
    assert result.content.startswith(
        f"execute_code: python_path not found: {tmp_path / 'bin' / 'python3'};"
    )


def test_no_python3_on_path(
    own_tool: Callable[..., ExecuteCode], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty directory: no python3 anywhere
    monkeypatch.setattr("sys.executable", "")  # and no host interpreter to fall back to
    result = own_tool(make_config(python_path="")).run_sync("print(1)")
    assert result.content.startswith("execute_code: no python3 interpreter found on PATH")
    assert result.details["error"] is True


def test_interpreter_without_ipykernel(
    own_tool: Callable[..., ExecuteCode],
    tmp_path: Path,
    session_kernels: Callable[..., set[int]],
) -> None:
    # The same Python without site-packages (-S): the stdlib works, ipykernel is missing.
    wrapper = tmp_path / "python-without-site"
    wrapper.write_text(f'#!/bin/sh\nexec {sys.executable} -S "$@"\n')
    wrapper.chmod(0o700)
    before = session_kernels(host=os.getpid())
    started = time.monotonic()
    result = own_tool(make_config(python_path=str(wrapper))).run_sync("print(1)")
    assert time.monotonic() - started < 12  # bounded by the 10 s startup limit
    assert "has no ipykernel" in result.content
    assert "pip install ipykernel" in result.content  # names the fix
    assert result.details["error"] is True
    assert session_kernels(host=os.getpid()) <= before, "a failed start left a process"


def test_workspace_creation_failure_is_refused(own_tool: Callable[..., ExecuteCode]) -> None:
    facade = own_tool()
    assert facade.run_sync("print('warm-up')").ok
    work_dir = facade.diagnostics.work_dir
    assert work_dir is not None
    work_dir.chmod(0o500)  # no longer private as required: fails closed (a missing one is remade)
    try:
        result = facade.run_sync("print('must not run')")
    finally:
        work_dir.chmod(0o700)
    assert result.content.startswith("execute_code: could not create a private workspace: ")
    assert result.details["error"] is True
    assert result.details["exit_code"] is None


def test_unusable_staging_base_is_refused_not_raised(
    own_tool: Callable[..., ExecuteCode], tmp_path: Path
) -> None:
    facade = own_tool(make_config(), staging_base=tmp_path / "missing")
    result = facade.run_sync("print('must not run')")
    assert result.content.startswith("execute_code: could not create a private workspace: ")
    assert result.details["error"] is True


def test_refusals_carry_every_details_key(
    tool: ExecuteCode, own_tool: Callable[..., ExecuteCode]
) -> None:
    abort = threading.Event()
    abort.set()
    results = [
        own_tool(make_config(enabled=False)).run_sync("print(1)"),
        tool.run_sync(""),
        tool.run_sync("print(1)", reset="yes"),
        tool.run_sync("print(1)", abort=abort),
        own_tool(make_config(python_path="/nonexistent/python3")).run_sync("print(1)"),
    ]
    for result in results:
        check_details(result)


# --- lifecycle -----------------------------------------------------------------------------------


def test_close_stops_every_kernel_and_removes_the_root(
    own_tool: Callable[..., ExecuteCode],
    session_kernels: Callable[..., set[int]],
    wait_gone: Callable[..., bool],
) -> None:
    before = session_kernels(host=os.getpid())
    facade = own_tool(make_config(warm_kernels=2))
    result = facade.run_sync(PID_LINE)
    assert result.ok
    root = facade.diagnostics.staging_root
    assert root is not None
    deadline = time.monotonic() + 10  # let the spares start, so close() has work to do
    while len(session_kernels(host=os.getpid()) - before) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    mine = session_kernels(host=os.getpid()) - before
    assert mine, "no warm spare was started"
    facade.close()
    for pid in mine | {pid_of(result)}:
        assert wait_gone(pid, 1.0), f"kernel {pid} survived close()"
    assert not root.exists()
    with pytest.raises(RuntimeError):
        facade.run_sync("print(1)")


@pytest.mark.parametrize("sig", [signal.SIGKILL])
def test_kernel_killed_from_outside_is_reported(
    tool: ExecuteCode, tmp_path: Path, sig: signal.Signals
) -> None:
    pid_file = tmp_path / "pid"
    script = (
        "import os, time\nprint('waiting', flush=True)\n"
        f"open({str(pid_file)!r}, 'w').write(str(os.getpid()))\ntime.sleep(30)\n"
    )
    results: list[ExecuteCodeResult] = []
    runner = threading.Thread(target=lambda: results.append(tool.run_sync(script)))
    runner.start()
    deadline = time.monotonic() + 8
    while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.3)  # let the printed line reach the host before the kill
    killed_at = time.monotonic()
    os.kill(int(pid_file.read_text()), sig)
    runner.join(10)
    assert results, "the run did not end after its kernel was killed"
    assert time.monotonic() - killed_at < 3
    result = results[0]
    assert result.content.startswith(f"Script exited with code {-sig}")
    assert "waiting\n" in result.content
    assert result.details.get("crashed") is True


# --- awkward input and output ---------------------------------------------------------------------


def test_lone_surrogates_in_the_script_and_its_output_are_replaced(tool: ExecuteCode) -> None:
    # A bad "\ud800" escape in the model's JSON, and one printed at run time: neither may
    # lose output or raise in the host.
    result = tool.run_sync("x = '\ud800'\nprint('a\\ud800b')\nprint('after', len(x))")
    assert result.content == "a\ufffdb\nafter 1\n"
    assert result.details["exit_code"] == 0


def test_nul_bytes_in_the_script_are_a_syntax_error(tool: ExecuteCode) -> None:
    result = tool.run_sync("print(1)\0")
    assert result.content.startswith("Script raised SyntaxError: ")
    assert "null bytes" in result.content
    assert result.details["exit_code"] == 1


def test_stdout_buffer_takes_bytes_and_replaces_invalid_utf8(tool: ExecuteCode) -> None:
    script = (
        "import sys\n"
        "sys.stdout.buffer.write('é'.encode()[:1])\n"  # half a character, completed next
        "sys.stdout.buffer.write('é'.encode()[1:] + b' \\xff end\\n')\n"
        "sys.stdout.buffer.flush()\n"
    )
    result = tool.run_sync(script)
    assert result.content == "é \ufffd end\n"
