"""Issue 11, host items: fresh environments, a fail-closed TMPDIR, config and runtime/ modes.

- A warm spare (or a fork-server template) started before the host changed its environment
  never runs a script: the next call sees the host's environment as of that call.
- An unusable ``TMPDIR`` is refused, naming it, instead of a silent fallback to ``/tmp``;
  in session mode that is the ``startup_failed`` fallback.
- ``ExecuteCodeConfig(...)`` converts values exactly as TOML/environment loading does.
- The staging ``runtime/`` directory stays 0700 once kernels have written connection files.
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from support import enabled_config, wait_until

from lemon_exec import ExecuteCode, ExecuteCodeConfig, SessionScope
from lemon_exec.config import MAX_WARM_KERNELS, MIN_TIMEOUT_MS
from lemon_exec.errors import RefusedError
from lemon_exec.host.disk.staging import StagingRoot
from lemon_exec.host.disk.staging_base import MAX_SOCKET_BASE_BYTES, staging_base

pytestmark = [pytest.mark.timeout(90), pytest.mark.kernel]

VAR = "LEMON_EXEC_TEST_FRESH_ENV"
SHOW = f"import os\nprint(repr(os.environ.get({VAR!r})))\n"


def make_config(**overrides: Any) -> ExecuteCodeConfig:
    """An enabled config for this module (see support.enabled_config)."""
    return enabled_config(**{"timeout_ms": 20_000, **overrides})


@pytest.fixture
def own_tool() -> Iterator[Callable[..., ExecuteCode]]:
    """``own_tool(config=None, **facade_kwargs)``: a facade for one test, closed after it."""
    made: list[ExecuteCode] = []

    def _make(config: ExecuteCodeConfig | None = None, **kwargs: Any) -> ExecuteCode:
        facade = ExecuteCode(config if config is not None else make_config(), **kwargs)
        made.append(facade)
        return facade

    yield _make
    for facade in made:
        facade.close()


def wait_for(predicate: Callable[[], bool], timeout: float = 20.0) -> None:
    assert wait_until(predicate, timeout, interval=0.02), "timed out waiting"


def mode_of(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


# --- item 4: a claimed kernel sees the host's environment as of the claim ------------------------


def test_spare_started_before_an_env_change_is_never_used(
    own_tool: Callable[..., ExecuteCode], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(VAR, raising=False)
    facade = own_tool(make_config(warm_kernels=1))
    assert facade.run_sync("pass").ok
    diagnostics = facade.diagnostics
    wait_for(lambda: diagnostics.spares >= 1)  # started while VAR was unset

    monkeypatch.setenv(VAR, "set-after-the-spare-started")
    result = facade.run_sync(SHOW)
    assert result.content == "'set-after-the-spare-started'\n", result.content
    assert result.details["kernel_source"] == "cold"  # the stale spare was discarded
    assert diagnostics.stale_spares_discarded == 1

    wait_for(lambda: diagnostics.spares >= 1)  # a spare started under the new value
    result = facade.run_sync(SHOW)
    assert result.content == "'set-after-the-spare-started'\n"
    assert result.details["kernel_source"] == "spare"  # an up-to-date spare is still used

    wait_for(lambda: diagnostics.spares >= 1)
    monkeypatch.delenv(VAR)  # a removed variable is gone on the very next call too
    result = facade.run_sync(SHOW)
    assert result.content == "None\n", result.content
    assert diagnostics.stale_spares_discarded == 2


def test_session_kernels_after_an_env_change(
    own_tool: Callable[..., ExecuteCode], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A new session kernel sees the current environment, startup variables included."""
    monkeypatch.delenv(VAR, raising=False)
    probe_dir = tmp_path / "probe"
    probe_dir.mkdir()
    (probe_dir / "lemon_env_probe.py").write_text("WHERE = 'probe'\n")
    facade = own_tool(make_config(kernel_mode="session"))
    first = SessionScope("env-first", "agent", cwd=str(tmp_path))
    assert facade.run_sync("x = 1", scope=first).ok
    interpreter = facade.config.resolve_python()

    def template_ready() -> bool:  # later kernels would be forked from this template
        return any(t.ready for t in facade.diagnostics.templates if t.interpreter == interpreter)

    wait_for(template_ready)

    monkeypatch.setenv(VAR, "new")
    monkeypatch.setenv("PYTHONPATH", str(probe_dir))  # read at interpreter startup only
    second = SessionScope("env-second", "agent", cwd=str(tmp_path))
    result = facade.run_sync(
        SHOW + "import lemon_env_probe\nprint(lemon_env_probe.WHERE)\n", scope=second
    )
    assert result.content == "'new'\nprobe\n", result.content
    assert result.details["persistent"] is True

    # An existing session kernel keeps its own environment: that is session state.
    result = facade.run_sync(SHOW + "print(x)", scope=first)
    assert result.content == "None\n1\n", result.content


