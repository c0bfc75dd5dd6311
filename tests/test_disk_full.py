"""Issue 25 item 8: a full disk under ``TMPDIR`` is a result, not an exception.

Every test runs against a real, small tmpfs mounted as ``TMPDIR`` (the suite runs as root,
as CI does) and filled with a file until the kernel answers ENOSPC; freeing it is deleting
that file. The runtime base (keys and sockets, ``/tmp/lemon-exec.<uid>/`` outside tests) is
put on the same tmpfs, so that a full disk reaches the kernels' own files too, as a full
``/tmp`` would. What is checked: the call returns a result saying the workspace could not be
created and why (ENOSPC), nothing ran, nothing is left behind (no workspace, no spill file,
no kernel), and the host keeps working, sessions and all, once there is room again.
"""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from support import enabled_config, wait_until

from lemon_exec import ExecuteCode, SessionScope
from lemon_exec.host.disk import runtime_base
from lemon_exec.host.disk.staging import StagingRoot
from lemon_exec.host.run.diagnostics import Diagnostics

pytestmark = [pytest.mark.timeout(120), pytest.mark.kernel]

WORKSPACE_REFUSED = "execute_code: could not create a private workspace: "
FULL = "No space left on device (ENOSPC)"
#: The runtime base's name on the test disk.
RUNTIME_BASE = "lemon-runtime"


class Disk:
    """A mounted tmpfs that can be filled to the last byte and emptied again."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._filler = path / "filler"

    def fill(self) -> None:
        fd = os.open(self._filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            for chunk in (1 << 16, 1 << 12):  # big writes first, then the last pages
                with contextlib.suppress(OSError):
                    while True:
                        os.write(fd, b"\0" * chunk)
            with pytest.raises(OSError) as raised:
                os.write(fd, b"\0")
            assert raised.value.errno == errno.ENOSPC
        finally:
            os.close(fd)

    def free(self) -> None:
        self._filler.unlink(missing_ok=True)

    def contents(self) -> list[str]:
        """What is on the disk, the runtime base (never removed) only when it is not empty."""
        found = sorted(p.name for p in self.path.iterdir() if p.name != RUNTIME_BASE)
        base = self.path / RUNTIME_BASE
        if base.is_dir() and any(base.iterdir()):
            found.append(RUNTIME_BASE)
        return found


@contextlib.contextmanager
def tmpfs(options: str) -> Iterator[Path]:
    """A tmpfs mounted with ``options`` on a short path (ipc socket paths are limited)."""
    path = Path(tempfile.mkdtemp(prefix="lxt-", dir="/tmp"))
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"{options},mode=0700", "tmpfs", str(path)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        os.rmdir(path)
        pytest.fail(f"these tests mount a tmpfs and need root (as in CI): {mounted.stderr}")
    try:
        yield path
    finally:
        # A kernel still stopping may hold the mount: detach it now, gone once they are.
        if subprocess.run(["umount", str(path)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(path)], check=True)
        os.rmdir(path)


@pytest.fixture
def disk(monkeypatch: pytest.MonkeyPatch) -> Iterator[Disk]:
    """A 16 MiB tmpfs as ``TMPDIR``."""
    with tmpfs("size=16m") as path:
        monkeypatch.setenv("TMPDIR", str(path))
        monkeypatch.setattr(runtime_base, "base_path", lambda: path / RUNTIME_BASE)
        yield Disk(path)


@pytest.fixture
def own_tool() -> Iterator[Callable[..., ExecuteCode]]:
    made: list[ExecuteCode] = []

    def _make(**overrides: Any) -> ExecuteCode:
        values: dict[str, Any] = {"timeout_ms": 30_000, **overrides}
        facade = ExecuteCode(enabled_config(**values))
        made.append(facade)
        return facade

    yield _make
    for facade in made:
        facade.close()


def staging_of(facade: ExecuteCode) -> Diagnostics:
    """The facade's diagnostics, once its staging root is made."""
    assert facade.diagnostics.started
    return facade.diagnostics


def leftovers(root: Diagnostics) -> list[str]:
    """Run workspaces and spill files of the root (connection files come and go)."""
    assert root.work_dir is not None and root.spill_dir is not None
    return sorted(p.name for p in (*root.work_dir.iterdir(), *root.spill_dir.iterdir()))


