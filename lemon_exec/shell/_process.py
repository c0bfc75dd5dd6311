"""Run one command under its wrapper: pump its pipes, enforce a deadline, stop its tree.

The wrapper (:mod:`lemon_exec.shell._reaper`) is started in a new session, so it leads a
process group that the command joins; it is also a child subreaper, so descendants that
leave the group (``setsid``) stay in its tree. On timeout or cancellation the wrapper gets
SIGTERM and stops the whole tree itself (SIGTERM, then SIGKILL 0.2 s later); the process
group gets SIGKILL as a backstop if the wrapper has not finished within ``_STOP_GRACE``.

A normal run ends when the wrapper's report has arrived: it is sent once the shell has ended
and no process of the command's tree holds stdout or stderr (under a sandbox, bwrap holds
them as well, so their EOF tells nothing). A background job that keeps the output open
therefore makes the call wait until the deadline; one whose output is redirected elsewhere
does not: it keeps running, with the wrapper as its reaper, and the wrapper is returned in
``lingering`` for the caller to stop later.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from lemon_exec.proc import supervise

from ._capture import BoundedText
from ._wrapper import Report, parse_report, wrapper_pid

_READ_CHUNK = 1 << 16
# How often the loop wakes to check the deadline and the cancel event.
_POLL_INTERVAL = 0.05
# How long the wrapper has to stop the tree after SIGTERM (0.2 s grace, then SIGKILL rounds
# of up to 2 s against a fork loop) before the group gets SIGKILL from here.
_STOP_GRACE = 3.0
# After SIGKILL of the group, how long to keep reading for output already in the pipes.
_DRAIN_GRACE = 0.5
# The report is a few bytes and a path; more is not a report.
_REPORT_LIMIT = 1 << 16

_Ending = Literal["exited", "timeout", "cancelled"]


@dataclass(frozen=True)
class ProcessOutcome:
    """What happened to one command."""

    stdout: str
    stderr: str
    # The wrapper's report; None if it sent none.
    report: Report | None
    timed_out: bool
    cancelled: bool
    # The wrapper, still running as the reaper of background jobs; None once it has exited.
    lingering: subprocess.Popen[bytes] | None


class _Report:
    """Collects the wrapper's report (bounded)."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.done: Report | None = None

    def feed(self, data: bytes) -> None:
        if len(self.data) < _REPORT_LIMIT:
            self.data += data
            self.done = parse_report(bytes(self.data))


def run_process(
    build_argv: Callable[[int], list[str]],
    *,
    env: dict[str, str] | None = None,
    timeout: float,
    limit: int,
    cancel: threading.Event | None = None,
) -> ProcessOutcome:
    """Start ``build_argv(report_fd)`` with stdin from /dev/null; capture stdout and stderr.

    ``env`` is the child's environment (default: inherited). Each stream keeps at most
    ``limit`` characters (see ``BoundedText``); the rest is read and discarded, so a chatty
    process never blocks on a full pipe. If ``timeout`` seconds pass, or ``cancel`` is set,
    the tree is stopped and the output captured so far is returned. Raises ``OSError`` if
    the process cannot be started.
    """
    deadline = time.monotonic() + timeout
    report_read, report_write = os.pipe()
    try:
        proc = subprocess.Popen(
            build_argv(report_write),
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            close_fds=True,
            pass_fds=(report_write,),
        )
    except BaseException:
        os.close(report_read)
        raise
    finally:
        os.close(report_write)
    assert proc.stdout is not None and proc.stderr is not None
    out, err, report = BoundedText(limit), BoundedText(limit), _Report()
    selector = selectors.DefaultSelector()
    try:
        selector.register(proc.stdout.fileno(), selectors.EVENT_READ, out)
        selector.register(proc.stderr.fileno(), selectors.EVENT_READ, err)
        selector.register(report_read, selectors.EVENT_READ, report)
        ending = _pump(selector, report, deadline, cancel)
        if ending != "exited":
            stop_tree(proc, selector, report)
        _read_what_is_there(selector)
    except BaseException:
        # E.g. KeyboardInterrupt in a synchronous caller: never leave the tree running.
        stop_tree(proc)
        raise
    finally:
        selector.close()
        proc.stdout.close()
        proc.stderr.close()
        os.close(report_read)
    return ProcessOutcome(
        stdout=out.finish(),
        stderr=err.finish(),
        report=report.done,
        timed_out=ending == "timeout",
        cancelled=ending == "cancelled",
        lingering=proc if proc.poll() is None else None,
    )


def _pump(
    selector: selectors.BaseSelector,
    report: _Report,
    deadline: float,
    cancel: threading.Event | None,
) -> _Ending:
    """Read until the report is complete (or every pipe is closed: the wrapper died);
    return why the loop ended."""
    while report.done is None and selector.get_map():
        if cancel is not None and cancel.is_set():
            return "cancelled"
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return "timeout"
        _read_ready(selector, min(remaining, _POLL_INTERVAL))
    return "exited"


def _read_ready(selector: selectors.BaseSelector, wait: float) -> None:
    """Read one chunk from each pipe that is ready within ``wait`` seconds."""
    for key, _events in selector.select(timeout=wait):
        data = os.read(key.fd, _READ_CHUNK)
        if data:
            key.data.feed(data)
        else:
            selector.unregister(key.fd)


def _read_what_is_there(selector: selectors.BaseSelector) -> None:
    """Read what the pipes hold now (its writers are gone once the report is in)."""
    while selector.get_map() and selector.select(timeout=0):
        _read_ready(selector, 0)


def _drain(
    selector: selectors.BaseSelector | None,
    report: _Report | None,
    until: float,
    proc: subprocess.Popen[bytes],
) -> bool:
    """Keep reading until the report is complete, or every pipe is closed and ``proc`` has
    exited, or until ``until``; return whether it finished."""
    while (remaining := until - time.monotonic()) > 0:
        if report is not None and report.done is not None:
            return True
        if selector is not None and selector.get_map():
            _read_ready(selector, min(remaining, _POLL_INTERVAL))
        elif proc.poll() is not None:
            return True
        else:
            time.sleep(min(remaining, 0.01))
    return False


def stop_tree(
    proc: subprocess.Popen[bytes],
    selector: selectors.BaseSelector | None = None,
    report: _Report | None = None,
) -> None:
    """Have the wrapper stop the command's whole tree; SIGKILL the group if it does not.

    With a ``selector``, the output and the report that arrive meanwhile are collected.
    """
    wrapper = wrapper_pid(proc.pid) if proc.poll() is None else None
    if wrapper is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(wrapper, signal.SIGTERM)
        if _drain(selector, report, time.monotonic() + _STOP_GRACE, proc):
            return
        # Stuck (the command can SIGSTOP its wrapper): kill its tree from here.
        supervise.kill_tree(wrapper)
    # The wrapper never started, or died (its orphans went to init): the group is in reach.
    _signal_group(proc.pid, signal.SIGKILL)
    _drain(selector, report, time.monotonic() + _DRAIN_GRACE, proc)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=_DRAIN_GRACE)


def _signal_group(pgid: int, signum: int) -> None:
    """Send ``signum`` to a process group, ignoring a group that is already gone."""
    # PermissionError: macOS reports EPERM for a group whose members are all zombies.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)
