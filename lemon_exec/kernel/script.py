"""Run a script as one unit and turn its ending into an outcome the host can report.

Unlike an IPython cell, a script is compiled as a file (no implicit display of the last
expression, no input transformations), its tracebacks keep only the script's own frames with
exact line numbers, and it cannot read stdin. ``exit(n)`` and ``quit(n)`` end it as
``sys.exit(n)`` does (IPython's versions would ask the kernel to shut down instead; see
``lemon_kernel.ScriptAwareExit``).
"""

from __future__ import annotations

import ast
import asyncio
import builtins
import contextlib
import getpass
import inspect
import io
import linecache
import os
import sys
import time
import traceback
from typing import Any

from lemon_exec.wire.script_outcome import ScriptOutcome

#: The script files this kernel has run; traceback frames from these are the script's own.
_SCRIPT_FILES: set[str] = set()

_NO_INPUT = (
    "{what} is not supported: execute_code scripts have no stdin. Read the data from a file "
    "(open() or the read() helper) or call a helper instead"
)


class UnsupportedInputError(RuntimeError):
    """Raised when a script asks for interactive input; scripts have no stdin."""


def _refuse_input(*_args: Any, **_kwargs: Any) -> str:
    raise UnsupportedInputError(_NO_INPUT.format(what="input()"))


def _refuse_getpass(*_args: Any, **_kwargs: Any) -> str:
    raise UnsupportedInputError(_NO_INPUT.format(what="getpass()"))


class NoStdin(io.TextIOBase):
    """A ``sys.stdin`` whose every read raises UnsupportedInputError instead of blocking.

    Its ``buffer`` refuses binary reads the same way (``sys.stdin.buffer.read()``,
    ``fileinput`` in binary mode). File descriptor 0 itself is ``/dev/null`` in a lemon
    kernel (:func:`detach_fd0`): ``os.read(0, n)`` and child processes see end of file.
    """

    def __init__(self) -> None:
        super().__init__()
        self._buffer = _NoStdinBytes()

    @property
    def buffer(self) -> io.BufferedIOBase:
        return self._buffer

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return "utf-8"

    @property
    def errors(self) -> str:  # type: ignore[override]
        return "strict"

    def read(self, *_args: Any, **_kwargs: Any) -> str:
        raise _stdin_refusal()

    # typeshed types these of io.IOBase as bytes even for text streams.
    def readline(self, *_args: Any, **_kwargs: Any) -> str:  # type: ignore[override]
        raise _stdin_refusal()

    def readlines(self, *_args: Any, **_kwargs: Any) -> list[str]:  # type: ignore[override]
        raise _stdin_refusal()

    def __next__(self) -> str:  # type: ignore[override]
        raise _stdin_refusal()

    def readable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return False

    def fileno(self) -> int:
        raise io.UnsupportedOperation("stdin is not available in execute_code scripts")

    def close(self) -> None:
        pass  # stays usable (and refusing): the kernel installs one for its lifetime

    def __del__(self) -> None:
        pass  # nothing to flush or close


class _NoStdinBytes(io.BufferedIOBase):
    """``sys.stdin.buffer``: every read raises UnsupportedInputError."""

    def read(self, *_args: Any, **_kwargs: Any) -> bytes:
        raise _stdin_refusal()

    read1 = readline = read

    def readlines(self, *_args: Any, **_kwargs: Any) -> list[bytes]:
        raise _stdin_refusal()

    def readinto(self, *_args: Any, **_kwargs: Any) -> int:
        raise _stdin_refusal()

    readinto1 = readinto

    def __next__(self) -> bytes:
        raise _stdin_refusal()

    def readable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return False

    def fileno(self) -> int:
        raise io.UnsupportedOperation("stdin is not available in execute_code scripts")

    def close(self) -> None:
        pass

    def __del__(self) -> None:
        pass


def _stdin_refusal() -> UnsupportedInputError:
    return UnsupportedInputError(_NO_INPUT.format(what="reading sys.stdin"))


def detach_fd0() -> None:
    """Put ``/dev/null`` on file descriptor 0, so a read there ends at once (end of file).

    Whatever the kernel was started with (a pipe from its launcher) would otherwise let
    ``os.read(0, n)`` or a child process that reads its stdin wait forever.
    """
    try:
        null = os.open(os.devnull, os.O_RDONLY)
    except OSError:
        return
    try:
        if null != 0:
            os.dup2(null, 0)
    finally:
        if null != 0:
            os.close(null)


_real_exit = os._exit

#: How long os._exit() in a script waits after flushing, so queued output leaves the socket.
_EXIT_DRAIN_S = 0.05


def _flushing_exit(code: int) -> None:
    # A script's last words before os._exit() would otherwise often die in the IOPub queue.
    _flush()
    time.sleep(_EXIT_DRAIN_S)
    _real_exit(code)


#: How many scripts are running (0 or 1: the kernel runs one cell at a time).
_running = 0


def in_script() -> bool:
    """Whether a lemon script is running, so exit() and quit() mean "end the script"."""
    return _running > 0


