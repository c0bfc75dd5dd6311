"""Staging roots left behind by dead processes: finding them, and removing the empty ones.

A root whose validated owner marker names a dead process is removed by the next process that
starts (:func:`sweep_stale_roots`), but only when it is empty: nothing but the owner marker,
the kernel index and empty known subdirectories. A non-empty stale root is never traversed
or removed; only its ``spill/`` directory is read, entry by entry, by the spill reaper
(:mod:`lemon_exec.host.disk.spill_reaper`), after which a later start removes it. Roots without a
readable, well-formed marker, or whose owner is alive, are never touched.
"""

from __future__ import annotations

import logging
import os
import stat
import tempfile
from pathlib import Path

from lemon_exec._constants import STAGING_ROOT_PREFIX
from lemon_exec.proc.private_fs import (
    DIR_FLAGS,
    OWNER_MARKER,
    is_own_private_dir,
    pid_alive,
    read_owner_pid,
)
from lemon_exec.proc.tree_removal import Budget

__all__ = ["find_stale_roots", "sweep_stale_roots"]

logger = logging.getLogger(__name__)

#: What an empty root may still hold: the owner marker, the index, and empty directories
#: (the layout of :class:`lemon_exec.host.disk.staging.StagingRoot`, plus the engine's pypath/).
_EMPTY_ROOT_FILES = frozenset({OWNER_MARKER, "kernels.json"})
_EMPTY_ROOT_DIRS = frozenset({"runtime", "spill", "work", "pypath"})


def find_stale_roots(
    base: Path,
    *,
    max_candidates: int,
    budget: Budget | None = None,
    exclude: Path | None = None,
    stop_after: int | None = None,
) -> list[Path]:
    """Sibling roots in ``base`` whose owner PID is dead.

    At most ``max_candidates`` ``lemon-exec-*`` entries are examined; with ``budget``, every
    entry of ``base`` scanned also costs one. Stops once ``stop_after`` roots are found.
    """
    found: list[Path] = []
    candidates = 0
    try:
        with os.scandir(base) as entries:
            for entry in entries:
                if candidates >= max_candidates or (budget is not None and budget.left <= 0):
                    break
                if budget is not None:
                    budget.left -= 1
                if not entry.name.startswith(STAGING_ROOT_PREFIX):
                    continue
                root = Path(entry.path)
                if exclude is not None and root == exclude:
                    continue
                candidates += 1
                if not is_own_private_dir(root):
                    continue
                pid = read_owner_pid(root)
                if pid is not None and not pid_alive(pid):
                    found.append(root)
                    if stop_after is not None and len(found) >= stop_after:
                        break
    except OSError as exc:
        logger.warning("execute_code: cannot scan %s for stale workspaces: %s", base, exc)
    return found


def sweep_stale_roots(base: Path | str | None = None, *, max_roots: int = 64) -> int:
    """Remove empty sibling staging roots left behind by dead processes; return how many went.

    At most ``max_roots`` candidate ``lemon-exec-*`` directories are examined. Only a root
    that is empty by :func:`_remove_if_empty` goes; any other stale root is left alone,
    untraversed (its spill files are the spill reaper's; the rest is kept, owner-only).
    """
    base_path = Path(base) if base is not None else Path(tempfile.gettempdir())
    removed = 0
    for root in find_stale_roots(base_path, max_candidates=max_roots):
        if _remove_if_empty(root):
            removed += 1
    return removed


def _remove_if_empty(root: Path) -> bool:
    """Remove a stale ``root`` holding only its marker, its index and empty known directories.

    Never recursive: each known directory is checked for a first entry, nothing deeper, and
    anything else (an unknown name, a symlink, a non-empty directory) leaves the root as it
    is. The owner marker goes last, so a removal that fails midway is retried next start.
    """
    try:
        fd = os.open(root, DIR_FLAGS)
    except OSError:
        return False
    try:
        names: list[str] = []
        with os.scandir(fd) as entries:
            for entry in entries:
                if len(names) >= len(_EMPTY_ROOT_FILES) + len(_EMPTY_ROOT_DIRS):
                    return False
                names.append(entry.name)
        for name in names:
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            if name in _EMPTY_ROOT_FILES and stat.S_ISREG(st.st_mode):
                continue
            if name not in _EMPTY_ROOT_DIRS or not stat.S_ISDIR(st.st_mode):
                return False
            sub = os.open(name, DIR_FLAGS, dir_fd=fd)
            try:
                with os.scandir(sub) as entries:
                    if next(entries, None) is not None:
                        return False
            finally:
                os.close(sub)
        for name in sorted(names, key=lambda n: n == OWNER_MARKER):
            if name in _EMPTY_ROOT_DIRS:
                os.rmdir(name, dir_fd=fd)  # fails if something appeared meanwhile
            else:
                os.unlink(name, dir_fd=fd)
    except OSError as exc:
        logger.debug("execute_code: left stale workspace %s: %s", root, exc)
        return False
    finally:
        os.close(fd)
    try:
        os.rmdir(root)
    except OSError as exc:
        logger.debug("execute_code: left stale workspace %s: %s", root, exc)
        return False
    return True
