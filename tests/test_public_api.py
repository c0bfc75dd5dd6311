"""The public surface of ``lemon_exec``: what ``__all__`` exports and how the facade behaves."""

from __future__ import annotations

import asyncio
import importlib
import importlib.metadata
import inspect
import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import lemon_exec
from lemon_exec import (
    ConfigError,
    ExecuteCode,
    ExecuteCodeConfig,
    ExecuteCodeResult,
    InterpreterError,
    KernelError,
    KernelStartError,
    LemonExecError,
    RefusedError,
    SessionBusyError,
    ToolDenied,
    ToolFailure,
)

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parents[1]
README_LIST = "Every public name is in `lemon_exec.__all__`:"


def documented_names() -> set[str]:
    """The public names the README's "Python API" lists (the paragraph that starts with
    README_LIST): every name in backquotes there that is an identifier."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    start = readme.index(README_LIST)
    paragraph = readme[start : readme.index("\n\n", start)]
    return {word for word in re.findall(r"`([^`]+)`", paragraph) if word.isidentifier()}


DOCUMENTED = documented_names()


def test_all_matches_the_documented_names() -> None:
    assert len(lemon_exec.__all__) == len(set(lemon_exec.__all__)), "duplicates in __all__"
    assert set(lemon_exec.__all__) == DOCUMENTED


def test_dir_is_all() -> None:
    assert dir(lemon_exec) == sorted(lemon_exec.__all__)


def test_nothing_private_is_exported() -> None:
    private = [n for n in lemon_exec.__all__ if n.startswith("_") and n != "__version__"]
    assert private == []


@pytest.mark.parametrize("name", sorted(DOCUMENTED))
def test_every_exported_name_imports(name: str) -> None:
    value = getattr(lemon_exec, name)
    assert value is not None
    namespace: dict[str, object] = {}
    exec(f"from lemon_exec import {name}", namespace)
    assert namespace[name] is value
    if inspect.isclass(value) or inspect.isfunction(value):
        assert value.__module__.startswith("lemon_exec."), f"{name} is not lemon_exec's own"


def test_types_callers_hold_are_defined_in_public_modules() -> None:
    # A runtime holds these; the module that defines them must be one it may import.
    assert lemon_exec.SessionOwner.__module__ == "lemon_exec.session"
    assert lemon_exec.ScriptSource.__module__ == "lemon_exec.scope"
    assert lemon_exec.SessionScope.__module__ == "lemon_exec.scope"
    assert lemon_exec.AbortSignal is importlib.import_module("lemon_exec.scope").AbortSignal


def test_public_run_takes_no_private_arguments() -> None:
    for method in (ExecuteCode.run, lemon_exec.SessionOwner.run):
        private = [p for p in inspect.signature(method).parameters if p.startswith("_")]
        assert private == [], f"{method.__qualname__} takes private arguments {private}"


def test_unknown_attribute_raises_attribute_error() -> None:
    with pytest.raises(AttributeError):
        _ = lemon_exec.NoSuchThing
    with pytest.raises(ImportError):
        exec("from lemon_exec import _EXPORTS_NOT_THERE", {})


def test_version_matches_the_installed_metadata() -> None:
    assert lemon_exec.__version__ == importlib.metadata.version("lemon_exec")


def test_importing_the_package_and_listing_its_names_stays_lazy() -> None:
    # The kernel imports lemon_exec.kernel, which runs lemon_exec/__init__.py: that must not
    # pull in the host side. What the kernel side itself imports is tests/test_layering.py's.
    probe = textwrap.dedent(
        """
        import json, sys
        import lemon_exec
        heavy = ("jupyter_client", "traitlets", "zmq", "lemon_exec.facade", "lemon_exec.config")
        after_import = sorted(m for m in heavy if m in sys.modules)
        listed = (lemon_exec.__all__, dir(lemon_exec))
        after_listing = sorted(m for m in heavy if m in sys.modules)
        print(json.dumps({"after_import": after_import, "after_listing": after_listing}))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    found = json.loads(done.stdout)
    assert found == {"after_import": [], "after_listing": []}


def test_the_exception_tree_in_the_docs_is_exported() -> None:
    doc = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    section = doc[doc.index("## Exceptions") :]
    tree = section[section.index("```") : section.index("```", section.index("```") + 3)]
    drawn = set(re.findall(r"^[\s│├└─]*([A-Z]\w+)", tree, re.MULTILINE))
    assert "LemonExecError" in drawn and "ToolDenied" in drawn
    assert drawn <= DOCUMENTED


def test_star_import_gives_every_public_name() -> None:
    namespace: dict[str, object] = {}
    exec("from lemon_exec import *", namespace)
    assert set(namespace) - {"__builtins__"} == DOCUMENTED


