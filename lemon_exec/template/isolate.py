"""A forked kernel's own sandbox: bubblewrap's setup, done in Python right after the fork.

Under ``sandbox = "bwrap"`` the fork-server template runs inside one bubblewrap sandbox that
sees the host's filesystem as it is (``--dev-bind / /``), with its own user namespace where it
holds ``CAP_SYS_ADMIN`` (and nothing outside it). It never runs a script. Each kernel it
forks builds its own sandbox before any of its code runs, from the very bwrap options a cold
sandboxed kernel is started with
(:func:`lemon_exec.host.kernels.sandbox.kernel_argv_prefix`), so a forked kernel sees exactly
what a cold one sees:

1. The forked child (the *outer* process, the PID the host knows) dies with the template
   (``PR_SET_PDEATHSIG``), ignores SIGINT like bwrap's launcher, unshares a PID namespace and
   forks its *init* there (PID 1), then waits for it and exits with the kernel's status.
2. The init (dies with the outer process) unshares a mount and an IPC namespace and builds
   the view as bwrap does (:mod:`lemon_exec.template.isolate_view`): a tmpfs root, the
   template's view under ``/oldroot``, each ``--ro-bind``/``--bind``/``--tmpfs``/``--dev``/
   ``--proc`` applied in order under ``/newroot``, then ``pivot_root`` into it, the
   template's view detached. ``/proc`` is a
   fresh one of the kernel's own PID namespace; ``/dev`` a fresh one with its own ``pts`` and
   ``shm``; ``/tmp`` its own tmpfs; of the staging root only its own runtime directory.
   Bind sources are opened first and bound through the descriptor, and only if they are
   the resolved paths the host computed (a symlink swapped in is refused).
3. The init then enters a new user namespace (and, with ``--unshare-net``, a network
   namespace with only its own loopback). Every mount it made is thereby *locked*: from a
   less privileged user namespace nothing can be unmounted to uncover what lies beneath, and
   nothing read-only can be made writable.
4. The init closes every inherited descriptor but the standard streams and forks the
   kernel (PID 2), which drops every capability (bounding set, ambient, effective,
   permitted, inheritable) and sets ``PR_SET_NO_NEW_PRIVS`` before it returns
   to run the kernel. The init reaps orphans and, when the kernel ends, exits with its
   status: the namespace, and every daemon the script left in it, ends with it.

The system calls behind steps 3 and 4 are in :mod:`lemon_exec.template.isolate_syscalls`.
Linux only (the host never asks for it elsewhere).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import signal
import sys
from dataclasses import dataclass, field

from lemon_exec.template.isolate_syscalls import (
    PR_SET_PDEATHSIG,
    IsolationError,
    check,
    drop_privileges,
    load_libc,
    loopback_up,
    map_ids,
    max_fd,
    pivot_root_known,
    prctl,
)
from lemon_exec.template.isolate_view import build_view

__all__ = ["IsolationError", "Plan", "enter", "parse", "supported"]

CLONE_NEWNS = 0x00020000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000

#: Signals whose default action ends a process (the outer process dies of the kernel's).
_FATAL_SIGNALS = frozenset(
    int(s)
    for s in signal.Signals
    if s.name
    in {
        "SIGHUP",
        "SIGINT",
        "SIGQUIT",
        "SIGILL",
        "SIGTRAP",
        "SIGABRT",
        "SIGBUS",
        "SIGFPE",
        "SIGKILL",
        "SIGUSR1",
        "SIGSEGV",
        "SIGUSR2",
        "SIGPIPE",
        "SIGALRM",
        "SIGTERM",
        "SIGXCPU",
        "SIGXFSZ",
        "SIGVTALRM",
        "SIGPROF",
        "SIGIO",
        "SIGPWR",
        "SIGSYS",
    }
)
#: bwrap options that take no argument, one, or two.
_NULLARY = {"--unshare-pid", "--unshare-ipc", "--unshare-net", "--die-with-parent"}
_UNARY = {"--tmpfs", "--dev", "--proc", "--chdir", "--unsetenv"}
_BINARY = {"--bind", "--ro-bind", "--setenv"}


@dataclass
class Plan:
    """A kernel's sandbox, parsed from the bwrap options of a cold sandboxed start."""

    #: ("bind"|"ro-bind", src, dest) and ("tmpfs"|"dev"|"proc", "", dest), in bwrap's order.
    mounts: list[tuple[str, str, str]] = field(default_factory=list)
    chdir: str = "/"
    network: bool = True
    setenv: dict[str, str] = field(default_factory=dict)
    unsetenv: list[str] = field(default_factory=list)


