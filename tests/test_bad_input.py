"""Bad input gets a clear refusal (or a documented clamp): never an exception, never a wait.

Each test is a regression test for one item of issue 10, run against real kernels where a
kernel is involved: a missing or non-directory cwd, a NaN or infinite ``timeout_ms``,
``timeout_ms = 0`` and ``warm_kernels = 1000`` in the config, a UTF-8 BOM before the script, a
kernel that cannot start in time, and a script that deletes the host's staging root.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import stat
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support import enabled_config, wait_until

from lemon_exec import ExecuteCode, ExecuteCodeConfig, ExecuteCodeResult, SessionScope
from lemon_exec.config import MAX_WARM_KERNELS, MIN_TIMEOUT_MS
from lemon_exec.facade import MISSING_SCRIPT, NAN_TIMEOUT
from lemon_exec.host.kernels import engine as engine_module

pytestmark = [pytest.mark.timeout(60), pytest.mark.kernel]

TIMEOUT_MS = 10_000


def make_config(**overrides: Any) -> ExecuteCodeConfig:
    """An enabled config for this module (see support.enabled_config)."""
    return enabled_config(**{"timeout_ms": TIMEOUT_MS, **overrides})


@pytest.fixture(scope="module")
def tool() -> Iterator[ExecuteCode]:
    facade = ExecuteCode(make_config())
    try:
        yield facade
    finally:
        facade.close()


def refused(result: ExecuteCodeResult) -> None:
    assert result.details["error"] is True
    assert result.details["exit_code"] is None
    assert not result.ok


# --- the working directory ------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["per_call", "session"])
def test_missing_cwd_is_refused_at_once_naming_the_path(mode: str, tmp_path: Path) -> None:
    missing = tmp_path / "no" / "such" / "dir"
    with ExecuteCode(make_config(kernel_mode=mode)) as facade:
        started = time.monotonic()
        result = facade.run_sync("print('must not run')", scope=SessionScope("s", cwd=missing))
        elapsed = time.monotonic() - started
    refused(result)
    assert str(missing) in result.content
    assert "does not exist" in result.content
    assert "must not run" not in result.content
    # Refused up front: long before the call's 30 s timeout.
    assert elapsed < 15, f"a missing cwd took {elapsed:.1f} s to refuse"


def test_cwd_that_is_a_file_is_refused(tool: ExecuteCode, tmp_path: Path) -> None:
    a_file = tmp_path / "notes.txt"
    a_file.write_text("x", encoding="utf-8")
    result = tool.run_sync("print('must not run')", scope=SessionScope("s", cwd=a_file))
    refused(result)
    assert f"{a_file} is not a directory" in result.content


def test_cwd_that_is_not_a_path_is_refused(tool: ExecuteCode) -> None:
    result = tool.run_sync("print(1)", scope=SessionScope("s", cwd="bad\0path"))
    refused(result)
    assert "is not a usable path" in result.content


def test_relative_cwd_is_taken_from_the_host_cwd(
    tool: ExecuteCode, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path)
    result = tool.run_sync("import os; print(os.getcwd())", scope=SessionScope("s", cwd="sub"))
    assert result.ok, result.content
    assert result.content.strip() == str(tmp_path / "sub")


# --- timeout_ms ---------------------------------------------------------------------------------


def test_nan_timeout_is_refused(tool: ExecuteCode) -> None:
    result = tool.run_sync("print('must not run')", timeout_ms=math.nan)
    refused(result)
    assert result.content == NAN_TIMEOUT


@pytest.mark.parametrize(("requested", "expected_ms"), [(math.inf, 2000), (-math.inf, 1000)])
def test_infinite_timeout_is_clamped(requested: float, expected_ms: int) -> None:
    with ExecuteCode(make_config(timeout_ms=2000)) as facade:
        result = facade.run_sync("while True:\n    pass\n", timeout_ms=requested)
    assert result.content.startswith(f"Script timed out after {expected_ms}ms."), result.content
    assert result.details["timed_out"] is True


def test_config_timeout_zero_gets_the_one_second_floor() -> None:
    config = make_config(timeout_ms=0)
    assert config.timeout_ms == 1  # stored clamped to a positive integer, as the spec says
    assert config.run_timeout_ms == MIN_TIMEOUT_MS
    config.warm_kernels = 1  # a warm spare: the 1 s must not be spent on a cold start
    with ExecuteCode(config) as facade:
        assert facade.schema()["input_schema"]["properties"]["timeout_ms"]["maximum"] == 1000
        facade.run_sync("pass")  # starts the fork server and the spare
        wait_until(lambda: facade.diagnostics.spares >= 1, 20)
        result = facade.run_sync("import time\ntime.sleep(0.2)\nprint('ran')")
    assert result.ok, result.content
    assert result.content == "ran\n"


# --- warm_kernels -------------------------------------------------------------------------------


def test_warm_kernels_is_clamped_to_its_maximum(tmp_path: Path) -> None:
    assert MAX_WARM_KERNELS == 8
    assert ExecuteCodeConfig(warm_kernels=1000).warm_kernels == MAX_WARM_KERNELS
    env = {"LEMON_EXECUTE_CODE_WARM_KERNELS": "1000"}
    assert ExecuteCodeConfig.load(environ=env).warm_kernels == MAX_WARM_KERNELS
    toml = tmp_path / "lemon.toml"
    toml.write_text("[runtime.tools.execute_code]\nwarm_kernels = 1000\n", encoding="utf-8")
    assert ExecuteCodeConfig.load(toml, environ={}).warm_kernels == MAX_WARM_KERNELS
    config = ExecuteCodeConfig()
    config.warm_kernels = 9
    assert config.warm_kernels == MAX_WARM_KERNELS
    assert ExecuteCodeConfig(warm_kernels=3).warm_kernels == 3


# --- the script ---------------------------------------------------------------------------------


def test_utf8_bom_before_the_script_is_dropped(tool: ExecuteCode) -> None:
    result = tool.run_sync("\ufeffprint('bom stripped')\nraise SystemExit(0)\n")
    assert result.ok, result.content
    assert result.content == "bom stripped\n"


def test_bom_alone_is_a_missing_script(tool: ExecuteCode) -> None:
    result = tool.run_sync("\ufeff")
    refused(result)
    assert result.content == MISSING_SCRIPT


# --- kernel start failure -----------------------------------------------------------------------


def test_kernel_start_timeout_is_a_result_not_an_exception(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A kernel whose interpreter takes longer than the startup timeout to start (a stopped
    fork-server template no longer does: it is retired and the kernel starts cold, see
    tests/test_template_faults.py)."""
    wrapper = tmp_path / "slow-python"
    wrapper.write_text(f'#!/bin/sh\nsleep 5\nexec {sys.executable} "$@"\n')
    wrapper.chmod(0o700)
    monkeypatch.setattr(engine_module, "STARTUP_TIMEOUT_S", 1.0)
    facade = ExecuteCode(make_config(fork_server=False, python_path=str(wrapper)))
    try:
        started = time.monotonic()
        result = facade.run_sync("print('must not run')")
        elapsed = time.monotonic() - started
    finally:
        facade.close()
    refused(result)
    assert "within 1 s" in result.content, result.content  # the timeout that applied
    assert result.details["startup_failed"] is True
    assert result.details["startup_error"] == "timeout"
    assert elapsed < 5


