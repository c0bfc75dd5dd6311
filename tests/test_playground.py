"""The kernel's own host: real helpers in a lemon-python notebook that Jupyter itself started.

Each test starts lemon-python the way a Jupyter front end does (nbclient, jupyter_client's
KernelManager, Jupyter Server's REST API), with no lemon_exec host, and checks what
docs/playground.md promises: helpers work cell by cell with one run's budgets per cell, the
notice says where they come from (once), ``LEMON_EXEC_MCP_CONFIG``'s tools appear under
``tools``, an interrupted helper call leaves the next cell working, and the host process
ends with its kernel however the kernel ends.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nbformat
import pytest
from jupyter_client import KernelManager
from mcp_upstream import serving_http
from nbclient import NotebookClient
from nbformat.v4 import new_code_cell, new_notebook
from support import wait_until
from support_jupyter import ExternalKernelServer
from test_jupyter_server import _collect, _send_execute

from lemon_exec.wire import playground as pg

pytestmark = [pytest.mark.timeout(180), pytest.mark.kernel]

KERNEL = "lemon-python"
SERVER = str(Path(__file__).parent / "mcp_upstream" / "server.py")


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    (tmp_path / "a.txt").write_text("alpha\nbeta\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.py").write_text("print('b')\n")
    return tmp_path


def run_notebook(sources: list[str], cwd: Path) -> list[Any]:
    """Execute the cells with nbclient on lemon-python in ``cwd``; the executed cells."""
    nb = new_notebook(cells=[new_code_cell(source) for source in sources])
    client = NotebookClient(
        nb, kernel_name=KERNEL, timeout=60, resources={"metadata": {"path": str(cwd)}}
    )
    client.execute()
    nbformat.validate(nb)
    return list(nb.cells)


def stream(cell: Any, name: str) -> str:
    return "".join(
        o["text"] for o in cell.outputs if o["output_type"] == "stream" and o["name"] == name
    )


def playground_hosts(parent: int | None = None) -> list[int]:
    """Pids of running playground hosts (children of ``parent`` only, when given)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if pg.HOST_MODULE.encode() not in cmdline:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if parent is None or ppid == parent:
            found.append(int(entry.name))
    return found