class _InputGuard:
    """Swap in the input refusals (and a flushing os._exit) for the duration of one script."""

    def __enter__(self) -> None:
        global _running
        _running += 1
        self._saved = (builtins.input, getpass.getpass, sys.stdin, os._exit)
        builtins.input = _refuse_input
        getpass.getpass = _refuse_getpass
        sys.stdin = NoStdin()
        os._exit = _flushing_exit  # type: ignore[assignment]

    def __exit__(self, *exc: object) -> None:
        global _running
        _running -= 1
        builtins.input, getpass.getpass, sys.stdin, os._exit = self._saved


def register_source(filename: str, code: str) -> None:
    """Make the script's source visible to tracebacks and inspect without a file on disk."""
    lines = code.splitlines(True)
    # As linecache itself reads a file: every line ends with a newline. Python 3.11 places a
    # traceback's carets by the line's length with it, one column off on a last line without.
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    linecache.cache[filename] = (len(code), None, lines, filename)
    _SCRIPT_FILES.add(filename)


async def run_script(code: str, filename: str, namespace: dict[str, Any]) -> ScriptOutcome:
    """Compile and run ``code`` in ``namespace``; print a filtered traceback on failure."""
    register_source(filename, code)
    flags = ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
    try:
        compiled = compile(code, filename, "exec", flags=flags, dont_inherit=True)
    except SyntaxError as exc:
        return _report_exception(exc)
    except ValueError as exc:  # NUL bytes, before Python 3.11.4 (a SyntaxError since)
        return _report_exception(_null_byte_error(code, filename) or exc)
    with _InputGuard():
        try:
            if compiled.co_flags & inspect.CO_COROUTINE:
                await eval(compiled, namespace)
            else:
                _run_sync(compiled, namespace)
        except SystemExit as exc:
            return _exit_outcome(exc)
        except KeyboardInterrupt:
            # The host interrupts a script only to stop it (timeout, abort); the contract is
            # state loss, so a KeyboardInterrupt traceback would be noise in the output.
            return ScriptOutcome("interrupted", exit_code=1, ename="KeyboardInterrupt")
        except BaseException as exc:  # the script's failure is an outcome, not our crash
            return _report_exception(exc)
        finally:
            _flush()
    return ScriptOutcome("ok")


def _null_byte_error(code: str, filename: str) -> SyntaxError | None:
    """The SyntaxError newer Pythons raise for a NUL in the source, so every one says so."""
    at = code.find("\0")
    if at < 0:
        return None
    line_start = code.rfind("\n", 0, at) + 1
    line_end = code.find("\n", at)
    text = code[line_start : None if line_end < 0 else line_end]
    lineno = code.count("\n", 0, at) + 1
    return SyntaxError(
        "source code cannot contain null bytes", (filename, lineno, at - line_start + 1, text)
    )


def _run_sync(compiled: Any, namespace: dict[str, Any]) -> None:
    # The kernel's event loop is running on this thread, which would make asyncio.run()
    # in the script fail ("cannot be called from a running event loop"). The loop is
    # blocked anyway while the script runs, so hide it for the duration.
    running = asyncio._get_running_loop()
    asyncio._set_running_loop(None)
    try:
        exec(compiled, namespace)
    finally:
        asyncio._set_running_loop(running)
        if running is not None:
            asyncio.set_event_loop(running)


def _exit_outcome(exc: SystemExit) -> ScriptOutcome:
    # ename/evalue say it was a SystemExit, also for code 0 (kind "ok", as python3 exits 0):
    # in session mode the host reports every SystemExit as a cell error (host/run/results.py).
    code = exc.code
    if code is None or code == 0:
        return ScriptOutcome("ok", ename="SystemExit", evalue="" if code is None else "0")
    if isinstance(code, int) and not isinstance(code, bool):
        return ScriptOutcome("exit", exit_code=code, ename="SystemExit", evalue=str(code))
    # sys.exit("message") prints the message and exits 1, as python3 does.
    print(code, file=sys.stderr)
    return ScriptOutcome("exit", exit_code=1, ename="SystemExit", evalue=_safe_str(code))


def _report_exception(exc: BaseException) -> ScriptOutcome:
    te = traceback.TracebackException.from_exception(exc)
    _filter_frames(te, set())
    sys.stderr.write("".join(te.format()))
    return ScriptOutcome("exception", exit_code=1, ename=type(exc).__name__, evalue=_safe_str(exc))


def _filter_frames(te: traceback.TracebackException, seen: set[int]) -> None:
    """Keep only the script's own frames, here and in chained exceptions."""
    if id(te) in seen:
        return
    seen.add(id(te))
    te.stack = traceback.StackSummary.from_list(
        [frame for frame in te.stack if frame.filename in _SCRIPT_FILES]
    )
    for chained in (te.__cause__, te.__context__):
        if chained is not None:
            _filter_frames(chained, seen)
    for group_member in getattr(te, "exceptions", None) or ():
        _filter_frames(group_member, seen)


def _safe_str(exc: object) -> str:
    try:
        return str(exc)
    except Exception:  # a broken __str__ must not break the report
        return f"<unprintable {type(exc).__name__}>"


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:
            with contextlib.suppress(Exception):
                stream.flush()
