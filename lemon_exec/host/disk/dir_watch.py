"""Knowing, without touching the disk, that a set of directories is as a check left them.

A call checks its host's staging root before it starts (a script may have deleted or
changed it: :meth:`~lemon_exec.host.disk.staging.StagingRoot.ensure`). That check is a
handful of ``lstat`` calls, but they belong off the event loop, and the hop to the disk
worker was most of its cost. :class:`DirWatch` lets a call skip it while nothing has
happened: inotify reports every removal, rename or change of mode or owner of a watched
directory, and of the names in it that the check looks at. Asking costs one non-blocking
``read`` of the inotify descriptor, which never waits for a disk.

It errs on the side of checking: any event it cannot place, a full event queue, a watch it
could not add, or a directory that is no longer the one it watched all mean "check again".
The process opens one inotify instance, shared by every watch (:class:`_Inotify`). Where
inotify is missing (not Linux) or the user has none left (``fs.inotify.max_user_instances``),
:meth:`DirWatch.open` returns None and every call checks.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import logging
import os
import struct
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

__all__ = ["DirWatch"]

log = logging.getLogger(__name__)

# <sys/inotify.h>
_IN_ATTRIB = 0x00000004
_IN_MOVED_FROM = 0x00000040
_IN_MOVED_TO = 0x00000080
_IN_CREATE = 0x00000100
_IN_DELETE = 0x00000200
_IN_DELETE_SELF = 0x00000400
_IN_MOVE_SELF = 0x00000800
_IN_IGNORED = 0x00008000  # the watch is gone (its directory was removed): the wd is free
_IN_ONLYDIR = 0x01000000
_IN_DONT_FOLLOW = 0x02000000
_IN_NONBLOCK = os.O_NONBLOCK
_IN_CLOEXEC = os.O_CLOEXEC
#: The directory itself removed, renamed or re-moded, and names in it removed, renamed or
#: made (only the guarded ones count); never followed through a symlink, only directories.
_MASK = (
    _IN_ATTRIB
    | _IN_MOVED_FROM
    | _IN_MOVED_TO
    | _IN_CREATE
    | _IN_DELETE
    | _IN_DELETE_SELF
    | _IN_MOVE_SELF
    | _IN_ONLYDIR
    | _IN_DONT_FOLLOW
)
_EVENT = struct.Struct("iIII")  # wd, mask, cookie, len; then len bytes of name
_READ_SIZE = 64 * 1024

#: Directories to watch, each with the names in it whose change matters.
Watched = Mapping[Path, frozenset[str]]


class _Inotify:
    """The process's one inotify instance, shared by every :class:`DirWatch`: instances
    are a per-user resource (``fs.inotify.max_user_instances``, often 128) that other
    programs of the user (editors, file watchers) need too."""

    _shared: _Inotify | None = None
    _opened = False
    _open_lock = threading.Lock()

    def __init__(self, fd: int, add_watch: Any) -> None:
        self.fd = fd
        self._add_watch = add_watch
        self.lock = threading.Lock()
        #: watch descriptor -> the watches that asked for it (one directory, one wd)
        self.watchers: dict[int, set[DirWatch]] = {}

    @classmethod
    def shared(cls) -> _Inotify | None:
        """The instance, opened on first use; None where inotify cannot be had."""
        with cls._open_lock:
            if not cls._opened:
                cls._opened = True
                cls._shared = cls._open()
            return cls._shared

    @classmethod
    def _open(cls) -> _Inotify | None:
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
            init, add_watch = libc.inotify_init1, libc.inotify_add_watch
        except (OSError, AttributeError):
            return None
        init.argtypes = [ctypes.c_int]
        init.restype = ctypes.c_int
        add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
        add_watch.restype = ctypes.c_int
        fd = init(_IN_NONBLOCK | _IN_CLOEXEC)
        if fd < 0:
            reason = os.strerror(ctypes.get_errno())
            log.info("execute_code: no inotify (%s): every call checks its staging root", reason)
            return None
        return cls(fd, add_watch)

    def watch(self, path: Path) -> int:
        """Watch ``path``: its wd, or -1 if it cannot be. Not under the lock: the path's
        lookup may wait for a slow disk, and :meth:`DirWatch.intact` must not."""
        return int(self._add_watch(self.fd, os.fsencode(path), _MASK))

    def forget(self, watcher: DirWatch) -> None:
        """(lock held) Its wds stay with the instance: the kernel drops each by itself once
        its directory is gone (``IN_IGNORED``, see :meth:`drain`)."""
        for wd in [wd for wd, users in self.watchers.items() if watcher in users]:
            self.watchers[wd].discard(watcher)
            if not self.watchers[wd]:
                del self.watchers[wd]

    def drain(self) -> None:
        """Read every pending event and tell the watches it concerns (lock held)."""
        while True:
            try:
                data = os.read(self.fd, _READ_SIZE)
            except BlockingIOError:
                return
            except InterruptedError:
                continue
            except OSError:
                self._tell_all()
                return
            offset = 0
            while offset + _EVENT.size <= len(data):
                wd, mask, _cookie, size = _EVENT.unpack_from(data, offset)
                raw = data[offset + _EVENT.size : offset + _EVENT.size + size]
                offset += _EVENT.size + size
                if wd < 0:  # the queue overflowed: anything may have happened
                    self._tell_all()
                    continue
                name = raw.rstrip(b"\0").decode("utf-8", "surrogateescape")
                for watcher in self.watchers.get(wd, ()):
                    watcher.notice(wd, name)
                if mask & _IN_IGNORED:  # forgotten, so a root removed again and again
                    for watcher in self.watchers.pop(wd, ()):  # leaves no trail of wds
                        watcher.drop(wd)

    def _tell_all(self) -> None:
        for users in self.watchers.values():
            for watcher in users:
                watcher.notice(-1, "")


class DirWatch:
    """One set of watched directories (one staging root's); thread-safe.

    :meth:`intact` says whether anything relevant happened since the last clean
    :meth:`checking` block. Use it as::

        if not watch.intact():
            with watch.checking(dirs):
                check(dirs)  # raises if the check fails: the watch stays dirty
    """

    def __init__(self, inotify: _Inotify) -> None:
        self._inotify = inotify
        #: watch descriptor -> the names in its directory that matter
        self._names: dict[int, frozenset[str]] = {}
        self._clean = False
        #: Something relevant happened since the current check began.
        self._changed = True
        self._closed = False

    @classmethod
    def open(cls) -> DirWatch | None:
        """A new watch, or None where inotify cannot be had (callers then always check)."""
        inotify = _Inotify.shared()
        return None if inotify is None else cls(inotify)

    def intact(self) -> bool:
        """Whether the directories are as the last clean check left them (no disk access)."""
        with self._inotify.lock:
            self._inotify.drain()
            return self._clean and not self._changed

    @contextlib.contextmanager
    def checking(self, dirs: Watched) -> Iterator[None]:
        """Watch ``dirs`` around a check of them: clean afterwards if the check passed and
        nothing changed meanwhile (what the check itself made or mended counts as a
        change, so the next call checks once more and finds it stable)."""
        with self._inotify.lock:
            self._inotify.drain()
            self._clean = False
            self._changed = False
        before = self._add(dirs)  # before the check: nothing after it goes unseen
        yield
        after = self._add(dirs)
        with self._inotify.lock:
            self._inotify.drain()
            if before is not None and before == after and not self._changed:
                self._clean = not self._closed

    def notice(self, wd: int, name: str) -> None:
        """An event on ``wd`` (lock held): nameless ones are about the directory itself."""
        names = self._names.get(wd)
        if names is None or not name or name in names:
            self._changed = True

    def drop(self, wd: int) -> None:
        """(lock held) ``wd`` no longer exists."""
        self._names.pop(wd, None)

    def close(self) -> None:
        with self._inotify.lock:
            self._closed = True
            self._clean = False
            self._inotify.forget(self)

    def _add(self, dirs: Watched) -> dict[int, frozenset[str]] | None:
        """Watch each directory; None if one cannot be (missing, not a directory...)."""
        added: dict[int, frozenset[str]] = {}
        for path, names in dirs.items():
            wd = self._inotify.watch(path)
            if wd < 0:
                return None
            # A new wd's events before this point reach nobody: harmless, since the check
            # comes after (and a new wd after it makes the check not count).
            with self._inotify.lock:
                if self._closed:
                    return None
                self._inotify.watchers.setdefault(wd, set()).add(self)
                self._names[wd] = names
            added[wd] = names
        return added
