"""Build the argv that runs one command under the wrapper, and read the wrapper's report.

Each command runs as ``[sandbox prefix] python -I -S _reaper.py REPORT_FD PARENT CWD --
/bin/bash -c COMMAND bash`` (see :mod:`lemon_exec.shell._reaper`). The command string is
passed to ``bash -c`` untouched, and its environment is the server's, unchanged: it behaves
exactly as a plain ``bash -c "command"`` (same ``$0`` and empty ``$@``, line numbers, error
messages, ``set -x`` output, ``BASH_ENV``). The wrapper learns the directory the shell
finished in from ``/proc`` and reports it on a pipe the command never holds.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from lemon_exec.proc import supervise

from . import _reaper

BASH = "/bin/bash"
#: The wrapper script, run by path (``-S``: no site-packages needed).
REAPER = str(Path(_reaper.__file__).resolve())

# ``$0`` of the command, as for ``bash -c "command"`` typed at a prompt.
_ARG0 = "bash"


@dataclass(frozen=True)
class Report:
    """What the wrapper says about the shell once it has ended."""

    #: As Popen gives it: the exit status, or -N after death by signal N.
    returncode: int
    #: ``ok`` (``cwd`` is known), ``unknown``, ``untraced`` (ptrace refused here) or
    #: ``nocwd`` (the start directory could not be entered; nothing ran).
    state: str
    #: The directory the shell finished in, when ``state`` is ``ok``.
    cwd: str | None


def wrapper_argv(
    command: str, *, report_fd: int, cwd: str, watch_host: bool, prefix: Sequence[str] = ()
) -> list[str]:
    """The argv of one command. ``watch_host``: the wrapper watches this process (the host)
    and kills the command's tree when it dies; otherwise it watches its own parent (a
    sandbox's init, which dies with the host)."""
    parent = os.getpid() if watch_host else 0
    return [
        *prefix,
        sys.executable,
        "-I",
        "-S",
        REAPER,
        str(report_fd),
        str(parent),
        cwd,
        "--",
        BASH,
        "-c",
        command,
        _ARG0,
    ]


def parse_report(data: bytes) -> Report | None:
    """The wrapper's report, or ``None`` while it is incomplete (or if it sent none)."""
    parts = data.split(b"\n", 3)
    if len(parts) != 4:
        return None
    head, state, size, cwd = parts
    try:
        returncode, length = int(head), int(size)
    except ValueError:
        return None
    if len(cwd) != length:
        return None
    text = state.decode("ascii", "replace")
    known = text == _reaper.OK and cwd.startswith(b"/")
    # fsdecode keeps undecodable bytes (surrogateescape), so the path round-trips to exec.
    return Report(returncode, text, os.fsdecode(cwd) if known else None)


def wrapper_pid(root: int) -> int | None:
    """The wrapper's PID: ``root`` itself, or (under a sandbox) the first process below it
    that runs the wrapper script. Parents come first, so a copy the command starts later
    is never taken for it."""
    for pid in (root, *supervise.descendants(root)):
        argv = supervise.proc_cmdline(pid)
        if len(argv) > 3 and argv[3] == os.fsencode(REAPER):
            return pid
    return None
