"""Stale staging roots and the spill reaper, as the spec bounds them.

- At boot a stale root (validated owner marker naming a dead process) is removed only when
  it is empty; a non-empty one is never traversed or removed.
- After a host died, the next start kills its recorded survivors and deletes the connection
  files its index names, nothing else; the fork-server template's teardown of its dead
  host keeps ``spill/`` and the owner marker.
- The spill reaper runs one batch of at most 1,000 direct entries per 24-hour window: the
  current root first, then one stale root; it resumes where it stopped.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from lemon_exec import ExecuteCodeConfig
from lemon_exec._constants import SPILL_PREFIX
from lemon_exec.host.disk import hygiene
from lemon_exec.host.disk.runtime_base import runtime_dir_of
from lemon_exec.host.disk.spill_reaper import SpillReaper
from lemon_exec.host.disk.staging import StagingRoot
from lemon_exec.host.disk.stale_roots import sweep_stale_roots
from lemon_exec.host.kernels.engine import Engine
from lemon_exec.proc import supervise
from lemon_exec.proc.host_teardown import teardown_dead_host
from lemon_exec.proc.private_fs import write_owner_marker
from lemon_exec.telemetry import Telemetry

pytestmark = pytest.mark.timeout(60)

DAY = 86_400.0


def private_file(path: Path, data: str = "") -> Path:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, data.encode())
    os.close(fd)
    return path


def dead_root(base: Path, name: str, owner: int, *, dirs: bool = True) -> Path:
    """A root as a dead host leaves it: marker, index, and (empty) known directories."""
    root = base / name
    root.mkdir(mode=0o700)
    private_file(root / "owner", json.dumps({"pid": owner, "created": 1, "version": 1}))
    private_file(root / "kernels.json", json.dumps({"pid": owner, "kernels": []}))
    if dirs:
        for sub in ("runtime", "spill", "work", "pypath"):
            (root / sub).mkdir(mode=0o700)
    return root


def spill(directory: Path, name: str, age_s: float, now: float | None = None) -> Path:
    path = private_file(directory / (SPILL_PREFIX + name), "output")
    when = (time.time() if now is None else now) - age_s
    os.utime(path, (when, when))
    return path


class Clock:
    """A monotonic clock the test moves forward by whole windows."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


# -- the boot-time sweep ---------------------------------------------------------------------


def test_boot_never_traverses_or_removes_a_non_empty_stale_root(
    tmp_path: Path, dead_pid: int
) -> None:
    stale = dead_root(tmp_path, "lemon-exec-full", dead_pid)
    nested = stale / "work" / "run-1" / "deep"
    nested.mkdir(parents=True)
    (nested / "data.txt").write_text("kept")
    expired = spill(stale / "spill", "old", 2 * DAY)
    before = sorted(str(p.relative_to(stale)) for p in stale.rglob("*"))
    with StagingRoot.create(tmp_path) as created:
        assert created.path != stale
        assert sorted(str(p.relative_to(stale)) for p in stale.rglob("*")) == before
    assert expired.exists(), "the boot sweep reaped spill files (the reaper's job, bounded)"
    assert sweep_stale_roots(tmp_path) == 0
    assert (nested / "data.txt").read_text() == "kept"


def test_boot_removes_an_empty_stale_root(tmp_path: Path, dead_pid: int) -> None:
    empty = dead_root(tmp_path, "lemon-exec-empty", dead_pid)
    bare = dead_root(tmp_path, "lemon-exec-bare", dead_pid, dirs=False)
    assert sweep_stale_roots(tmp_path) == 2
    assert not empty.exists() and not bare.exists()


@pytest.mark.parametrize("extra", ["file", "symlink", "unknown_dir", "pypath_link"])
def test_boot_keeps_a_stale_root_with_anything_else(
    tmp_path: Path, dead_pid: int, extra: str
) -> None:
    stale = dead_root(tmp_path, "lemon-exec-odd", dead_pid)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim").write_text("keep")
    if extra == "file":
        (stale / "runtime" / "kernel-1.log").write_text("log")
    elif extra == "symlink":
        (stale / "spill").rmdir()
        (stale / "spill").symlink_to(outside)
    elif extra == "unknown_dir":
        (stale / "other").mkdir()
    else:
        (stale / "pypath" / "lemon_exec").symlink_to(outside)
    assert sweep_stale_roots(tmp_path) == 0
    assert (stale / "owner").exists()
    assert (outside / "victim").read_text() == "keep"


def test_boot_skips_a_live_owner(tmp_path: Path) -> None:
    live = dead_root(tmp_path, "lemon-exec-live", os.getpid())
    assert sweep_stale_roots(tmp_path) == 0
    assert live.exists()


# -- after a host died -----------------------------------------------------------------------


