"""Suite-wide fixtures: leak checks for kernel processes and staging roots, the shared
setups (facades, a dead PID, the anyio backend) and the ``kernel`` marks made here.

Every kernel this test session starts, directly or through a ``lemon-exec`` subprocess,
inherits the environment variable :data:`SESSION_ENV` with a value unique to the session.
That lets the checks below find *our* kernels among any other lemon_exec kernels on the
machine (other test runs, a developer's own work) and ignore theirs.

At the end of the session, :func:`leak_watch` asserts that none of our kernels is still
running and that no ``lemon-exec-*`` staging root owned by this process (or by a subprocess
registered with ``leak_watch.add_pid``) is left in the temp directory. Kernels may be
launched directly (``python -m lemon_exec.kernel``) or forked by a fork-server template
(``python -m lemon_exec.template.server``); both, and the templates, count.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from support import enabled_config, wait_until

from lemon_exec import ExecuteCode, ExecuteCodeConfig

#: Environment variable that marks processes started by this test session.
SESSION_ENV = "LEMON_EXEC_TEST_SESSION"
#: How long background kernel shutdowns and root removals may take after the last test.
SETTLE_S = 5.0

_STAGING_PREFIX = "lemon-exec-"


def _marked_processes(marker: str) -> dict[int, tuple[list[bytes], int]]:
    """``pid -> (argv, ppid)`` of running lemon_exec kernel-side processes under ``marker``.

    That is kernels (``-m lemon_exec.kernel``) and fork-server templates and the kernels
    they fork (``-m lemon_exec.template.server``; a forked kernel keeps its template's
    command line and environment block). Zombies are not running and are left out.
    """
    needle = f"{SESSION_ENV}={marker}".encode()
    found: dict[int, tuple[list[bytes], int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        proc = Path("/proc", entry)
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            if not any(
                arg.startswith((b"lemon_exec.kernel", b"lemon_exec.template")) for arg in argv
            ):
                continue
            if needle not in (proc / "environ").read_bytes().split(b"\0"):
                continue
            found[int(entry)] = (argv, _ppid(proc))
        except (OSError, IndexError, ValueError):  # gone meanwhile, or not ours to read
            continue
    return found


def _is_template(argv: list[bytes]) -> bool:
    return b"lemon_exec.template.server" in argv


def lemon_processes(
    marker: str | None = None, *, host: int | None = None
) -> tuple[set[int], set[int]]:
    """``(kernels, templates)``: this session's running kernels and fork-server templates.

    ``marker`` defaults to this session's marker. With ``host``, only processes started by
    that host process: its children, and the kernels forked by its templates.
    """
    procs = _marked_processes(marker if marker is not None else os.environ.get(SESSION_ENV, ""))
    # A template is a fork-server process whose parent is not itself a template.
    templates = {
        pid
        for pid, (argv, ppid) in procs.items()
        if _is_template(argv) and not (ppid in procs and _is_template(procs[ppid][0]))
    }
    kernels = set(procs) - templates
    if host is not None:
        templates = {pid for pid in templates if procs[pid][1] == host}
        kernels = {pid for pid in kernels if procs[pid][1] == host or procs[pid][1] in templates}
    return kernels, templates


def kernel_pids(marker: str | None = None, *, host: int | None = None) -> set[int]:
    """PIDs of this session's running kernels (not templates); see :func:`lemon_processes`."""
    return lemon_processes(marker, host=host)[0]