def parse(args: list[str]) -> Plan:
    """The :class:`Plan` of bwrap options ``args``; ``IsolationError`` for anything else.

    Only what :func:`lemon_exec.host.kernels.sandbox.kernel_argv_prefix` emits is understood, and
    a PID and IPC namespace and ``--die-with-parent`` are required: never a weaker sandbox.
    """
    plan = Plan()
    seen: set[str] = set()
    i = 0
    while i < len(args):
        opt = args[i]
        if opt in _NULLARY:
            seen.add(opt)
            i += 1
            continue
        width = 1 if opt in _UNARY else 2 if opt in _BINARY else 0
        if not width:
            raise IsolationError(f"unsupported sandbox option {opt!r}")
        values = args[i + 1 : i + 1 + width]
        if len(values) != width:
            raise IsolationError(f"sandbox option {opt!r} lacks its argument")
        i += 1 + width
        if opt in ("--bind", "--ro-bind"):
            src, dest = values
            _require_absolute(src, dest)
            plan.mounts.append((opt[2:], src, dest))
        elif opt in ("--tmpfs", "--dev", "--proc"):
            _require_absolute(values[0])
            plan.mounts.append((opt[2:], "", values[0]))
        elif opt == "--chdir":
            _require_absolute(values[0])
            plan.chdir = values[0]
        elif opt == "--setenv":
            plan.setenv[values[0]] = values[1]
        else:
            plan.unsetenv.append(values[0])
    missing = {"--unshare-pid", "--unshare-ipc", "--die-with-parent"} - seen
    if missing:
        raise IsolationError(f"a kernel sandbox needs {', '.join(sorted(missing))}")
    if not any(kind == "proc" for kind, _, _ in plan.mounts):
        raise IsolationError("a kernel sandbox needs its own /proc")
    plan.network = "--unshare-net" not in seen
    return plan


def _require_absolute(*paths: str) -> None:
    for path in paths:
        if not path.startswith("/"):
            raise IsolationError(f"sandbox path {path!r} is not absolute")


def supported() -> bool:
    """Whether this machine's architecture is one :func:`enter` knows (Linux only)."""
    return sys.platform.startswith("linux") and pivot_root_known()


# -- the three processes ------------------------------------------------------------------


def enter(plan: Plan, template: int) -> int:
    """Confine this freshly forked child; returns (in the kernel only) the PID to watch.

    Called in the template's child before anything of the kernel runs. The calling process
    becomes the outer process and never returns; nor does the init; the kernel returns the
    init's PID (1), whose end is the end of its namespace.
    """
    libc = load_libc()
    prctl(libc, PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != template:  # the template died before the prctl took effect
        os._exit(1)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # bwrap's launcher does the same
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    check(libc.unshare(CLONE_NEWPID), "unshare(CLONE_NEWPID)")
    alive_r, alive_w = os.pipe()  # the init sees EOF on it when the outer process is gone
    init = os.fork()
    if init:
        os.close(alive_r)
        _outer(init)
    os.close(alive_w)
    return _init(libc, plan, alive_r)


def _outer(init: int) -> None:
    """Wait for the namespace's init; exit as the kernel did (bwrap's monitor's job)."""
    code = 1
    try:
        while True:
            try:
                _, status = os.waitpid(init, 0)
                break
            except InterruptedError:
                continue
        code = os.waitstatus_to_exitcode(status)
        # The init reports a kernel killed by signal N as 128 + N: die of N, as it did.
        signum = -code if code < 0 else code - 128 if 128 < code <= 128 + 64 else 0
        if signum:
            code = 128 + signum  # what bwrap reports, should the signal not end us
        if signum in _FATAL_SIGNALS:
            with contextlib.suppress(OSError, ValueError):
                if signum != signal.SIGKILL:
                    signal.signal(signum, signal.SIG_DFL)
                os.kill(os.getpid(), signum)
    finally:
        os._exit(code)


def _init(libc: ctypes.CDLL, plan: Plan, alive: int) -> int:
    try:
        prctl(libc, PR_SET_PDEATHSIG, signal.SIGKILL)
        if select.select([alive], [], [], 0)[0]:  # EOF: the outer process died already
            os._exit(1)
        os.close(alive)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        uid, gid = os.geteuid(), os.getegid()
        check(libc.unshare(CLONE_NEWNS | CLONE_NEWIPC), "unshare(CLONE_NEWNS)")
        build_view(libc, plan.mounts)
        # A new user namespace locks every mount made so far (nothing can be unmounted or
        # made writable from it); the kernel's own network namespace belongs to it.
        flags = CLONE_NEWUSER | CLONE_NEWNS | (0 if plan.network else CLONE_NEWNET)
        check(libc.unshare(flags), "unshare(CLONE_NEWUSER)")
        map_ids(uid, gid)
        if not plan.network:
            loopback_up()
        os.chdir(plan.chdir)
        for name in plan.unsetenv:
            os.environ.pop(name, None)
        os.environ.update(plan.setenv)
    except BaseException as exc:
        with contextlib.suppress(Exception):
            os.write(2, f"lemon_exec sandbox: {exc}\n".encode())
        os._exit(70)
    # Nothing of the template's (another request's stderr, say) stays open in the init or
    # the kernel.
    os.closerange(3, max_fd())
    kernel = os.fork()
    if kernel == 0:
        drop_privileges(libc)
        return 1
    _reap_until(kernel)
    raise AssertionError("unreachable")  # pragma: no cover


def _reap_until(kernel: int) -> None:
    """Be the namespace's init: reap everything; exit with the kernel's status."""
    code = 1
    try:
        with contextlib.suppress(OSError):
            os.closerange(0, 3)
        while True:
            try:
                pid, status = os.waitpid(-1, 0)
            except InterruptedError:
                continue
            except ChildProcessError:
                break
            if pid == kernel:
                code = os.waitstatus_to_exitcode(status)
                code = 128 - code if code < 0 else code
                break
    finally:
        os._exit(code)