# --- item 9: staging fails closed on an unusable TMPDIR ------------------------------------------


def _missing(tmp: Path) -> Path:
    return tmp / "missing"


def _a_file(tmp: Path) -> Path:
    (tmp / "file").write_text("")
    return tmp / "file"


def _world_writable(tmp: Path) -> Path:
    path = tmp / "open"
    path.mkdir()
    path.chmod(0o777)  # no sticky bit: anyone could rename our root away
    return path


def _foreign_owner(tmp: Path) -> Path:
    path = tmp / "foreign"
    path.mkdir(mode=0o700)
    if os.getuid() == 0:
        os.chown(path, 65534, 65534)
    else:  # not root: any directory owned by another user will do
        return Path("/var/empty") if Path("/var/empty").is_dir() else Path("/root")
    return path


def _dangling_link(tmp: Path) -> Path:
    (tmp / "link").symlink_to(tmp / "nowhere")
    return tmp / "link"


BAD_TMPDIRS = {
    "missing": (_missing, "does not exist"),
    "file": (_a_file, "is not a directory"),
    "world-writable": (_world_writable, "lacks the sticky bit"),
    "foreign-owner": (_foreign_owner, "owned by uid"),
    "dangling-symlink": (_dangling_link, "does not exist"),
}


@pytest.mark.parametrize("case", sorted(BAD_TMPDIRS))
def test_unusable_tmpdir_is_refused_per_call(
    case: str,
    own_tool: Callable[..., ExecuteCode],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    make, problem = BAD_TMPDIRS[case]
    bad = make(tmp_path)
    monkeypatch.setenv("TMPDIR", str(bad))
    facade = own_tool()
    result = facade.run_sync("print('must not run')")
    assert result.content.startswith("execute_code: could not create a private workspace: ")
    assert f"TMPDIR={bad} " in result.content, result.content
    assert problem in result.content
    assert result.details["error"] is True
    assert result.details["exit_code"] is None
    assert not facade.diagnostics.started  # nothing started, nothing to clean up

    # Fixed: the next call just works. (Short path: ipc socket paths are limited to 107.)
    good = Path(tempfile.mkdtemp(prefix="lxt-", dir="/tmp"))
    try:
        monkeypatch.setenv("TMPDIR", str(good))
        result = facade.run_sync("print('ran')")
        assert result.content == "ran\n"
        root = facade.diagnostics.staging_root
        assert root is not None
        assert root.parent == good
        facade.close()
    finally:
        shutil.rmtree(good, ignore_errors=True)


def test_unusable_tmpdir_is_a_startup_failed_fallback_in_session_mode(
    own_tool: Callable[..., ExecuteCode], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path / "missing"))
    facade = own_tool(make_config(kernel_mode="session"))
    result = facade.run_sync("print('must not run')", scope=SessionScope("s", "a", cwd=tmp_path))
    assert f"TMPDIR={tmp_path / 'missing'} does not exist" in result.content
    details = result.details
    assert details["mode"] == "session"
    assert details["persistent"] is False
    assert details["fallback_reason"] == "startup_failed"
    assert details["startup_failed"] is True
    assert details["startup_error"] == "staging"
    assert details["exit_code"] is None


