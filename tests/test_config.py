"""Tests for lemon_exec.config: defaults, layered loading, clamping, interpreter lookup."""

from __future__ import annotations

import logging
import os
import re
import stat
from pathlib import Path

import pytest

from lemon_exec.config import (
    DEFAULT_SANDBOX_ENV_HIDDEN,
    DEFAULT_SANDBOX_HIDDEN,
    DEFAULT_SANDBOX_VISIBLE,
    ENV_PREFIX,
    HELPER_ALLOWLIST,
    MAX_WARM_KERNELS,
    SETTING_KEYS,
    ExecuteCodeConfig,
    canonical_python,
)
from lemon_exec.errors import ConfigError

pytestmark = pytest.mark.timeout(60)

DEFAULTS = {
    "enabled": False,
    "python_path": "",
    "timeout_ms": 120_000,
    "max_rpc_calls": 100,
    "max_rpc_result_bytes": 5_242_880,
    "max_output_bytes": 50_000,
    "max_text_bytes": 65_536,
    "max_images": 8,
    "max_image_bytes": 5_242_880,
    "max_image_edge": 1568,
    "max_parallel_rpc": 4,
    "max_parallel_mcp": 16,
    "tools": [],
    "kernel_mode": "per_call",
    "kernel_idle_timeout_ms": 1_800_000,
    "max_live_kernels": 16,
    "max_queued_cells_per_kernel": 8,
    "warm_kernels": 1,
    "fork_server": True,
    "gc_freeze": True,
    "max_concurrent_per_call": 0,
    "max_queued_per_call": 64,
    "max_job_ms": 3_600_000,
    "job_result_ttl_ms": 3_600_000,
    "max_finished_jobs": 100,
    "max_spill_bytes": 64 * 2**20,
    "kernel_memory_mb": 0,
    "kernel_max_processes": 0,
    "kernel_max_open_files": 0,
    "sandbox": "none",
    "sandbox_cwd": "rw",
    "sandbox_hidden": list(DEFAULT_SANDBOX_HIDDEN),
    "sandbox_visible": list(DEFAULT_SANDBOX_VISIBLE),
    "sandbox_env_hidden": list(DEFAULT_SANDBOX_ENV_HIDDEN),
    "sandbox_env_allowed": [],
    "sandbox_network": False,
    "gateway_url": "",
    "gateway_auth_token": "",
    "gateway_kernel_name": "lemon-python",
}


