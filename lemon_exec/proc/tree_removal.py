"""Bounded removal of directory trees that never follows symlinks.

A script can create millions of files, so every removal visits at most a budget of entries
and stops, leaving the rest owner-only, rather than run unbounded. A script can also plant a
link to somewhere it should not be able to make us delete, so each directory is held open
with ``O_NOFOLLOW`` and worked on relative to that descriptor: swapping a directory for a
link mid-walk cannot redirect the walk.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import stat
from pathlib import Path

from lemon_exec._constants import REMOVE_TREE_MAX_ENTRIES
from lemon_exec.proc.private_fs import DIR_FLAGS

__all__ = ["Budget", "clear_dir", "remove_tree"]

logger = logging.getLogger(__name__)

# Deepest directory nesting remove_tree descends into; each level holds one open fd.
_MAX_DEPTH = 256
# Directory entries read per listing, so memory stays small whatever a directory holds.
_LIST_BATCH = 1024


class Budget:
    """Entries a removal may still visit, shared across the whole walk."""

    def __init__(self, entries: int) -> None:
        self.left = entries


def remove_tree(path: Path | str, max_entries: int = REMOVE_TREE_MAX_ENTRIES) -> bool:
    """Remove ``path`` and everything under it, visiting at most ``max_entries`` entries.

    Symlinks are unlinked, never followed: the walk holds each directory open with
    ``O_NOFOLLOW`` and works relative to it, so swapping a directory for a link mid-walk
    cannot redirect it. Returns True when ``path`` is gone (or never existed). When the bound
    (or the depth limit, or an error) stops it, returns False, leaving the rest in place with
    ``path`` itself reset to 0700 so what remains stays owner-only.
    """
    path = os.fspath(path)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return True
    if not stat.S_ISDIR(st.st_mode):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        return True
    try:
        fd = os.open(path, DIR_FLAGS)
    except FileNotFoundError:
        return True
    except OSError as exc:  # e.g. swapped for a symlink since the lstat
        logger.warning("execute_code: could not remove %s: %s", path, exc)
        return False
    try:
        done = clear_dir(fd, Budget(max_entries), depth=1)
        if not done:
            _make_owner_only(fd)
    finally:
        os.close(fd)
    if not done:
        return False
    try:
        os.rmdir(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        logger.warning("execute_code: could not remove %s: %s", path, exc)
        return False
    return True


def _make_owner_only(fd: int) -> None:
    try:
        if os.fstat(fd).st_uid == os.getuid():
            os.fchmod(fd, 0o700)
    except OSError:
        pass


def clear_dir(fd: int, budget: Budget, depth: int, keep: frozenset[str] = frozenset()) -> bool:
    """Empty the directory open at ``fd`` (except names in ``keep``); True when it is empty.

    ``fd`` must have been opened with :data:`~lemon_exec.proc.private_fs.DIR_FLAGS`; every
    entry visited costs ``budget`` one, and ``depth`` counts toward the nesting limit.
    """
    failed: set[str] = set(keep)
    while True:
        batch, more = _list_batch(fd, budget, failed)
        progress = False
        for name, is_dir in batch:
            if _remove_entry(fd, name, is_dir, budget, depth):
                progress = True
            else:
                failed.add(name)
                if budget.left <= 0:
                    return False
        if not more:
            return not (failed - keep)
        if not progress and budget.left <= 0:
            return False


def _list_batch(fd: int, budget: Budget, skip: set[str]) -> tuple[list[tuple[str, bool]], bool]:
    """Read up to one batch of entries not in ``skip``; also say whether more may remain."""
    batch: list[tuple[str, bool]] = []
    with os.scandir(fd) as entries:
        for entry in entries:
            if entry.name in skip:
                continue
            if budget.left <= 0 or len(batch) >= _LIST_BATCH:
                return batch, True
            budget.left -= 1
            try:
                is_dir = entry.is_dir(follow_symlinks=False)
            except OSError:
                is_dir = False
            batch.append((entry.name, is_dir))
    return batch, False


def _remove_entry(parent: int, name: str, is_dir: bool, budget: Budget, depth: int) -> bool:
    try:
        if not is_dir:
            os.unlink(name, dir_fd=parent)
            return True
        if depth >= _MAX_DEPTH:
            return False
        try:
            fd = os.open(name, DIR_FLAGS, dir_fd=parent)
        except OSError as exc:
            if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                raise
            # Replaced by a file or symlink since it was listed: unlink that instead.
            os.unlink(name, dir_fd=parent)
            return True
        try:
            emptied = clear_dir(fd, budget, depth + 1)
            if not emptied:
                _make_owner_only(fd)
        finally:
            os.close(fd)
        if emptied:
            os.rmdir(name, dir_fd=parent)
        return emptied
    except FileNotFoundError:
        return True
    except OSError as exc:
        logger.debug("execute_code: could not remove %s: %s", name, exc)
        return False
