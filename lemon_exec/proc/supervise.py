"""Process supervision: nothing a kernel starts outlives its run, its session or its host.

Linux only (elsewhere every function here is a harmless no-op). Three mechanisms:

- **Subreaper** (``PR_SET_CHILD_SUBREAPER``): a kernel, and the fork-server template, adopt
  the orphans of their descendants instead of init. A ``setsid`` daemon or a classic
  double-fork daemon therefore stays in the kernel's process tree, where :func:`kill_tree`
  finds it, although it left the kernel's process group.
- **Parent watch**: a thread waits on a pidfd of the process that started the kernel (the
  host, or the template), and when that process is gone kills the kernel's whole tree,
  removes its connection file (it holds the key) and exits. A pidfd watches the *process*;
  ``PR_SET_PDEATHSIG`` would fire when the parent *thread* that forked us exits, which for a
  host running its event loop in a helper thread is not the host's death.
- **SIGTERM**: a kernel told to stop kills its descendants (SIGTERM, a short grace, then
  SIGKILL) before it dies, so a graceful stop leaves nothing either.

The tree is read from ``/proc/<pid>/task/*/children`` where the kernel provides it, else
from every ``/proc/<pid>/stat`` (a full scan: only on stop paths, never per cell).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

_PR_SET_CHILD_SUBREAPER = 36
#: How long a kill_tree keeps killing what keeps appearing (a fork loop) before giving up.
_KILL_TREE_TIMEOUT_S = 2.0
#: Grace the SIGTERM handler gives descendants before SIGKILL.
_TERM_GRACE_S = 0.3
_POLL_PARENT_S = 0.2
_LINUX = sys.platform.startswith("linux")
#: Set in a kernel's environment by the sandbox (lemon_exec.host.kernels.sandbox): its launcher
#: ignored SIGINT (bwrap would die of the host's interrupts), so the kernel restores it.
SANDBOX_ENV = "LEMON_EXEC_SANDBOXED"


def _load_prctl() -> Any:
    if not _LINUX:
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


#: libc's prctl, looked up once (at import: in the fork-server template, for every kernel).
_PRCTL = _load_prctl()


def _prctl(option: int, arg: int) -> bool:
    if _PRCTL is None:
        return False
    return int(_PRCTL(option, arg, 0, 0, 0)) == 0


def become_subreaper() -> bool:
    """Adopt orphaned descendants (they would go to init otherwise); True if it worked."""
    return _prctl(_PR_SET_CHILD_SUBREAPER, 1)


# -- reading the process tree ---------------------------------------------------------------


def _stat_fields(pid: int) -> list[str] | None:
    """Fields of ``/proc/<pid>/stat`` after the command name (state is [0], ppid [1])."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            raw = fh.read()
    except OSError:
        return None
    return raw.rsplit(b")", 1)[-1].decode("ascii", "replace").split()


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (tells a reused PID apart)."""
    fields = _stat_fields(pid)
    try:
        return int(fields[19]) if fields else None
    except (IndexError, ValueError):
        return None


def state(pid: int) -> tuple[str, int] | None:
    """``(state letter, CPU ticks used)`` of ``pid`` (``T``: stopped, ``t``: traced, ``Z``:
    zombie; ticks: user plus system time), None when it is gone."""
    fields = _stat_fields(pid)
    try:
        return (fields[0], int(fields[11]) + int(fields[12])) if fields else None
    except (IndexError, ValueError):
        return None


def kill_pending(pid: int) -> bool:
    """Whether ``pid`` has a SIGKILL pending: it dies as soon as it next runs (on a busy
    machine that may take a while, and until then it looks alive)."""
    try:
        with open(f"/proc/{pid}/status", "rb") as fh:
            status = fh.read()
    except OSError:
        return False
    bit = 1 << (signal.SIGKILL - 1)
    for line in status.splitlines():
        if line.startswith((b"SigPnd:", b"ShdPnd:")):
            with contextlib.suppress(ValueError):
                if int(line.split()[1], 16) & bit:
                    return True
    return False


def running(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie."""
    fields = _stat_fields(pid)
    if not fields:
        return False
    return fields[0] not in ("Z", "X")


def same_process(pid: int, started: int | None) -> bool:
    """Whether ``pid`` is still the process that had start time ``started`` and runs."""
    return started is not None and running(pid) and start_time(pid) == started


