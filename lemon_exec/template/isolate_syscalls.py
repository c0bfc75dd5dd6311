"""The Linux calls a forked kernel's sandbox is made of (:mod:`lemon_exec.template.isolate`).

prctl, pivot_root (no libc wrapper: its number per architecture), the identity maps of a
new user namespace, a loopback interface brought up in a new network namespace, and the
dropping of every capability. Each failure is an ``OSError`` naming the call.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import platform
import socket
import struct
from pathlib import Path

__all__ = [
    "PR_SET_PDEATHSIG",
    "IsolationError",
    "check",
    "drop_privileges",
    "load_libc",
    "loopback_up",
    "map_ids",
    "max_fd",
    "pivot_root",
    "pivot_root_known",
    "prctl",
]

PR_SET_PDEATHSIG = 1
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


class IsolationError(Exception):
    """A sandbox option that cannot be applied (the host then starts the kernel cold)."""


def map_ids(uid: int, gid: int) -> None:
    """Keep our uid and gid in the new user namespace (and no supplementary groups)."""
    Path("/proc/self/setgroups").write_text("deny")
    Path("/proc/self/uid_map").write_text(f"{uid} {uid} 1\n")
    Path("/proc/self/gid_map").write_text(f"{gid} {gid} 1\n")


def loopback_up() -> None:
    """Bring up ``lo`` in a new network namespace (its only interface)."""
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


def drop_privileges(libc: ctypes.CDLL) -> None:
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
    check(libc.capset(ctypes.byref(header), ctypes.byref(data)), "capset")
    prctl(libc, _PR_SET_NO_NEW_PRIVS, 1)


def max_fd() -> int:
    """One past the highest descriptor this process could hold (bounded)."""
    try:
        return min(os.sysconf("SC_OPEN_MAX"), 1 << 20)
    except (OSError, ValueError):
        return 1024


def load_libc() -> ctypes.CDLL:
    """The C library, with ``errno`` kept for :func:`check`."""
    return ctypes.CDLL(None, use_errno=True)


def prctl(libc: ctypes.CDLL, option: int, arg: int) -> None:
    check(libc.prctl(option, ctypes.c_ulong(arg), 0, 0, 0), f"prctl({option})")


def pivot_root_known() -> bool:
    """Whether pivot_root's syscall number is known on this machine's architecture."""
    return platform.machine() in _SYS_PIVOT_ROOT


def pivot_root(libc: ctypes.CDLL, new: str, old: str) -> None:
    number = _SYS_PIVOT_ROOT.get(platform.machine())
    if number is None:
        raise IsolationError(f"pivot_root is unknown on {platform.machine()}")
    rc = libc.syscall(ctypes.c_long(number), os.fsencode(new), os.fsencode(old))
    check(rc, f"pivot_root({new}, {old})")


def check(rc: int, what: str) -> None:
    """Raise the ``OSError`` of the last failed call when ``rc`` says it failed."""
    if rc != 0:
        _fail(what, ctypes.get_errno())


def _fail(what: str, err: int) -> None:
    raise OSError(err, f"{what}: {os.strerror(err)}")