def write_toml(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "lemon.toml"
    path.write_text("[runtime.tools.execute_code]\n" + body, encoding="utf-8")
    return path


def make_executable(path: Path, mode: int = 0o755) -> Path:
    path.write_text("#!/bin/sh\n", encoding="utf-8")
    path.chmod(mode)
    return path


# --- defaults and traits --------------------------------------------------------------------


def test_defaults() -> None:
    config = ExecuteCodeConfig()
    assert config.to_dict() == DEFAULTS
    assert config.mode == "per_call"
    assert config.enabled_helpers == HELPER_ALLOWLIST


def test_load_with_nothing_gives_defaults() -> None:
    assert ExecuteCodeConfig.load(environ={}).to_dict() == DEFAULTS


def test_every_setting_is_a_documented_config_trait() -> None:
    traits = ExecuteCodeConfig.class_traits(config=True)
    assert set(traits) == set(SETTING_KEYS)
    for name, trait in traits.items():
        assert trait.help, name


def test_every_setting_carries_the_metadata_the_loader_and_docs_read() -> None:
    # The loader and docs/conf.py derive env names, conversions and clamping from these tags.
    traits = ExecuteCodeConfig.class_traits(config=True)
    for name in SETTING_KEYS:
        assert traits[name].metadata["env"] == ENV_PREFIX + name.upper()
        assert callable(traits[name].metadata["convert"]), name
    assert traits["timeout_ms"].metadata["clamp"] == (1, None)
    assert traits["warm_kernels"].metadata["clamp"] == (0, MAX_WARM_KERNELS)
    assert traits["max_queued_per_call"].metadata["clamp"] == (0, None)


def test_to_dict_has_the_spec_keys_plus_extras() -> None:
    keys = list(ExecuteCodeConfig().to_dict())
    assert keys == list(SETTING_KEYS)
    # the spec's 13, max_images, max_image_bytes, max_image_edge, max_parallel_mcp,
    # warm_kernels, fork_server, gc_freeze, max_concurrent_per_call, max_queued_per_call,
    # max_job_ms, job_result_ttl_ms, max_finished_jobs,
    # max_spill_bytes, kernel_memory_mb, kernel_max_processes, kernel_max_open_files,
    # sandbox, sandbox_cwd, sandbox_hidden, sandbox_visible, sandbox_env_hidden,
    # sandbox_env_allowed, sandbox_network, gateway_url, gateway_auth_token,
    # gateway_kernel_name
    assert len(keys) == 39


def test_startup_timeout_is_not_a_setting() -> None:
    from lemon_exec import _constants

    assert "kernel_start_timeout_s" not in ExecuteCodeConfig.class_traits()
    assert _constants.STARTUP_TIMEOUT_S == 10.0
    assert _constants.GRACE_S == 1.0
    # The kernel-side numbers live where the kernel imports them from (one copy each).
    from lemon_exec.kernel import streams
    from lemon_exec.wire import protocol

    assert protocol.FRAME_CAP_BYTES == 256 * 1024
    assert streams.STREAM_CHUNK_CHARS == 64 * 1024


# --- layers -----------------------------------------------------------------------------------


def test_toml_loading(tmp_path: Path) -> None:
    path = write_toml(
        tmp_path,
        'enabled = true\npython_path = "/opt/py/bin/python"\ntimeout_ms = 5000\n'
        'tools = ["ls", "read"]\nkernel_mode = "session"\nwarm_kernels = 0\n'
        "max_live_kernels = 3\n",
    )
    config = ExecuteCodeConfig.load(path, environ={})
    assert config.enabled is True
    assert config.python_path == "/opt/py/bin/python"
    assert config.timeout_ms == 5000
    assert config.enabled_helpers == ("read", "ls")
    assert config.mode == "session"
    assert config.warm_kernels == 0
    assert config.max_live_kernels == 3
    assert config.max_rpc_calls == 100  # untouched keys keep their defaults


def test_toml_without_the_table_gives_defaults(tmp_path: Path) -> None:
    path = tmp_path / "other.toml"
    path.write_text('[runtime]\nname = "x"\n', encoding="utf-8")
    assert ExecuteCodeConfig.load(path, environ={}).to_dict() == DEFAULTS


def test_toml_table_of_wrong_type_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text("[runtime.tools]\nexecute_code = 3\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="not a table"):
        ExecuteCodeConfig.load(path, environ={})


def test_unknown_toml_keys_are_ignored_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = write_toml(tmp_path, "timeout_ms = 7\nkernel_start_timeout_s = 99\n")
    with caplog.at_level(logging.WARNING, logger="lemon_exec.config"):
        config = ExecuteCodeConfig.load(path, environ={})
    assert config.timeout_ms == 7
    assert "kernel_start_timeout_s" in caplog.text


def test_env_overrides_toml(tmp_path: Path) -> None:
    path = write_toml(tmp_path, 'timeout_ms = 5000\nmax_rpc_calls = 7\nkernel_mode = "session"\n')
    environ = {
        "LEMON_EXECUTE_CODE_TIMEOUT_MS": "9000",
        "LEMON_EXECUTE_CODE_KERNEL_MODE": "per_call",
        "LEMON_EXECUTE_CODE_WARM_KERNELS": "3",
        "UNRELATED": "1",
    }
    config = ExecuteCodeConfig.load(path, environ=environ)
    assert config.timeout_ms == 9000
    assert config.max_rpc_calls == 7
    assert config.mode == "per_call"
    assert config.warm_kernels == 3


def test_every_env_variable_is_read() -> None:
    environ = {
        "LEMON_EXECUTE_CODE_ENABLED": "yes",
        "LEMON_EXECUTE_CODE_PYTHON_PATH": "/x/python",
        "LEMON_EXECUTE_CODE_TIMEOUT_MS": "11",
        "LEMON_EXECUTE_CODE_MAX_RPC_CALLS": "12",
        "LEMON_EXECUTE_CODE_MAX_RPC_RESULT_BYTES": "13",
        "LEMON_EXECUTE_CODE_MAX_OUTPUT_BYTES": "14",
        "LEMON_EXECUTE_CODE_MAX_TEXT_BYTES": "15",
        "LEMON_EXECUTE_CODE_MAX_PARALLEL_RPC": "16",
        "LEMON_EXECUTE_CODE_MAX_PARALLEL_MCP": "7",
        "LEMON_EXECUTE_CODE_TOOLS": "grep",
        "LEMON_EXECUTE_CODE_KERNEL_MODE": "session",
        "LEMON_EXECUTE_CODE_KERNEL_IDLE_TIMEOUT_MS": "17",
        "LEMON_EXECUTE_CODE_MAX_LIVE_KERNELS": "18",
        "LEMON_EXECUTE_CODE_MAX_QUEUED_CELLS_PER_KERNEL": "19",
        "LEMON_EXECUTE_CODE_WARM_KERNELS": "2",
        "LEMON_EXECUTE_CODE_FORK_SERVER": "off",
        "LEMON_EXECUTE_CODE_GC_FREEZE": "false",
        "LEMON_EXECUTE_CODE_MAX_CONCURRENT_PER_CALL": "20",
        "LEMON_EXECUTE_CODE_MAX_QUEUED_PER_CALL": "21",
        "LEMON_EXECUTE_CODE_MAX_SPILL_BYTES": "22",
        "LEMON_EXECUTE_CODE_KERNEL_MEMORY_MB": "23",
        "LEMON_EXECUTE_CODE_KERNEL_MAX_PROCESSES": "24",
        "LEMON_EXECUTE_CODE_KERNEL_MAX_OPEN_FILES": "25",
        "LEMON_EXECUTE_CODE_SANDBOX": "BWrap",
        "LEMON_EXECUTE_CODE_SANDBOX_CWD": "ro",
        "LEMON_EXECUTE_CODE_SANDBOX_HIDDEN": "~/.ssh, /srv/secrets",
        "LEMON_EXECUTE_CODE_SANDBOX_VISIBLE": "~/.cache/pip",
        "LEMON_EXECUTE_CODE_SANDBOX_ENV_HIDDEN": "*_TOKEN",
        "LEMON_EXECUTE_CODE_SANDBOX_ENV_ALLOWED": "CI_TOKEN",
        "LEMON_EXECUTE_CODE_SANDBOX_NETWORK": "on",
        "LEMON_EXECUTE_CODE_GATEWAY_URL": " http://eg.example:8888/ ",
        "LEMON_EXECUTE_CODE_GATEWAY_AUTH_TOKEN": "s3cret",
        "LEMON_EXECUTE_CODE_GATEWAY_KERNEL_NAME": "lemon-k8s",
        "LEMON_EXECUTE_CODE_MAX_IMAGES": "3",
        "LEMON_EXECUTE_CODE_MAX_IMAGE_BYTES": "4096",
        "LEMON_EXECUTE_CODE_MAX_IMAGE_EDGE": "0",
        "LEMON_EXECUTE_CODE_MAX_JOB_MS": "26",
        "LEMON_EXECUTE_CODE_JOB_RESULT_TTL_MS": "27",
        "LEMON_EXECUTE_CODE_MAX_FINISHED_JOBS": "28",
    }
    assert ExecuteCodeConfig.load(environ=environ).to_dict() == {
        "enabled": True,
        "python_path": "/x/python",
        "timeout_ms": 11,
        "max_rpc_calls": 12,
        "max_rpc_result_bytes": 13,
        "max_output_bytes": 14,
        "max_text_bytes": 15,
        "max_images": 3,
        "max_image_bytes": 4096,
        "max_image_edge": 0,
        "max_parallel_rpc": 16,
        "max_parallel_mcp": 7,
        "tools": ["grep"],
        "kernel_mode": "session",
        "kernel_idle_timeout_ms": 17,
        "max_live_kernels": 18,
        "max_queued_cells_per_kernel": 19,
        "warm_kernels": 2,
        "fork_server": False,
        "gc_freeze": False,
        "max_concurrent_per_call": 20,
        "max_queued_per_call": 21,
        "max_job_ms": 26,
        "job_result_ttl_ms": 27,
        "max_finished_jobs": 28,
        "max_spill_bytes": 22,
        "kernel_memory_mb": 23,
        "kernel_max_processes": 24,
        "kernel_max_open_files": 25,
        "sandbox": "bwrap",
        "sandbox_cwd": "ro",
        "sandbox_hidden": ["~/.ssh", "/srv/secrets"],
        "sandbox_visible": ["~/.cache/pip"],
        "sandbox_env_hidden": ["*_TOKEN"],
        "sandbox_env_allowed": ["CI_TOKEN"],
        "sandbox_network": True,
        "gateway_url": "http://eg.example:8888",
        "gateway_auth_token": "s3cret",
        "gateway_kernel_name": "lemon-k8s",
    }


def test_process_environment_is_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LEMON_EXECUTE_CODE_MAX_RPC_CALLS", "42")
    assert ExecuteCodeConfig.load().max_rpc_calls == 42


def test_keyword_overrides_win_over_everything(tmp_path: Path) -> None:
    path = write_toml(tmp_path, "timeout_ms = 5000\nenabled = true\n")
    environ = {"LEMON_EXECUTE_CODE_TIMEOUT_MS": "9000"}
    config = ExecuteCodeConfig.load(
        path, environ=environ, timeout_ms=1234, enabled=False, tools=["ls"], python_path=None
    )
    assert config.timeout_ms == 1234
    assert config.enabled is False
    assert config.enabled_helpers == ("ls",)
    assert config.python_path == ""  # None means "not given"


def test_string_overrides_are_parsed_like_env() -> None:
    config = ExecuteCodeConfig.load(environ={}, max_rpc_calls="55", enabled="on")
    assert config.max_rpc_calls == 55
    assert config.enabled is True


def test_unknown_override_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="bogus"):
        ExecuteCodeConfig.load(environ={}, bogus=1)


# --- clamping and parsing -----------------------------------------------------------------------


@pytest.mark.parametrize("value", [0, -5])
def test_limits_clamp_to_one_from_every_source(tmp_path: Path, value: int) -> None:
    path = write_toml(tmp_path, f"timeout_ms = {value}\nmax_live_kernels = {value}\n")
    from_toml = ExecuteCodeConfig.load(path, environ={})
    assert from_toml.timeout_ms == 1
    assert from_toml.max_live_kernels == 1

    from_env = ExecuteCodeConfig.load(environ={"LEMON_EXECUTE_CODE_MAX_RPC_CALLS": str(value)})
    assert from_env.max_rpc_calls == 1

    direct = ExecuteCodeConfig(max_parallel_rpc=value)
    assert direct.max_parallel_rpc == 1
    direct.max_queued_cells_per_kernel = value
    assert direct.max_queued_cells_per_kernel == 1


def test_every_limit_is_clamped() -> None:
    limits = [key for key, default in DEFAULTS.items() if type(default) is int]
    config = ExecuteCodeConfig(**dict.fromkeys(limits, -1))
    for key in limits:
        # warm_kernels = 0 means "off"; 0 per-call slots "automatic", 0 queued "no queue",
        # a 0 resource limit "unlimited", a 0 image edge "never downscale"
        zero_ok = (
            "max_image_edge",
            "warm_kernels",
            "max_concurrent_per_call",
            "max_queued_per_call",
            "kernel_memory_mb",
            "kernel_max_processes",
            "kernel_max_open_files",
        )
        expected = 0 if key in zero_ok else 1
        assert getattr(config, key) == expected, key


def test_warm_kernels_zero_is_kept() -> None:
    assert (
        ExecuteCodeConfig.load(environ={"LEMON_EXECUTE_CODE_WARM_KERNELS": "0"}).warm_kernels == 0
    )


@pytest.mark.parametrize(
    ("raw", "expected"),
    [("abc", 120_000), ("", 120_000), ("1.9", 1), (" 250 ", 250), ("1e3", 1000), ("nan", 120_000)],
)
def test_env_number_parsing(raw: str, expected: int) -> None:
    config = ExecuteCodeConfig.load(environ={"LEMON_EXECUTE_CODE_TIMEOUT_MS": raw})
    assert config.timeout_ms == expected


def test_unparseable_toml_values_keep_the_default(tmp_path: Path) -> None:
    path = write_toml(
        tmp_path,
        'timeout_ms = "abc"\nmax_rpc_calls = true\nmax_output_bytes = 2.7\n'
        "python_path = 5\nenabled = 3\ntools = 7\n",
    )
    config = ExecuteCodeConfig.load(path, environ={})
    assert config.timeout_ms == 120_000
    assert config.max_rpc_calls == 100
    assert config.max_output_bytes == 2  # floats truncate
    assert config.python_path == ""
    assert config.enabled is False
    assert config.tools == []


def test_unparseable_env_keeps_the_toml_value(tmp_path: Path) -> None:
    path = write_toml(tmp_path, "timeout_ms = 5000\nenabled = true\n")
    environ = {"LEMON_EXECUTE_CODE_TIMEOUT_MS": "soon", "LEMON_EXECUTE_CODE_ENABLED": "maybe"}
    config = ExecuteCodeConfig.load(path, environ=environ)
    assert config.timeout_ms == 5000
    assert config.enabled is True


# --- kernel_mode ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "mode"),
    [
        ("session", "session"),
        ("per_call", "per_call"),
        ("Session", "per_call"),
        (" session", "per_call"),
        ("session ", "per_call"),
        ("sesion", "per_call"),
        ("", "per_call"),
        ("true", "per_call"),
    ],
)
def test_kernel_mode_from_env(raw: str, mode: str) -> None:
    config = ExecuteCodeConfig.load(environ={"LEMON_EXECUTE_CODE_KERNEL_MODE": raw})
    assert config.mode == mode
    assert config.kernel_mode == mode


