"""Last-resort cleanup when the host process exits without closing its facades.

Normal shutdown is ``await ExecuteCode.aclose()``. If the program exits without it (normal
interpreter exit, or SIGTERM with the default disposition in a program that runs the facade
on its main thread), these hooks SIGKILL every live kernel's process tree and remove the
private staging roots, so no kernel, connection file or workspace outlives the host.

A host that dies without running any hook (SIGKILL; SIGTERM while its handler is not ours) is
covered by the kernel side (:mod:`lemon_exec.kernel.supervise`): kernels and the fork-server
template watch their parent and kill their whole process trees. What even that could not
clean (say the template was killed too) the next host start sweeps: :func:`sweep_dead_hosts`
kills the processes a dead host recorded in its index (only if PID *and* start time still
match) and removes its staging root, connection files and their keys included.
"""

from __future__ import annotations

import atexit
import contextlib
import json
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
from lemon_exec.host import staging
from lemon_exec.host.index import INDEX_NAME
from lemon_exec.kernel import supervise

log = logging.getLogger(__name__)

#: At most this many sibling roots are examined per sweep, and index files this large read.
_MAX_ROOTS = 64
_MAX_INDEX_BYTES = 1 << 20


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


def host_dead(pid: int, started: int | None) -> bool:
    """Whether the host that was ``pid`` (started at ``started``, if known) has ended.

    A zombie has ended; a live process with another start time is a reused PID.
    """
    if started is not None:
        return not supervise.same_process(pid, started)
    return not supervise.running(pid)


def remove_dead_root(root: Path, host_pid: int) -> bool:
    """Remove ``root`` if it is our private staging root owned by ``host_pid``, now dead.

    Used by the fork-server template when its host died; spill files younger than 24 h stay
    (as after a normal close). True when the root is gone.
    """
    if not _own_private_dir(root) or staging._read_marker_pid(root) != host_pid:
        return False
    if supervise.running(host_pid):
        return False
    return staging._remove_root(root)


def sweep_dead_hosts(base: str | os.PathLike[str] | None = None) -> int:
    """Kill what dead hosts' kernels left running; remove their roots. Returns kills.

    For every staging root in ``base`` whose index names a host that has ended, every
    recorded process (kernel or template) whose start time still matches is killed with its
    whole process tree, then the root is removed. Roots without an index are left to the
    staging sweep (owner PID dead), which also removes their connection files.
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
        except (KeyError, TypeError, ValueError):
            continue
        if host == os.getpid() or not host_dead(host, host_start):
            continue
        for pid, started in procs:
            if pid > 1 and supervise.same_process(pid, started):
                killed += supervise.kill_tree(pid)
        try:
            staging._remove_root(root)
        except OSError as exc:
            log.warning("execute_code: could not remove stale workspace %s: %s", root, exc)
    return killed


def _own_private_dir(path: Path) -> bool:
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return (
        stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and stat.S_IMODE(st.st_mode) == 0o700
    )


def _read_index(root: Path) -> dict[str, Any] | None:
    """A root's index if it is exactly as we write it (ours, 0600, a regular file)."""
    if not _own_private_dir(root):
        return None
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    try:
        fd = os.open(root / INDEX_NAME, flags)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if (
            not stat.S_ISREG(st.st_mode)
            or st.st_uid != os.getuid()
            or stat.S_IMODE(st.st_mode) != 0o600
            or st.st_size > _MAX_INDEX_BYTES
        ):
            return None
        data = json.loads(os.read(fd, _MAX_INDEX_BYTES + 1))
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)
    return data if isinstance(data, dict) else None
