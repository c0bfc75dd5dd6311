"""Where staging roots may go: ``TMPDIR`` (or a given base), validated, with room for sockets.

Read from the environment on every call and never silently replaced by another directory:
an unusable base fails closed with a ``RefusedError`` that names it and the fix. The roots
themselves are :mod:`lemon_exec.host.disk.staging`'s.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from lemon_exec.proc.private_fs import refused

__all__ = ["MAX_SOCKET_BASE_BYTES", "check_socket_room", "staging_base"]


def staging_base(base: Path | str | None = None) -> Path:
    """The directory staging roots go in: ``base``, else ``$TMPDIR``, else ``/tmp``; validated.

    Read from the environment on every call, never through :func:`tempfile.gettempdir`: that
    caches its answer and, when ``TMPDIR`` is unusable, silently falls back to other
    directories (``/tmp``, ``/var/tmp``, the working directory). Here an unusable directory
    fails closed with a ``RefusedError`` naming it (and ``TMPDIR`` when it came from there).
    A symlink is followed and its target validated; the resolved path is returned, so a later
    swap of the link changes nothing. An empty ``TMPDIR`` counts as unset, as in ``tempfile``.
    """
    if base is not None:
        return _check_base(Path(base), f"the staging base {base}")
    tmpdir = os.environ.get("TMPDIR", "")
    if not tmpdir:
        return _check_base(Path("/tmp"), "/tmp (TMPDIR is unset)")
    return _check_base(Path(os.path.abspath(tmpdir)), f"TMPDIR={tmpdir}")


def _check_base(path: Path, name: str) -> Path:
    """``path`` resolved, if it is a directory we may safely create private roots in."""
    fix = "; set TMPDIR to a writable directory on a local filesystem"
    try:
        resolved = Path(os.path.realpath(path))
        st = os.stat(resolved)
    except FileNotFoundError:
        raise refused(f"{name} does not exist{fix}") from None
    except OSError as exc:
        raise refused(f"{name} cannot be used ({exc.strerror or exc}){fix}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise refused(f"{name} is not a directory{fix}")
    if not os.access(resolved, os.W_OK | os.X_OK):
        raise refused(f"{name} is not writable{fix}")
    mode = stat.S_IMODE(st.st_mode)
    # Others who can write here (or own it) can rename or replace our root in it; /tmp is
    # safe only thanks to the sticky bit and root ownership.
    if st.st_uid not in (0, os.getuid()):
        raise refused(f"{name} is owned by uid {st.st_uid}, neither us nor root{fix}")
    if mode & 0o022 and not mode & stat.S_ISVTX:
        raise refused(f"{name} is writable by other users and lacks the sticky bit{fix}")
    return resolved


# A Unix socket path holds at most 107 bytes (sun_path is 108 with its NUL). The longest one
# a local kernel binds is /tmp/lemon-exec.<uid>/lemon-exec-XXXXXXXX/k-<16 hex>-ipc-host (74
# bytes at most): the runtime base does not depend on TMPDIR. The TMPDIR bound below is kept
# (the staging root's own paths are bounded by it), as long as it was when sockets lay there.
_SUN_PATH_MAX = 107
_LONGEST_SOCKET_SUFFIX = len("/lemon-exec-XXXXXXXX/runtime/k-0123456789abcdef-ipc-host")
MAX_SOCKET_BASE_BYTES = _SUN_PATH_MAX - _LONGEST_SOCKET_SUFFIX


def check_socket_room(base: Path) -> None:
    """Refuse a staging base too long for the ipc sockets that kernels bind below it.

    Without this, a long ``TMPDIR`` surfaces as zmq's bare "File name too long" at the first
    kernel start instead of a refusal that names the directory and the fix.
    """
    size = len(os.fsencode(base))
    if size > MAX_SOCKET_BASE_BYTES:
        raise refused(
            f"TMPDIR={base} is too long ({size} bytes; at most {MAX_SOCKET_BASE_BYTES}): kernels "
            f"listen on Unix sockets below it and a socket path may not exceed {_SUN_PATH_MAX} "
            "bytes; set TMPDIR to a shorter directory such as /tmp"
        )