def test_a_notebook_calls_the_real_helpers_with_budgets_per_cell(
    workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LEMON_EXECUTE_CODE_MAX_RPC_CALLS", "3")
    cells = run_notebook(
        [
            "print(sorted(ls('.').split()))",
            "print(read('a.txt'))\nprint(grep('beta'))\nprint(find('**/*.py'))",
            "print(batch([('grep', {'pattern': 'alp'}), ('ls', {'path': 'sub'})]))",
            "text('for the model')\nnotify('half way')",
            # A fourth call in one cell is over max_rpc_calls (3): a ToolError, caught.
            "for i in range(4):\n"
            "    try:\n"
            "        ls('.')\n"
            "    except ToolError as exc:\n"
            "        print(i, exc)",
            # The next cell has a budget of its own.
            "print([len(ls('.')) > 0 for _ in range(3)])",
            "import os\nos.chdir('sub')\nprint(ls('.'))",
            "try:\n    read('missing.txt')\nexcept ToolError as exc:\n    print('ToolError:', exc)",
        ],
        workdir,
    )
    assert stream(cells[0], "stdout") == "['a.txt', 'sub/']\n"
    assert stream(cells[0], "stderr") == pg.NOTICE + "\n"
    assert all(pg.NOTICE not in stream(cell, "stderr") for cell in cells[1:]), "noticed once"
    assert stream(cells[1], "stdout") == "alpha\nbeta\n\na.txt:2:beta\nsub/b.py\n"
    assert stream(cells[2], "stdout") == "['a.txt:1:alpha', 'b.py']\n"
    assert stream(cells[3], "stdout") == "for the model\n"
    assert stream(cells[3], "stderr") == "notify: half way\n"
    over = stream(cells[4], "stdout")
    assert over == "3 rpc call limit exceeded (max 3 calls per script)\n"
    assert stream(cells[5], "stdout") == "[True, True, True]\n"
    assert stream(cells[6], "stdout") == "b.py\n"
    assert stream(cells[7], "stdout").startswith("ToolError: read: no such file")
    assert not [o for cell in cells for o in cell.outputs if o["output_type"] == "error"]


@pytest.mark.slow
def test_the_mcp_config_tools_are_there_from_the_first_cell(
    workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with serving_http(SERVER) as url:
        config = workdir / "mcp.json"
        config.write_text(json.dumps({"mcpServers": {"up": {"type": "http", "url": url}}}))
        monkeypatch.setenv(pg.MCP_CONFIG_ENV, str(config))
        cells = run_notebook(
            [
                "print(tools.up.add(a=20, b=22)['sum'])",
                "print(batch([('up.echo', {'text': 'hi', 'times': 2})]))",
            ],
            workdir,
        )
    assert stream(cells[0], "stdout") == "42\n"
    assert stream(cells[1], "stdout") == "['hihi']\n"


@pytest.fixture
def kernel(workdir: Path) -> Iterator[tuple[KernelManager, Any]]:
    km = KernelManager(kernel_name=KERNEL)
    km.start_kernel(cwd=str(workdir))
    kc = km.client()
    kc.start_channels()
    kc.wait_for_ready(timeout=60)
    try:
        yield km, kc
    finally:
        kc.stop_channels()
        if km.is_alive():
            km.shutdown_kernel(now=True)


def run(kc: Any, code: str, timeout: float = 60) -> tuple[str, dict[str, Any]]:
    out: list[str] = []

    def hook(msg: dict[str, Any]) -> None:
        if msg["msg_type"] == "stream":
            out.append(msg["content"]["text"])

    reply = kc.execute_interactive(code, output_hook=hook, timeout=timeout, allow_stdin=False)
    return "".join(out), reply["content"]


def kernel_pid(km: KernelManager) -> int:
    pid = getattr(km.provisioner, "pid", None)
    assert isinstance(pid, int)
    return pid


@pytest.mark.parametrize("how", ["shutdown", "killed"])
def test_the_host_ends_with_its_kernel(kernel: tuple[KernelManager, Any], how: str) -> None:
    km, kc = kernel
    out, reply = run(kc, "print(ls('.').split())")
    assert reply["status"] == "ok", reply
    assert out.endswith("['a.txt', 'sub/']\n")
    [host] = playground_hosts(kernel_pid(km))
    base = Path(f"/tmp/lemon-exec.{os.getuid()}")
    assert not list(base.glob("lemon-exec-playground-*")), "its link directory goes at once"
    if how == "killed":
        os.kill(kernel_pid(km), signal.SIGKILL)
    else:
        km.shutdown_kernel()
    assert wait_until(lambda: not Path(f"/proc/{host}").exists() or _zombie(host), 15)


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_an_interrupted_helper_call_leaves_the_next_cell_working(
    kernel: tuple[KernelManager, Any], workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    km, kc = kernel
    with serving_http(SERVER) as url:
        config = workdir / "mcp.json"
        config.write_text(json.dumps({"mcpServers": {"up": {"type": "http", "url": url}}}))
        # The kernel fixture started already: the tools come from the host's environment.
        out, reply = run(kc, f"import os\nos.environ[{pg.MCP_CONFIG_ENV!r}] = {str(config)!r}")
        assert reply["status"] == "ok"
        out, reply = run(kc, "print(tools.up.add(a=1, b=1)['sum'])")  # the host has started
        assert out.endswith("2\n"), out
        msg_id = kc.execute("print('calling', flush=True)\nprint(tools.up.slow(ms=30000))")
        assert kc.get_iopub_msg(timeout=30)  # busy, then the cell's own output:
        while (msg := kc.get_iopub_msg(timeout=30))["msg_type"] != "stream":
            pass
        assert msg["content"]["text"] == "calling\n"
        time.sleep(0.5)  # the call is on its way: the interrupt lands while it waits
        km.interrupt_kernel()
        reply = kc.get_shell_msg(timeout=30)
        assert reply["parent_header"]["msg_id"] == msg_id
        assert reply["content"]["status"] == "error"
        assert reply["content"]["ename"] == "KeyboardInterrupt"
        out, reply = run(kc, "print(tools.up.add(a=1, b=2)['sum'], ls('.').split())")
    assert reply["status"] == "ok", reply
    assert out.endswith("3 ['a.txt', 'mcp.json', 'sub/']\n")


def test_turned_off_the_helpers_say_how_to_turn_it_on(
    workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(pg.ENABLE_ENV, "0")
    [cell] = run_notebook(["try:\n    ls('.')\nexcept ToolError as exc:\n    print(exc)"], workdir)
    assert stream(cell, "stdout") == pg.DISABLED_NO_HOST + "\n"
    assert not playground_hosts()


@pytest.mark.slow
def test_a_kernel_jupyter_server_started_serves_its_helpers(workdir: Path) -> None:
    external = workdir / "external"
    external.mkdir(mode=0o700)
    server = ExternalKernelServer(workdir, external)
    try:
        # As JupyterLab opens a notebook: a session, whose kernel runs in the notebook's folder.
        body = {"path": "play.ipynb", "type": "notebook", "kernel": {"name": KERNEL}}
        status, session = server.request("POST", "/api/sessions", body)
        assert status == 201, session
        kernel = session["kernel"]
        with server.ws(kernel["id"]) as ws:
            out, reply = _collect(
                ws, _send_execute(ws, "print(sorted(ls('.').split()))"), timeout=60
            )
        assert reply["status"] == "ok", reply
        assert "'a.txt'" in out and "'sub/'" in out, out
        status, _ = server.request("DELETE", f"/api/sessions/{session['id']}")
        assert status == 204
    finally:
        server.stop()
    assert wait_until(lambda: not playground_hosts(), 15), "the host ended with its kernel"


def test_a_host_that_cannot_start_is_a_tool_error(
    workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(pg.MCP_CONFIG_ENV, str(workdir / "no-such-mcp.json"))
    [first, second] = run_notebook(
        [
            "try:\n    ls('.')\nexcept ToolError as exc:\n    print(exc)",
            "print('still here')",
        ],
        workdir,
    )
    said = stream(first, "stdout")
    assert said.startswith("the playground host could not start: ")
    assert "no-such-mcp.json" in said
    assert stream(second, "stdout") == "still here\n"
