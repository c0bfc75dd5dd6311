"""Last-resort cleanup when the host process exits without closing its facades.

Normal shutdown is ``await ExecuteCode.aclose()``. If the program exits without it (normal
interpreter exit, or SIGTERM with the default disposition in a program that runs the facade
on its main thread), these hooks SIGKILL every live kernel's process tree and remove the
private staging roots, so no kernel, connection file or workspace outlives the host.

A host that dies without running any hook (SIGKILL; SIGTERM while its handler is not ours) is
covered by the kernel side (:mod:`lemon_exec.proc.supervise`): kernels and the fork-server
template watch their parent and kill their whole process trees, and each kernel deletes its
connection file. The template also runs the dead host's own teardown
(:func:`lemon_exec.proc.host_teardown.teardown_dead_host`): what the host would have removed
on a clean close goes; ``spill/`` (spill files stay readable for 24 hours), the owner marker
and the index stay.

What even that could not clean (say the template was killed too) the next host start
handles with :func:`sweep_dead_hosts`: it kills the processes a dead host recorded in its
index (only if PID *and* start time still match) and deletes the connection files (the
keys) the index names. It never traverses or removes the root: the staging sweep removes
it once it is empty (:func:`lemon_exec.host.disk.stale_roots.sweep_stale_roots`), and the spill
reaper empties its ``spill/`` (:mod:`lemon_exec.host.disk.spill_reaper`).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import signal
import stat
import subprocess
import tempfile
import threading
import weakref
from pathlib import Path
from typing import Any, Protocol

from lemon_exec._constants import STAGING_ROOT_PREFIX
from lemon_exec.host.disk import external
from lemon_exec.host.disk.runtime_base import runtime_dir_of
from lemon_exec.proc import supervise
from lemon_exec.proc.host_teardown import INDEX_NAME
from lemon_exec.proc.private_fs import DIR_FLAGS, is_own_private_dir, read_private_json

log = logging.getLogger(__name__)

#: At most this many sibling roots are examined per sweep, and index files this large read.
_MAX_ROOTS = 64
_MAX_INDEX_BYTES = 1 << 20
#: At most this many connection files an index names are deleted.
_MAX_CONNECTION_FILES = 4096


class _Cleanable(Protocol):
    def emergency_cleanup(self) -> None: ...


_engines: weakref.WeakSet[Any] = weakref.WeakSet()
_installed = False
_lock = threading.Lock()


def register(engine: _Cleanable) -> None:
    """Track ``engine`` for exit-time cleanup (installs the hooks once)."""
    global _installed
    with _lock:
        _engines.add(engine)
        if _installed:
            return
        _installed = True
    atexit.register(cleanup_all)
    _install_sigterm()


def unregister(engine: _Cleanable) -> None:
    with _lock:
        _engines.discard(engine)


def cleanup_all() -> None:
    for engine in list(_engines):
        with contextlib.suppress(Exception):
            engine.emergency_cleanup()
    _engines.clear()


def kill_kernel_tree(process: Any) -> None:
    """Kill a cold-started kernel's descendants and the kernel, before its group is killed.

    ``killpg`` misses what left the group (``setsid`` daemons); the kernel is a subreaper,
    so they are all in its tree. Only a process not yet reaped (its PID cannot have been
    reused). A forked kernel needs none of this: its template adopts and kills its orphans.
    """
    if isinstance(process, subprocess.Popen) and process.poll() is None:
        supervise.kill_tree(process.pid)


def _install_sigterm() -> None:
    # Only take SIGTERM over when nobody else handles it, and only from the main thread.
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return

    def on_sigterm(signum: int, _frame: Any) -> None:
        cleanup_all()
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)  # die of SIGTERM as the default would have

    signal.signal(signal.SIGTERM, on_sigterm)


# -- after a host died ------------------------------------------------------------------------


def _host_dead(pid: int, started: int | None) -> bool:
    """Whether the host that was ``pid`` (started at ``started``, if known) has ended.

    A zombie has ended; a live process with another start time is a reused PID.
    """
    if started is not None:
        return not supervise.same_process(pid, started)
    return not supervise.running(pid)


def sweep_dead_hosts(base: str | os.PathLike[str] | None = None) -> int:
    """Kill what dead hosts left running and delete their keys. Returns kills.

    For every staging root in ``base`` whose index names a host that has ended, every
    recorded process (kernel or template) whose start time still matches is killed with its
    whole process tree, and every connection file the index names is deleted (each a direct,
    regular file in the root's runtime directory; nothing is walked). The root itself is left to
    the staging sweep, which removes it only once it is empty.
    """
    base_path = Path(base) if base is not None else Path(tempfile.gettempdir())
    killed = 0
    try:
        roots = [p for p in base_path.glob(f"{STAGING_ROOT_PREFIX}*")][:_MAX_ROOTS]
    except OSError:
        return 0
    for root in roots:
        data = _read_index(root)
        if data is None:
            continue
        try:
            host = int(data["pid"])
            host_start = data.get("host_start")
            procs = [(int(p["pid"]), int(p["start"])) for p in data.get("processes", [])]
            kernels = [k for k in data.get("kernels", []) if isinstance(k, dict)]
        except (KeyError, TypeError, ValueError, AttributeError):
            continue
        if host == os.getpid() or not _host_dead(host, host_start):
            continue
        for pid, started in procs:
            if pid > 1 and supervise.same_process(pid, started):
                killed += supervise.kill_tree(pid)
        names = [k.get("connection_file") for k in kernels[:_MAX_CONNECTION_FILES]]
        _delete_connection_files(root, [n for n in names if isinstance(n, str)])
        external.sweep_dangling()  # their links for Jupyter Server now dangle
    return killed


def _delete_connection_files(root: Path, paths: list[str]) -> None:
    """Delete each of ``paths`` that is a regular file of ours directly in ``root``'s runtime
    directory (:func:`lemon_exec.host.disk.runtime_base.runtime_dir_of`)."""
    runtime = runtime_dir_of(root)
    names = {Path(p).name for p in paths if Path(p).parent == runtime}
    names = {n for n in names if n.startswith("kernel-") and n.endswith(".json")}
    if not names:
        return
    try:
        fd = os.open(runtime, DIR_FLAGS)  # O_NOFOLLOW: never a symlinked runtime directory
    except OSError:
        return
    try:
        for name in names:
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                if stat.S_ISREG(st.st_mode) and st.st_uid == os.getuid():
                    os.unlink(name, dir_fd=fd)
            except FileNotFoundError:
                continue
            except OSError as exc:
                log.warning("execute_code: could not delete %s/%s: %s", runtime, name, exc)
    finally:
        os.close(fd)


def _read_index(root: Path) -> dict[str, Any] | None:
    """A root's index if it is exactly as we write it (ours, 0600, a regular file)."""
    if not is_own_private_dir(root):
        return None
    data = read_private_json(root / INDEX_NAME, _MAX_INDEX_BYTES)
    return data if isinstance(data, dict) else None
