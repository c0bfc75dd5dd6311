"""Owner-only filesystem primitives: private directories and files, owner markers.

Everything here fails closed: a directory is used only if it is a real directory (not a
symlink), owned by us, mode exactly 0700; a file is created 0600 with ``O_EXCL |
O_NOFOLLOW``, so an existing file or a planted symlink at the name is an error rather than
something we write through. An owner marker is a small 0600 JSON file naming the process
that owns a directory, so later processes can tell a dead owner's directory from a live one.

Bounded removal lives in :mod:`lemon_exec.proc.tree_removal`; the staging area built from
these pieces in :mod:`lemon_exec.host.disk.staging`.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lemon_exec.errors import RefusedError

__all__ = [
    "DIR_FLAGS",
    "DISK_FULL",
    "OWNER_MARKER",
    "check_private_dir",
    "describe_os_error",
    "ensure_private_dir",
    "is_own_private_dir",
    "pid_alive",
    "read_owner_pid",
    "read_private_json",
    "refused",
    "write_owner_marker",
    "write_private_file",
]

#: The owner marker's file name: JSON ``{"pid", "created", "version"}``.
OWNER_MARKER = "owner"
_MARKER_VERSION = 1
_MARKER_MAX_BYTES = 4096

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
#: Flags to open a directory for ``dir_fd`` work: never through a symlink, never inherited.
DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _NOFOLLOW | _CLOEXEC


def refused(reason: str) -> RefusedError:
    """The error for a private directory or file that cannot be made or used as required."""
    return RefusedError(f"execute_code: could not create a private workspace: {reason}")


#: The errnos of a full filesystem (blocks, inodes or quota).
DISK_FULL = frozenset({errno.ENOSPC, errno.EDQUOT})


#: An owner-only directory: 0700, with or without the sticky bit (see check_private_dir).
_PRIVATE_MODES = (0o700, 0o1700)


def describe_os_error(exc: OSError) -> str:
    """``exc`` for a reader: its message and errno name, plus the fix when the disk is full.

    ``No space left on device (ENOSPC)`` rather than ``[Errno 28] ...``: the errno name is
    what people search for, and a full disk needs a different fix from a permission problem.
    """
    text = exc.strerror or str(exc)
    name = errno.errorcode.get(exc.errno) if exc.errno is not None else None
    if name:
        text = f"{text} ({name})"
    if exc.errno in DISK_FULL:
        text += (
            "; the filesystem of the staging directory (TMPDIR) is full: free space there, "
            "or set TMPDIR to a directory with room, and try again"
        )
    return text


def check_private_dir(path: Path) -> None:
    """Fail closed unless ``path`` is a real directory, owned by us, mode 0700.

    The sticky bit is allowed (01700): it only restricts deletion, in a directory nobody else
    can enter. jupyter_client sets it on the directory of a connection file it writes; the
    host writes its own (:mod:`lemon_exec.host.kernels.local.connfile`), but a forked kernel
    racing its template's death can still have jupyter_client write one back, and that
    must not make the runtime directory refuse every later call.
    """
    _check_private_stat(path, _lstat(path, ""), "")


def _lstat(path: Path, fix: str) -> os.stat_result:
    try:
        return os.lstat(path)
    except OSError as exc:
        raise refused(f"cannot inspect {path}: {exc.strerror or exc}{fix}") from None


def _check_private_stat(path: Path, st: os.stat_result, fix: str) -> None:
    if stat.S_ISLNK(st.st_mode):
        raise refused(f"{path} is a symlink{fix}")
    if not stat.S_ISDIR(st.st_mode):
        raise refused(f"{path} is not a directory{fix}")
    if st.st_uid != os.getuid():
        raise refused(f"{path} is owned by uid {st.st_uid}, not {os.getuid()}{fix}")
    mode = stat.S_IMODE(st.st_mode)
    if mode not in _PRIVATE_MODES:
        raise refused(f"{path} has mode {mode:04o}, not 0700{fix}")


def ensure_private_dir(path: Path, *, fix: str = "") -> None:
    """Create ``path`` (0700) if it is missing; then :func:`check_private_dir` it.

    ``fix`` ends every refusal's message (what the reader should do about it).
    """
    # Asked on every call: one lstat when all is well. mkdir on a name that exists fails
    # only after locking its parent, so it is tried only when the name is missing.
    try:
        found = os.lstat(path)
    except FileNotFoundError:
        try:
            os.mkdir(path, 0o700)  # never follows or reuses what is there: EEXIST instead
        except FileExistsError:
            pass  # made meanwhile: checked below like anything else found there
        except OSError as exc:
            raise refused(f"cannot create {path}: {describe_os_error(exc)}{fix}") from None
        found = _lstat(path, fix)
    except OSError as exc:
        raise refused(f"cannot inspect {path}: {exc.strerror or exc}{fix}") from None
    _check_private_stat(path, found, fix)


def is_own_private_dir(path: Path) -> bool:
    """Whether ``path`` (``lstat``, not followed) is a directory of ours, mode 0700 (or 01700)."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return (
        stat.S_ISDIR(st.st_mode)
        and st.st_uid == os.getuid()
        and stat.S_IMODE(st.st_mode) in _PRIVATE_MODES
    )


