"""The shell built in the fork-server template (kernel/prebuilt.py, issue 17).

A forked session kernel runs on the template's shell when it would have built the same one,
and that shell is the kernel's own: its kernel, working directory, environment variables,
history, and IPython's ``%reset --aggressive``. A kernel whose environment changed since
the template started builds its own shell and behaves the same.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from lemon_exec import ExecuteCode, ExecuteCodeConfig, SessionScope
from lemon_exec.host.local_backend import LocalBackend
from lemon_exec.kernel.prebuilt import _ModuleNames

pytestmark = pytest.mark.timeout(120)

PROBE = """
import json, os
from lemon_exec.kernel import prebuilt
shell = get_ipython()
shell.run_line_magic("history", "-l 1")  # the history database answers
print(json.dumps({
    "adopted": prebuilt.adopted,
    "kernel_is_parent": shell.kernel is shell.parent and shell.kernel is not None,
    "kernel_shell": shell.kernel.shell is shell,
    "starting_dir": shell.starting_dir,
    "dir_hist": [str(p) for p in shell.history_manager.dir_hist],
    "cwd": os.getcwd(),
    "pager": os.environ.get("PAGER"),
    "managed": os.environ.get("LEMON_EXEC_MANAGED"),
    "pid": os.getpid(),
    "ppid": os.getppid(),
}))
"""

RESET = """
import this_module_is_new_here  # noqa: F401  (on the kernel's path: see the test)
get_ipython().reset(new_session=False, aggressive=True)
import json, sys  # the namespace was reset too
print(json.dumps({
    "new_module_unloaded": "this_module_is_new_here" not in sys.modules,
    "kernel_modules_kept": all(m in sys.modules for m in ("json", "ipykernel", "lemon_exec")),
}))
"""


def _last_json(content: str) -> dict:
    return json.loads(content.strip().splitlines()[-1])


async def _started_template(ec: ExecuteCode, scope: SessionScope) -> int:
    """Run once (which starts the fork server) and wait until the template is ready."""
    await ec.run("pass", scope=scope)
    engine = ec._engine
    assert engine is not None and isinstance(engine.backend, LocalBackend)
    server = next(iter(engine.backend._forkservers.values()))
    assert await server.wait_ready(20)
    assert server._proc is not None
    return server._proc.pid


def test_a_forked_kernel_adopts_the_template_shell_as_its_own(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "this_module_is_new_here.py").write_text("VALUE = 1\n")

    async def main() -> None:
        config = ExecuteCodeConfig(enabled=True, kernel_mode="session", warm_kernels=0)
        async with ExecuteCode(config) as ec:
            template = await _started_template(ec, SessionScope("first", cwd=str(work)))
            scope = SessionScope("adopting", cwd=str(work))
            result = await ec.run(PROBE, scope=scope)
            assert not result.details.get("error"), result.content
            info = _last_json(result.content)
            assert info["ppid"] == template  # forked, not launched cold
            assert info["adopted"] is True
            assert info["kernel_is_parent"] and info["kernel_shell"]
            # What the template's shell knew of its own process is this kernel's now.
            assert info["starting_dir"] == info["cwd"] == str(work)
            assert info["dir_hist"] == [str(work)]
            assert info["pager"] == "cat"  # set again in the kernel's own environment
            assert info["managed"] == "1"
            reset = await ec.run(RESET, scope=scope)
            assert not reset.details.get("error"), reset.content
            assert _last_json(reset.content) == {
                "new_module_unloaded": True,
                "kernel_modules_kept": True,
            }

    asyncio.run(main())


def test_a_kernel_whose_environment_changed_builds_its_own_shell(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def main() -> None:
        config = ExecuteCodeConfig(enabled=True, kernel_mode="session", warm_kernels=0)
        async with ExecuteCode(config) as ec:
            template = await _started_template(ec, SessionScope("first", cwd=str(tmp_path)))
            # Not a variable the fork server restarts for (PYTHON*, LD_*, ...): the same
            # template forks the kernel, whose shell would differ (IPython reads HOME).
            monkeypatch.setenv("HOME", str(tmp_path))
            result = await ec.run(PROBE, scope=SessionScope("changed", cwd=str(tmp_path)))
            assert not result.details.get("error"), result.content
            info = _last_json(result.content)
            assert info["ppid"] == template
            assert info["adopted"] is False
            assert info["kernel_is_parent"] and info["kernel_shell"]
            assert info["starting_dir"] == str(tmp_path)
            assert info["pager"] == "cat"

    asyncio.run(main())


def test_module_names_work_as_the_set_ipython_subtracts() -> None:
    names = _ModuleNames(frozenset({"os", "sys"}), {"sys", "mine"})
    assert len(names) == 3 and set(names) == {"os", "sys", "mine"}
    assert "os" in names and "mine" in names and "other" not in names
    # IPython's %reset --aggressive: the modules loaded since the start.
    assert {"os", "mine", "later", "json"} - names == {"later", "json"}
    assert isinstance({"later"} - names, set)