def test_exception_tree() -> None:
    expected_parents = {
        ConfigError: LemonExecError,
        RefusedError: LemonExecError,
        KernelError: LemonExecError,
        KernelStartError: KernelError,
        SessionBusyError: LemonExecError,
        ToolFailure: LemonExecError,
        ToolDenied: ToolFailure,
    }
    for cls, parent in expected_parents.items():
        assert issubclass(cls, parent), (cls, parent)
    # An unusable interpreter is both a start failure and a configuration problem.
    assert issubclass(InterpreterError, KernelStartError)
    assert issubclass(InterpreterError, ConfigError)
    assert issubclass(LemonExecError, Exception)
    assert not issubclass(RefusedError, KernelError)


def test_result_shape() -> None:
    result = ExecuteCodeResult("out\n", {"exit_code": 0}, "trusted")
    assert result.to_dict() == {"content": "out\n", "details": {"exit_code": 0}, "trust": "trusted"}
    assert result.ok
    assert not ExecuteCodeResult("x", {"exit_code": 1}).ok
    assert not ExecuteCodeResult("x", {"exit_code": None, "error": True}).ok


def test_library_default_is_disabled(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LEMON_EXECUTE_CODE_ENABLED", raising=False)
    assert ExecuteCodeConfig().enabled is False
    assert ExecuteCodeConfig.load().enabled is False
    assert ExecuteCodeConfig.load(default_enabled=True).enabled is True
    off = {"LEMON_EXECUTE_CODE_ENABLED": "0"}
    assert ExecuteCodeConfig.load(environ=off, default_enabled=True).enabled is False
    tool = ExecuteCode()  # config from the (empty) environment: disabled
    try:
        result = tool.run_sync("print('must not run')")
    finally:
        tool.close()
    assert result.content.startswith("execute_code is disabled")
    assert not result.ok


# --- schema --------------------------------------------------------------------------------------


def test_schema_shape() -> None:
    schema = ExecuteCode(ExecuteCodeConfig(enabled=True, timeout_ms=30_000)).schema()
    assert set(schema) == {"name", "description", "input_schema"}
    assert schema["name"] == "execute_code"
    params = schema["input_schema"]
    assert params["type"] == "object"
    assert set(params["properties"]) == {"script", "timeout_ms", "reset"}
    assert params["required"] == ["script"]
    assert params["properties"]["script"]["type"] == "string"
    assert params["properties"]["timeout_ms"]["type"] == "integer"
    assert params["properties"]["timeout_ms"]["minimum"] == 1000
    assert params["properties"]["timeout_ms"]["maximum"] == 30_000
    assert params["properties"]["reset"]["type"] == "boolean"
    json.dumps(schema)  # plain JSON, ready for any tool-calling API


def test_schema_description_follows_the_config() -> None:
    def describe(**settings: object) -> str:
        return ExecuteCode(ExecuteCodeConfig(enabled=True, **settings)).schema()["description"]

    narrowed = describe(tools=["read", "grep"], max_rpc_calls=7)
    assert "read(" in narrowed and "grep(" in narrowed
    assert "webfetch(" not in narrowed and "ls(" not in narrowed
    assert "7 helper calls" in narrowed
    full = describe()
    for helper in ("read(", "grep(", "find(", "ls(", "webfetch("):
        assert helper in full
    # Identical configs give byte-identical descriptions; a different limit does not.
    assert describe(timeout_ms=5000) == describe(timeout_ms=5000)
    assert describe(timeout_ms=5000) != describe(timeout_ms=6000)


# --- the async API -------------------------------------------------------------------------------


@pytest.mark.kernel
def test_async_context_manager_runs_and_cleans_up() -> None:
    config = ExecuteCodeConfig(enabled=True, warm_kernels=0, python_path=sys.executable)

    async def main() -> tuple[ExecuteCodeResult, ExecuteCodeResult, list[str], Path]:
        updates: list[str] = []
        async with ExecuteCode(config) as tool:
            first = await tool.run(
                "notify('working')\nprint('printed')\ntext('the result')", on_update=updates.append
            )
            abort = asyncio.Event()
            asyncio.get_running_loop().call_later(1.5, abort.set)
            second = await tool.run("import time\ntime.sleep(30)", abort=abort)
            root = tool.diagnostics.staging_root
            assert root is not None
        with pytest.raises(RuntimeError):
            await tool.run("print(1)")
        return first, second, updates, root

    first, second, updates, root = asyncio.run(main())
    assert first.content == (
        "Script result (text()):\nthe result\n\n"
        "Diagnostics (stdout/stderr, not the result):\nprinted\n"
    )
    assert first.ok and first.trust == "trusted"
    assert updates == ["notify: working"]
    assert second.content.startswith("Script cancelled.")
    assert second.details["cancelled"] is True
    assert not root.exists(), "leaving `async with` must remove the staging root"


def test_run_sync_refuses_to_run_inside_an_event_loop() -> None:
    tool = ExecuteCode(ExecuteCodeConfig(enabled=True))

    async def main() -> None:
        with pytest.raises(RuntimeError, match="await run"):
            tool.run_sync("print(1)")

    try:
        asyncio.run(main())
    finally:
        tool.close()
