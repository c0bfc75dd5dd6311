"""Newcomer papercuts of ``lemon-exec`` (issue 12, item 7), from the outside.

``--version``; ``run`` streams the script's output live, names tracebacks after the user's
file, passes ``-- ARGS`` as ``sys.argv``, and exits 130 without a traceback when Ctrl-C comes
while it is still starting. Real subprocesses, real kernels, real signals; the pure logic of
"what is left to print after the stream" is unit-tested on built results.
"""

from __future__ import annotations

import importlib.metadata
import io
import json
import os
import select
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Unpack

import pytest
from test_cli import Run, cli, cli_command, cli_env, roots_owned_by, write

from lemon_exec.cli.live import LiveOutput, unstreamed_content
from lemon_exec.details import Details
from lemon_exec.envelope import wrap_untrusted
from lemon_exec.host.run.results import DIAGNOSTICS_HEADER, TEXT_HEADER
from lemon_exec.result import ExecuteCodeResult

__all__ = ["cli"]  # the fixture, shared with test_cli

pytestmark = pytest.mark.timeout(60)
pytest_plugins = ["pytester"]


def test_version_flag(cli: Run) -> None:
    done = cli("--version")
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"lemon-exec {importlib.metadata.version('lemon_exec')}\n"


# --- live output ---------------------------------------------------------------------------------


@pytest.mark.kernel
def test_run_streams_output_while_the_script_runs(tmp_path: Path, leak_watch: Any) -> None:
    # The script prints, then waits until the test has seen that line on the CLI's stdout:
    # without live streaming the line would only come at the end, after the wait.
    go = tmp_path / "go"
    script = write(
        tmp_path,
        "live.py",
        "import os, time\n"
        "print('first', flush=True)\n"
        f"deadline = time.monotonic() + 20\n"
        f"while not os.path.exists({str(go)!r}) and time.monotonic() < deadline:\n"
        "    time.sleep(0.02)\n"
        "print('second')\n"
        "text('the answer')\n",
    )
    proc = subprocess.Popen(
        [*cli_command(), "run", str(script)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=cli_env(),
        cwd=tmp_path,
    )
    leak_watch.add_pid(proc.pid)
    assert proc.stdout is not None
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 15)
        assert ready, "no output while the script ran: it was not streamed"
        first = os.read(proc.stdout.fileno(), 4096)
        assert first == b"first\n"
        go.touch()
        rest, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    # The output is not repeated; what it did not show (the text() blocks) follows.
    assert (first + rest).decode() == f"first\nsecond\n\n{TEXT_HEADER}\nthe answer\n"


# --- tracebacks and sys.argv ---------------------------------------------------------------------