@pytest.mark.parametrize("value", ["true", "1", '["session"]', '"SESSION"'])
def test_kernel_mode_non_session_toml_values(tmp_path: Path, value: str) -> None:
    path = write_toml(tmp_path, f"kernel_mode = {value}\n")
    assert ExecuteCodeConfig.load(path, environ={}).mode == "per_call"


def test_kernel_mode_set_programmatically() -> None:
    config = ExecuteCodeConfig(kernel_mode="session")
    assert config.mode == "session"
    config.kernel_mode = "Session"
    assert config.mode == "per_call"


# --- tools ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tools", "helpers"),
    [
        ([], HELPER_ALLOWLIST),
        (["webfetch", "read"], ("read", "webfetch")),
        (["ls", "ls", "grep", "ls"], ("grep", "ls")),
        (["read", "shell", "write"], ("read",)),
        (["shell"], ()),  # only unknown names: a narrowing to nothing, never a widening
        (["Read"], ()),  # names are exact
    ],
)
def test_tools_narrow_the_allowlist(tools: list[str], helpers: tuple[str, ...]) -> None:
    assert ExecuteCodeConfig(tools=tools).enabled_helpers == helpers


def test_tools_from_env_are_comma_separated() -> None:
    environ = {"LEMON_EXECUTE_CODE_TOOLS": " find , bash,read ,, ls "}
    config = ExecuteCodeConfig.load(environ=environ)
    assert config.enabled_helpers == ("read", "find", "ls")