def write_private_file(directory: Path, name: str, data: bytes | str) -> Path:
    """Create ``directory/name`` holding ``data``, mode 0600, failing if the name exists.

    ``O_EXCL | O_NOFOLLOW`` means an existing file *or symlink* at the name is an error
    (``FileExistsError``) rather than something we write through. ``name`` must be a plain
    file name. Text is written as UTF-8.
    """
    if not name or name in (".", "..") or os.sep in name or (os.altsep and os.altsep in name):
        raise ValueError(f"not a plain file name: {name!r}")
    payload = data.encode("utf-8") if isinstance(data, str) else data
    path = Path(directory) / name

    def owner_only(fd: int) -> None:
        mode = stat.S_IMODE(os.fstat(fd).st_mode)
        if mode & 0o077:  # only a very odd umask could get here, but never leak
            raise refused(f"{path} was created with mode {mode:04o}")

    create_new_file(path, payload, 0o600, check=owner_only)
    return path


def create_new_file(
    path: Path, data: bytes, mode: int, check: Callable[[int], None] | None = None
) -> None:
    """Create ``path`` holding ``data`` (``mode`` less the umask); never an existing name.

    ``O_EXCL | O_NOFOLLOW``: an existing file *or symlink* at the name raises
    ``FileExistsError`` rather than being written through. ``check`` sees the new file's
    descriptor before anything is written; a failure removes the file.
    """
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC, mode)
    try:
        if check is not None:
            check(fd)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    except BaseException:
        os.close(fd)
        path.unlink(missing_ok=True)
        raise
    os.close(fd)


# --- owner markers ------------------------------------------------------------------------------


def write_owner_marker(directory: Path) -> None:
    """Write ``directory``'s owner marker naming this process; ``RefusedError`` if we cannot."""
    data = {"pid": os.getpid(), "created": time.time(), "version": _MARKER_VERSION}
    try:
        write_private_file(directory, OWNER_MARKER, json.dumps(data))
    except OSError as exc:
        raise refused(
            f"cannot write owner marker in {directory}: {describe_os_error(exc)}"
        ) from None


def read_private_json(path: Path, max_bytes: int) -> Any:
    """The JSON in ``path`` if it is exactly as we write it (ours, 0600, a regular file of at
    most ``max_bytes``, not behind a link), else None.
    """
    try:
        # O_NONBLOCK: a FIFO planted at the name must not hang the caller in open().
        fd = os.open(path, os.O_RDONLY | _NOFOLLOW | _CLOEXEC | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if (
            not stat.S_ISREG(st.st_mode)
            or st.st_uid != os.getuid()
            or stat.S_IMODE(st.st_mode) != 0o600
            or st.st_size > max_bytes
        ):
            return None
        raw = os.read(fd, max_bytes + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return None


def read_owner_pid(directory: Path) -> int | None:
    """The PID in ``directory``'s owner marker, or None unless it is exactly as we write it."""
    data = read_private_json(directory / OWNER_MARKER, _MARKER_MAX_BYTES)
    pid = data.get("pid") if isinstance(data, dict) else None
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return None
    return pid


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` may still be running; when in doubt, yes (so nothing is touched)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # PermissionError and anything odd: assume alive, touch nothing
    return True
