"""Tests for the staging area: private directories, bounded removal, sweeping, reaping.

Modules: host.staging, host.private_fs, host.tree_removal, host.stale_roots.
"""

from __future__ import annotations

import json
import os
import stat
import tempfile
import time
from pathlib import Path

import pytest

from lemon_exec._constants import SPILL_PREFIX
from lemon_exec.errors import RefusedError
from lemon_exec.host.disk import staging, staging_base, stale_roots
from lemon_exec.host.disk.staging import StagingRoot
from lemon_exec.host.disk.stale_roots import sweep_stale_roots
from lemon_exec.proc import private_fs, tree_removal
from lemon_exec.proc.private_fs import write_private_file
from lemon_exec.proc.tree_removal import remove_tree

pytestmark = pytest.mark.timeout(60)

DAY = 86_400


def mode_of(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.fixture
def root(tmp_path: Path):
    with StagingRoot.create(tmp_path) as created:
        yield created


def fake_root(base: Path, name: str, marker: object, *, marker_mode: int = 0o600) -> Path:
    """A sibling root as another process would have left it."""
    path = base / name
    path.mkdir(mode=0o700)
    (path / "spill").mkdir(mode=0o700)
    (path / "work" / "run-1").mkdir(mode=0o700, parents=True)
    (path / "work" / "run-1" / "data.txt").write_text("x")
    if marker is not None:
        text = marker if isinstance(marker, str) else json.dumps(marker)
        fd = os.open(path / "owner", os.O_WRONLY | os.O_CREAT | os.O_EXCL, marker_mode)
        os.write(fd, text.encode())
        os.close(fd)
    return path


# --- creation and modes -------------------------------------------------------------------------


def test_root_layout_and_modes(root: StagingRoot, tmp_path: Path) -> None:
    assert root.path.parent == tmp_path
    assert root.path.name.startswith("lemon-exec-")
    assert mode_of(root.path) == 0o700
    # Keys and sockets: under the fixed per-user runtime base, named as the root.
    assert root.runtime_dir == Path(f"/tmp/lemon-exec.{os.getuid()}") / root.path.name
    assert not (root.path / "runtime").exists()
    for sub in (root.runtime_dir, root.spill_dir, root.work_dir):
        if sub != root.runtime_dir:
            assert sub.parent == root.path
        assert stat.S_ISDIR(os.lstat(sub).st_mode)
        assert mode_of(sub) == 0o700
        assert os.lstat(sub).st_uid == os.getuid()


def test_owner_marker(root: StagingRoot) -> None:
    marker = root.path / "owner"
    assert stat.S_ISREG(os.lstat(marker).st_mode)
    assert mode_of(marker) == 0o600
    data = json.loads(marker.read_text())
    assert data["pid"] == os.getpid()
    assert data["version"] == 1
    assert abs(data["created"] - time.time()) < 60


def test_modes_hold_under_a_permissive_umask(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        with StagingRoot.create(tmp_path) as created:
            workspace = created.new_workspace()
            private = write_private_file(workspace, "f", "x")
            assert {mode_of(created.path), mode_of(created.spill_dir), mode_of(workspace)} == {
                0o700
            }
            assert mode_of(private) == 0o600
    finally:
        os.umask(old)


def test_default_base_is_the_temp_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # read each time, not tempfile's cached dir
    with StagingRoot.create() as created:
        assert created.path.parent == tmp_path


def test_new_workspace(root: StagingRoot) -> None:
    first, second = root.new_workspace(), root.new_workspace()
    assert first != second
    for workspace in (first, second):
        assert workspace.parent == root.work_dir
        assert mode_of(workspace) == 0o700
        assert list(workspace.iterdir()) == []


def test_a_bare_workspace_goes_at_once_and_anything_more_is_left_to_the_walk(
    root: StagingRoot, tmp_path: Path
) -> None:
    bare = root.new_workspace("print(1)")
    assert root.remove_bare_workspace(bare) and not bare.exists()
    assert root.remove_bare_workspace(bare)  # gone already: nothing to do

    busy = root.new_workspace("print(1)")
    (busy / "left.txt").write_text("the run wrote this")
    assert not root.remove_bare_workspace(busy)
    assert (busy / "left.txt").exists()  # nothing lost: the bounded walk removes it
    assert root.remove_workspace(busy) and not busy.exists()

    # A workspace swapped for a symlink: refused, and the target's script.py untouched.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "script.py").write_text("keep me")
    swapped = root.new_workspace("print(1)")
    root.remove_workspace(swapped)
    swapped.symlink_to(elsewhere)
    assert not root.remove_bare_workspace(swapped)
    assert (elsewhere / "script.py").read_text() == "keep me"
    swapped.unlink()


def test_close_removes_everything_and_is_idempotent(tmp_path: Path) -> None:
    created = StagingRoot.create(tmp_path)
    write_private_file(created.new_workspace(), "a.txt", b"data")
    created.close()
    assert not created.path.exists()
    created.close()
    with StagingRoot.create(tmp_path) as other:
        path = other.path
    assert not path.exists()


def test_close_keeps_fresh_spill_files_readable(tmp_path: Path) -> None:
    created = StagingRoot.create(tmp_path)
    write_private_file(created.new_workspace(), "a.txt", b"data")
    spill = write_private_file(created.spill_dir, SPILL_PREFIX + "abc", b"full output")
    created.close()
    # The result named this file: it stays readable after the tool closed (spec: 24 hours).
    assert spill.read_bytes() == b"full output"
    assert sorted(p.name for p in created.path.iterdir()) == ["owner", "spill"]
    assert not created.work_dir.exists() and not created.runtime_dir.exists()


def test_sweep_never_traverses_a_non_empty_root(tmp_path: Path, dead_pid: int) -> None:
    stale = fake_root(tmp_path, "lemon-exec-dead", {"pid": dead_pid, "created": 1, "version": 1})
    fresh = stale / "spill" / (SPILL_PREFIX + "fresh")
    fresh.write_text("recent")
    old = stale / "spill" / (SPILL_PREFIX + "old")
    old.write_text("expired")
    os.utime(old, (time.time() - 2 * DAY, time.time() - 2 * DAY))
    # Spec: non-empty stale roots are never removed or traversed (the spill reaper, bounded,
    # removes expired spill files; tests/test_stale_roots.py).
    assert sweep_stale_roots(tmp_path) == 0
    assert fresh.exists() and old.exists()
    assert (stale / "work" / "run-1" / "data.txt").exists()


# --- fail closed ----------------------------------------------------------------------------------


def test_base_that_is_a_file_is_refused(tmp_path: Path) -> None:
    base = tmp_path / "not-a-dir"
    base.write_text("")
    with pytest.raises(RefusedError) as info:
        StagingRoot.create(base)
    assert str(info.value).startswith("execute_code: could not create a private workspace: ")


def test_missing_base_is_refused(tmp_path: Path) -> None:
    with pytest.raises(RefusedError, match="could not create a private workspace"):
        StagingRoot.create(tmp_path / "missing")


def test_wrong_mode_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_mkdtemp = tempfile.mkdtemp

    def loose_mkdtemp(*args: object, **kwargs: object) -> str:
        path = real_mkdtemp(*args, **kwargs)  # type: ignore[call-overload]
        os.chmod(path, 0o755)
        return path

    monkeypatch.setattr(tempfile, "mkdtemp", loose_mkdtemp)
    with pytest.raises(RefusedError, match="mode 0755, not 0700"):
        StagingRoot.create(tmp_path)


def test_wrong_owner_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_uid = os.getuid()
    monkeypatch.setattr(os, "getuid", lambda: real_uid + 4242)
    with pytest.raises(RefusedError, match="owned by uid"):
        StagingRoot.create(tmp_path)


def test_symlinked_subdir_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    outside = tmp_path / "outside"
    outside.mkdir(mode=0o700)
    real_mkdir = os.mkdir

    def planting_mkdir(path: object, mode: int = 0o777, **kwargs: object) -> None:
        if str(path).endswith("spill"):
            os.symlink(outside, path)  # type: ignore[arg-type]
            return
        real_mkdir(path, mode, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "mkdir", planting_mkdir)
    with pytest.raises(RefusedError, match="symlink"):
        StagingRoot.create(tmp_path)
    assert outside.is_dir()  # cleanup removed the link, not its target
    assert [p.name for p in tmp_path.iterdir()] == ["outside"]


# --- private files --------------------------------------------------------------------------------


def test_write_private_file(root: StagingRoot) -> None:
    path = write_private_file(root.runtime_dir, "kernel.json", '{"key": "é"}')
    assert path == root.runtime_dir / "kernel.json"
    assert mode_of(path) == 0o600
    assert json.loads(path.read_text(encoding="utf-8")) == {"key": "é"}
    raw = root.write_private_file(root.runtime_dir, "raw.bin", b"\x00\x01")
    assert raw.read_bytes() == b"\x00\x01"


def test_write_private_file_refuses_an_existing_name(root: StagingRoot) -> None:
    path = write_private_file(root.runtime_dir, "once", b"first")
    with pytest.raises(FileExistsError):
        write_private_file(root.runtime_dir, "once", b"second")
    assert path.read_bytes() == b"first"


def test_write_private_file_refuses_a_symlink(root: StagingRoot, tmp_path: Path) -> None:
    target = tmp_path / "target.txt"
    target.write_text("untouched")
    (root.runtime_dir / "link").symlink_to(target)
    with pytest.raises(FileExistsError):
        write_private_file(root.runtime_dir, "link", b"evil")
    assert target.read_text() == "untouched"
    dangling = root.runtime_dir / "dangling"
    dangling.symlink_to(tmp_path / "would-be-created")
    with pytest.raises(FileExistsError):
        write_private_file(root.runtime_dir, "dangling", b"evil")
    assert not (tmp_path / "would-be-created").exists()


@pytest.mark.parametrize("name", ["", ".", "..", "a/b", "../escape"])
def test_write_private_file_wants_a_plain_name(root: StagingRoot, name: str) -> None:
    with pytest.raises(ValueError):
        write_private_file(root.runtime_dir, name, b"")


# --- bounded removal ------------------------------------------------------------------------------


def test_remove_tree_removes_nested_content(tmp_path: Path) -> None:
    top = tmp_path / "top"
    (top / "a" / "b" / "c").mkdir(parents=True)
    (top / "a" / "b" / "c" / "f").write_text("x")
    (top / "a" / "g").write_text("y")
    (top / "fifo").symlink_to("nowhere")
    assert remove_tree(top) is True
    assert not top.exists()
    assert remove_tree(top) is True  # already gone


def test_remove_tree_stops_at_the_bound(tmp_path: Path) -> None:
    top = tmp_path / "big"
    top.mkdir()
    for i in range(10_050):
        (top / f"f{i:05d}").touch()
    assert remove_tree(top, max_entries=10_000) is False
    left = list(top.iterdir())
    assert len(left) == 50
    assert mode_of(top) == 0o700  # the remainder stays owner-only
    assert remove_tree(top, max_entries=10_000) is True
    assert not top.exists()


def test_remove_tree_bound_counts_nested_entries(tmp_path: Path) -> None:
    top = tmp_path / "nested"
    for d in range(10):
        (top / f"d{d}").mkdir(parents=True)
        for i in range(20):
            (top / f"d{d}" / f"f{i}").touch()
    assert remove_tree(top, max_entries=100) is False
    assert top.exists()
    assert remove_tree(top, max_entries=10_000) is True


def test_remove_tree_does_not_follow_symlinks(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    (outside / "deep").mkdir(parents=True)
    (outside / "precious.txt").write_text("keep me")
    (outside / "deep" / "also.txt").write_text("keep me too")
    top = tmp_path / "ws"
    (top / "sub").mkdir(parents=True)
    (top / "sub" / "to-dir").symlink_to(outside)
    (top / "to-file").symlink_to(outside / "precious.txt")
    assert remove_tree(top) is True
    assert not top.exists()
    assert (outside / "precious.txt").read_text() == "keep me"
    assert (outside / "deep" / "also.txt").read_text() == "keep me too"


def test_remove_tree_on_a_symlink_removes_only_the_link(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "f").write_text("x")
    link = tmp_path / "link"
    link.symlink_to(outside)
    assert remove_tree(link) is True
    assert not link.is_symlink()
    assert (outside / "f").exists()


def test_remove_workspace(root: StagingRoot) -> None:
    workspace = root.new_workspace()
    (workspace / "out.txt").write_text("result")
    assert root.remove_workspace(workspace) is True
    assert not workspace.exists()


# --- sweeping stale roots -------------------------------------------------------------------------


def empty_root(base: Path, name: str, marker: object) -> Path:
    """A stale root that holds nothing but its marker and empty directories."""
    path = fake_root(base, name, marker)
    (path / "work" / "run-1" / "data.txt").unlink()
    (path / "work" / "run-1").rmdir()
    return path


def test_sweep_removes_a_dead_owners_empty_root(tmp_path: Path, dead_pid: int) -> None:
    stale = empty_root(tmp_path, "lemon-exec-dead", {"pid": dead_pid, "created": 1, "version": 1})
    assert sweep_stale_roots(tmp_path) == 1
    assert not stale.exists()


def test_sweep_keeps_a_live_owners_root(tmp_path: Path) -> None:
    live = fake_root(tmp_path, "lemon-exec-live", {"pid": os.getpid(), "created": 1, "version": 1})
    assert sweep_stale_roots(tmp_path) == 0
    assert (live / "work" / "run-1" / "data.txt").exists()


@pytest.mark.parametrize(
    "marker",
    [None, "not json", "[1, 2]", {"pid": "123"}, {"pid": True}, {"pid": -1}, {"created": 1}],
)
def test_sweep_skips_missing_or_malformed_markers(tmp_path: Path, marker: object) -> None:
    kept = fake_root(tmp_path, "lemon-exec-odd", marker)
    assert sweep_stale_roots(tmp_path) == 0
    assert (kept / "work" / "run-1" / "data.txt").exists()


def test_sweep_skips_a_marker_with_loose_mode(tmp_path: Path, dead_pid: int) -> None:
    kept = fake_root(tmp_path, "lemon-exec-loose", {"pid": dead_pid}, marker_mode=0o644)
    assert sweep_stale_roots(tmp_path) == 0
    assert kept.exists()


def test_sweep_skips_a_symlinked_marker(tmp_path: Path, dead_pid: int) -> None:
    real = tmp_path / "real-marker"
    fd = os.open(real, os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(fd, json.dumps({"pid": dead_pid}).encode())
    os.close(fd)
    kept = fake_root(tmp_path, "lemon-exec-linked", None)
    (kept / "owner").symlink_to(real)
    assert sweep_stale_roots(tmp_path) == 0
    assert kept.exists()


def test_sweep_is_not_hung_by_a_fifo_marker(tmp_path: Path) -> None:
    kept = fake_root(tmp_path, "lemon-exec-fifo", None)
    os.mkfifo(kept / "owner", 0o600)
    assert sweep_stale_roots(tmp_path) == 0
    assert kept.exists()


def test_sweep_skips_other_names_and_symlinked_roots(tmp_path: Path, dead_pid: int) -> None:
    other = fake_root(tmp_path, "not-lemon", {"pid": dead_pid})
    target = fake_root(tmp_path, "elsewhere", {"pid": dead_pid})
    (tmp_path / "lemon-exec-link").symlink_to(target)
    assert sweep_stale_roots(tmp_path) == 0
    assert other.exists() and target.exists()


def test_sweep_max_roots(tmp_path: Path, dead_pid: int) -> None:
    for i in range(5):
        empty_root(tmp_path, f"lemon-exec-dead{i}", {"pid": dead_pid})
    assert sweep_stale_roots(tmp_path, max_roots=2) == 2
    assert sweep_stale_roots(tmp_path) == 3


def test_create_sweeps_empty_stale_siblings(tmp_path: Path, dead_pid: int) -> None:
    stale = empty_root(tmp_path, "lemon-exec-old", {"pid": dead_pid})
    full = fake_root(tmp_path, "lemon-exec-full", {"pid": dead_pid})
    with StagingRoot.create(tmp_path) as created:
        assert not stale.exists()
        assert (full / "work" / "run-1" / "data.txt").exists()
        assert created.path.exists()


# Reaping spill files (one batch per 24-hour window): tests/test_stale_roots.py.


def test_module_exports() -> None:
    assert set(staging.__all__) >= {"StagingRoot"}
    assert set(staging_base.__all__) >= {"staging_base", "check_socket_room"}
    assert set(tree_removal.__all__) >= {"remove_tree"}
    assert set(stale_roots.__all__) >= {"sweep_stale_roots"}
    assert set(private_fs.__all__) >= {"write_private_file"}


@pytest.mark.parametrize("mode", [0o700, 0o1700])
def test_an_owner_only_directory_passes_with_or_without_the_sticky_bit(
    tmp_path: Path, mode: int
) -> None:
    """jupyter_client sets the sticky bit on a connection file's directory: it restricts
    deletion only, so a 01700 runtime directory is as private as a 0700 one."""
    path = tmp_path / "d"
    path.mkdir()
    os.chmod(path, mode)
    private_fs.check_private_dir(path)
    assert private_fs.is_own_private_dir(path)


@pytest.mark.parametrize("mode", [0o710, 0o750, 0o1710, 0o755, 0o2700])
def test_a_directory_others_can_enter_is_refused(tmp_path: Path, mode: int) -> None:
    path = tmp_path / "d"
    path.mkdir()
    os.chmod(path, mode)
    with pytest.raises(RefusedError, match=f"has mode {mode:04o}, not 0700"):
        private_fs.check_private_dir(path)
    assert not private_fs.is_own_private_dir(path)
