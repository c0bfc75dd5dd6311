"""``lemon-exec run`` from the outside: real subprocesses, real kernels, real signals."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.timeout(60), pytest.mark.kernel]

_BIN = os.path.dirname(sys.executable)


def cli_command() -> list[str]:
    """The installed ``lemon-exec`` console script, else the module entry point."""
    script = shutil.which("lemon-exec", path=_BIN)
    return [script] if script else [sys.executable, "-m", "lemon_exec"]


def cli_env(**extra: str) -> dict[str, str]:
    """The test's environment without LEMON_EXECUTE_CODE_* settings, plus ``extra``.

    The interpreter running the tests (which has ipykernel) comes first on PATH, because a
    blank python_path means "python3 on PATH".
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEMON_EXECUTE_CODE_")}
    env["PATH"] = _BIN + os.pathsep + env.get("PATH", "")
    env.update(extra)
    return env


Run = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def cli(tmp_path: Path, leak_watch: Any) -> Iterator[Run]:
    """``cli(*args, input=None, env=None, cwd=tmp_path)``: run ``lemon-exec`` to completion.

    The subprocess is registered with the leak check, so a staging root it leaves behind
    fails the session.
    """
    spills: list[Path] = []

    def _run(
        *args: str,
        input: str | None = None,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
        timeout: float = 30,
        command: list[str] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        proc = subprocess.Popen(
            [*(command or cli_command()), *args],
            stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env if env is not None else cli_env(),
            cwd=cwd or tmp_path,
        )
        leak_watch.add_pid(proc.pid)
        try:
            out, err = proc.communicate(input, timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            raise
        result = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
        for line in out.splitlines():
            if line.startswith("[Full output saved to: "):
                spills.append(Path(line[len("[Full output saved to: ") : -1]))
        return result

    yield _run
    for spill in spills:  # the CLI moves spill files out of its staging root; tidy up
        spill.unlink(missing_ok=True)


def write(tmp_path: Path, name: str, source: str) -> Path:
    path = tmp_path / name
    path.write_text(source)
    return path


# --- success and output --------------------------------------------------------------------------


def test_success_prints_content_and_streams_notify(cli: Run, tmp_path: Path) -> None:
    script = write(
        tmp_path,
        "ok.py",
        "notify('step one')\nprint('diagnostic line')\nnotify('step two')\ntext('the answer')\n",
    )
    done = cli("run", str(script))
    assert done.returncode == 0, done.stderr
    # The printed output streams live; the text() blocks follow it (it is not repeated).
    assert done.stdout == "diagnostic line\n\nScript result (text()):\nthe answer\n"
    assert done.stderr == "notify: step one\nnotify: step two\n"


def test_output_gets_a_final_newline(cli: Run, tmp_path: Path) -> None:
    done = cli("run", str(write(tmp_path, "n.py", "import sys\nsys.stdout.write('no newline')\n")))
    assert done.returncode == 0
    assert done.stdout == "no newline\n"
    empty = cli("run", str(write(tmp_path, "quiet.py", "x = 1\n")))
    assert empty.stdout == "(script produced no output)\n"


def test_script_from_stdin(cli: Run) -> None:
    done = cli("run", "-", input="print(6 * 7)\n")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "42\n"


def test_json_output_shape(cli: Run) -> None:
    done = cli("run", "--json", "-", input="print('hi')\ntext('block')\n")
    assert done.returncode == 0, done.stderr
    assert done.stdout.endswith("\n") and done.stdout.count("\n") == 1  # one JSON object
    payload = json.loads(done.stdout)
    assert set(payload) == {"content", "details", "trust"}
    assert payload["content"] == (
        "Script result (text()):\nblock\n\nDiagnostics (stdout/stderr, not the result):\nhi\n"
    )
    assert payload["trust"] == "trusted"
    details = payload["details"]
    for key in (
        "mode",
        "exit_code",
        "truncated",
        "duration_ms",
        "persistent",
        "reset_performed",
        "state_retained",
    ):
        assert key in details, key
    assert details["exit_code"] == 0
    assert details["mode"] == "per_call"
    assert details["text_blocks"] == 1


def test_script_runs_in_the_current_directory(cli: Run, tmp_path: Path) -> None:
    workdir = tmp_path / "project"
    workdir.mkdir()
    (workdir / "notes.txt").write_text("alpha\nbeta\n")
    done = cli(
        "run", "-", cwd=workdir, input="import os\nprint(os.getcwd())\ntext(read('notes.txt'))\n"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == str(workdir)  # printed, streamed first
    assert "alpha\nbeta" in done.stdout


def test_truncated_output_is_kept_after_exit(cli: Run) -> None:
    done = cli("run", "--json", "-", input="for i in range(30000):\n    print(i)\n")
    assert done.returncode == 0, done.stderr
    details = json.loads(done.stdout)["details"]
    assert details["truncated"] is True
    spill = Path(details["full_output_path"])
    try:
        # The staging root is gone with the process; the spill file must not be.
        assert spill.read_text() == "".join(f"{i}\n" for i in range(30000))
        assert spill.stat().st_mode & 0o777 == 0o600
        assert f"[Full output saved to: {spill}]" in json.loads(done.stdout)["content"]
    finally:
        spill.unlink(missing_ok=True)


# --- failures ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("source", "headline"),
    [
        ("raise ValueError('nope')\n", "Script raised ValueError: nope"),
        ("import sys\nsys.exit(3)\n", "Script exited with code 3"),
        ("import os\nos._exit(7)\n", "Script exited with code 7"),
    ],
)
def test_script_failure_exits_1(cli: Run, source: str, headline: str) -> None:
    done = cli("run", "-", input=source)
    assert done.returncode == 1
    assert headline + "\n" in done.stdout  # after the streamed output, if any
    assert "Traceback" not in done.stdout.partition(headline)[2]  # not repeated
    assert done.stderr == ""


def test_timeout_flag(cli: Run) -> None:
    started = time.monotonic()
    # 4 s: the deadline counts the kernel's start too, and this one is a fresh process's
    # first (it may wait for the fork-server template), on a loaded machine.
    done = cli(
        "run", "--timeout-ms", "4000", "-", input="print('tick', flush=True)\nwhile True: pass\n"
    )
    assert done.returncode == 1
    assert done.stdout == "tick\n\nScript timed out after 4000ms.\n"
    assert time.monotonic() - started < 15


def test_timeout_flag_overrides_the_environment(cli: Run) -> None:
    # 4 s for the flag, as above: a shorter deadline can end in the kernel's start when the
    # machine is loaded, and the result then says so instead.
    env = cli_env(LEMON_EXECUTE_CODE_TIMEOUT_MS="1000")
    done = cli("run", "--timeout-ms", "4000", "-", env=env, input="while True: pass\n")
    assert done.stdout.startswith("Script timed out after 4000ms.\n")


# --- usage and configuration errors --------------------------------------------------------------


def one_line(stderr: str) -> str:
    lines = stderr.splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("lemon-exec: ")
    return lines[0]


def test_missing_file(cli: Run) -> None:
    done = cli("run", "missing.py")
    assert done.returncode == 2
    assert done.stdout == ""
    assert one_line(done.stderr) == (
        "lemon-exec: cannot read script missing.py: No such file or directory"
    )


def test_empty_script(cli: Run, tmp_path: Path) -> None:
    done = cli("run", str(write(tmp_path, "empty.py", "\n  \n")))
    assert done.returncode == 2
    assert "is empty" in one_line(done.stderr)


def test_disabled_by_environment(cli: Run) -> None:
    env = cli_env(LEMON_EXECUTE_CODE_ENABLED="0")
    done = cli("run", "-", env=env, input="print('must not run')\n")
    assert done.returncode == 2
    assert done.stdout == ""
    line = one_line(done.stderr)
    assert "execute_code is disabled" in line
    assert "LEMON_EXECUTE_CODE_ENABLED=1" in line  # says how to turn it on


def test_disabled_by_config_file_and_enabled_again_by_environment(cli: Run, tmp_path: Path) -> None:
    config = write(tmp_path, "lemon.toml", "[runtime.tools.execute_code]\nenabled = false\n")
    done = cli("run", "--config", str(config), "-", input="print('must not run')\n")
    assert done.returncode == 2
    assert "execute_code is disabled" in one_line(done.stderr)
    env = cli_env(LEMON_EXECUTE_CODE_ENABLED="1")  # env wins over the file
    again = cli("run", "--config", str(config), "-", env=env, input="print('ran')\n")
    assert again.returncode == 0, again.stderr
    assert again.stdout == "ran\n"


def test_config_file_settings_apply(cli: Run, tmp_path: Path) -> None:
    config = write(tmp_path, "lemon.toml", "[runtime.tools.execute_code]\nmax_output_bytes = 100\n")
    done = cli("run", "--json", "--config", str(config), "-", input="print('x' * 500)\n")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["details"]["truncated"] is True


def test_bad_toml(cli: Run, tmp_path: Path) -> None:
    config = write(tmp_path, "bad.toml", "[runtime.tools.execute_code\nenabled = true\n")
    done = cli("run", "--config", str(config), "-", input="print(1)\n")
    assert done.returncode == 2
    line = one_line(done.stderr)
    assert f"could not parse config file {config}" in line


def test_missing_config_file(cli: Run, tmp_path: Path) -> None:
    done = cli("run", "--config", str(tmp_path / "nope.toml"), "-", input="print(1)\n")
    assert done.returncode == 2
    assert "config file not found" in one_line(done.stderr)


def test_bad_python_path(cli: Run, tmp_path: Path) -> None:
    env = cli_env(LEMON_EXECUTE_CODE_PYTHON_PATH=str(tmp_path / "nopython"))
    done = cli("run", "-", env=env, input="print(1)\n")
    assert done.returncode == 2
    assert "python_path not found" in one_line(done.stderr)


@pytest.mark.parametrize("args", [["run"], ["run", "--timeout-ms", "soon", "x.py"], []])
def test_usage_errors_exit_2(cli: Run, args: list[str]) -> None:
    done = cli(*args)
    assert done.returncode == 2
    assert "usage: lemon-exec" in done.stderr


# --- interruption --------------------------------------------------------------------------------


def test_ctrl_c_aborts_the_run_and_cleans_up(
    tmp_path: Path, leak_watch: Any, wait_gone: Callable[..., bool]
) -> None:
    script = (
        "import os\nnotify(f'pid {os.getpid()}')\nprint('partial', flush=True)\nwhile True: pass\n"
    )
    started = time.time()
    proc = subprocess.Popen(
        [*cli_command(), "run", "-"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=cli_env(),
        cwd=tmp_path,
    )
    leak_watch.add_pid(proc.pid)
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    try:
        proc.stdin.write(script)
        proc.stdin.close()
        line = proc.stderr.readline()  # blocks until the script is running
        assert line.startswith("notify: pid "), line
        kernel_pid = int(line.split()[-1])
        time.sleep(0.2)  # let the print reach the host
        os.kill(proc.pid, signal.SIGINT)
        proc.wait(timeout=15)  # the output is far below a pipe's buffer: no deadlock
        out, err = proc.stdout.read(), proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()
    assert proc.returncode == 130
    assert out == "partial\n\nScript cancelled.\n"
    assert err == ""
    assert wait_gone(kernel_pid), "the kernel outlived the interrupted CLI"
    left = roots_owned_by(proc.pid, started)
    assert left == [], "the interrupted CLI left its staging root behind"


def roots_owned_by(pid: int, since: float) -> list[Path]:
    """Staging roots in the temp dir whose owner marker names ``pid`` and that were created
    at or after ``since`` (a dead process's leftover root may name a reused pid)."""
    owned = []
    for marker in Path(tempfile.gettempdir()).glob("lemon-exec-*/owner"):
        try:
            owner = json.loads(marker.read_text())
            if owner.get("pid") == pid and float(owner.get("created", 0)) >= since:
                owned.append(marker.parent)
        except (OSError, ValueError, AttributeError, TypeError):
            continue
    return owned


def test_python_dash_m_entry_point(cli: Run) -> None:
    done = cli("run", "-", input="print('via -m')\n", command=[sys.executable, "-m", "lemon_exec"])
    assert done.returncode == 0, done.stderr
    assert done.stdout == "via -m\n"
