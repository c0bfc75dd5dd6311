"""Wait for a process to exit on its pidfd, never by polling its status on a timer.

A pidfd (Linux 5.3+) becomes readable when the process terminates (a zombie counts: its exit
status is ready to be reaped), so the event loop wakes the moment it dies. Where pidfds are
missing (another OS, an old kernel, a seccomp filter) the wait falls back to a short poll of
``alive``.

Only for a process whose PID cannot have been reused meanwhile: an unreaped child of ours, or
a process that ``alive`` says still runs just before the pidfd is opened (a PID is reused
only after its process was reaped, which the caller checks through ``alive``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Callable

#: Fallback poll interval where no pidfd can be opened.
_FALLBACK_POLL_S = 0.005


async def wait_exit(pid: int, alive: Callable[[], bool], timeout: float) -> bool:
    """Wait until ``pid`` has exited, at most ``timeout`` seconds; True once it has.

    ``alive()`` answers whether the process still runs (e.g. ``Popen.poll() is None``); it is
    asked first, and again once the pidfd fires or the wait ends.
    """
    if not alive():
        return True
    fd = _pidfd(pid)
    if fd is None:
        return await _poll(alive, timeout)
    loop = asyncio.get_running_loop()
    exited = loop.create_future()

    def on_exit() -> None:
        if not exited.done():
            exited.set_result(None)

    try:
        loop.add_reader(fd, on_exit)
        try:
            if alive():  # it may have exited between the first check and the pidfd
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(exited, timeout)
        finally:
            loop.remove_reader(fd)
    finally:
        os.close(fd)
    return not alive()


def _pidfd(pid: int) -> int | None:
    opener = getattr(os, "pidfd_open", None)
    if opener is None:
        return None
    try:
        return int(opener(pid))
    except OSError:  # ESRCH (already reaped), ENOSYS, EPERM: the caller's alive() decides
        return None


async def _poll(alive: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while alive():
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(_FALLBACK_POLL_S)
    return True


__all__ = ["wait_exit"]