@pytest.mark.kernel
def test_traceback_names_the_users_file(cli: Run, tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    write(tmp_path, "pkg/foo.py", "x = 1\n\ndef f():\n    raise ValueError('bad')\n\nf()\n")
    done = cli("run", "pkg/foo.py")
    assert done.returncode == 1
    assert 'File "pkg/foo.py", line 6, in <module>' in done.stdout
    assert 'File "pkg/foo.py", line 4, in f' in done.stdout
    assert "script.py" not in done.stdout
    assert done.stdout.rstrip().endswith("Script raised ValueError: bad")


@pytest.mark.kernel
def test_traceback_of_stdin_script_names_stdin(cli: Run) -> None:
    done = cli("run", "-", input="\n1 / 0\n")
    assert done.returncode == 1
    assert 'File "<stdin>", line 2, in <module>' in done.stdout


@pytest.mark.kernel
def test_script_arguments_become_sys_argv(cli: Run, tmp_path: Path) -> None:
    script = write(tmp_path, "args.py", "import json, sys\nprint(json.dumps(sys.argv))\n")
    done = cli("run", "args.py", "--", "one", "--json", "three four")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == ["args.py", "one", "--json", "three four"]
    plain = cli("run", str(script), "alpha")
    assert json.loads(plain.stdout) == [str(script), "alpha"]
    bare = cli("run", "args.py")
    assert json.loads(bare.stdout) == ["args.py"]
    piped = cli("run", "-", "--", "x", input="import sys\nprint(sys.argv)\n")
    assert piped.stdout == "['-', 'x']\n"


# --- Ctrl-C while starting -----------------------------------------------------------------------


def _maps(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return ""


def _interrupt_when(
    tmp_path: Path, leak_watch: Any, ready: Callable[[int], Any]
) -> tuple[subprocess.CompletedProcess[str], int, Any]:
    """Start ``lemon-exec run``, SIGINT it once ``ready(pid)`` is truthy.

    Returns the finished process, its pid and what ``ready`` returned.
    """
    script = write(tmp_path, "slow.py", "import time\ntime.sleep(30)\n")
    proc = subprocess.Popen(
        [*cli_command(), "run", str(script)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=cli_env(),
        cwd=tmp_path,
    )
    leak_watch.add_pid(proc.pid)
    try:
        deadline = time.monotonic() + 20
        seen = None
        while not seen and time.monotonic() < deadline and proc.poll() is None:
            seen = ready(proc.pid)
            time.sleep(0.001)
        assert seen, "the startup stage never came"
        os.kill(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err), proc.pid, seen


def test_ctrl_c_while_the_command_loads_exits_130_quietly(tmp_path: Path, leak_watch: Any) -> None:
    # pyzmq's extension is loaded while the command imports its modules, well before the
    # kernel starts: the signal lands in the imports or just after them.
    started = time.time()
    done, pid, _ = _interrupt_when(tmp_path, leak_watch, lambda pid: "zmq" in _maps(pid))
    assert done.returncode == 130, done.stderr
    assert "Traceback" not in done.stderr
    assert roots_owned_by(pid, started) == [], "the interrupted CLI left its staging root behind"


# --- what is printed after the stream (pure logic) ------------------------------------------------


def _live(*chunks: str) -> LiveOutput:
    live = LiveOutput(io.StringIO())
    for chunk in chunks:
        live.write(chunk)
    return live


def _result(content: str, **details: Unpack[Details]) -> ExecuteCodeResult:
    return ExecuteCodeResult(content, {"text_blocks": 0, "truncated": False, **details})


def test_unstreamed_is_empty_for_plain_output() -> None:
    assert unstreamed_content(_result("a\nb\n"), _live("a\n", "b\n")) == ""


def test_unstreamed_keeps_headline_and_text_blocks() -> None:
    failed = _result("Script exited with code 3\n\nbye\n")
    assert unstreamed_content(failed, _live("bye\n")) == "Script exited with code 3"
    content = f"Script raised E: x\n\n{TEXT_HEADER}\nresult\n\n{DIAGNOSTICS_HEADER}\nlog\n"
    blocks = _result(content, text_blocks=1)
    expected = f"Script raised E: x\n\n{TEXT_HEADER}\nresult"
    assert unstreamed_content(blocks, _live("log\n")) == expected


def test_unstreamed_matches_sanitized_output() -> None:
    # The result holds the output without terminal escapes and with \r\n as \n.
    live = _live("\x1b[31mred\x1b[0m\r\n")
    assert unstreamed_content(_result("Script exited with code 1\n\nred\n"), live) == (
        "Script exited with code 1"
    )


def test_unstreamed_finds_truncated_output() -> None:
    streamed = "".join(f"line {i}\n" for i in range(5000))
    kept = streamed[:400] + "\n... [1234 bytes truncated] ...\n" + streamed[-600:]
    content = f"Script exited with code 2\n\n{kept}[Full output saved to: /tmp/x]"
    result = _result(content, truncated=True)
    assert unstreamed_content(result, _live(streamed)) == "Script exited with code 2"


def test_unstreamed_keeps_the_envelope_around_what_is_left() -> None:
    inner = f"{TEXT_HEADER}\nfetched\n\n{DIAGNOSTICS_HEADER}\nlog\n"
    wrapped = wrap_untrusted(inner, "NOTICE", nonce="ab12")
    result = _result(wrapped, text_blocks=1)
    rest = unstreamed_content(result, _live("log\n"))
    assert rest == wrap_untrusted(f"{TEXT_HEADER}\nfetched", "NOTICE", nonce="ab12")
    # Only output: nothing is left, not even an empty envelope.
    only = _result(wrap_untrusted("log\n", "NOTICE", nonce="cd34"))
    assert unstreamed_content(only, _live("log\n")) == ""


def test_unstreamed_prints_everything_when_the_output_is_not_found() -> None:
    result = _result("Script exited with code 1\n\nsomething else\n")
    assert unstreamed_content(result, _live("what was streamed\n")) == result.content


def test_nothing_streamed_prints_the_whole_content() -> None:
    result = _result("(script produced no output)")
    assert unstreamed_content(result, _live()) == result.content


# --- scenario notebooks next to nbmake / nbval ----------------------------------------------------

#: Stands in for nbmake (``--nbmake``) or nbval: it collects every notebook it is given.
_OTHER_NOTEBOOK_PLUGIN = """
import pytest

def pytest_addoption(parser):
    parser.addoption("--othernb", action="store_true")

class OtherNotebook(pytest.File):
    def collect(self):
        yield OtherItem.from_parent(self, name="othernb")

class OtherItem(pytest.Item):
    def runtest(self):
        pass

def pytest_collect_file(file_path, parent):
    if file_path.suffix == ".ipynb" and parent.config.getoption("othernb"):
        return OtherNotebook.from_parent(parent, path=file_path)
"""


def _notebook(path: Path, metadata: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {"cells": [], "metadata": metadata, "nbformat": 4, "nbformat_minor": 5}
    path.write_text(json.dumps(doc))


def test_notebooks_are_collected_once_beside_another_notebook_plugin(
    pytester: pytest.Pytester,
) -> None:
    pytester.makeconftest(_OTHER_NOTEBOOK_PLUGIN)
    _notebook(pytester.path / "notebooks" / "scenario.ipynb", {"lemon": {}})
    _notebook(pytester.path / "notebooks" / "plain.ipynb", {})
    _notebook(pytester.path / "named.ipynb", {})
    done = pytester.runpytest_inprocess(
        "--othernb", "--collect-only", "-q", "notebooks", "named.ipynb"
    )
    items = sorted(line for line in done.outlines if "::" in line)
    assert items == [
        "named.ipynb::othernb",  # named, but not a scenario: the other plugin's
        "notebooks/plain.ipynb::othernb",
        "notebooks/scenario.ipynb::scenario",  # a scenario: ours only
    ]
    # Without the other plugin's flag, both notebooks the command names are ours.
    alone = pytester.runpytest_inprocess("--collect-only", "-q", "notebooks", "named.ipynb")
    assert sorted(line for line in alone.outlines if "::" in line) == [
        "named.ipynb::named",
        "notebooks/scenario.ipynb::scenario",
    ]