def test_next_start_deletes_recorded_keys_and_nothing_else(
    tmp_path: Path, dead_pid: int, reap_dirs: list[Path]
) -> None:
    root = dead_root(tmp_path, f"lemon-exec-dead{uuid.uuid4().hex[:8]}", dead_pid)
    runtime = runtime_dir_of(root)  # keys live under the fixed runtime base
    runtime.mkdir(mode=0o700)
    reap_dirs.append(runtime)
    key = private_file(runtime / "kernel-a.json", '{"key": "secret"}')
    log_file = private_file(runtime / "kernel-a.log", "log")
    unrecorded = private_file(runtime / "kernel-b.json", '{"key": "other"}')
    workspace = root / "work" / "run-1"
    workspace.mkdir()
    (workspace / "data.txt").write_text("kept")
    outside = private_file(tmp_path / "kernel-x.json", "not ours to delete")
    linked = runtime / "kernel-l.json"
    linked.symlink_to(outside)
    survivor = subprocess.Popen(["sleep", "1000"], start_new_session=True)
    try:
        started = supervise.start_time(survivor.pid)
        index = {
            "pid": dead_pid,
            "host_start": 1,
            "kernels": [
                {"connection_file": str(key)},
                {"connection_file": str(outside)},  # not in runtime/: never deleted
                {"connection_file": str(linked)},  # a symlink: never followed
                {"connection_file": str(runtime / ".." / "owner")},
            ],
            "processes": [{"pid": survivor.pid, "start": started}],
        }
        (root / "kernels.json").write_text(json.dumps(index))
        assert hygiene.sweep_dead_hosts(tmp_path) == 1
        survivor.wait(5)
        assert not key.exists(), "a recorded connection file (a key) survived"
        assert outside.read_text() == "not ours to delete"
        assert linked.is_symlink()
        # Nothing else is traversed or removed: the root stays for the empty-root rule.
        assert (root / "owner").exists() and (workspace / "data.txt").exists()
        assert log_file.exists() and unrecorded.exists()
    finally:
        survivor.kill()
        survivor.wait()


def test_template_teardown_keeps_spill_files_and_the_marker(
    tmp_path: Path, dead_pid: int, reap_dirs: list[Path]
) -> None:
    root = dead_root(tmp_path, f"lemon-exec-torn{uuid.uuid4().hex[:8]}", dead_pid)
    (root / "work" / "run-1" / "deep").mkdir(parents=True)
    (root / "pypath" / "lemon_exec").symlink_to(tmp_path)
    fresh = spill(root / "spill", "fresh", 60)
    runtime = runtime_dir_of(root)  # keys live under the fixed runtime base
    runtime.mkdir(mode=0o700)
    reap_dirs.append(runtime)
    private_file(runtime / "owner", json.dumps({"pid": dead_pid, "created": 1, "version": 1}))
    key = private_file(runtime / "kernel-a.json", '{"key": "secret"}')
    links = tmp_path / "external"
    links.mkdir()
    (links / "lemon-a.json").symlink_to(key)
    (links / "lemon-live.json").symlink_to(fresh)
    assert teardown_dead_host(root, dead_pid, runtime, links)
    assert sorted(p.name for p in root.iterdir()) == ["kernels.json", "owner", "spill"]
    assert not runtime.exists(), "the dead host's keys outlived its teardown"
    assert sorted(p.name for p in links.iterdir()) == ["lemon-live.json"]
    assert fresh.read_text() == "output", "a spill file must stay readable for 24 h"
    assert tmp_path.exists()
    # With its spill file gone (the reaper's job), a later boot removes the root.
    assert sweep_stale_roots(tmp_path) == 0
    fresh.unlink()
    assert sweep_stale_roots(tmp_path) == 1


def test_template_teardown_needs_a_dead_owner(tmp_path: Path) -> None:
    root = dead_root(tmp_path, "lemon-exec-alive", os.getpid())
    (root / "work" / "run-1").mkdir()
    runtime = tmp_path / "runtime"
    runtime.mkdir(mode=0o700)
    write_owner_marker(runtime)
    assert not teardown_dead_host(root, os.getpid(), runtime)
    assert (root / "work" / "run-1").exists() and runtime.exists()


# -- the spill reaper --------------------------------------------------------------------------


def test_one_batch_per_window_resumes_later(tmp_path: Path) -> None:
    clock = Clock()
    with StagingRoot.create(tmp_path) as root:
        now = time.time()
        for i in range(1500):
            spill(root.spill_dir, f"{i:04d}", 2 * DAY, now)
        reaper = SpillReaper(root.path, clock=clock)
        try:
            assert reaper.run() == 1000
            assert reaper.run() is None, "a second batch ran within the same 24 h window"
            clock.now += DAY - 1
            assert reaper.run() is None
            assert len(os.listdir(root.spill_dir)) == 500
            clock.now += 1
            assert reaper.run() == 500
            assert os.listdir(root.spill_dir) == []
        finally:
            reaper.close()