def test_empty_tools_env_means_full_allowlist(tmp_path: Path) -> None:
    path = write_toml(tmp_path, 'tools = ["ls"]\n')
    config = ExecuteCodeConfig.load(path, environ={"LEMON_EXECUTE_CODE_TOOLS": " "})
    assert config.enabled_helpers == HELPER_ALLOWLIST


def test_tools_toml_string_is_comma_separated(tmp_path: Path) -> None:
    path = write_toml(tmp_path, 'tools = "grep, webfetch"\n')
    assert ExecuteCodeConfig.load(path, environ={}).enabled_helpers == ("grep", "webfetch")


# --- booleans and enabled ---------------------------------------------------------------------


@pytest.mark.parametrize("raw", ["1", "true", "TRUE", " Yes ", "on", "On"])
def test_env_true_words(raw: str) -> None:
    assert ExecuteCodeConfig.load(environ={"LEMON_EXECUTE_CODE_ENABLED": raw}).enabled is True


@pytest.mark.parametrize("raw", ["0", "false", "False", " no", "OFF "])
def test_env_false_words(raw: str) -> None:
    environ = {"LEMON_EXECUTE_CODE_ENABLED": raw}
    assert ExecuteCodeConfig.load(environ=environ, default_enabled=True).enabled is False


@pytest.mark.parametrize("raw", ["", "2", "enabled", "y", "nope"])
def test_env_other_words_keep_the_lower_layer(raw: str) -> None:
    environ = {"LEMON_EXECUTE_CODE_ENABLED": raw}
    assert ExecuteCodeConfig.load(environ=environ).enabled is False
    assert ExecuteCodeConfig.load(environ=environ, default_enabled=True).enabled is True


