"""Run one process in its own process group: pump its pipes, enforce a deadline, kill the group.

The child is started with ``start_new_session=True``, so it leads a new process group that
its children and grandchildren join; on timeout or cancellation the whole group gets SIGTERM,
then SIGKILL after a short grace.

A normal run ends when both pipes reach EOF *and* the process has exited. A background job
that keeps a pipe open therefore makes the call wait until the deadline; one whose output is
redirected elsewhere does not (and is left running: only the pipes and the leader are waited
for).
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from typing import Literal

from ._capture import BoundedText

_READ_CHUNK = 1 << 16
# How often the loop wakes to check the deadline and the cancel event.
_POLL_INTERVAL = 0.05
# Time between SIGTERM and SIGKILL, so programs (and bash's EXIT trap) can clean up.
_TERM_GRACE = 0.2
# After SIGKILL, how long to keep reading for output already in the pipes. Only a process
# that escaped the group (e.g. with setsid) can hold a pipe open past this.
_DRAIN_GRACE = 0.5

_Ending = Literal["exited", "timeout", "cancelled"]


@dataclass(frozen=True)
class ProcessOutcome:
    """What happened to one process."""

    stdout: str
    stderr: str
    # The Popen return code (negative for death by signal); None if we killed the group.
    returncode: int | None
    timed_out: bool
    cancelled: bool


def run_process(
    argv: list[str],
    *,
    cwd: str,
    env: dict[str, str] | None = None,
    timeout: float,
    limit: int,
    cancel: threading.Event | None = None,
) -> ProcessOutcome:
    """Run ``argv`` in ``cwd`` with stdin from /dev/null; capture stdout and stderr.

    ``env`` is the child's environment (default: inherited).

    Each stream keeps at most ``limit`` characters (see ``BoundedText``); the rest is read
    and discarded, so a chatty process never blocks on a full pipe. If ``timeout`` seconds
    pass, or ``cancel`` is set, the process group is killed and the output captured so far is
    returned. Raises ``OSError`` if the process cannot be started.
    """
    deadline = time.monotonic() + timeout
    proc = subprocess.Popen(
        argv,
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        close_fds=True,
    )
    assert proc.stdout is not None and proc.stderr is not None
    out, err = BoundedText(limit), BoundedText(limit)
    selector = selectors.DefaultSelector()
    try:
        selector.register(proc.stdout.fileno(), selectors.EVENT_READ, out)
        selector.register(proc.stderr.fileno(), selectors.EVENT_READ, err)
        ending = _pump(proc, selector, deadline, cancel)
        if ending != "exited":
            _stop_group(proc, selector)
    except BaseException:
        # E.g. KeyboardInterrupt in a synchronous caller: never leave the tree running.
        _signal_group(proc.pid, signal.SIGKILL)
        proc.wait()
        raise
    finally:
        selector.close()
        proc.stdout.close()
        proc.stderr.close()
    return ProcessOutcome(
        stdout=out.finish(),
        stderr=err.finish(),
        returncode=proc.returncode if ending == "exited" else None,
        timed_out=ending == "timeout",
        cancelled=ending == "cancelled",
    )


def _pump(
    proc: subprocess.Popen[bytes],
    selector: selectors.BaseSelector,
    deadline: float,
    cancel: threading.Event | None,
) -> _Ending:
    """Read until EOF on both pipes and exit of ``proc``; return why the loop ended.

    Returns ``"exited"``, ``"timeout"`` or ``"cancelled"``.
    """
    while True:
        if cancel is not None and cancel.is_set():
            return "cancelled"
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return "timeout"
        wait = min(remaining, _POLL_INTERVAL)
        if selector.get_map():
            _read_ready(selector, wait)
            continue
        # Both pipes are closed. The leader is reaped only now, so while a background job
        # holds a pipe the unreaped leader pins the process-group id against reuse.
        try:
            proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            continue
        return "exited"


def _read_ready(selector: selectors.BaseSelector, wait: float) -> None:
    """Read one chunk from each pipe that is ready within ``wait`` seconds."""
    for key, _events in selector.select(timeout=wait):
        data = os.read(key.fd, _READ_CHUNK)
        if data:
            key.data.feed(data)
        else:
            selector.unregister(key.fd)


def _drain(selector: selectors.BaseSelector, until: float, proc: subprocess.Popen[bytes]) -> None:
    """Keep reading until both pipes are closed and ``proc`` has exited, or until ``until``."""
    while (remaining := until - time.monotonic()) > 0:
        if selector.get_map():
            _read_ready(selector, min(remaining, _POLL_INTERVAL))
        elif proc.poll() is not None:
            return
        else:
            time.sleep(min(remaining, 0.01))


def _stop_group(proc: subprocess.Popen[bytes], selector: selectors.BaseSelector) -> None:
    """SIGTERM the group, give it a moment, SIGKILL it, and collect the remaining output."""
    _signal_group(proc.pid, signal.SIGTERM)
    _drain(selector, time.monotonic() + _TERM_GRACE, proc)
    # Always follow up with SIGKILL: members that ignore SIGTERM, or that closed their
    # output, are not visible from here.
    # (If _drain reaped the leader, the group id stays reserved while any member lives, and
    # an empty group just gives ESRCH.)
    _signal_group(proc.pid, signal.SIGKILL)
    _drain(selector, time.monotonic() + _DRAIN_GRACE, proc)
    # Only a leader that left its own group could survive SIGKILL of the group; do not hang
    # the session on it.
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=_DRAIN_GRACE)


def _signal_group(pgid: int, signum: int) -> None:
    """Send ``signum`` to a process group, ignoring a group that is already gone."""
    # PermissionError: macOS reports EPERM for a group whose members are all zombies.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)
