"""``ShellSession``: one shell session that remembers its working directory between calls."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from lemon_exec.errors import RefusedError
from lemon_exec.host.kernels import sandbox as sandboxes

from ._config import effective_timeout, output_limit
from ._process import ProcessOutcome, run_process, stop_tree
from ._reaper import NO_CWD, UNTRACED
from ._result import CommandResult, make_result
from ._wrapper import BASH, wrapper_argv

if TYPE_CHECKING:
    from lemon_exec.config import ExecuteCodeConfig

# How often a call waiting for the session lock checks whether it was cancelled.
_LOCK_POLL = 0.05


class ShellSession:
    """A shell session: each command runs in a fresh ``/bin/bash -c`` in the session's
    working directory, and the directory the command finished in carries over to the next.

    Only the working directory carries over (not variables, functions or options). Calls are
    serialised by a lock, so two commands never run at once in the same session; the async
    methods run the blocking work in a worker thread so the event loop is never blocked.
    Settings come from the environment and are read on every call (see ``_config``).
    """

    def __init__(
        self,
        start_dir: str | os.PathLike[str] | None = None,
        *,
        sandbox: sandboxes.SandboxSpec | None = None,
    ) -> None:
        """Start in ``start_dir`` (default: the process's current directory right now).

        The directory is resolved to its real path, like ``pwd -P``. Raises
        ``NotADirectoryError`` if it is not an existing directory. With an enabled
        ``sandbox``, every command runs in the view a sandboxed kernel working in
        ``start_dir`` gets (see ``docs/shell.md``); a sandbox that cannot start refuses the
        command, it never runs unconfined.
        """
        given = os.getcwd() if start_dir is None else os.fsdecode(os.fspath(start_dir))
        real = os.path.realpath(given)
        if not os.path.isdir(real):
            raise NotADirectoryError(f"start_dir is not an existing directory: {given!r}")
        self._start_dir = real
        self._cwd = real
        self._lock = threading.Lock()
        self._sandbox = sandbox if sandbox is not None and sandbox.enabled else None
        # Wrappers still reaping background jobs of earlier commands.
        self._lingering: list[subprocess.Popen[bytes]] = []

    @classmethod
    def for_config(
        cls, config: ExecuteCodeConfig, start_dir: str | os.PathLike[str] | None = None
    ) -> ShellSession:
        """A session whose commands run in ``config``'s sandbox, the view its kernels get
        (unconfined when the config has none, ``sandbox = "none"``)."""
        return cls(start_dir, sandbox=sandboxes.spec_from_config(config))

    def confined_like(self, config: ExecuteCodeConfig) -> bool:
        """Whether commands are as confined as ``config``'s kernels: in its sandbox, or the
        config has none."""
        spec = sandboxes.spec_from_config(config)
        return not spec.enabled or self._sandbox == spec

    @property
    def sandbox(self) -> sandboxes.SandboxSpec | None:
        """The sandbox every command runs in, or None."""
        return self._sandbox

    @property
    def cwd(self) -> str:
        """The directory the next command will start in."""
        return self._cwd

    @property
    def start_dir(self) -> str:
        """The directory the session started in, and returns to on restart."""
        return self._start_dir

    def execute_command(
        self,
        command: str,
        timeout: float | None = None,
        *,
        cancel_event: threading.Event | None = None,
        on_start: Callable[[], None] | None = None,
    ) -> CommandResult:
        """Run ``command`` with ``/bin/bash -c`` in the session's working directory.

        ``timeout`` is in seconds: ``None`` means ``DPTTOOLS_SANDBOX_TIMEOUT`` (default 30),
        and a larger value is lowered to it; zero or a negative value runs nothing and returns
        ``exit_code`` -1 with the reason in stderr. Setting ``cancel_event`` (from another
        thread) kills the command's process tree; the result then has ``exit_code`` -1.
        Blocks while another call of this session is running; ``on_start`` is called (in
        this thread) once the command has the session and is about to run.
        """
        _check_command(command)
        try:
            seconds = effective_timeout(timeout)
        except ValueError as exc:
            return make_result(stderr=f"Error: {exc}\n", exit_code=-1)
        limit = output_limit()
        if not self._acquire(cancel_event):
            return make_result(stderr=_NOT_STARTED_NOTE, exit_code=-1)
        try:
            if on_start is not None:
                on_start()
            return self._run_locked(command, seconds, limit, cancel_event)
        finally:
            self._lock.release()

    def restart_session(self) -> str:
        """Return to the start directory; returns a confirmation naming it.

        Waits for a running command to finish (calls are serialised).
        """
        with self._lock:
            self._cwd = self._start_dir
        return f"Session restarted. Working directory reset to {self._start_dir}"

    def close(self) -> None:
        """Stop the background jobs earlier commands left running (their whole trees).

        The session stays usable. They also die on their own when this process exits.
        """
        with self._lock:
            lingering, self._lingering = self._lingering, []
        for proc in lingering:
            stop_tree(proc)

    async def aclose(self) -> None:
        """Async ``close``, run in a worker thread."""
        await asyncio.to_thread(self.close)

    async def aexecute_command(
        self,
        command: str,
        timeout: float | None = None,
        *,
        cancel_event: threading.Event | None = None,
        on_start: Callable[[], None] | None = None,
    ) -> CommandResult:
        """Async ``execute_command``, run in a worker thread.

        If the awaiting task is cancelled, the command's process group is killed, and the
        cancellation propagates only once the worker has finished, so nothing is left running.
        Setting ``cancel_event`` stops it the same way but returns the command's result
        (``exit_code`` -1, the output so far); ``on_start`` is as for ``execute_command``.
        """
        _check_command(command)
        cancel = threading.Event() if cancel_event is None else cancel_event
        worker = asyncio.ensure_future(
            asyncio.to_thread(
                self.execute_command, command, timeout, cancel_event=cancel, on_start=on_start
            )
        )
        try:
            # shield: a cancel must reach us here without abandoning the worker thread.
            return await asyncio.shield(worker)
        except asyncio.CancelledError:
            cancel.set()
            await asyncio.wait({worker})
            if not worker.cancelled():
                worker.exception()  # mark it retrieved: the caller wants the cancellation
            raise

    async def arestart_session(self) -> str:
        """Async ``restart_session``, run in a worker thread."""
        return await asyncio.to_thread(self.restart_session)

    def _acquire(self, cancel: threading.Event | None) -> bool:
        """Take the session lock; give up (return False) if ``cancel`` is set meanwhile."""
        if cancel is None:
            self._lock.acquire()
            return True
        while not self._lock.acquire(timeout=_LOCK_POLL):
            if cancel.is_set():
                return False
        if cancel.is_set():
            self._lock.release()
            return False
        return True

    def _run_locked(
        self,
        command: str,
        seconds: float,
        limit: int,
        cancel: threading.Event | None,
    ) -> CommandResult:
        """Run one command; the caller holds the lock."""
        self._lingering = [p for p in self._lingering if p.poll() is None]
        before = self._ensure_cwd_exists()
        cwd = self._cwd
        try:
            with self._prefix() as prefix:
                outcome = run_process(
                    lambda fd: wrapper_argv(
                        command,
                        report_fd=fd,
                        cwd=cwd,
                        watch_host=self._sandbox is None,
                        prefix=prefix,
                    ),
                    timeout=seconds,
                    limit=limit,
                    cancel=cancel,
                )
        except RefusedError as exc:
            return make_result(stderr=f"{before}Error: {exc}\n", exit_code=-1)
        except OSError as exc:
            # E.g. no Python or bwrap to start, or no temporary directory: report, do not crash.
            return make_result(
                stderr=f"{before}Error: could not run the command with {BASH}: {exc}\n",
                exit_code=-1,
            )
        if outcome.lingering is not None:
            self._lingering.append(outcome.lingering)
        note = self._follow(outcome)
        after = self._ensure_cwd_exists()

        stderr = before + outcome.stderr + note + after
        if outcome.cancelled:
            stderr += _CANCELLED_NOTE
        report = outcome.report
        if outcome.timed_out or outcome.cancelled or report is None or report.state == NO_CWD:
            return make_result(
                stdout=outcome.stdout, stderr=stderr, exit_code=-1, timed_out=outcome.timed_out
            )
        return make_result(
            stdout=outcome.stdout, stderr=stderr, exit_code=_exit_status(report.returncode)
        )

    def _follow(self, outcome: ProcessOutcome) -> str:
        """Move to the directory the shell finished in, when known; return a note or ''."""
        report = outcome.report
        if report is None:
            if outcome.timed_out or outcome.cancelled:
                return ""
            return _NO_REPORT_NOTE.format(cwd=self._cwd)
        if report.cwd is not None:
            self._cwd = _undeleted(report.cwd)
        elif report.state == NO_CWD:
            missing, self._cwd = self._cwd, self._start_dir
            return f"Note: {missing} cannot be entered; falling back to {self._cwd}\n"
        elif report.state == UNTRACED:
            return _UNTRACED_NOTE.format(cwd=self._cwd)
        return ""

    @contextlib.contextmanager
    def _prefix(self) -> Iterator[list[str]]:
        """The sandbox's argv prefix for one command (nothing without a sandbox)."""
        if self._sandbox is None:
            yield []
            return
        bwrap = sandboxes.require(self._sandbox)
        scratch = tempfile.mkdtemp(prefix="lemon-shell-")  # mode 0700, stays empty
        try:
            yield sandboxes.command_argv_prefix(
                self._sandbox,
                bwrap=bwrap,
                cwd=Path(self._start_dir),
                scratch=Path(scratch),
                runtime=sandboxes.runtime_paths(sys.executable),
            )
        finally:
            shutil.rmtree(scratch, ignore_errors=True)

    def _ensure_cwd_exists(self) -> str:
        """Fall back to the start directory if the current one is gone; return a note or ''."""
        if os.path.isdir(self._cwd):
            return ""
        missing = self._cwd
        # If even the start directory is gone, "/" is the one directory sure to exist.
        self._cwd = self._start_dir if os.path.isdir(self._start_dir) else "/"
        return (
            f"Note: the working directory {missing} no longer exists; falling back to {self._cwd}\n"
        )


_CANCELLED_NOTE = "Command cancelled; its process tree was killed.\n"
_NO_REPORT_NOTE = (
    "Note: the command's wrapper ended without a report (it was killed, or could not "
    "start); the working directory stays {cwd}\n"
)
_UNTRACED_NOTE = (
    "Note: this system does not let the shell tool trace its commands (ptrace), so the "
    "directory a command finished in is not known; the working directory stays {cwd}\n"
)
_NOT_STARTED_NOTE = "Command cancelled before it started.\n"


def _check_command(command: object) -> None:
    """Reject a non-string command early, with a clear message."""
    if not isinstance(command, str):
        raise TypeError(f"command must be a str, not {type(command).__name__}")


def _undeleted(path: str) -> str:
    """``/proc`` names a deleted directory ``PATH (deleted)``: name it by its path."""
    suffix = " (deleted)"
    if path.endswith(suffix) and not os.path.isdir(path):
        return path[: -len(suffix)]
    return path


def _exit_status(returncode: int) -> int:
    """Report death by signal N as 128+N, the way bash reports it in ``$?``.

    Children killed by a signal already arrive as 128+N through bash; this covers bash itself
    being killed (e.g. ``kill -9 $$``), which Popen reports as -N.
    """
    return 128 - returncode if returncode < 0 else returncode
