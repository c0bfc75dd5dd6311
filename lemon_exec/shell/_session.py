"""``ShellSession``: one shell session that remembers its working directory between calls."""

from __future__ import annotations

import asyncio
import os
import threading

from ._config import effective_timeout, output_limit
from ._process import run_process
from ._result import CommandResult, make_result
from ._wrapper import BASH, prepared_launch, read_cwd_file

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

    def __init__(self, start_dir: str | os.PathLike[str] | None = None) -> None:
        """Start in ``start_dir`` (default: the process's current directory right now).

        The directory is resolved to its real path, like ``pwd -P``. Raises
        ``NotADirectoryError`` if it is not an existing directory.
        """
        given = os.getcwd() if start_dir is None else os.fsdecode(os.fspath(start_dir))
        real = os.path.realpath(given)
        if not os.path.isdir(real):
            raise NotADirectoryError(f"start_dir is not an existing directory: {given!r}")
        self._start_dir = real
        self._cwd = real
        self._lock = threading.Lock()

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
    ) -> CommandResult:
        """Run ``command`` with ``/bin/bash -c`` in the session's working directory.

        ``timeout`` is in seconds: ``None`` means ``DPTTOOLS_SANDBOX_TIMEOUT`` (default 30),
        and a larger value is lowered to it; zero or a negative value runs nothing and returns
        ``exit_code`` -1 with the reason in stderr. Setting ``cancel_event`` (from another
        thread) kills the command's process group; the result then has ``exit_code`` -1.
        Blocks while another call of this session is running.
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

    async def aexecute_command(self, command: str, timeout: float | None = None) -> CommandResult:
        """Async ``execute_command``, run in a worker thread.

        If the awaiting task is cancelled, the command's process group is killed, and the
        cancellation propagates only once the worker has finished, so nothing is left running.
        """
        _check_command(command)
        cancel = threading.Event()
        worker = asyncio.ensure_future(
            asyncio.to_thread(self.execute_command, command, timeout, cancel_event=cancel)
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
        before = self._ensure_cwd_exists()
        try:
            with prepared_launch(command) as launch:
                outcome = run_process(
                    launch.argv,
                    env=launch.env,
                    cwd=self._cwd,
                    timeout=seconds,
                    limit=limit,
                    cancel=cancel,
                )
                finished_in = read_cwd_file(launch.cwd_file)
        except OSError as exc:
            # E.g. no /bin/bash, or no writable temporary directory: report, do not crash.
            return make_result(
                stderr=f"{before}Error: could not run the command with {BASH}: {exc}\n",
                exit_code=-1,
            )
        # Recorded after timeouts too: bash's EXIT trap also runs on the timeout's SIGTERM.
        if finished_in is not None:
            self._cwd = finished_in
        after = self._ensure_cwd_exists()

        stderr = before + outcome.stderr + after
        if outcome.cancelled:
            stderr += _CANCELLED_NOTE
        if outcome.returncode is None:
            return make_result(
                stdout=outcome.stdout, stderr=stderr, exit_code=-1, timed_out=outcome.timed_out
            )
        return make_result(
            stdout=outcome.stdout, stderr=stderr, exit_code=_exit_status(outcome.returncode)
        )

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


_CANCELLED_NOTE = "Command cancelled; its process group was killed.\n"
_NOT_STARTED_NOTE = "Command cancelled before it started.\n"


def _check_command(command: object) -> None:
    """Reject a non-string command early, with a clear message."""
    if not isinstance(command, str):
        raise TypeError(f"command must be a str, not {type(command).__name__}")


def _exit_status(returncode: int) -> int:
    """Report death by signal N as 128+N, the way bash reports it in ``$?``.

    Children killed by a signal already arrive as 128+N through bash; this covers bash itself
    being killed (e.g. ``kill -9 $$``), which Popen reports as -N.
    """
    return 128 - returncode if returncode < 0 else returncode