def test_default_enabled_for_front_ends(tmp_path: Path) -> None:
    assert ExecuteCodeConfig.load(environ={}, default_enabled=True).enabled is True
    path = write_toml(tmp_path, "enabled = false\n")
    assert ExecuteCodeConfig.load(path, environ={}, default_enabled=True).enabled is False


def test_explicitly_disabled(tmp_path: Path) -> None:
    off = write_toml(tmp_path, "enabled = false\n")
    on_path = tmp_path / "on.toml"
    on_path.write_text("[runtime.tools.execute_code]\nenabled = true\n", encoding="utf-8")

    assert ExecuteCodeConfig.explicitly_disabled(environ={}) is False
    assert ExecuteCodeConfig.explicitly_disabled(off, environ={}) is True
    assert ExecuteCodeConfig.explicitly_disabled(on_path, environ={}) is False
    env_off = {"LEMON_EXECUTE_CODE_ENABLED": "off"}
    env_on = {"LEMON_EXECUTE_CODE_ENABLED": "1"}
    env_junk = {"LEMON_EXECUTE_CODE_ENABLED": "perhaps"}
    assert ExecuteCodeConfig.explicitly_disabled(environ=env_off) is True
    assert ExecuteCodeConfig.explicitly_disabled(on_path, environ=env_off) is True
    assert ExecuteCodeConfig.explicitly_disabled(off, environ=env_on) is False
    assert ExecuteCodeConfig.explicitly_disabled(off, environ=env_junk) is True
    assert ExecuteCodeConfig.explicitly_disabled(environ=env_junk) is False


