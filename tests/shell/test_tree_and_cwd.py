"""The shell tool's wrapper: the directory carried over is the one the shell really finished
in (never one the command forged), and a timeout, ``close()`` or the host's death stops the
command's whole tree, ``setsid`` children and double-forked daemons included."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from support import wait_until

from lemon_exec.shell import ShellSession

from .test_shell import pid_alive, read_pid, real

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="the subreaper and /proc are Linux's"
)


def q(path: Path | str) -> str:
    return shlex.quote(str(path))


@pytest.fixture
def dirs(tmp_path: Path) -> tuple[Path, Path]:
    """(real, spoof): where a command goes, and where it tries to make the session go."""
    (tmp_path / "real").mkdir()
    (tmp_path / "spoof").mkdir()
    return tmp_path / "real", tmp_path / "spoof"


# --- the directory cannot be spoofed or lost --------------------------------------------------


@pytest.mark.timeout(10)
def test_function_named_builtin_cannot_spoof_the_directory(
    session: ShellSession, dirs: tuple[Path, Path]
) -> None:
    good, spoof = dirs
    result = session.execute_command(
        f"builtin() {{ printf '%s\\n' {q(spoof)}; }}; cd {q(good)}; echo done"
    )
    assert result == {"stdout": "done\n", "stderr": "", "exit_code": 0, "timed_out": False}
    assert session.cwd == real(good)


@pytest.mark.timeout(10)
def test_commands_own_exit_trap_keeps_the_directory(
    session: ShellSession, dirs: tuple[Path, Path]
) -> None:
    good, _ = dirs
    result = session.execute_command(f"trap 'echo bye' EXIT; cd {q(good)}; exit 5")
    assert result["stdout"] == "bye\n"
    assert result["exit_code"] == 5
    assert session.cwd == real(good)


@pytest.mark.timeout(10)
def test_exit_trap_that_moves_the_shell_is_followed(
    session: ShellSession, dirs: tuple[Path, Path]
) -> None:
    # The trap runs in the shell: where it leaves the shell is where the shell finished.
    good, spoof = dirs
    session.execute_command(f"trap 'cd {q(good)}' EXIT; cd {q(spoof)}")
    assert session.cwd == real(good)


@pytest.mark.timeout(10)
def test_exec_keeps_the_directory_the_shell_was_in(
    session: ShellSession, dirs: tuple[Path, Path]
) -> None:
    good, spoof = dirs
    result = session.execute_command(
        f"cd {q(good)} && exec python3 -c " + q(f"import os; os.chdir({str(spoof)!r}); print(1)")
    )
    assert result["stdout"] == "1\n"
    # The program exec'd in the shell's place moved, the shell did not.
    assert session.cwd == real(good)


@pytest.mark.timeout(10)
def test_shell_killed_by_sigkill_keeps_its_directory(
    session: ShellSession, dirs: tuple[Path, Path]
) -> None:
    good, _ = dirs
    result = session.execute_command(f"cd {q(good)}; kill -9 $$")
    assert result["exit_code"] == 128 + signal.SIGKILL
    assert session.cwd == real(good)


@pytest.mark.timeout(10)
def test_subshell_replaying_the_exit_trap_cannot_spoof(
    session: ShellSession, dirs: tuple[Path, Path], tmp_path: Path
) -> None:
    # Whatever a subshell does (here: re-run any EXIT trap it can see, then the shell leaves
    # no trace of its own), the session follows the shell, not the subshell.
    _, spoof = dirs
    session.execute_command(f'(cd {q(spoof)} && eval "$(trap -p EXIT)"); exec true')
    assert session.cwd == real(tmp_path)


@pytest.mark.timeout(10)
def test_command_sees_no_trap_and_no_marker(session: ShellSession) -> None:
    result = session.execute_command(
        'trap -p; echo "BASH_ENV=${BASH_ENV-unset}"; ls /proc/self/fd | wc -l'
    )
    # stdin, stdout, stderr and the fd ls opens to list them: nothing of the tool's.
    assert result == {
        "stdout": "BASH_ENV=unset\n4\n",
        "stderr": "",
        "exit_code": 0,
        "timed_out": False,
    }


@pytest.mark.timeout(10)
def test_writing_to_every_descriptor_cannot_spoof(
    session: ShellSession, dirs: tuple[Path, Path], tmp_path: Path
) -> None:
    _, spoof = dirs
    forge = "".join(f"printf '0\\nok\\n%s' {q(spoof)} >&{fd}; " for fd in range(3, 20))
    session.execute_command(f"{{ {forge} }} 2>/dev/null; echo {q(spoof)}")
    assert session.cwd == real(tmp_path)


@pytest.mark.timeout(15)
def test_directory_is_recorded_after_a_timeout(
    session: ShellSession, dirs: tuple[Path, Path]
) -> None:
    good, _ = dirs
    result = session.execute_command(f"cd {q(good)}; sleep 30", timeout=1)
    assert result["timed_out"] is True
    assert session.cwd == real(good)


# --- the whole tree is stopped ---------------------------------------------------------------


@pytest.mark.timeout(15)
def test_setsid_child_is_killed_on_timeout(
    session: ShellSession, tmp_path: Path, reap_pids: list[int]
) -> None:
    pid_file = tmp_path / "daemon.pid"
    command = (
        f"setsid sh -c 'echo $$ > {q(pid_file)}; exec sleep 60' > /dev/null 2>&1 < /dev/null &"
        " sleep 30"
    )
    result = session.execute_command(command, timeout=1)
    pid = read_pid(pid_file)
    reap_pids.append(pid)
    assert result["timed_out"] is True
    assert wait_until(lambda: not pid_alive(pid)), "a setsid child survived the timeout"


@pytest.mark.timeout(15)
def test_setsid_child_holding_the_output_is_killed_on_timeout(
    session: ShellSession, tmp_path: Path, reap_pids: list[int]
) -> None:
    pid_file = tmp_path / "daemon.pid"
    command = f"setsid sh -c 'echo $$ > {q(pid_file)}; echo up; exec sleep 60' & wait"
    result = session.execute_command(command, timeout=1)
    pid = read_pid(pid_file)
    reap_pids.append(pid)
    assert result["timed_out"] is True
    assert result["stdout"] == "up\n"
    assert wait_until(lambda: not pid_alive(pid)), "a setsid child survived the timeout"


@pytest.mark.timeout(15)
def test_double_forked_daemon_is_killed_on_timeout(
    session: ShellSession, tmp_path: Path, reap_pids: list[int]
) -> None:
    pid_file = tmp_path / "daemon.pid"
    daemon = f"setsid sh -c 'echo $$ > {q(pid_file)}; exec sleep 60' > /dev/null 2>&1 &"
    result = session.execute_command(f"( {daemon} ); sleep 30", timeout=1)
    pid = read_pid(pid_file)
    reap_pids.append(pid)
    assert result["timed_out"] is True
    assert wait_until(lambda: not pid_alive(pid)), "a double-forked daemon survived"


@pytest.mark.timeout(15)
def test_stopped_shell_is_killed_on_timeout(session: ShellSession) -> None:
    result = session.execute_command("kill -STOP $$; echo unreachable", timeout=1)
    assert result["timed_out"] is True
    assert result["stdout"] == ""
    assert session.execute_command("echo next")["stdout"] == "next\n"


@pytest.mark.timeout(15)
def test_close_stops_background_jobs_and_their_daemons(
    session: ShellSession, tmp_path: Path, reap_pids: list[int]
) -> None:
    job, daemon = tmp_path / "job.pid", tmp_path / "daemon.pid"
    command = (
        f"sleep 60 > /dev/null 2>&1 & echo $! > {q(job)}; "
        f"setsid sh -c 'echo $$ > {q(daemon)}; exec sleep 60' > /dev/null 2>&1 &"
    )
    result = session.execute_command(command)
    pids = [read_pid(job), read_pid(daemon)]
    reap_pids.extend(pids)
    assert result["exit_code"] == 0
    assert all(pid_alive(pid) for pid in pids), "background jobs outlive their call"
    session.close()
    assert wait_until(lambda: not any(pid_alive(pid) for pid in pids)), "close() left a job"
    assert session.execute_command("echo still usable")["stdout"] == "still usable\n"


_HOST = textwrap.dedent(
    """
    import sys
    from lemon_exec.shell import ShellSession

    session = ShellSession(sys.argv[1])
    job, daemon = sys.argv[2], sys.argv[3]
    session.execute_command(
        f"sleep 60 > /dev/null 2>&1 & echo $! > {job}; "
        f"setsid sh -c 'echo $$ > {daemon}; exec sleep 60' > /dev/null 2>&1 &"
    )
    print("ready", flush=True)
    sys.stdin.read()
    """
)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("death", [signal.SIGKILL, signal.SIGTERM])
def test_background_jobs_die_with_the_host(
    tmp_path: Path, reap_pids: list[int], death: signal.Signals
) -> None:
    job, daemon = tmp_path / "job.pid", tmp_path / "daemon.pid"
    host = subprocess.Popen(
        [sys.executable, "-c", _HOST, str(tmp_path), str(job), str(daemon)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    reap_pids.append(host.pid)
    try:
        assert host.stdout is not None
        assert host.stdout.readline() == b"ready\n"
        pids = [read_pid(job), read_pid(daemon)]
        reap_pids.extend(pids)
        assert all(pid_alive(pid) for pid in pids)
        os.kill(host.pid, death)
        host.wait(10)
        assert wait_until(lambda: not any(pid_alive(pid) for pid in pids), 5), (
            "a background job outlived the host"
        )
    finally:
        host.kill()
        host.wait()


@pytest.mark.timeout(30)
def test_stopping_the_wrapper_does_not_save_the_tree(
    session: ShellSession, tmp_path: Path, reap_pids: list[int]
) -> None:
    pid_file = tmp_path / "daemon.pid"
    command = (
        f"setsid sh -c 'echo $$ > {q(pid_file)}; exec sleep 60' > /dev/null 2>&1 < /dev/null &"
        " kill -STOP $PPID; sleep 30"
    )
    result = session.execute_command(command, timeout=1)
    pid = read_pid(pid_file)
    reap_pids.append(pid)
    assert result["timed_out"] is True
    assert wait_until(lambda: not pid_alive(pid)), "a setsid child survived the timeout"
    assert session.execute_command("echo next")["stdout"] == "next\n"
