"""lemon-python as a Jupyter kernel: kernelspec, front ends, inspection and attaching.

Checks issue 7's "Jupyter-native" promises with real processes:

- ``jupyter kernelspec list`` shows the installed ``lemon-python`` spec;
- nbclient runs a notebook on lemon-python with no lemon_exec host attached and the
  playground host turned off (``text()`` prints, ``notify()`` goes to stderr, helpers raise
  a ToolError that says how to turn it on, and ordinary IPython behaviour such as the
  last-expression display works; tests/test_playground.py has the helpers served);
- the kernel answers kernel_info, complete, inspect, is_complete and history requests;
- a second jupyter_client attached to a live session kernel reads the agent's variables and
  runs its own code, while the agent's results stay exactly its own;
- ``lemon-exec kernels --json`` (a subprocess) lists the running kernel, ``lemon-exec attach
  --print`` names its connection file, and ``jupyter console --existing`` works on it.

Every scenario notebook under ``notebooks/`` is a test of its own, collected by the
``lemon_exec_notebooks`` pytest plugin (see ``docs/notebooks.md``).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest
from support import index_row

from lemon_exec import ExecuteCode, ExecuteCodeConfig, SessionScope
from lemon_exec.wire import playground

pytestmark = [pytest.mark.timeout(120), pytest.mark.kernel]

REPO = Path(__file__).resolve().parents[1]
KERNEL_NAME = "lemon-python"


def _jupyter(*args: str) -> list[str]:
    exe = shutil.which("jupyter")
    return [exe, *args] if exe else [sys.executable, "-m", "jupyter", *args]


def _lemon_exec(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "lemon_exec", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


# --- the kernelspec ------------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_kernelspec_list_shows_lemon_python() -> None:
    listing = subprocess.run(
        _jupyter("kernelspec", "list"), capture_output=True, text=True, timeout=60, check=True
    )
    assert KERNEL_NAME in listing.stdout.split()

    as_json = subprocess.run(
        _jupyter("kernelspec", "list", "--json"),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    spec = json.loads(as_json.stdout)["kernelspecs"][KERNEL_NAME]["spec"]
    assert spec["argv"][1:3] == ["-m", "lemon_exec.kernel"]
    assert "{connection_file}" in spec["argv"]
    assert spec["language"] == "python"


# --- a plain Jupyter front end, no host ----------------------------------------------------------


@pytest.mark.timeout(120)
def test_nbclient_runs_lemon_python_without_a_host(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(playground.ENABLE_ENV, "0")
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    from nbformat.v4 import new_code_cell, new_notebook

    cells = [
        new_code_cell('text("hello from text()")'),
        new_code_cell('notify("progress message")'),
        new_code_cell(
            'try:\n    read("anything.txt")\nexcept ToolError as exc:\n'
            '    print(type(exc).__name__, "|", exc)'
        ),
        new_code_cell('ls(".")', metadata={"tags": ["raises-exception"]}),
        new_code_cell("x = 21\nx * 2"),
        new_code_cell(
            'from IPython.display import Markdown, display\ndisplay(Markdown("**shown**"))'
        ),
        new_code_cell("%load_ext autoreload\nbatch([])"),
    ]
    nb = new_notebook(
        cells=cells,
        metadata={
            "kernelspec": {
                "name": KERNEL_NAME,
                "display_name": "Python 3 (lemon_exec)",
                "language": "python",
            }
        },
    )
    client = nbclient.NotebookClient(
        nb, kernel_name=KERNEL_NAME, timeout=60, resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute()
    nbformat.validate(nb)

    def streams(i: int, name: str) -> str:
        return "".join(
            o["text"]
            for o in nb.cells[i].outputs
            if o["output_type"] == "stream" and o["name"] == name
        )

    def result(i: int) -> dict[str, Any]:
        found = [o for o in nb.cells[i].outputs if o["output_type"] == "execute_result"]
        assert len(found) == 1, nb.cells[i].outputs
        return found[0]["data"]

    assert streams(0, "stdout") == "hello from text()\n"
    assert streams(1, "stderr") == "notify: progress message\n"
    assert streams(1, "stdout") == ""
    assert streams(2, "stdout").startswith("ToolError | ")
    assert streams(2, "stdout") == f"ToolError | {playground.DISABLED_NO_HOST}\n"
    [error] = [o for o in nb.cells[3].outputs if o["output_type"] == "error"]
    assert error["ename"] == "ToolError"
    assert error["evalue"] == playground.DISABLED_NO_HOST
    assert result(4)["text/plain"] == "42"
    [display] = [o for o in nb.cells[5].outputs if o["output_type"] == "display_data"]
    assert display["data"]["text/markdown"] == "**shown**"
    assert result(6)["text/plain"] == "[]"


# --- protocol requests ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def plain_kernel() -> Iterator[Any]:
    """A lemon-python kernel started from the installed kernelspec, and a blocking client."""
    from jupyter_client import KernelManager

    km = KernelManager(kernel_name=KERNEL_NAME)
    km.start_kernel()
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=60)
        yield kc
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def _shell_reply(kc: Any, msg_id: str, timeout: float = 15) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        msg = kc.get_shell_msg(timeout=max(0.1, deadline - time.monotonic()))
        if msg["parent_header"].get("msg_id") == msg_id:
            return msg


@pytest.mark.timeout(60)
def test_kernel_info(plain_kernel: Any) -> None:
    reply = plain_kernel.kernel_info(reply=True, timeout=15)["content"]
    assert reply["status"] == "ok"
    assert reply["implementation"] == "lemon-python"
    assert reply["language_info"]["name"] == "python"
    assert reply["protocol_version"].startswith("5.")
    assert reply["lemon_protocol"] == 1


@pytest.mark.timeout(60)
def test_execute_complete_inspect(plain_kernel: Any) -> None:
    kc = plain_kernel
    reply = kc.execute_interactive(
        "import os\nvalue_for_inspection = [1, 2, 3]", timeout=15, allow_stdin=False
    )
    assert reply["content"]["status"] == "ok"

    code = "os.pa"
    completion = kc.complete(code, reply=True, timeout=15)["content"]
    assert completion["status"] == "ok"
    # Front ends replace code[cursor_start:cursor_end] with a match; IPython's completers
    # differ in where they start ("os.path" from 0, ".path" from 2), so apply them.
    start, end = completion["cursor_start"], completion["cursor_end"]
    applied = {code[:start] + match + code[end:] for match in completion["matches"]}
    assert "os.path" in applied, completion

    inspected = kc.inspect("value_for_inspection", reply=True, timeout=15)["content"]
    assert inspected["status"] == "ok"
    assert inspected["found"] is True
    assert "list" in inspected["data"]["text/plain"]

    error = kc.execute_interactive("1 / 0", timeout=15, allow_stdin=False)["content"]
    assert error["status"] == "error"
    assert error["ename"] == "ZeroDivisionError"
    assert error["traceback"]


@pytest.mark.timeout(60)
def test_is_complete(plain_kernel: Any) -> None:
    kc = plain_kernel
    answers = {
        code: _shell_reply(kc, kc.is_complete(code))["content"]
        for code in ("x = 1", "for i in range(3):", "x = )")
    }
    assert answers["x = 1"]["status"] == "complete"
    assert answers["for i in range(3):"]["status"] == "incomplete"
    assert answers["for i in range(3):"]["indent"] == "    "
    assert answers["x = )"]["status"] == "invalid"


@pytest.mark.timeout(60)
def test_history_and_comm_info(plain_kernel: Any) -> None:
    kc = plain_kernel
    kc.execute_interactive("history_marker = 1", timeout=15, allow_stdin=False)
    history = kc.history(
        hist_access_type="tail", n=10, output=False, raw=True, reply=True, timeout=15
    )["content"]
    assert history["status"] == "ok"
    assert isinstance(history["history"], list)
    for entry in history["history"]:
        assert len(entry) == 3  # (session, line, input)
    # History is kept in memory (no sqlite file), so it is really there.
    assert any("history_marker = 1" in entry[2] for entry in history["history"])
    comms = kc.comm_info(reply=True, timeout=15)["content"]
    assert comms["status"] == "ok"


# --- a live session kernel and a person attached to it -------------------------------------------


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ExecuteCode, SessionScope]]:
    """A session-mode host in this process (synchronous facade on its own loop thread)."""
    config = ExecuteCodeConfig(
        enabled=True,
        kernel_mode="session",
        warm_kernels=0,
        python_path=sys.executable,
        timeout_ms=30_000,
    )
    tool = ExecuteCode(config)
    scope = SessionScope("jupyter-native", "agent", tmp_path_factory.mktemp("agent-cwd"))
    try:
        yield tool, scope
    finally:
        tool.close()


@pytest.fixture(scope="module")
def agent_kernel(host: tuple[ExecuteCode, SessionScope]) -> dict[str, Any]:
    """The agent's session kernel after its first call set ``agent_var``."""
    tool, scope = host
    result = tool.run_sync("agent_var = {'answer': 42}\nprint('agent call 1')", scope=scope)
    assert result.content == "agent call 1\n", result.content
    assert result.details["persistent"] is True
    return index_row(result.details["kernel_id"])