# --- TOML errors ------------------------------------------------------------------------------


def test_missing_toml_file_is_a_config_error(tmp_path: Path) -> None:
    missing = tmp_path / "nope.toml"
    with pytest.raises(ConfigError, match=r"nope\.toml"):
        ExecuteCodeConfig.load(missing, environ={})
    with pytest.raises(ConfigError, match=r"nope\.toml"):
        ExecuteCodeConfig.explicitly_disabled(missing, environ={})


def test_broken_toml_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "broken.toml"
    path.write_text("[runtime.tools.execute_code\nenabled = ", encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        ExecuteCodeConfig.load(path, environ={})
    message = str(info.value)
    assert "broken.toml" in message
    assert "line 1" in message  # the parser's own message is kept


def test_toml_path_that_is_a_directory_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=re.escape(str(tmp_path))):
        ExecuteCodeConfig.load(tmp_path, environ={})


# --- resolve_python ---------------------------------------------------------------------------


def test_blank_python_path_uses_python3_on_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = make_executable(tmp_path / "python3")
    monkeypatch.setenv("PATH", str(tmp_path))
    assert ExecuteCodeConfig().resolve_python() == str(fake)
    assert ExecuteCodeConfig(python_path="   ").resolve_python() == str(fake)


def test_no_python3_on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    # And no host interpreter to fall back to (see tests/test_interpreter_fallback.py).
    monkeypatch.setattr("sys.executable", "")
    with pytest.raises(ConfigError) as info:
        ExecuteCodeConfig().resolve_python()
    assert str(info.value) == (
        "execute_code: no python3 interpreter found on PATH; install Python 3 or set "
        "python_path / LEMON_EXECUTE_CODE_PYTHON_PATH to an interpreter"
    )