def closes_clean(facade: ExecuteCode, disk: Disk) -> None:
    """Closing the facade leaves nothing on the disk: no root, no kernel's files."""
    facade.close()
    assert disk.contents() == []


def test_per_call_on_a_full_disk_is_a_workspace_refusal(
    own_tool: Callable[..., ExecuteCode], disk: Disk, session_kernels: Callable[..., set[int]]
) -> None:
    facade = own_tool()
    assert facade.run_sync("print('before')").content == "before\n"
    root = staging_of(facade)
    kernels = session_kernels(host=os.getpid())

    disk.fill()
    result = facade.run_sync("open('ran', 'w').close()")
    assert result.content.startswith(WORKSPACE_REFUSED), result.content
    assert FULL in result.content
    assert "TMPDIR" in result.content  # says where room is needed
    assert result.details["error"] is True
    assert result.details["exit_code"] is None
    assert leftovers(root) == []  # the half-made workspace was removed
    assert session_kernels(host=os.getpid()) <= kernels  # no kernel was started for it

    disk.free()
    result = facade.run_sync("print('after')")
    assert result.content == "after\n", result.content
    closes_clean(facade, disk)


@pytest.mark.parametrize("fork_server", [True, False], ids=["forked", "cold"])
def test_kernel_files_on_a_full_disk_are_a_staging_start_failure(
    own_tool: Callable[..., ExecuteCode],
    disk: Disk,
    fork_server: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    facade = own_tool(fork_server=fork_server)
    assert facade.run_sync("pass").ok
    root = staging_of(facade)
    # The used kernel's files go with it: gone before the disk fills, or they would free it.
    assert wait_until(lambda: facade.snapshot()["kernels_total"] == 0), "the kernel stayed"
    made = StagingRoot.new_workspace

    def then_fill(self: StagingRoot, script: str | None = None) -> Path:
        # The workspace is made; the disk fills before the kernel writes its own files.
        workspace = made(self, script)
        disk.fill()
        return workspace

    with monkeypatch.context() as patch:
        patch.setattr(StagingRoot, "new_workspace", then_fill)
        result = facade.run_sync("open('ran', 'w').close()")
    assert result.content.startswith(WORKSPACE_REFUSED), result.content
    assert FULL in result.content and str(root.runtime_dir) in result.content
    assert result.details["startup_failed"] is True
    assert result.details["startup_error"] == "staging"
    assert result.details["exit_code"] is None
    assert wait_until(lambda: leftovers(root) == []), leftovers(root)  # removed soon after

    disk.free()
    assert facade.run_sync("print('after')").content == "after\n"
    closes_clean(facade, disk)


def test_a_host_started_on_a_full_disk_refuses_then_recovers(
    own_tool: Callable[..., ExecuteCode], disk: Disk
) -> None:
    disk.fill()
    facade = own_tool()
    result = facade.run_sync("print('must not run')")
    assert result.content.startswith(WORKSPACE_REFUSED), result.content
    assert FULL in result.content
    assert not facade.diagnostics.started  # no half-made host kept
    assert disk.contents() == ["filler"]  # its root was removed again

    disk.free()
    assert facade.run_sync("print('after')").content == "after\n"
    closes_clean(facade, disk)


def test_session_mode_on_a_full_disk_keeps_its_sessions_and_falls_back_clearly(
    own_tool: Callable[..., ExecuteCode],
    disk: Disk,
    session_kernels: Callable[..., set[int]],
    tmp_path: Path,
) -> None:
    facade = own_tool(kernel_mode="session")
    old = SessionScope("old", "a", cwd=tmp_path)
    new = SessionScope("new", "a", cwd=tmp_path)
    assert facade.run_sync("x = 41", scope=old).ok
    root = staging_of(facade)
    kernels = session_kernels(host=os.getpid())

    disk.fill()
    # A session whose kernel runs needs no new files: its state is there and it runs.
    assert facade.run_sync("x += 1; print(x)", scope=old).content == "42\n"
    # A new session cannot start its kernel; nor can the isolated fallback stage its run.
    result = facade.run_sync("print('must not run')", scope=new)
    content = result.content
    assert content.startswith("Note: this call could not run in its session (startup_failed)")
    assert "nothing ran" in content.splitlines()[0]
    assert WORKSPACE_REFUSED in content and FULL in content
    details = result.details
    assert details["fallback_reason"] == "startup_failed"
    assert details["startup_failed"] is True
    assert details["startup_error"] == "staging"
    assert details["persistent"] is False
    assert details["exit_code"] is None
    assert wait_until(lambda: leftovers(root) == []), leftovers(root)  # removed soon after
    assert session_kernels(host=os.getpid()) == kernels  # the old session's kernel only

    disk.free()
    assert facade.run_sync("print(x)", scope=old).content == "42\n"  # nothing lost
    result = facade.run_sync("y = 1; print('new')", scope=new)
    assert result.content == "new\n" and result.details["persistent"] is True
    closes_clean(facade, disk)


@pytest.mark.parametrize("mode", ["per_call", "session"])
def test_output_spill_failing_mid_run_keeps_the_run_and_says_so(
    own_tool: Callable[..., ExecuteCode], disk: Disk, mode: str, tmp_path: Path
) -> None:
    config: dict[str, Any] = {"kernel_mode": mode, "max_output_bytes": 1000}
    facade = own_tool(**config)
    scope = SessionScope("s", "a", cwd=tmp_path)
    assert facade.run_sync("pass", scope=scope).ok
    root = staging_of(facade)
    # Per call the workspace needs a page or two; the spill file then finds none.
    disk.fill()
    if mode == "per_call":
        disk.free()
        reserve = disk.path / "room"
        reserve.write_bytes(b"\0" * (1 << 20))
        disk.fill()
        reserve.unlink()  # 1 MiB free: the run starts, its 8 MiB of output cannot all spill
    script = "for i in range(8192): print(str(i).rjust(1023, '.'))"
    result = facade.run_sync(script, scope=scope)
    assert result.details["exit_code"] == 0, result.content
    assert result.details["truncated"] is True
    assert "full_output_path" not in result.details
    content = result.content
    assert content.startswith("." * 100) and content.rstrip().endswith(
        "only the part shown above is kept.]"
    ), content[-500:]
    assert "[The full output could not be saved to a file: " + FULL in content
    assert "8191" in content  # the tail is kept
    assert leftovers(root) == []  # the partial spill file was removed

    disk.free()
    result = facade.run_sync(script, scope=scope)
    assert result.details["full_output_path"], result.content[-300:]
    assert Path(result.details["full_output_path"]).stat().st_size == 8192 * 1024
    facade.close()


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["per_call", "session"])
def test_a_disk_that_fills_at_any_step_of_a_start_gives_a_result(
    monkeypatch: pytest.MonkeyPatch, mode: str, tmp_path: Path
) -> None:
    """One more file (inode) each time: the disk fills at every step from the staging root
    to the kernel's last socket. Each is a refusal naming the full disk (never an exception,
    never a wait for the startup timeout) and leaves nothing, until the run fits."""
    scope = SessionScope("s", "a", cwd=tmp_path)
    for inodes in range(2, 60):
        with tmpfs(f"size=16m,nr_inodes={inodes}") as path:
            monkeypatch.setenv("TMPDIR", str(path))
            base = path / RUNTIME_BASE
            monkeypatch.setattr(runtime_base, "base_path", lambda base=base: base)
            facade = ExecuteCode(enabled_config(kernel_mode=mode, timeout_ms=30_000))
            try:
                result = facade.run_sync("print('ran')", scope=scope)
            finally:
                facade.close()
            left = [name for name in os.listdir(path) if name != RUNTIME_BASE]
            if base.is_dir():
                left += [f"{RUNTIME_BASE}/{name}" for name in os.listdir(base)]
            assert left == [], (inodes, left)
        if result.content == "ran\n":
            break
        where = f"with {inodes} inodes: {result.content}"
        assert WORKSPACE_REFUSED in result.content, where
        assert "No space left on device" in result.content, where
        assert result.details["exit_code"] is None, where
        assert result.details.get("startup_error") in (None, "staging"), where
    else:
        pytest.fail("the run never fitted")
    assert inodes > 10  # it did fill at the kernel's own files first
