"""The shell built in the fork-server template (kernel/prebuilt.py, issue 17).

A forked session kernel runs on the template's shell when it would have built the same one,
and that shell is the kernel's own: its kernel, working directory, environment variables,
history, and IPython's ``%reset --aggressive``. A kernel whose environment changed since
the template started builds its own shell and behaves the same.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from lemon_exec import ExecuteCode, ExecuteCodeConfig, SessionScope
from lemon_exec.kernel.prebuilt import _ModuleNames

pytestmark = [pytest.mark.timeout(120), pytest.mark.kernel]

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
    template = await ec.diagnostics.wait_template(20)
    assert template is not None and template.pid is not None
    return template.pid


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


TEMPLATE_WORK = """
import json, logging
from ipykernel import ipkernel, kernelbase
from lemon_exec.kernel import app, helpers, ipykernel_patches, prebuilt
shell = get_ipython()
kernel = shell.kernel
log = logging.getLogger("LemonKernelApp")
print(json.dumps({
    "adopted": prebuilt.adopted,
    "preloaded": sorted(prebuilt.loaded_extensions()),
    "store_loaded": sorted(shell.extension_manager.loaded),
    "store_magic": "store" in shell.magics_manager.magics["line"],
    "log_handlers_kept": [id(h) for h in log.handlers]
    == [id(h) for h in app._applied_logging[1]],
    "log_handlers": len(log.handlers),
    "log_debug_enabled": log.isEnabledFor(logging.DEBUG),
    "memoized": kernelbase._accepts_parameters is ipykernel_patches.signature_check
    and ipkernel._accepts_parameters is ipykernel_patches.signature_check,
    "accepts": kernel._do_exec_accepted_params,
    "accepts_uncached": ipykernel_patches._accepts_parameters(
        kernel.do_execute, ["cell_meta", "cell_id"]
    ),
    "tools_key": repr(helpers._tools_cache[0]),
    "search": list(tools.search("read")),
}))
"""


def test_what_the_template_did_for_every_kernel_is_the_kernels(tmp_path: Path) -> None:
    """Extensions, logging, the helpers' ``tools`` object, ipykernel's signature checks.

    The template does each once (a forked kernel would do it the same way); the kernel
    finds them done and working, as a cold kernel would have made them.
    """

    async def main() -> None:
        config = ExecuteCodeConfig(enabled=True, kernel_mode="session", warm_kernels=0)
        async with ExecuteCode(config) as ec:
            template = await _started_template(ec, SessionScope("first", cwd=str(tmp_path)))
            result = await ec.run(
                TEMPLATE_WORK + "\nimport os\nprint(os.getppid())",
                scope=SessionScope("work", cwd=str(tmp_path)),
            )
            assert not result.details.get("error"), result.content
            lines = result.content.strip().splitlines()
            assert int(lines[-1]) == template
            info = json.loads(lines[-2])
            assert info["adopted"] is True
            assert info["preloaded"] == ["storemagic"]
            assert info["store_loaded"] == ["IPython.extensions.storemagic"]  # once
            assert info["store_magic"] is True
            assert info["log_handlers_kept"] is True and info["log_handlers"] == 1
            assert info["log_debug_enabled"] is False  # no record built for a debug call
            assert info["memoized"] is True
            assert info["accepts"] == info["accepts_uncached"]
            assert info["tools_key"] == repr((("read", "grep", "find", "ls", "webfetch"), None))
            assert info["search"] and info["search"][0].startswith("read(")

    asyncio.run(main())


_LOGGING_PROBE = """
import logging, sys
from lemon_exec.kernel import app
first = app.LemonKernelApp()
first.log  # configures logging
handlers = list(logging.getLogger("LemonKernelApp").handlers)
second = app.LemonKernelApp()
second.log  # the same configuration: nothing rebuilt
same = logging.getLogger("LemonKernelApp").handlers == handlers
second.log_level = logging.DEBUG  # another configuration: applied
changed = logging.getLogger("LemonKernelApp").handlers != handlers
level = logging.getLogger("LemonKernelApp").handlers[0].level
print(same, changed, len(handlers), level == logging.DEBUG)
"""


_LEVEL_PROBE = """
import io, logging, sys
from lemon_exec.kernel import app
made = []
factory = logging.getLogRecordFactory()
logging.setLogRecordFactory(lambda *a, **k: made.append(a[1]) or factory(*a, **k))
kernel_app = app.LemonKernelApp()
log = kernel_app.log
log.debug("dropped before a record is built")
log.warning("kept")
quiet = list(made)
kernel_app.log_level = logging.DEBUG
log.handlers[0].stream = out = io.StringIO()
log.debug("now shown")
print(quiet == [logging.WARNING], made[-1] == logging.DEBUG, "now shown" in out.getvalue())
"""


def test_a_debug_call_builds_no_record_unless_debug_output_is_on() -> None:
    out = subprocess.run(
        [sys.executable, "-c", _LEVEL_PROBE], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "True", "True"]


def test_logging_is_configured_again_only_when_its_configuration_changes() -> None:
    out = subprocess.run(
        [sys.executable, "-c", _LOGGING_PROBE], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "True", "1", "True"]


CONFIG_PROBE = """
import json, os
from lemon_exec.kernel import prebuilt
from lemon_exec.kernel.app import LemonKernelApp
app = LemonKernelApp.instance()
shell = get_ipython()
print(json.dumps({
    # The adopted shell has the template's profile directory: so has the application,
    # when it took the template's configuration phase over.
    "phase_from_template": app.profile_dir is shell.profile_dir,
    "adopted": prebuilt.adopted,
    "loaded": app.loaded_config_files,
    "xmode": shell.xmode,
    "ppid": os.getppid(),
}))
"""


def test_a_configuration_file_written_after_the_template_started_is_loaded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The template's configuration phase is a kernel's only while no config file exists."""
    ipython_dir = tmp_path / "ipython"
    monkeypatch.setenv("IPYTHONDIR", str(ipython_dir))

    async def main() -> None:
        config = ExecuteCodeConfig(enabled=True, kernel_mode="session", warm_kernels=0)
        async with ExecuteCode(config) as ec:
            template = await _started_template(ec, SessionScope("first", cwd=str(tmp_path)))
            before = await ec.run(CONFIG_PROBE, scope=SessionScope("before", cwd=str(tmp_path)))
            assert not before.details.get("error"), before.content
            info = _last_json(before.content)
            assert info["ppid"] == template
            assert info["phase_from_template"] is True and info["adopted"] is True
            assert info["loaded"] == [] and info["xmode"] == "Context"

            config_file = ipython_dir / "profile_default" / "ipython_config.py"
            config_file.write_text("c.InteractiveShell.xmode = 'Plain'\n")
            after = await ec.run(CONFIG_PROBE, scope=SessionScope("after", cwd=str(tmp_path)))
            assert not after.details.get("error"), after.content
            info = _last_json(after.content)
            assert info["ppid"] == template  # still forked
            assert info["adopted"] is False  # another configuration: its own shell too
            assert info["loaded"] == [str(config_file)]
            assert info["xmode"] == "Plain"

    asyncio.run(main())