def test_absolute_python_path(tmp_path: Path) -> None:
    fake = make_executable(tmp_path / "py")
    assert ExecuteCodeConfig(python_path=str(fake)).resolve_python() == str(fake)


def test_relative_python_path_resolves_against_cwd(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "venv" / "bin").mkdir(parents=True)
    fake = make_executable(tmp_path / "venv" / "bin" / "python")
    config = ExecuteCodeConfig(python_path="venv/bin/python")
    assert config.resolve_python(cwd=tmp_path) == str(fake)
    monkeypatch.chdir(tmp_path)
    assert config.resolve_python() == str(fake)


def test_missing_python_path(tmp_path: Path) -> None:
    missing = tmp_path / "nope" / "python"
    with pytest.raises(ConfigError) as info:
        ExecuteCodeConfig(python_path=str(missing)).resolve_python()
    assert str(info.value) == (
        f"execute_code: python_path not found: {missing}; set python_path "
        "(or LEMON_EXECUTE_CODE_PYTHON_PATH) to an existing Python interpreter"
    )


def test_relative_missing_python_path_names_the_absolute_path(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=re.escape(f"not found: {tmp_path}/bin/py;")):
        ExecuteCodeConfig(python_path="bin/py").resolve_python(cwd=tmp_path)


def test_python_path_not_executable(tmp_path: Path) -> None:
    plain = make_executable(tmp_path / "python", mode=0o644)
    with pytest.raises(ConfigError) as info:
        ExecuteCodeConfig(python_path=str(plain)).resolve_python()
    assert str(info.value).startswith(f"execute_code: python_path is not executable: {plain}; ")


def test_python_path_is_a_directory(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="is not executable"):
        ExecuteCodeConfig(python_path=str(tmp_path)).resolve_python()


def test_resolve_keeps_symlinks_and_canonical_resolves_them(tmp_path: Path) -> None:
    real = make_executable(tmp_path / "python3.11")
    link = tmp_path / "python3"
    link.symlink_to(real.name)
    resolved = ExecuteCodeConfig(python_path=str(link)).resolve_python()
    assert resolved == str(link)
    assert canonical_python(resolved) == str(real)
    assert os.path.isabs(canonical_python("relative/python"))


def test_real_interpreter_resolves() -> None:
    # The machine running the tests has python3; the result must be an executable file.
    resolved = ExecuteCodeConfig().resolve_python()
    assert os.path.isabs(resolved)
    assert os.stat(resolved).st_mode & stat.S_IXUSR