def test_a_window_goes_on_where_the_last_one_stopped(tmp_path: Path) -> None:
    clock = Clock()
    with StagingRoot.create(tmp_path) as root:
        now = time.time()
        files = [spill(root.spill_dir, f"{i:04d}", 60, now) for i in range(1010)]
        reaper = SpillReaper(root.path, clock=clock)
        try:
            assert reaper.run() == 0  # 1,000 fresh entries examined, none expired
            old = now - 2 * DAY
            for path in files:
                os.utime(path, (old, old))
            clock.now += DAY
            # Only the 10 entries not examined yet: not the same 1,000 again.
            assert reaper.run() == 10
            clock.now += DAY
            assert reaper.run() == 1000  # a new pass
        finally:
            reaper.close()


def test_current_root_first_then_one_stale_root(tmp_path: Path, dead_pid: int) -> None:
    clock = Clock()
    now = time.time()
    first = dead_root(tmp_path, "lemon-exec-a", dead_pid)
    second = dead_root(tmp_path, "lemon-exec-b", dead_pid)
    for stale in (first, second):
        for i in range(600):
            spill(stale / "spill", f"{i:03d}", 2 * DAY, now)
    live = dead_root(tmp_path, "lemon-exec-live", os.getpid())
    live_spill = spill(live / "spill", "live", 2 * DAY, now)
    with StagingRoot.create(tmp_path) as root:
        for i in range(600):
            spill(root.spill_dir, f"{i:03d}", 2 * DAY, now)
        reaper = SpillReaper(root.path, clock=clock)
        try:
            assert sorted(reaper.stale) == [first, second]
            head, other = reaper.stale
            assert reaper.run() == 1000
            assert os.listdir(root.spill_dir) == []
            assert len(os.listdir(head / "spill")) == 200
            assert len(os.listdir(other / "spill")) == 600, "a second stale root was used"
            clock.now += DAY
            assert reaper.run() == 200  # the same stale root goes on; no other this window
            assert len(os.listdir(other / "spill")) == 600
            clock.now += DAY
            assert reaper.run() == 600
            assert reaper.stale == []
        finally:
            reaper.close()
    assert live_spill.exists()
    # Their spill directories emptied, the stale roots are removed at a later boot.
    assert sweep_stale_roots(tmp_path) == 2
    assert not first.exists() and not second.exists() and live.exists()


def test_only_expired_regular_spill_files_go(tmp_path: Path, dead_pid: int) -> None:
    now = time.time()
    outside = tmp_path / "outside"
    outside.mkdir()
    victim = spill(outside, "victim", 2 * DAY, now)
    stale = dead_root(tmp_path, "lemon-exec-stale", dead_pid)
    (stale / "spill").rmdir()
    (stale / "spill").symlink_to(outside)  # a symlinked spill dir is never followed
    with StagingRoot.create(tmp_path) as root:
        old = spill(root.spill_dir, "old", 2 * DAY, now)
        fresh = spill(root.spill_dir, "fresh", 60, now)
        live = spill(root.spill_dir, "live", 2 * DAY, now)
        other = private_file(root.spill_dir / "notes.txt")
        os.utime(other, (now - 2 * DAY, now - 2 * DAY))
        link = root.spill_dir / (SPILL_PREFIX + "link")
        link.symlink_to(victim)
        os.utime(link, (now - 2 * DAY, now - 2 * DAY), follow_symlinks=False)
        directory = root.spill_dir / (SPILL_PREFIX + "dir")
        directory.mkdir()
        os.utime(directory, (now - 2 * DAY, now - 2 * DAY))
        reaper = SpillReaper(root.path, is_live=lambda path: path == live)
        try:
            assert reaper.run() == 1
        finally:
            reaper.close()
        assert not old.exists()
        assert fresh.exists() and live.exists() and other.exists()
        assert link.is_symlink() and directory.is_dir() and victim.exists()


def test_the_engine_reaps_once_per_window(short_tmp: Path, dead_pid: int) -> None:
    now = time.time()
    stale = dead_root(short_tmp, "lemon-exec-old", dead_pid)
    for i in range(1200):
        spill(stale / "spill", f"{i:04d}", 2 * DAY, now)

    async def boot() -> None:
        # The node boots (its kernel supervisor is made): one batch of 1,000 entries.
        engine = Engine(ExecuteCodeConfig(enabled=True), Telemetry(), short_tmp)
        try:
            assert len(os.listdir(stale / "spill")) == 200
            assert engine.reaper.run() is None  # the hourly check, within the same window
            assert len(os.listdir(stale / "spill")) == 200
        finally:
            await engine.aclose()

    asyncio.run(boot())
    assert stale.exists()