def test_symlinked_tmpdir_is_followed_and_validated(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    target = tmp_path / "real"
    target.mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(target)
    monkeypatch.setenv("TMPDIR", str(tmp_path / "link"))
    assert staging_base() == target
    with StagingRoot.create() as root:
        assert root.path.parent == target
    monkeypatch.setenv("TMPDIR", "")  # empty counts as unset, as in tempfile
    assert staging_base() == Path("/tmp").resolve()
    with pytest.raises(RefusedError, match="the staging base"):
        staging_base(tmp_path / "missing")  # an explicit base is checked the same way


# --- item 11: config values convert as the loader converts them; runtime/ is 0700 ---------------


CONVERSIONS: list[tuple[str, Any]] = [
    ("kernel_mode", True),
    ("kernel_mode", None),
    ("kernel_mode", "Session"),
    ("timeout_ms", 2.9),
    ("timeout_ms", "2.9"),
    ("timeout_ms", -5),
    ("timeout_ms", float("nan")),
    ("timeout_ms", True),
    ("warm_kernels", 99.5),
    ("warm_kernels", "-3"),
    ("max_queued_per_call", -1.5),
    ("enabled", "yes"),
    ("fork_server", "off"),
    ("enabled", 1),
    ("tools", "read, grep"),
    ("tools", ("read", 7, "nope")),
    ("python_path", Path("/usr/bin/python3")),
    ("python_path", 42),
]


@pytest.mark.parametrize(("key", "raw"), CONVERSIONS, ids=[f"{k}={v!r}" for k, v in CONVERSIONS])
def test_constructor_converts_like_the_loader(key: str, raw: Any) -> None:
    built = ExecuteCodeConfig(**{key: raw}).to_dict()[key]
    overridden = ExecuteCodeConfig.load(**{key: raw}).to_dict()[key]
    assert built == overridden
    if not isinstance(raw, str | Path | tuple):  # strings come from the environment as-is
        return
    text = ", ".join(map(str, raw)) if isinstance(raw, tuple) else os.fspath(raw)
    env = {f"LEMON_EXECUTE_CODE_{key.upper()}": text}
    if key != "tools" or not isinstance(raw, tuple) or all(isinstance(i, str) for i in raw):
        assert ExecuteCodeConfig.load(environ=env).to_dict()[key] == built


def test_constructor_values_the_issue_names() -> None:
    assert ExecuteCodeConfig(kernel_mode=True).mode == "per_call"
    config = ExecuteCodeConfig(timeout_ms=2.9)
    assert config.timeout_ms == 2  # truncated like "2.9" from TOML, then clamped to >= 1
    assert config.run_timeout_ms == MIN_TIMEOUT_MS
    assert ExecuteCodeConfig(timeout_ms=0.5).timeout_ms == 1
    assert ExecuteCodeConfig(warm_kernels=99.5).warm_kernels == MAX_WARM_KERNELS
    config.timeout_ms = "not a number"  # unusable: ignored with a warning, value kept
    assert config.timeout_ms == 2
    config.kernel_mode = "session"
    config.kernel_mode = 3
    assert config.mode == "per_call"


@pytest.mark.parametrize("fork_server", [True, False])
def test_runtime_dir_stays_0700(own_tool: Callable[..., ExecuteCode], fork_server: bool) -> None:
    facade = own_tool(make_config(fork_server=fork_server, warm_kernels=1))
    for _ in range(2):  # with the fork server, later kernels are forked by the template
        assert facade.run_sync("print(1)").content == "1\n"
    diagnostics = facade.diagnostics
    wait_for(lambda: diagnostics.spares >= 1)  # a live kernel: its file is there
    runtime = diagnostics.runtime_dir
    assert runtime is not None
    assert mode_of(runtime) == 0o700  # not 01700: nothing chmods it after creation
    assert facade.run_sync("pass").ok  # each call checks the root (owner-only) first
    files = list(runtime.glob("kernel-*.json"))
    assert files
    assert all(mode_of(path) == 0o600 for path in files)


def test_tmpdir_too_long_for_socket_paths_is_refused_naming_it(
    own_tool: Callable[..., ExecuteCode], monkeypatch: pytest.MonkeyPatch, short_tmp: Path
) -> None:
    """A long TMPDIR is a clear refusal, not zmq's bare "File name too long" from run()."""
    room = MAX_SOCKET_BASE_BYTES - len(os.fsencode(short_tmp)) - 1
    longest = short_tmp / ("d" * room)  # exactly as long as sockets allow
    longest.mkdir(mode=0o700)
    too_long = short_tmp / ("d" * (room + 1))
    too_long.mkdir(mode=0o700)

    monkeypatch.setenv("TMPDIR", str(too_long))
    facade = own_tool()
    result = facade.run_sync("print('must not run')")
    assert result.content.startswith("execute_code: could not create a private workspace: ")
    assert f"TMPDIR={too_long} is too long" in result.content, result.content
    assert "set TMPDIR to a shorter directory" in result.content
    assert result.details["error"] is True

    monkeypatch.setenv("TMPDIR", str(longest))
    result = facade.run_sync("print('ran')")
    assert result.content == "ran\n", result.content
    facade.close()