def _children_running(module: str, parent: int) -> list[int]:
    """Pids of ``python -m module`` processes whose parent is ``parent``."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError):
            continue
        if module.encode() in cmdline and ppid == parent:
            found.append(int(entry.name))
    return found


def _person(connection_file: str) -> Any:
    from jupyter_client import BlockingKernelClient

    kc = BlockingKernelClient()
    kc.load_connection_file(connection_file)
    kc.start_channels()
    kc.wait_for_ready(timeout=30)
    return kc


def _person_runs(kc: Any, code: str) -> tuple[str, dict[str, Any]]:
    """Execute ``code`` as a person would; return (stdout, reply content)."""
    out: list[str] = []

    def hook(msg: dict[str, Any]) -> None:
        if msg["msg_type"] == "stream":
            out.append(msg["content"]["text"])

    reply = kc.execute_interactive(code, output_hook=hook, timeout=30, allow_stdin=False)
    return "".join(out), reply["content"]


@pytest.mark.timeout(120)
def test_kernels_json_lists_the_running_kernel(agent_kernel: dict[str, Any]) -> None:
    proc = _lemon_exec("kernels", "--json")
    assert proc.returncode == 0, proc.stderr
    rows = [r for r in json.loads(proc.stdout) if r["id"] == agent_kernel["public_id"]]
    assert len(rows) == 1, proc.stdout
    row = rows[0]
    assert row["mode"] == "session"
    assert row["phase"] in ("idle", "running")
    assert row["cells"] >= 1
    assert row["host_pid"] == os.getpid()
    assert row["connection_file"] == agent_kernel["connection_file"]
    assert row["age_s"] >= row["idle_s"] >= 0

    table = _lemon_exec("kernels")
    assert table.returncode == 0
    assert agent_kernel["public_id"] in table.stdout
    assert table.stdout.splitlines()[0].split()[:3] == ["ID", "MODE", "PHASE"]


@pytest.mark.timeout(60)
def test_attach_print_names_the_connection_file(agent_kernel: dict[str, Any]) -> None:
    prefix = agent_kernel["public_id"][:8]
    proc = _lemon_exec("attach", prefix, "--print")
    assert proc.returncode == 0, proc.stderr
    argv = shlex.split(proc.stdout.strip())
    assert argv[-3:] == ["console", "--existing", agent_kernel["connection_file"]]

    missing = _lemon_exec("attach", "not-a-kernel-id", "--print")
    assert missing.returncode == 1
    assert "no live kernel id starts with" in missing.stderr


@pytest.mark.timeout(120)
def test_second_client_reads_agent_state_without_leaking(
    host: tuple[ExecuteCode, SessionScope], agent_kernel: dict[str, Any]
) -> None:
    tool, scope = host
    person = _person(agent_kernel["connection_file"])
    try:
        out, reply = _person_runs(
            person, "print('PERSON sees', agent_var['answer'])\nperson_var = 7"
        )
        assert reply["status"] == "ok"
        assert out == "PERSON sees 42\n"

        # A person's helper call in the agent's kernel: its host serves only the agent's
        # scripts, and the kernel starts no host of its own.
        code = "import os\ntry:\n    ls('.')\nexcept ToolError as e:\n    print(os.getpid(), e)"
        out, reply = _person_runs(person, code)
        pid, said = out.split(" ", 1)
        assert said == playground.MANAGED_NO_HOST + "\n"
        assert not _children_running(playground.HOST_MODULE, int(pid))

        # The agent's next call returns only its own output (and sees the shared namespace).
        result = tool.run_sync("print('agent call 2', person_var)", scope=scope)
        assert result.content == "agent call 2 7\n"
        assert result.details["kernel_reused"] is True

        # A person's execution sent while the agent's cell runs waits its turn in the kernel
        # and never shows up in the agent's result.
        pending: Future[Any] = Future()

        def agent() -> None:
            try:
                pending.set_result(
                    tool.run_sync(
                        "import time\nprint('agent call 3 start', flush=True)\ntime.sleep(0.8)\n"
                        "print('agent call 3 end')\ntext(f\"answer={agent_var['answer']}\")",
                        scope=scope,
                    )
                )
            except BaseException as exc:  # pragma: no cover - reported by the assert below
                pending.set_exception(exc)

        worker = threading.Thread(target=agent)
        worker.start()
        time.sleep(0.3)
        out, reply = _person_runs(person, "print('PERSON interleaved')")
        worker.join(timeout=60)
        third = pending.result(timeout=1)
        assert reply["status"] == "ok"
        assert out == "PERSON interleaved\n"
        assert third.content == (
            "Script result (text()):\nanswer=42\n\n"
            "Diagnostics (stdout/stderr, not the result):\n"
            "agent call 3 start\nagent call 3 end\n"
        )
        assert "PERSON" not in third.content

        fourth = tool.run_sync("text('agent call 4')", scope=scope)
        assert fourth.content == "Script result (text()):\nagent call 4"
        assert fourth.details["state_retained"] is True
        assert fourth.details["kernel_id"] == agent_kernel["public_id"]
    finally:
        person.stop_channels()


@pytest.mark.timeout(120)
def test_attached_client_cannot_shut_the_agents_kernel_down(
    host: tuple[ExecuteCode, SessionScope], agent_kernel: dict[str, Any]
) -> None:
    tool, scope = host
    person = _person(agent_kernel["connection_file"])
    try:
        # What `exit` in `jupyter console --existing` sends.
        reply = person.shutdown(restart=False, reply=True, timeout=15)["content"]
        assert reply["status"] == "error"
        assert "managed by lemon_exec" in reply["evalue"]
    finally:
        person.stop_channels()
    time.sleep(0.5)
    result = tool.run_sync("print(agent_var['answer'])", scope=scope)
    assert result.content == "42\n"
    assert result.details["kernel_reused"] is True


@pytest.mark.timeout(120)
def test_jupyter_console_existing(
    host: tuple[ExecuteCode, SessionScope], agent_kernel: dict[str, Any]
) -> None:
    pytest.importorskip("jupyter_console")
    tool, scope = host
    cmd = _jupyter("console", "--existing", agent_kernel["connection_file"], "--simple-prompt")
    proc = subprocess.run(
        cmd,
        input="print('console sees', agent_var['answer'])\n",
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert "console sees 42" in proc.stdout, proc.stdout + proc.stderr
    assert "keeping kernel alive" in proc.stdout  # end of input is Ctrl-D: the kernel stays

    after = tool.run_sync("text(agent_var['answer'])", scope=scope)
    assert after.content == "Script result (text()):\n42"
    assert after.details["kernel_reused"] is True


# --- the scenario plugin, end to end -------------------------------------------------------------


def _pytest_in(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_scenario_plugin_regenerates_and_detects_changes(tmp_path: Path) -> None:
    nbformat = pytest.importorskip("nbformat")
    from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

    folder = tmp_path / "notebooks"
    folder.mkdir()
    path = folder / "scenario.ipynb"
    nb = new_notebook(
        metadata={"lemon": {}},
        cells=[
            new_markdown_cell("# a tiny scenario"),
            new_code_cell("import os\nx = 1\ntext(f'x={x} in {os.getcwd()}')"),
            new_code_cell("text(x + 1)"),
            new_code_cell("raise SystemExit(2)", metadata={"lemon": {"expect": {"exit_code": 2}}}),
        ],
    )
    nbformat.write(nb, path)
    # An unrelated notebook next to it (no lemon metadata) is not collected.
    nbformat.write(new_notebook(cells=[new_code_cell("1 + 1")]), folder / "other.ipynb")

    regen = _pytest_in(tmp_path, "--lemon-regen")
    assert regen.returncode == 0, regen.stdout + regen.stderr
    assert "1 passed" in regen.stdout
    stored = nbformat.read(path, as_version=4)
    text_outputs = [
        "".join(o["data"]["text/plain"])
        for c in stored.cells
        if c.cell_type == "code"
        for o in c.outputs
        if o["output_type"] == "execute_result"
    ]
    assert text_outputs == [
        "Script result (text()):\nx=1 in <cwd>",
        "Script result (text()):\n2",
        "Script raised SystemExit: 2",  # a session's SystemExit is a cell error
    ]
    assert "<kernel-1>" in path.read_text()

    check = _pytest_in(tmp_path)
    assert check.returncode == 0, check.stdout + check.stderr

    stored.cells[2].source = "text(x + 2)"
    nbformat.write(stored, path)
    changed = _pytest_in(tmp_path)
    assert changed.returncode == 1
    assert "Results differ from the stored outputs" in changed.stdout
    assert "-  | 2" in changed.stdout and "+  | 3" in changed.stdout

    stored.cells[3].metadata["lemon"] = {"expect": "timed_out"}
    nbformat.write(stored, path)
    cli = _lemon_exec("notebook", "run", str(path), "--check", "-q")
    assert cli.returncode == 1
    assert "expected timed_out" in cli.stdout
    assert "MISMATCH cell 2" in cli.stdout


# --- a quiet kernel ------------------------------------------------------------------------------

#: What ipykernel prints to its terminal when it runs standalone (``ipython kernel``).
_BANNER_LINES = ("Ctrl-C will not work", "To connect another client to this kernel", "--existing")


@pytest.mark.parametrize("kernel", [KERNEL_NAME, "python3"])
def test_jupyter_execute_prints_nothing_of_the_kernel(tmp_path: Path, kernel: str) -> None:
    """A notebook run by ``jupyter execute`` (nbclient): the client's own stdout carries
    nothing from lemon-python's start, as with the stock python3 kernel beside it."""
    nbformat = pytest.importorskip("nbformat")
    from nbformat.v4 import new_code_cell, new_notebook

    nb = new_notebook(
        cells=[new_code_cell("x = 6 * 7")],
        metadata={"kernelspec": {"name": kernel, "display_name": kernel, "language": "python"}},
    )
    path = tmp_path / "quiet.ipynb"
    nbformat.write(nb, path)
    done = subprocess.run(
        [*_jupyter("execute", f"--kernel_name={kernel}", str(path))],
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    for line in _BANNER_LINES:
        assert line not in done.stdout, done.stdout
        assert line not in done.stderr, done.stderr
    assert done.stdout == "", done.stdout
