"""A forked kernel's view of the filesystem, built as bubblewrap builds it.

Run by the sandbox's init (:mod:`lemon_exec.template.isolate`) in its new mount namespace:
a tmpfs root, the template's view under ``/oldroot``, each ``--ro-bind``/``--bind``/
``--tmpfs``/``--dev``/``--proc`` applied in order under ``/newroot``, then ``pivot_root``
into it and the template's view detached. Bind sources are opened first and bound through
the descriptor, and only if they are the resolved paths the host computed.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import stat
from typing import Protocol

from lemon_exec.template.isolate_syscalls import IsolationError, check, pivot_root

__all__ = ["build_view"]

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

#: bwrap covers these in a fresh /proc (read-only), and so does this.
_PROC_COVERED = ("sys", "sysrq-trigger", "irq", "bus")
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


def build_view(libc: ctypes.CDLL, mounts: list[tuple[str, str, str]]) -> None:
    """bwrap's setup: the kernel's view under /newroot, sources from /oldroot, then pivot.

    ``mounts``: ``(kind, source, destination)`` in bwrap's order, as a parsed plan holds them.
    """
    mount = _mounter(libc)
    mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing propagates back to the template
    mount("tmpfs", _BASE, "tmpfs", MS_NODEV | MS_NOSUID, "mode=0755")
    os.chdir(_BASE)
    os.mkdir("newroot", 0o755)
    os.mkdir("oldroot", 0o755)
    pivot_root(libc, _BASE, "oldroot")
    os.chdir("/")
    mount("newroot", "newroot", None, MS_BIND | MS_REC)
    for kind, src, dest in mounts:
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
    check(libc.umount2(b"oldroot", MNT_DETACH), "umount oldroot")
    # pivot_root(".", ".") stacks the base over the new root; from the base's own root
    # directory, "." is the base, which is then detached (bwrap's second pivot).
    base = os.open("/", os.O_DIRECTORY | os.O_RDONLY)
    try:
        os.chdir("/newroot")
        pivot_root(libc, ".", ".")
        os.fchdir(base)
    finally:
        os.close(base)
    check(libc.umount2(b".", MNT_DETACH), "umount base")
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
        check(rc, f"mount {fstype or src} on {target}")

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
