"""The spill reaper: one bounded batch per 24-hour window, resumed where it stopped.

Spill files (``lemon-exec-output-*`` in a staging root's ``spill/``) stay readable for 24
hours after their run finished, also after the host that wrote them is gone. Each engine
(one staging root, the spec's "node") owns one :class:`SpillReaper`:

- At boot it discovers sibling stale roots: ``lemon-exec-*`` directories of ours whose
  validated 0600 owner marker names a dead process (at most 64 candidates examined). The
  staging sweep has already removed the empty ones; what is left is never traversed, only
  its ``spill/`` directory is read, one entry at a time.
- :meth:`SpillReaper.run` processes one batch of at most 1,000 direct entries per 24-hour
  window: the current root's ``spill/`` first, then one stale root's with whatever budget is
  left. A call within the same window does nothing. The window start is kept in process
  memory: the current root lives only as long as the engine, so a file would add nothing.
- An entry is removed only if it is a regular file (``lstat``; symlinks are never followed),
  owned by us, named ``lemon-exec-output-*``, last written more than 24 hours ago, and not a
  live capture. Unlinking is relative to the directory opened with ``O_NOFOLLOW``.
- A directory not finished in one batch keeps its position: its open directory stream is the
  continuation, and the next window reads on from there instead of re-reading the entries
  already examined. A stale root whose spill directory still holds files after a full pass
  waits its turn again; one left empty is dropped (a later boot removes the root).
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import stat
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from lemon_exec._constants import SPILL_PREFIX
from lemon_exec.host.disk.staging import SPILL_MAX_AGE_S
from lemon_exec.host.disk.stale_roots import find_stale_roots
from lemon_exec.proc.private_fs import DIR_FLAGS

log = logging.getLogger(__name__)

#: One batch per window, per engine.
WINDOW_S = 86_400.0
#: Direct directory entries examined per batch, across the current and one stale root.
BATCH_ENTRIES = 1000
#: Sibling ``lemon-exec-*`` entries examined at boot when looking for stale roots.
MAX_STALE_CANDIDATES = 64

_SPILL_DIR = "spill"


class _Cursor:
    """One spill directory being read, possibly across windows (its open stream)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._fd: int | None = None
        self._entries: Iterator[os.DirEntry[str]] | None = None
        #: Entries seen and left in place during the current (or last finished) pass.
        self.kept = 0

    def step(
        self, budget: int, cutoff: float, is_live: Callable[[Path], bool]
    ) -> tuple[int, int, bool]:
        """Examine up to ``budget`` entries; ``(removed, examined, pass_finished)``."""
        if self._entries is None and not self._open():
            return 0, 0, True
        assert self._fd is not None and self._entries is not None
        removed = examined = 0
        try:
            while examined < budget:
                entry = next(self._entries, None)
                if entry is None:
                    self.close()
                    return removed, examined, True
                examined += 1
                if self._remove_if_expired(entry, cutoff, is_live):
                    removed += 1
                else:
                    self.kept += 1
        except OSError as exc:  # the directory went away or became unreadable: pass over
            log.warning("execute_code: cannot scan %s for old spill files: %s", self.directory, exc)
            self.close()
            return removed, examined, True
        return removed, examined, False

    def _open(self) -> bool:
        self.kept = 0
        try:
            fd = os.open(self.directory, DIR_FLAGS)  # O_NOFOLLOW: no symlinked dir
        except FileNotFoundError:
            return False
        except OSError as exc:
            log.warning("execute_code: cannot scan %s for old spill files: %s", self.directory, exc)
            return False
        try:
            st = os.fstat(fd)
            if st.st_uid != os.getuid() or stat.S_IMODE(st.st_mode) != 0o700:
                os.close(fd)
                return False
            self._entries = os.scandir(fd)  # reads through its own duplicate of fd
        except OSError:
            os.close(fd)
            return False
        self._fd = fd
        return True

    def _remove_if_expired(
        self, entry: os.DirEntry[str], cutoff: float, is_live: Callable[[Path], bool]
    ) -> bool:
        if not entry.name.startswith(SPILL_PREFIX):
            return False
        try:
            st = entry.stat(follow_symlinks=False)  # lstat
        except OSError:
            return False
        if (
            not stat.S_ISREG(st.st_mode)
            or st.st_uid != os.getuid()
            or st.st_mtime >= cutoff
            or is_live(self.directory / entry.name)
        ):
            return False
        try:
            os.unlink(entry.name, dir_fd=self._fd)
        except FileNotFoundError:
            return False
        except OSError as exc:
            log.debug("execute_code: could not remove %s: %s", entry.name, exc)
            return False
        return True

    def close(self) -> None:
        if self._entries is not None:
            with contextlib.suppress(Exception):
                self._entries.close()  # type: ignore[attr-defined]
            self._entries = None
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None


def stale_roots(current: Path, max_candidates: int = MAX_STALE_CANDIDATES) -> list[Path]:
    """Siblings of ``current`` whose validated owner marker names a dead process."""
    return find_stale_roots(current.parent, max_candidates=max_candidates, exclude=current)


class SpillReaper:
    """Removes expired spill files of one staging root and of stale sibling roots."""

    def __init__(
        self,
        root: Path,
        *,
        stale: list[Path] | None = None,
        batch: int = BATCH_ENTRIES,
        window_s: float = WINDOW_S,
        max_age_s: float = SPILL_MAX_AGE_S,
        is_live: Callable[[Path], bool] | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        """``stale``: the stale roots to serve (default: discovered now, at boot)."""
        self._current = _Cursor(root / _SPILL_DIR)
        found = stale_roots(root) if stale is None else stale
        self._stale: collections.deque[_Cursor] = collections.deque(
            _Cursor(path / _SPILL_DIR) for path in found
        )
        self._batch = batch
        self._window_s = window_s
        self._max_age_s = max_age_s
        self._is_live = is_live or (lambda _path: False)
        self._clock = clock
        self._wall_clock = wall_clock
        self._window_start: float | None = None

    @property
    def stale(self) -> list[Path]:
        """The stale roots still served, next first."""
        return [cursor.directory.parent for cursor in self._stale]

    def run(self) -> int | None:
        """Run this window's batch; the number of files removed, or None if it already ran."""
        now = self._clock()
        if self._window_start is not None and now - self._window_start < self._window_s:
            return None
        self._window_start = now
        cutoff = self._wall_clock() - self._max_age_s
        removed, budget, _finished = self._spend(self._current, self._batch, cutoff)
        if budget > 0 and self._stale:
            cursor = self._stale.popleft()
            got, budget, finished = self._spend(cursor, budget, cutoff)
            removed += got
            if not finished:
                self._stale.appendleft(cursor)  # it goes on from here next window
            elif cursor.kept:
                self._stale.append(cursor)  # files not expired yet: another pass later
            # else its spill directory is empty (or gone): a later boot removes the root
        return removed

    def _spend(self, cursor: _Cursor, budget: int, cutoff: float) -> tuple[int, int, bool]:
        """``(removed, budget left, pass finished)`` after one step of ``cursor``."""
        removed, examined, finished = cursor.step(budget, cutoff, self._is_live)
        return removed, budget - examined, finished

    def close(self) -> None:
        """Close the directory streams kept for later windows."""
        self._current.close()
        for cursor in self._stale:
            cursor.close()


__all__ = ["BATCH_ENTRIES", "WINDOW_S", "SpillReaper", "stale_roots"]
