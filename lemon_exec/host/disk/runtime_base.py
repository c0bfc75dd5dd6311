"""The per-user runtime base: the one place every kernel's control material lives.

Layout (every directory 0700, every file 0600, all owned by this user)::

    /tmp/lemon-exec.<uid>/              the base: fixed, never removed
        lemon-exec-XXXXXXXX/            one host's runtime directory (named as its
            owner                       staging root; its owner marker for the sweep)
            kernel-<id>.json, k-<id>-ipc-1 ... -5, k-<id>-ipc-host, kernel-<id>.log
            <id>/                       a sandboxed kernel's own directory (its key,
                                        sockets and host link; the only part bound
                                        into its view)

Connection files (the HMAC keys), the kernels' ipc sockets and the host-link listeners are
what lets a process drive a kernel. They live here, never under ``$TMPDIR`` or any
configured directory, so that every sandbox view can hide all of them, including those
created after it started, with one mount over this fixed path
(:func:`lemon_exec.host.kernels.sandbox.kernel_argv_prefix`). The path is independent of
``TMPDIR`` and of the configuration on purpose: a host whose ``TMPDIR`` lies anywhere
still puts its keys where every other host's sandboxes mask.

The base is never removed: a mount over a directory that is deleted is detached in every
other mount namespace, and a base made again later would then be visible in a running
sandbox. A base that is not a real directory of ours, mode 0700 (another user created it
first, or it is a symlink) fails closed with ``RefusedError``, naming the fix.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from lemon_exec._constants import REMOVE_TREE_MAX_ENTRIES, STAGING_ROOT_PREFIX
from lemon_exec.proc.private_fs import (
    ensure_private_dir,
    is_own_private_dir,
    pid_alive,
    read_owner_pid,
)
from lemon_exec.proc.tree_removal import remove_tree

__all__ = ["base_path", "runtime_base", "runtime_dir_of", "sweep_stale_runtime_dirs"]

logger = logging.getLogger(__name__)

#: At most this many entries of the base are looked at by one sweep.
_SWEEP_MAX_ENTRIES = 256


def base_path() -> Path:
    """Where the base is (``/tmp/lemon-exec.<uid>``, ``/tmp`` resolved); not created."""
    return Path(os.path.realpath("/tmp")) / f"lemon-exec.{os.getuid()}"


def runtime_dir_of(root: Path) -> Path:
    """The runtime directory (keys, sockets) of the staging root ``root``."""
    return base_path() / root.name


def runtime_base() -> Path:
    """The base, created 0700 if missing and checked; ``RefusedError`` if unusable."""
    path = base_path()
    fix = (
        "; lemon_exec keeps every kernel's keys and sockets there (independent of TMPDIR); "
        f"remove {path} if it is not yours (as root if need be) and start again"
    )
    ensure_private_dir(path, fix=fix)
    return path


def sweep_stale_runtime_dirs(base: Path) -> int:
    """Remove host runtime directories whose owner marker names a dead process (bounded).

    Only a host killed outright leaves one behind (a clean close removes its own); what is
    in it (keys, sockets, logs) is useless once its kernels are gone.
    """
    removed = 0
    try:
        with os.scandir(base) as entries:
            for n, entry in enumerate(entries):
                if n >= _SWEEP_MAX_ENTRIES:
                    break
                if not entry.name.startswith(STAGING_ROOT_PREFIX):
                    continue
                path = Path(entry.path)
                if not is_own_private_dir(path):
                    continue
                pid = read_owner_pid(path)
                if pid is None or pid_alive(pid):
                    continue
                if remove_tree(path, REMOVE_TREE_MAX_ENTRIES):
                    removed += 1
    except OSError as exc:
        logger.warning("execute_code: cannot sweep %s: %s", base, exc)
    return removed