def process_running(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie."""
    try:
        stat = Path("/proc", str(pid), "stat").read_text()
    except OSError:
        return False
    # The state follows the parenthesised command name, which may itself contain ")".
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _ppid(proc: Path) -> int:
    return int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])


def _root_owner(root: Path) -> int | None:
    try:
        data = json.loads((root / "owner").read_text())
    except (OSError, ValueError):
        return None
    pid = data.get("pid") if isinstance(data, dict) else None
    return pid if isinstance(pid, int) else None


def _only_spills(root: Path) -> bool:
    """A closed root keeps its owner marker and fresh spill files, by design (24 h)."""
    try:
        return {p.name for p in root.iterdir()} <= {"owner", "spill"}
    except OSError:
        return False


def _staging_roots() -> set[Path]:
    base = Path(tempfile.gettempdir())
    return {p for p in base.glob(_STAGING_PREFIX + "*") if p.is_dir() and not p.is_symlink()}


class LeakWatch:
    """What the end-of-session leak check looks at; tests register their subprocesses here."""

    def __init__(self, marker: str) -> None:
        self.marker = marker
        self.owner_pids: set[int] = {os.getpid()}
        self.roots_before = _staging_roots()

    def add_pid(self, pid: int) -> None:
        """Count staging roots owned by ``pid`` (a subprocess the test started) as ours."""
        self.owner_pids.add(pid)

    def leftover_processes(self) -> set[int]:
        kernels, templates = lemon_processes(self.marker)
        return kernels | templates

    def leftover_roots(self) -> set[Path]:
        return {
            root
            for root in _staging_roots() - self.roots_before
            if root.exists() and _root_owner(root) in self.owner_pids and not _only_spills(root)
        }


@pytest.fixture(scope="session", autouse=True)
def leak_watch() -> Iterator[LeakWatch]:
    """Mark this session's processes; at the end, assert no kernel or staging root is left."""
    marker = secrets.token_hex(8)
    saved = os.environ.get(SESSION_ENV)
    os.environ[SESSION_ENV] = marker
    watch = LeakWatch(marker)
    try:
        yield watch
        # Used kernels are stopped in the background (SIGTERM, 1 s grace, SIGKILL).
        wait_until(lambda: not watch.leftover_processes() and not watch.leftover_roots(), SETTLE_S)
        processes = watch.leftover_processes()
        roots = watch.leftover_roots()
        assert not processes, f"lemon_exec kernels still running after the session: {processes}"
        assert not roots, f"staging roots left in the temp dir: {sorted(map(str, roots))}"
    finally:
        if saved is None:
            os.environ.pop(SESSION_ENV, None)
        else:
            os.environ[SESSION_ENV] = saved


@pytest.fixture(scope="session")
def wait_gone() -> Callable[..., bool]:
    """``wait_gone(pid, timeout=3.0)``: True once process ``pid`` is no longer running."""

    def _wait_gone(pid: int, timeout: float = 3.0) -> bool:
        return wait_until(lambda: not process_running(pid), timeout)

    return _wait_gone


@pytest.fixture(scope="session")
def session_kernels() -> Callable[..., set[int]]:
    """``session_kernels(host=None)``: PIDs of this session's running kernels.

    Fork-server templates are not kernels and are left out. ``host=os.getpid()`` narrows
    to kernels this test process started (directly or through its fork servers).
    """

    def _session_kernels(host: int | None = None) -> set[int]:
        return kernel_pids(host=host)

    return _session_kernels


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A private TMPDIR short enough for ipc socket paths (pytest's tmp_path is too long)."""
    path = Path(tempfile.mkdtemp(prefix="lxt-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def reap_dirs() -> Iterator[list[Path]]:
    """Directories a test made outside its tmp_path (runtime directories under the fixed
    runtime base, /tmp/lemon-exec.<uid>/): removed at the end."""
    made: list[Path] = []
    try:
        yield made
    finally:
        for path in made:
            shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def anyio_backend() -> str:
    """The anyio tests run on asyncio, the loop lemon_exec's facade lives on."""
    return "asyncio"


@pytest.fixture(scope="session")
def dead_pid() -> int:
    """The PID of a process that has ended (and been reaped)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


# The shared facades are per module, not per session: their idle kernels would otherwise
# live on into later modules, whose checks count this process's kernels.


@pytest.fixture(scope="module")
def session_facade() -> Iterator[ExecuteCode]:
    """A session-mode facade (no spares, default settings) shared by a module's tests that
    only run scripts in session scopes of their own. Tests that change a setting use
    ``support.configured``."""
    facade = ExecuteCode(ExecuteCodeConfig(enabled=True, warm_kernels=0, kernel_mode="session"))
    yield facade
    facade.close()


@pytest.fixture(scope="module")
def per_call_facade() -> Iterator[ExecuteCode]:
    """A per-call facade of ``support.enabled_config()`` shared by a module's tests that only
    run independent scripts (a fresh kernel each); a session scope gets its own kernel."""
    with ExecuteCode(enabled_config()) as facade:
        yield facade


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Marks added before -m deselects. Scenario notebooks (lemon_exec's notebook plugin)
    # run their cells on real kernels.
    for item in items:
        if item.path.suffix == ".ipynb":
            item.add_marker(pytest.mark.kernel)


def pytest_collection_finish(session: pytest.Session) -> None:
    # Before any test runs: a selection with sandbox tests gets bubblewrap, or one clear stop.
    if any(item.get_closest_marker("bwrap") for item in session.items):
        import support_debian

        support_debian.ensure_for_session(
            session.config, "bwrap", "bubblewrap", "the sandbox tests"
        )