# --- the staging root ---------------------------------------------------------------------------


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_deleted_staging_root_is_recreated_private() -> None:
    with ExecuteCode(make_config()) as facade:
        assert facade.run_sync("print('first')").ok
        diagnostics = facade.diagnostics
        root = diagnostics.staging_root
        assert root is not None
        script = f"import shutil\nshutil.rmtree({str(root)!r})\nprint('deleted')\n"
        result = facade.run_sync(script)
        assert result.ok, result.content
        assert not root.exists()
        for attempt in range(2):  # the next calls run as usual, on a recreated root
            after = facade.run_sync(f"print('after {attempt}')")
            assert after.ok, after.content
            assert after.content == f"after {attempt}\n"
        for directory in (root, diagnostics.work_dir, diagnostics.spill_dir):
            assert directory is not None and _mode(directory) == 0o700, directory
        assert diagnostics.runtime_dir is not None
        assert _mode(diagnostics.runtime_dir) & ~stat.S_ISVTX == 0o700
        assert os.lstat(root).st_uid == os.getuid()
        assert json.loads((root / "owner").read_text())["pid"] == os.getpid()
        assert _mode(root / "owner") == 0o600
    assert not (root / "work").exists()  # closing still removes it


def test_staging_root_replaced_by_a_symlink_fails_closed(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    facade = ExecuteCode(make_config())
    root: Path | None = None
    try:
        assert facade.run_sync("print('first')").ok
        root = facade.diagnostics.staging_root
        assert root is not None
        shutil.rmtree(root)
        root.symlink_to(elsewhere)
        result = facade.run_sync("print('must not run')")
        refused(result)
        assert result.content.startswith("execute_code: could not create a private workspace: ")
        assert "symlink" in result.content
        assert list(elsewhere.iterdir()) == []  # nothing was created through the link
    finally:
        facade.close()
        if root is not None and root.is_symlink():
            root.unlink()
