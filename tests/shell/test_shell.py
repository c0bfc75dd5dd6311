"""Tests of the shell tool (``lemon_exec.shell``), with real bash and real subprocesses."""

from __future__ import annotations

import asyncio
import os
import shlex
import shutil
import sys
import threading
import time
from pathlib import Path

import pytest
from support import wait_until

from lemon_exec.shell import CommandResult, ShellSession
from lemon_exec.shell._capture import BoundedText
from lemon_exec.shell._config import effective_timeout, output_limit, sandbox_timeout

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="Windows is out of scope")


# --- helpers ---------------------------------------------------------------------------------


def q(path: Path | str) -> str:
    """Quote a path for the shell."""
    return shlex.quote(str(path))


def real(path: Path | str) -> str:
    """The path as ``pwd -P`` prints it (macOS: /tmp is /private/tmp)."""
    return os.path.realpath(path)


def pid_alive(pid: int) -> bool:
    """True if ``pid`` is running. A zombie counts as dead: in a container whose PID 1 does not
    reap orphans, a killed grandchild can stay a zombie for ever."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    try:
        # The state letter follows the parenthesised command name.
        return stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        # No /proc on macOS: trust kill(0). On Linux the process just went away.
        return not sys.platform.startswith("linux")
    except (OSError, IndexError):
        return False


def read_pid(path: Path) -> int:
    """Read the pid a command wrote to ``path``."""
    assert wait_until(lambda: path.exists() and path.read_text().strip() != "")
    return int(path.read_text().strip())


def timed(session: ShellSession, command: str, timeout: float | None = None):
    """Run a command and return (result, seconds it took)."""
    start = time.monotonic()
    result = session.execute_command(command, timeout=timeout)
    return result, time.monotonic() - start


# --- the working directory and what carries over ---------------------------------------------


@pytest.mark.timeout(10)
def test_cd_persists_but_export_does_not(session: ShellSession) -> None:
    first = session.execute_command('cd /tmp && export X=1 && echo "X=$X"')
    assert first == {"stdout": "X=1\n", "stderr": "", "exit_code": 0, "timed_out": False}
    assert session.cwd == real("/tmp")

    second = session.execute_command('pwd; echo "X=${X-unset}"')
    assert second["stdout"] == f"{real('/tmp')}\nX=unset\n"


@pytest.mark.timeout(10)
def test_files_persist_and_pipes_redirects_chaining_work(
    session: ShellSession, tmp_path: Path
) -> None:
    session.execute_command(
        "echo hello | tr a-z A-Z > out.txt && false || echo fallback >> out.txt"
    )
    result = session.execute_command("cat out.txt; true && echo and; false; echo semi")
    assert result["stdout"] == "HELLO\nfallback\nand\nsemi\n"
    assert (tmp_path / "out.txt").read_text() == "HELLO\nfallback\n"


@pytest.mark.timeout(10)
def test_exit_n_keeps_directory_and_exit_code(session: ShellSession) -> None:
    result = session.execute_command("cd /etc; exit 3")
    assert result["exit_code"] == 3
    assert session.cwd == real("/etc")
    assert session.execute_command("pwd")["stdout"] == real("/etc") + "\n"


@pytest.mark.timeout(10)
def test_directory_after_set_e_failure_carries_over(session: ShellSession) -> None:
    result = session.execute_command("set -e; cd /; false; cd /etc")
    assert result["exit_code"] == 1
    assert session.cwd == "/"


@pytest.mark.timeout(10)
def test_subshell_cd_does_not_carry_over(session: ShellSession, tmp_path: Path) -> None:
    session.execute_command("(cd / && exit 0)")
    assert session.cwd == real(tmp_path)


@pytest.mark.timeout(10)
def test_command_sees_plain_bash_c_environment(session: ShellSession) -> None:
    result = session.execute_command('echo "$0|$#|${BASH_ENV-unset}|$LINENO"; set -x; true')
    # Same $0, $@, line numbers and xtrace output as a plain `bash -c`; no wrapper leaks.
    assert result["stdout"] == "bash|0|unset|1\n"
    assert result["stderr"] == "+ true\n"


@pytest.mark.timeout(10)
def test_output_cannot_spoof_the_directory(session: ShellSession, tmp_path: Path) -> None:
    session.execute_command("echo /etc; echo /etc >&2; printf '/usr\\n'")
    assert session.cwd == real(tmp_path)


@pytest.mark.timeout(10)
def test_callers_bash_env_and_posix_mode_are_kept(
    session: ShellSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rc = tmp_path / "rc.sh"
    rc.write_text("greet() { echo hi from rc; }\n")
    monkeypatch.setenv("BASH_ENV", str(rc))
    result = session.execute_command('greet; echo "$BASH_ENV"; cd /')
    assert result["stdout"] == f"hi from rc\n{rc}\n"
    assert session.cwd == "/"
    # As in a plain bash -c: POSIX mode, in which bash does not read BASH_ENV.
    monkeypatch.setenv("POSIXLY_CORRECT", "1")
    result = session.execute_command("shopt -qo posix && echo posix; cd /etc")
    assert result["stdout"] == "posix\n"
    assert session.cwd == real("/etc")


@pytest.mark.timeout(10)
def test_deleted_directory_falls_back_with_note(session: ShellSession, tmp_path: Path) -> None:
    gone = tmp_path / "gone"
    gone.mkdir()
    session.execute_command(f"cd {q(gone)}")
    assert session.cwd == real(gone)
    shutil.rmtree(gone)

    result = session.execute_command("pwd")
    assert result["stdout"] == real(tmp_path) + "\n"
    assert "no longer exists" in result["stderr"]
    assert real(gone) in result["stderr"]
    assert result["exit_code"] == 0
    assert session.cwd == real(tmp_path)


@pytest.mark.timeout(10)
def test_command_deleting_its_own_directory_falls_back(
    session: ShellSession, tmp_path: Path
) -> None:
    result = session.execute_command("mkdir sub && cd sub && rmdir ../sub")
    assert result["exit_code"] == 0
    assert "no longer exists" in result["stderr"]
    assert session.cwd == real(tmp_path)
    assert session.execute_command("pwd")["stdout"] == real(tmp_path) + "\n"


@pytest.mark.timeout(10)
def test_restart_session_returns_to_start_dir(session: ShellSession, tmp_path: Path) -> None:
    session.execute_command("cd /etc")
    message = session.restart_session()
    assert message == f"Session restarted. Working directory reset to {real(tmp_path)}"
    assert session.cwd == real(tmp_path)
    assert session.execute_command("pwd")["stdout"] == real(tmp_path) + "\n"

    session.execute_command("cd /")
    assert asyncio.run(session.arestart_session()) == message
    assert session.cwd == real(tmp_path)


@pytest.mark.timeout(10)
def test_start_dir_defaults_to_process_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert ShellSession().cwd == real(tmp_path)
    with pytest.raises(NotADirectoryError):
        ShellSession(tmp_path / "missing")


# --- results: streams, exit codes, decoding, truncation --------------------------------------


@pytest.mark.timeout(10)
def test_stdout_and_stderr_are_separate(session: ShellSession) -> None:
    result = session.execute_command("echo out; echo err >&2; exit 5")
    assert result == {"stdout": "out\n", "stderr": "err\n", "exit_code": 5, "timed_out": False}


@pytest.mark.timeout(10)
def test_empty_command_succeeds(session: ShellSession) -> None:
    assert session.execute_command("") == {
        "stdout": "",
        "stderr": "",
        "exit_code": 0,
        "timed_out": False,
    }


@pytest.mark.timeout(10)
@pytest.mark.parametrize("command", [b"ls", 42, None, ["ls"]])
def test_non_str_command_is_a_type_error(session: ShellSession, command: object) -> None:
    with pytest.raises(TypeError, match="command must be a str"):
        session.execute_command(command)  # type: ignore[arg-type]


@pytest.mark.timeout(10)
def test_signal_deaths_report_128_plus_signum(session: ShellSession) -> None:
    # A child killed by SIGTERM, as bash reports it; bash itself killed by SIGKILL.
    assert session.execute_command("sleep 10 & kill -TERM $!; wait $!")["exit_code"] == 143
    assert session.execute_command("kill -KILL $$")["exit_code"] == 137


@pytest.mark.timeout(10)
def test_cat_returns_at_once_because_stdin_is_dev_null(session: ShellSession) -> None:
    # pytest already points fd 0 at /dev/null; put an open, empty pipe there instead, so a
    # child that inherited our stdin would block and the test would catch it.
    read_end, write_end = os.pipe()
    saved_stdin = os.dup(0)
    os.dup2(read_end, 0)
    try:
        result, elapsed = timed(session, 'cat; read -r line; echo "read=$?"', timeout=3)
    finally:
        os.dup2(saved_stdin, 0)
        for fd in (saved_stdin, read_end, write_end):
            os.close(fd)
    assert result["stdout"] == "read=1\n"
    assert not result["timed_out"]
    assert elapsed < 2.9  # returned at end of input, not at the 3 s timeout


@pytest.mark.timeout(10)
def test_invalid_utf8_is_replaced(session: ShellSession) -> None:
    result = session.execute_command("printf 'a\\377b\\300'; printf '\\376x' >&2")
    assert result["stdout"] == "a\ufffdb\ufffd"
    assert result["stderr"] == "\ufffdx"


@pytest.mark.timeout(10)
def test_multibyte_output_cut_at_limit_in_characters(session: ShellSession) -> None:
    result = session.execute_command("yes é | head -n 60000 | tr -d '\\n'")
    assert result["exit_code"] == 0
    assert result["stdout"] == "é" * 50_000


@pytest.mark.timeout(10)
def test_three_byte_chars_split_across_reads_decode_whole(session: ShellSession) -> None:
    # 3-byte characters never line up with 64 KiB reads, so some arrive split.
    result = session.execute_command("yes € | head -n 40000 | tr -d '\\n'")
    assert result["stdout"] == "€" * 40_000


@pytest.mark.timeout(10)
def test_truncation_limit_comes_from_env_for_each_stream(
    session: ShellSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DPTTOOLS_OUTPUT_TRUNCATION_LIMIT", "5")
    result = session.execute_command("echo 0123456789; echo abcdefghij >&2")
    assert result["stdout"] == "01234"
    assert result["stderr"] == "abcde"


@pytest.mark.timeout(60)
def test_50_mb_on_both_streams_does_not_deadlock(session: ShellSession) -> None:
    # stderr first: a reader that drained stdout before stderr would block for ever here.
    command = (
        "head -c 52428800 /dev/zero | tr '\\0' b >&2; "
        "head -c 52428800 /dev/zero | tr '\\0' a; echo done >&2"
    )
    result, elapsed = timed(session, command, timeout=30)
    assert not result["timed_out"]
    assert result["exit_code"] == 0
    assert result["stdout"] == "a" * 50_000
    assert result["stderr"] == "b" * 50_000
    assert elapsed < 20


@pytest.mark.timeout(10)
def test_bounded_text_decodes_split_sequences_and_stays_bounded() -> None:
    text = BoundedText(limit=4)
    for byte in "é€x".encode():
        text.feed(bytes([byte]))  # every multi-byte sequence arrives split
    assert text.size == 3
    for _ in range(1000):
        text.feed(b"y" * 65536)
    assert text.size == 4  # nothing kept beyond the limit
    assert text.finish() == "é€xy"

    dangling = BoundedText(limit=10)
    dangling.feed(b"ok\xe2\x82")  # a truncated 3-byte sequence at EOF
    assert dangling.finish() == "ok\ufffd"


# --- timeouts ---------------------------------------------------------------------------------


@pytest.mark.timeout(10)
def test_timeout_argument_is_lowered_to_the_ceiling(
    session: ShellSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DPTTOOLS_SANDBOX_TIMEOUT", "1")
    result, elapsed = timed(session, "cd /etc; echo before; sleep 5; echo after", timeout=60)
    assert result["timed_out"] is True
    assert result["exit_code"] == -1
    assert result["stdout"] == "before\n"  # output captured before the kill is kept
    assert 0.9 <= elapsed < 4.5  # the ceiling, not the sleep's 5 s
    # bash's EXIT trap runs on the timeout's SIGTERM, so the cd is still recorded.
    assert session.cwd == real("/etc")


@pytest.mark.timeout(10)
def test_timeout_none_uses_env_default(
    session: ShellSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DPTTOOLS_SANDBOX_TIMEOUT", "0.5")
    result, elapsed = timed(session, "sleep 5")
    assert result["timed_out"] is True
    assert 0.4 <= elapsed < 4.5


@pytest.mark.timeout(10)
def test_smaller_timeout_argument_is_used(session: ShellSession) -> None:
    result, elapsed = timed(session, "sleep 5", timeout=0.5)
    assert result["timed_out"] is True
    assert elapsed < 4.5
    fast = session.execute_command("echo quick", timeout=2)
    assert fast == {"stdout": "quick\n", "stderr": "", "exit_code": 0, "timed_out": False}


@pytest.mark.timeout(10)
@pytest.mark.parametrize("timeout", [0, 0.0, -1, -0.5, float("nan")])
def test_non_positive_timeout_runs_nothing(
    session: ShellSession, tmp_path: Path, timeout: float
) -> None:
    result = session.execute_command("touch ran.txt", timeout=timeout)
    assert result["exit_code"] == -1
    assert result["timed_out"] is False
    assert "timeout" in result["stderr"]
    assert result["stdout"] == ""
    assert not (tmp_path / "ran.txt").exists()


@pytest.mark.timeout(10)
@pytest.mark.parametrize("timeout", ["5", True, [1]])
def test_non_number_timeout_is_a_type_error(session: ShellSession, timeout: object) -> None:
    with pytest.raises(TypeError, match="timeout"):
        session.execute_command("true", timeout=timeout)  # type: ignore[arg-type]


@pytest.mark.timeout(10)
def test_env_values_are_read_per_call_and_invalid_ones_fall_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert (sandbox_timeout(), output_limit()) == (30.0, 50_000)
    monkeypatch.setenv("DPTTOOLS_SANDBOX_TIMEOUT", "2.5")
    monkeypatch.setenv("DPTTOOLS_OUTPUT_TRUNCATION_LIMIT", "123")
    assert (sandbox_timeout(), output_limit()) == (2.5, 123)
    assert effective_timeout(None) == 2.5
    assert effective_timeout(10) == 2.5
    assert effective_timeout(1) == 1.0
    for bad in ("abc", "", "0", "-3", "inf", "nan"):
        monkeypatch.setenv("DPTTOOLS_SANDBOX_TIMEOUT", bad)
        assert sandbox_timeout() == 30.0, bad
    for bad in ("abc", "", "0", "-3", "1.5"):
        monkeypatch.setenv("DPTTOOLS_OUTPUT_TRUNCATION_LIMIT", bad)
        assert output_limit() == 50_000, bad


@pytest.mark.timeout(10)
def test_grandchildren_are_killed_on_timeout(
    session: ShellSession, tmp_path: Path, reap_pids: list[int]
) -> None:
    pid_file = tmp_path / "grandchild.pid"
    command = f"bash -c 'sleep 30 & echo $! > {q(pid_file)}; wait'; echo unreachable"
    result, elapsed = timed(session, command, timeout=1)
    pid = read_pid(pid_file)
    reap_pids.append(pid)
    assert result["timed_out"] is True
    assert result["stdout"] == ""
    assert elapsed < 15  # the 1 s timeout, not the sleep's 30 s
    assert wait_until(lambda: not pid_alive(pid)), "grandchild survived the timeout"


@pytest.mark.timeout(10)
def test_processes_ignoring_sigterm_are_killed(
    session: ShellSession, tmp_path: Path, reap_pids: list[int]
) -> None:
    pid_file = tmp_path / "stubborn.pid"
    command = f"trap '' TERM; sleep 30 & echo $! > {q(pid_file)}; wait"
    result, elapsed = timed(session, command, timeout=1)
    pid = read_pid(pid_file)
    reap_pids.append(pid)
    assert result["timed_out"] is True
    assert elapsed < 15
    assert wait_until(lambda: not pid_alive(pid)), "a SIGTERM-ignoring process survived"


@pytest.mark.timeout(10)
def test_background_job_holding_the_pipe_waits_for_timeout(
    session: ShellSession, tmp_path: Path, reap_pids: list[int]
) -> None:
    pid_file = tmp_path / "bg.pid"
    result, elapsed = timed(session, f"sleep 30 & echo $! > {q(pid_file)}; echo started", 1)
    pid = read_pid(pid_file)
    reap_pids.append(pid)
    assert result["timed_out"] is True
    assert result["exit_code"] == -1
    assert result["stdout"] == "started\n"
    assert 0.9 <= elapsed < 15
    assert wait_until(lambda: not pid_alive(pid)), "background job left running"


@pytest.mark.timeout(10)
def test_background_job_with_redirected_output_returns_at_once(
    session: ShellSession, tmp_path: Path, reap_pids: list[int]
) -> None:
    pid_file = tmp_path / "bg.pid"
    command = f"sleep 30 >/dev/null 2>&1 & echo $! > {q(pid_file)}; echo started"
    result, elapsed = timed(session, command, timeout=10)
    pid = read_pid(pid_file)
    reap_pids.append(pid)
    assert result == {"stdout": "started\n", "stderr": "", "exit_code": 0, "timed_out": False}
    assert elapsed < 8  # at once, not at the 10 s timeout
    assert pid_alive(pid), "a detached job should outlive the call"


# --- concurrency and async --------------------------------------------------------------------


@pytest.mark.timeout(15)
def test_calls_from_two_threads_never_overlap(session: ShellSession, tmp_path: Path) -> None:
    lock_dir, log = tmp_path / "lock", tmp_path / "log"
    barrier = threading.Barrier(2)
    results: dict[str, CommandResult] = {}

    def call(name: str) -> None:
        # mkdir is atomic: it fails if the other command is inside its critical section.
        command = (
            f"mkdir {q(lock_dir)} || {{ echo OVERLAP; exit 1; }}; "
            f"echo start-{name} >> {q(log)}; sleep 0.4; echo end-{name} >> {q(log)}; "
            f"rmdir {q(lock_dir)}"
        )
        barrier.wait()
        results[name] = session.execute_command(command, timeout=10)

    start = time.monotonic()
    threads = [threading.Thread(target=call, args=(name,)) for name in ("a", "b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.monotonic() - start

    assert [results[n]["exit_code"] for n in ("a", "b")] == [0, 0], results
    lines = log.read_text().split()
    assert len(lines) == 4
    assert [line.split("-")[0] for line in lines] == ["start", "end", "start", "end"]
    assert lines[0].split("-")[1] == lines[1].split("-")[1]
    assert elapsed >= 0.8


@pytest.mark.timeout(10)
def test_async_call_does_not_block_the_event_loop(session: ShellSession) -> None:
    async def main() -> tuple[CommandResult, int]:
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.05)
                ticks += 1

        tick_task = asyncio.create_task(ticker())
        result = await session.aexecute_command("sleep 0.6; echo done", timeout=5)
        tick_task.cancel()
        return result, ticks

    result, ticks = asyncio.run(main())
    assert result["stdout"] == "done\n"
    assert ticks >= 5


@pytest.mark.timeout(10)
def test_async_cancellation_kills_the_process_group(
    session: ShellSession, tmp_path: Path, reap_pids: list[int]
) -> None:
    pid_file = tmp_path / "job.pid"

    async def main() -> float:
        task = asyncio.create_task(
            session.aexecute_command(f"sleep 30 & echo $! > {q(pid_file)}; wait", timeout=20)
        )
        while not (pid_file.exists() and pid_file.read_text().strip()):
            await asyncio.sleep(0.02)
        start = time.monotonic()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return time.monotonic() - start

    elapsed = asyncio.run(main())
    pid = read_pid(pid_file)
    reap_pids.append(pid)
    assert elapsed < 15  # not the sleep's 30 s
    # The cancellation propagates only after the worker killed the group.
    assert wait_until(lambda: not pid_alive(pid), 0.5), "cancelled job left running"
    # The session is free again.
    assert session.execute_command("echo ok", timeout=5)["stdout"] == "ok\n"


@pytest.mark.timeout(10)
def test_async_cancel_event_returns_the_result_and_on_start_marks_the_start(
    session: ShellSession, tmp_path: Path, reap_pids: list[int]
) -> None:
    pid_file = tmp_path / "job.pid"
    started: list[str] = []

    async def main() -> CommandResult:
        cancel = threading.Event()
        task = asyncio.create_task(
            session.aexecute_command(
                f"echo before; sleep 30 & echo $! > {q(pid_file)}; wait",
                timeout=20,
                cancel_event=cancel,
                on_start=lambda: started.append(session.cwd),
            )
        )
        while not (pid_file.exists() and pid_file.read_text().strip()):
            await asyncio.sleep(0.02)
        cancel.set()
        return await task  # a result, not a cancellation

    result = asyncio.run(main())
    pid = read_pid(pid_file)
    reap_pids.append(pid)
    assert started == [session.start_dir]
    assert result["exit_code"] == -1 and result["stdout"] == "before\n"
    assert "process tree was killed" in result["stderr"]
    assert wait_until(lambda: not pid_alive(pid), 0.5), "cancelled job left running"


@pytest.mark.timeout(10)
def test_sync_cancel_event_kills_the_command(session: ShellSession) -> None:
    cancel = threading.Event()
    threading.Timer(0.3, cancel.set).start()
    start = time.monotonic()
    result = session.execute_command("echo before; sleep 30", timeout=20, cancel_event=cancel)
    assert time.monotonic() - start < 15
    assert result["exit_code"] == -1
    assert result["stdout"] == "before\n"
    assert "cancelled" in result["stderr"]


@pytest.mark.timeout(10)
def test_cancel_while_waiting_for_the_lock_runs_nothing(
    session: ShellSession, tmp_path: Path
) -> None:
    busy = threading.Thread(target=session.execute_command, args=("sleep 2",))
    busy.start()
    time.sleep(0.2)  # let the first call take the lock
    cancel = threading.Event()
    threading.Timer(0.2, cancel.set).start()
    result = session.execute_command("touch ran.txt", timeout=5, cancel_event=cancel)
    busy_still_ran = busy.is_alive()
    busy.join()
    assert result["exit_code"] == -1
    assert "before it started" in result["stderr"]
    assert busy_still_ran  # did not wait for the busy call to finish
    assert not (tmp_path / "ran.txt").exists()