def _children_file(pid: int) -> list[int] | None:
    """Children from /proc/<pid>/task/*/children, or None where the kernel lacks the file."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    found: list[int] = []
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as fh:
                found.extend(int(c) for c in fh.read().split())
        except FileNotFoundError:
            if not os.path.exists(f"/proc/{pid}/task/{tid}"):
                continue  # the thread ended meanwhile
            return None
        except OSError:
            continue
    return found


def _parent_map() -> dict[int, list[int]]:
    """``ppid -> [pid]`` of every running process (zombies left out)."""
    tree: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        fields = _stat_fields(int(entry))
        if not fields or fields[0] in ("Z", "X"):
            continue
        with contextlib.suppress(IndexError, ValueError):
            tree.setdefault(int(fields[1]), []).append(int(entry))
    return tree


def children(pid: int) -> list[int]:
    """Running (non-zombie) children of ``pid``."""
    found = _children_file(pid)
    if found is None:
        return _parent_map().get(pid, [])
    return [c for c in found if running(c)]


def descendants(pid: int) -> list[int]:
    """Every running descendant of ``pid``, parents before their children."""
    if not _LINUX:
        return []
    if _children_file(pid) is None:
        tree = _parent_map()

        def kids(p: int) -> Iterable[int]:
            return tree.get(p, [])
    else:

        def kids(p: int) -> Iterable[int]:
            found = _children_file(p)
            return [c for c in found or [] if running(c)]

    order: list[int] = []
    seen: set[int] = {pid}
    queue = [pid]
    while queue:
        for child in kids(queue.pop(0)):
            if child not in seen:
                seen.add(child)
                order.append(child)
                queue.append(child)
    return order


# -- killing --------------------------------------------------------------------------------


def _signal(pid: int, signum: int) -> None:
    with contextlib.suppress(OSError):
        os.kill(pid, signum)


def kill_tree(pid: int, *, include_root: bool = True) -> int:
    """SIGKILL every descendant of ``pid`` (and ``pid`` itself with ``include_root``).

    The root is stopped first so it starts nothing new; descendants are killed in rounds
    until none runs, because a killed process's children reparent (to the root, when it is a
    subreaper) and show up in the next round. Returns how many processes were signalled.
    """
    if not _LINUX or pid <= 1 or (include_root and pid == os.getpid()):
        return 0
    if include_root:
        if not running(pid):
            return 0
        _signal(pid, signal.SIGSTOP)
    killed: set[int] = set()
    deadline = time.monotonic() + _KILL_TREE_TIMEOUT_S
    while True:
        found = [p for p in descendants(pid) if p != os.getpid()]
        if not found:
            break
        for child in found:
            _signal(child, signal.SIGKILL)
            killed.add(child)
        if time.monotonic() > deadline:
            break
        time.sleep(0.002)  # let the kills land and the orphans reparent
    if include_root:
        _signal(pid, signal.SIGKILL)
        killed.add(pid)
    return len(killed)


def _terminate_descendants() -> None:
    """SIGTERM this process's descendants, give them a short grace, then kill the rest."""
    me = os.getpid()
    found = descendants(me)
    for child in found:
        _signal(child, signal.SIGTERM)
    deadline = time.monotonic() + _TERM_GRACE_S
    while found and time.monotonic() < deadline:
        time.sleep(0.01)
        found = [p for p in found if running(p)]
    kill_tree(me, include_root=False)


# -- the kernel's own supervision -----------------------------------------------------------


def supervise_kernel(connection_file: str | None, parent: int | None = None) -> None:
    """Arm a kernel process: subreaper, SIGTERM kills the tree, the parent's death too.

    ``parent`` is the PID of the process that launched us (the host, or the template): it
    may have died before we got here, and then we were reparented already. Call from the
    main thread before the kernel starts its threads.
    """
    if not _LINUX:
        return
    if os.environ.get(SANDBOX_ENV):
        # Inside the sandbox's PID namespace our parent is its init, which bwrap kills (and
        # with it the namespace) when the host dies: that parent is the one to watch.
        signal.signal(signal.SIGINT, signal.default_int_handler)
    become_subreaper()
    signal.signal(signal.SIGTERM, _on_sigterm)
    _watch_parent(lambda: _parent_died(connection_file), parent)


def _on_sigterm(signum: int, _frame: object) -> None:
    _terminate_descendants()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)  # die of SIGTERM, as the default would have


#: Held by whoever writes or removes the kernel's connection file; the parent watch takes
#: it for good (the process exits), so a write that checked the file is there cannot race
#: its removal (kernel/app.py's write_connection_file).
connection_file_lock = threading.Lock()


def _parent_died(connection_file: str | None) -> None:
    try:
        connection_file_lock.acquire()  # never released: os._exit below
        if connection_file:  # it holds the key: nobody may connect to what is left
            with contextlib.suppress(OSError):
                os.unlink(connection_file)
        kill_tree(os.getpid(), include_root=False)
    finally:
        os._exit(1)


def _watch_parent(on_death: Callable[[], None], parent: int | None) -> None:
    """Call ``on_death`` (on a daemon thread) once our parent ``parent`` has exited.

    ``parent`` None means the current parent. If it is no longer our parent, it is gone
    already (we were reparented) and ``on_death`` runs at once.
    """
    ppid = parent if parent else os.getppid()
    fd: int | None = None
    with contextlib.suppress(OSError, AttributeError):
        fd = os.pidfd_open(ppid)

    def watch() -> None:
        # Checked after the pidfd exists: a parent that died before cannot be missed.
        if os.getppid() == ppid:
            if fd is not None:
                poller = select.poll()
                poller.register(fd, select.POLLIN)
                while not poller.poll():
                    pass
            else:  # no pidfd (Linux < 5.3): being reparented tells
                while os.getppid() == ppid:
                    time.sleep(_POLL_PARENT_S)
        on_death()

    threading.Thread(target=watch, name="lemon-parent-watch", daemon=True).start()


def connection_file_arg(argv: list[str]) -> str | None:
    """The ``-f FILE`` (or ``-f=FILE``, ``--f=FILE``) connection file in a kernel's argv."""
    for i, arg in enumerate(argv):
        if arg == "-f" and i + 1 < len(argv):
            return argv[i + 1]
        for prefix in ("-f=", "--f="):
            if arg.startswith(prefix):
                return arg[len(prefix) :]
    return None


def proc_cmdline(pid: int) -> list[bytes]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return []
