"""A forked kernel's own sandbox: bubblewrap's setup, done in Python right after the fork.

Under ``sandbox = "bwrap"`` the fork-server template runs inside one bubblewrap sandbox that
sees the host's filesystem as it is (``--dev-bind / /``), with its own user namespace where it
holds ``CAP_SYS_ADMIN`` (and nothing outside it). It never runs a script. Each kernel it
forks builds its own sandbox before any of its code runs, from the very bwrap options a cold
sandboxed kernel is started with (:func:`lemon_exec.host.kernels.sandbox.kernel_argv_prefix`), so a
forked kernel sees exactly what a cold one sees:

1. The forked child (the *outer* process, the PID the host knows) dies with the template
   (``PR_SET_PDEATHSIG``), ignores SIGINT like bwrap's launcher, unshares a PID namespace and
   forks its *init* there (PID 1), then waits for it and exits with the kernel's status.
2. The init (dies with the outer process) unshares a mount and an IPC namespace and builds
   the view as bwrap does: a tmpfs root, the template's view under ``/oldroot``, each
   ``--ro-bind``/``--bind``/``--tmpfs``/``--dev``/``--proc`` applied in order under
   ``/newroot``, then ``pivot_root`` into it, the template's view detached. ``/proc`` is a
   fresh one of the kernel's own PID namespace; ``/dev`` a fresh one with its own ``pts`` and
   ``shm``; ``/tmp`` its own tmpfs; of the staging root only its own runtime directory.
   Bind sources are opened first and bound through the descriptor, and only if they are
   the resolved paths the host computed (a symlink swapped in is refused).
3. The init then enters a new user namespace (and, with ``--unshare-net``, a network
   namespace with only its own loopback). Every mount it made is thereby *locked*: from a
   less privileged user namespace nothing can be unmounted to uncover what lies beneath, and
   nothing read-only can be made writable.
4. The init closes every inherited descriptor but the standard streams and forks the
   kernel (PID 2), which drops every capability (bounding set, ambient,
   effective, permitted, inheritable) and sets ``PR_SET_NO_NEW_PRIVS`` before it returns
   to run the kernel. The init reaps orphans and, when the kernel ends, exits with its
   status: the namespace, and every daemon the script left in it, ends with it.

Linux only (the host never asks for it elsewhere).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import os
import platform
import select
import signal
import socket
import stat
import struct
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

CLONE_NEWNS = 0x00020000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000

MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_NOATIME = 1024
MS_NODIRATIME = 2048
MS_BIND = 4096
MS_REC = 16384
MS_SILENT = 32768
MS_PRIVATE = 1 << 18
MS_RELATIME = 1 << 21
MNT_DETACH = 2

_PR_SET_PDEATHSIG = 1
_PR_CAPBSET_DROP = 24
_PR_SET_NO_NEW_PRIVS = 38
_PR_CAP_AMBIENT = 47
_PR_CAP_AMBIENT_CLEAR_ALL = 4
_CAP_VERSION_3 = 0x20080522

_SIOCSIFFLAGS = 0x8914
_IFF_UP = 0x1
_IFF_LOOPBACK = 0x8
_IFF_RUNNING = 0x40

#: pivot_root has no libc wrapper: its syscall number per architecture.
_SYS_PIVOT_ROOT = {
    "x86_64": 155,
    "aarch64": 41,
    "arm64": 41,
    "riscv64": 41,
    "ppc64le": 203,
    "ppc64": 203,
    "s390x": 217,
    "i686": 217,
    "i386": 217,
    "armv7l": 218,
}
#: bwrap covers these in a fresh /proc (read-only), and so does this.
_PROC_COVERED = ("sys", "sysrq-trigger", "irq", "bus")
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
#: The device nodes of bwrap's --dev.
_DEV_NODES = ("null", "zero", "full", "random", "urandom", "tty")
_DEV_LINKS = (
    ("stdin", "/proc/self/fd/0"),
    ("stdout", "/proc/self/fd/1"),
    ("stderr", "/proc/self/fd/2"),
    ("fd", "/proc/self/fd"),
    ("core", "/proc/kcore"),
    ("ptmx", "pts/ptmx"),
)
_DEVPTS_OPTIONS = "newinstance,ptmxmode=0666,mode=620"
#: Where the template's view is reached while the kernel's own is built.
_BASE = "/tmp"
_OPTION_FLAGS = {
    "ro": MS_RDONLY,
    "nosuid": MS_NOSUID,
    "nodev": MS_NODEV,
    "noexec": MS_NOEXEC,
    "noatime": MS_NOATIME,
    "nodiratime": MS_NODIRATIME,
    "relatime": MS_RELATIME,
}
#: bwrap options that take no argument, one, or two.
_NULLARY = {"--unshare-pid", "--unshare-ipc", "--unshare-net", "--die-with-parent"}
_UNARY = {"--tmpfs", "--dev", "--proc", "--chdir", "--unsetenv"}
_BINARY = {"--bind", "--ro-bind", "--setenv"}


class IsolationError(Exception):
    """A sandbox option this module cannot apply (the host then starts the kernel cold)."""


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
    return sys.platform.startswith("linux") and platform.machine() in _SYS_PIVOT_ROOT


# -- the three processes ------------------------------------------------------------------


def enter(plan: Plan, template: int) -> int:
    """Confine this freshly forked child; returns (in the kernel only) the PID to watch.

    Called in the template's child before anything of the kernel runs. The calling process
    becomes the outer process and never returns; nor does the init; the kernel returns the
    init's PID (1), whose end is the end of its namespace.
    """
    libc = _libc()
    _prctl(libc, _PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != template:  # the template died before the prctl took effect
        os._exit(1)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # bwrap's launcher does the same
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _check(libc.unshare(CLONE_NEWPID), "unshare(CLONE_NEWPID)")
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
        _prctl(libc, _PR_SET_PDEATHSIG, signal.SIGKILL)
        if select.select([alive], [], [], 0)[0]:  # EOF: the outer process died already
            os._exit(1)
        os.close(alive)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        uid, gid = os.geteuid(), os.getegid()
        _check(libc.unshare(CLONE_NEWNS | CLONE_NEWIPC), "unshare(CLONE_NEWNS)")
        _build_root(libc, plan)
        # A new user namespace locks every mount made so far (nothing can be unmounted or
        # made writable from it); the kernel's own network namespace belongs to it.
        flags = CLONE_NEWUSER | CLONE_NEWNS | (0 if plan.network else CLONE_NEWNET)
        _check(libc.unshare(flags), "unshare(CLONE_NEWUSER)")
        _map_ids(uid, gid)
        if not plan.network:
            _loopback_up()
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
    os.closerange(3, _max_fd())
    kernel = os.fork()
    if kernel == 0:
        _drop_privileges(libc)
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


# -- building the view ---------------------------------------------------------------------


def _build_root(libc: ctypes.CDLL, plan: Plan) -> None:
    """bwrap's setup: the kernel's view under /newroot, sources from /oldroot, then pivot."""
    mount = _mounter(libc)
    mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing propagates back to the template
    mount("tmpfs", _BASE, "tmpfs", MS_NODEV | MS_NOSUID, "mode=0755")
    os.chdir(_BASE)
    os.mkdir("newroot", 0o755)
    os.mkdir("oldroot", 0o755)
    _pivot_root(libc, _BASE, "oldroot")
    os.chdir("/")
    mount("newroot", "newroot", None, MS_BIND | MS_REC)
    for kind, src, dest in plan.mounts:
        target = "/newroot" + dest.rstrip("/") if dest != "/" else "/newroot"
        if kind in ("bind", "ro-bind"):
            _bind(mount, "/oldroot" + (src if src != "/" else ""), target, kind == "ro-bind")
        elif kind == "tmpfs":
            _ensure_dir(target)
            mount("tmpfs", target, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755")
        elif kind == "dev":
            _make_dev(mount, target)
        else:
            _make_proc(mount, target)
    mount("oldroot", "oldroot", None, MS_REC | MS_PRIVATE)
    _check(libc.umount2(b"oldroot", MNT_DETACH), "umount oldroot")
    # pivot_root(".", ".") stacks the base over the new root; from the base's own root
    # directory, "." is the base, which is then detached (bwrap's second pivot).
    base = os.open("/", os.O_DIRECTORY | os.O_RDONLY)
    try:
        os.chdir("/newroot")
        _pivot_root(libc, ".", ".")
        os.fchdir(base)
    finally:
        os.close(base)
    _check(libc.umount2(b".", MNT_DETACH), "umount base")
    os.chdir("/")


class Mount(Protocol):
    def __call__(
        self, src: str | None, target: str, fstype: str | None, flags: int, data: str | None = ...
    ) -> None: ...


def _mounter(libc: ctypes.CDLL) -> Mount:
    def mount(
        src: str | None, target: str, fstype: str | None, flags: int, data: str | None = None
    ) -> None:
        rc = libc.mount(
            None if src is None else os.fsencode(src),
            os.fsencode(target),
            None if fstype is None else os.fsencode(fstype),
            ctypes.c_ulong(flags | MS_SILENT),
            None if data is None else os.fsencode(data),
        )
        _check(rc, f"mount {fstype or src} on {target}")

    return mount


def _bind(mount: Mount, src: str, target: str, readonly: bool) -> None:
    """bwrap's --bind / --ro-bind: recursive, nosuid and nodev, read-only all the way down.

    The source is opened first and bound through its descriptor, and only if it is where
    the host saw it: a script that can write where a source lies (its working directory)
    cannot turn a path into a symlink that would bind something else into the next
    kernel's view (the host hands over resolved paths, so any symlink is such a swap).
    """
    fd = os.open(src, os.O_PATH | os.O_CLOEXEC)
    try:
        proc = _proc()
        if os.readlink(f"{proc}/self/fd/{fd}") != src:
            raise IsolationError(f"{src[len('/oldroot') :] or '/'} is not a resolved path")
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            _ensure_dir(target)
        else:
            _ensure_file(target)
        mount(f"{proc}/self/fd/{fd}", target, None, MS_BIND | MS_REC)
    finally:
        os.close(fd)
    for mountpoint, options in _mounts_under(target):
        flags = MS_BIND | MS_REMOUNT | MS_NOSUID | MS_NODEV
        for option in options:
            flags |= _OPTION_FLAGS.get(option, 0)
        if readonly:
            flags |= MS_RDONLY  # else as writable as its source (the template sees the host's)
        try:
            mount(None, mountpoint, None, flags)
        except OSError as exc:
            # A mount underneath that is not ours to change (e.g. locked) is left as it
            # is, unless we were making it read-only: then the bind must not stand.
            if readonly or mountpoint == target:
                raise
            del exc


def _mounts_under(target: str) -> list[tuple[str, list[str]]]:
    prefix = target.rstrip("/") + "/"
    return [(m, o) for m, o in _mountinfo() if m == target or m.startswith(prefix)]


def _mountinfo() -> list[tuple[str, list[str]]]:
    """(mount point, per-mount options) of this mount namespace, in mount order."""
    with open(f"{_proc()}/self/mountinfo", "rb") as fh:
        lines = fh.read().decode("utf-8", "surrogateescape").splitlines()
    found = []
    for line in lines:
        fields = line.split()
        if len(fields) > 5:
            found.append((_unescape(fields[4]), fields[5].split(",")))
    return found


def _proc() -> str:
    """The /proc that shows this process while the view is built (the template's)."""
    return "/oldroot/proc" if os.path.isdir("/oldroot/proc/self") else "/proc"


def _unescape(path: str) -> str:
    out, i = [], 0
    while i < len(path):
        if path[i] == "\\" and i + 3 < len(path) and path[i + 1 : i + 4].isdigit():
            out.append(chr(int(path[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(path[i])
            i += 1
    return "".join(out)


def _make_dev(mount: Mount, target: str) -> None:
    """bwrap's --dev: a tmpfs with the basic nodes, its own pts and shm."""
    _ensure_dir(target)
    mount("tmpfs", target, "tmpfs", MS_NOSUID, "mode=0755")
    for node in _DEV_NODES:
        source = f"/oldroot/dev/{node}"
        if os.path.exists(source):
            _ensure_file(f"{target}/{node}")
            mount(source, f"{target}/{node}", None, MS_BIND | MS_REC)
    os.mkdir(f"{target}/shm", 0o1777)
    os.chmod(f"{target}/shm", 0o1777)
    os.mkdir(f"{target}/pts", 0o755)
    mount("devpts", f"{target}/pts", "devpts", MS_NOSUID | MS_NOEXEC, _DEVPTS_OPTIONS)
    for name, link in _DEV_LINKS:
        os.symlink(link, f"{target}/{name}")


def _make_proc(mount: Mount, target: str) -> None:
    """bwrap's --proc: a procfs of this PID namespace, its riskier corners read-only."""
    _ensure_dir(target)
    mount("proc", target, "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    for name in _PROC_COVERED:
        path = f"{target}/{name}"
        if os.path.exists(path):
            mount(path, path, None, MS_BIND | MS_REC)
            flags = MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC
            mount(None, path, None, flags)


def _ensure_dir(path: str) -> None:
    with contextlib.suppress(FileExistsError):
        os.makedirs(path, 0o755)


def _ensure_file(path: str) -> None:
    _ensure_dir(os.path.dirname(path))
    if not os.path.lexists(path):
        with contextlib.suppress(FileExistsError):
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o444))


# -- identity, network and privileges ------------------------------------------------------


def _map_ids(uid: int, gid: int) -> None:
    """Keep our uid and gid in the new user namespace (and no supplementary groups)."""
    Path("/proc/self/setgroups").write_text("deny")
    Path("/proc/self/uid_map").write_text(f"{uid} {uid} 1\n")
    Path("/proc/self/gid_map").write_text(f"{gid} {gid} 1\n")


def _loopback_up() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        ifreq = struct.pack("16sH14x", b"lo", _IFF_UP | _IFF_LOOPBACK | _IFF_RUNNING)
        fcntl.ioctl(sock.fileno(), _SIOCSIFFLAGS, ifreq)


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    ]


def _drop_privileges(libc: ctypes.CDLL) -> None:
    """No capability now or after any exec, and no setuid gain: what bwrap leaves a kernel."""
    try:
        last = int(Path("/proc/sys/kernel/cap_last_cap").read_text())
    except (OSError, ValueError):
        last = 63
    for cap in range(last + 1):
        if libc.prctl(_PR_CAPBSET_DROP, ctypes.c_ulong(cap), 0, 0, 0) != 0:
            err = ctypes.get_errno()
            if err != errno.EINVAL:
                _fail("prctl(PR_CAPBSET_DROP)", err)
    libc.prctl(_PR_CAP_AMBIENT, ctypes.c_ulong(_PR_CAP_AMBIENT_CLEAR_ALL), 0, 0, 0)
    header = _CapHeader(_CAP_VERSION_3, 0)
    data = (_CapData * 2)()
    _check(libc.capset(ctypes.byref(header), ctypes.byref(data)), "capset")
    _prctl(libc, _PR_SET_NO_NEW_PRIVS, 1)


def _max_fd() -> int:
    try:
        return min(os.sysconf("SC_OPEN_MAX"), 1 << 20)
    except (OSError, ValueError):
        return 1024


# -- syscalls ------------------------------------------------------------------------------


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _prctl(libc: ctypes.CDLL, option: int, arg: int) -> None:
    _check(libc.prctl(option, ctypes.c_ulong(arg), 0, 0, 0), f"prctl({option})")


def _pivot_root(libc: ctypes.CDLL, new: str, old: str) -> None:
    number = _SYS_PIVOT_ROOT.get(platform.machine())
    if number is None:
        raise IsolationError(f"pivot_root is unknown on {platform.machine()}")
    rc = libc.syscall(ctypes.c_long(number), os.fsencode(new), os.fsencode(old))
    _check(rc, f"pivot_root({new}, {old})")


def _check(rc: int, what: str) -> None:
    if rc != 0:
        _fail(what, ctypes.get_errno())


def _fail(what: str, err: int) -> None:
    raise OSError(err, f"{what}: {os.strerror(err)}")
