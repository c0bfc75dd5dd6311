"""The typed contract between the public surface and the runs (per-call and session).

:class:`CallArgs` is what a caller passed to ``run`` (unvalidated, exactly as given);
:func:`prepare` checks it against the configuration and either refuses it (a result that
says what is wrong; nothing ran) or turns it into a :class:`Call`, the one value the runs
accept. The runner calls :func:`prepare` for the facade and every session owner alike.
"""

from __future__ import annotations

import math
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lemon_exec.config import MIN_TIMEOUT_MS, ExecuteCodeConfig
from lemon_exec.errors import ConfigError
from lemon_exec.host.run.results import refusal
from lemon_exec.interpreter import fallback_note
from lemon_exec.result import ExecuteCodeResult
from lemon_exec.scope import AbortSignal, ScriptSource, SessionScope
from lemon_exec.wire.text_budget import normalize_text

DISABLED = (
    "execute_code is disabled. Enable it with `enabled = true` under "
    "[runtime.tools.execute_code] or LEMON_EXECUTE_CODE_ENABLED=1."
)
MISSING_SCRIPT = "execute_code: `script` is required and must be a non-empty string."
BAD_RESET = "execute_code: `reset` must be a boolean (true or false)."
BAD_TIMEOUT = "execute_code: `timeout_ms` must be an integer number of milliseconds."
NAN_TIMEOUT = "execute_code: `timeout_ms` is NaN; pass a number of milliseconds (or omit it)."
ALREADY_ABORTED = "execute_code: the call was aborted before it started; nothing ran."
BAD_CWD = "execute_code: the working directory {path} {problem}; nothing ran. {fix}"
_CWD_FIX = "Pass an existing directory as the scope's cwd."
_BOM = "\ufeff"

Listener = Callable[[str], None]


@dataclass(frozen=True)
class CallArgs:
    """The arguments of one ``run`` call, as the caller gave them (nothing checked yet)."""

    script: Any
    timeout_ms: Any = None
    reset: Any = False
    scope: SessionScope | None = None
    on_update: Listener | None = None
    abort: AbortSignal | None = None
    on_output: Listener | None = None
    source: ScriptSource = field(default_factory=ScriptSource)
    #: A job (``start``): its deadline is ``max_job_ms`` instead of ``timeout_ms``; the job
    #: learns its start and its text() blocks through these hooks.
    job: bool = False
    on_text: Listener | None = None
    on_start: Callable[[], None] | None = None


@dataclass(frozen=True)
class Call:
    """One validated execute_code call, as the per-call and session runs take it."""

    script: str
    interpreter: str
    cwd: Path
    deadline: float  # time.monotonic() by which the whole call must end
    timeout_ms: int  # as reported in a timeout headline
    abort: AbortSignal | None
    on_update: Listener | None
    details: dict[str, Any]
    on_output: Listener | None = None  # the script's output, live
    filename: str = "script.py"  # what tracebacks call the script
    argv: tuple[str, ...] | None = None  # sys.argv in the script; None leaves it alone
    scope: SessionScope | None = None
    reset: bool = False
    on_text: Listener | None = None  # each accepted text() block, live
    on_start: Callable[[], None] | None = None  # the script is being sent to its kernel


def base_details(mode: str) -> dict[str, Any]:
    """The details every result starts from."""
    return {"mode": mode, "persistent": False, "reset_performed": False, "state_retained": False}


def prepare(config: ExecuteCodeConfig, args: CallArgs, entered: float) -> Call | ExecuteCodeResult:
    """``args`` checked and made a :class:`Call`, or the refusal saying what is wrong.

    Checked before anything starts: nothing here needs a kernel or the staging root.
    """
    details = base_details(config.mode)
    if not config.enabled:
        return refusal(DISABLED, details)
    script = args.script
    if isinstance(script, str):
        # Editors and some encoders prepend a UTF-8 byte order mark; it is not code.
        script = script.removeprefix(_BOM)
    if not isinstance(script, str) or not script.strip():
        return refusal(MISSING_SCRIPT, details)
    if not isinstance(args.reset, bool):
        return refusal(BAD_RESET, details)
    # A lone surrogate (e.g. a bad "\ud800" escape in the model's JSON) cannot be sent or
    # compiled; as in every other text crossing the bridge, it becomes U+FFFD.
    script = normalize_text(script)
    timeout_ms = args.timeout_ms
    if timeout_ms is not None and (
        isinstance(timeout_ms, bool) or not isinstance(timeout_ms, int | float)
    ):
        return refusal(BAD_TIMEOUT, details)
    if isinstance(timeout_ms, float) and math.isnan(timeout_ms):
        return refusal(NAN_TIMEOUT, details)
    if args.abort is not None and args.abort.is_set():
        return refusal(ALREADY_ABORTED, details)
    ceiling = config.job_timeout_ms if args.job else config.run_timeout_ms
    effective_ms = clamp_timeout(timeout_ms, ceiling)
    cwd = working_dir(args.scope)
    if isinstance(cwd, str):
        return refusal(cwd, details)
    try:
        interpreter = config.resolve_python(cwd)
    except ConfigError as exc:
        return refusal(str(exc), details)
    details["python"] = interpreter
    if (note := fallback_note(interpreter)) is not None:
        details["python_fallback"] = note
    return Call(
        script=script,
        interpreter=interpreter,
        cwd=cwd,
        deadline=entered + effective_ms / 1000,
        timeout_ms=effective_ms,
        abort=args.abort,
        on_update=args.on_update,
        details=details,
        on_output=args.on_output,
        filename=args.source.filename,
        argv=args.source.argv_tuple(),
        scope=args.scope,
        reset=args.reset,
        on_text=args.on_text,
        on_start=args.on_start,
    )


def clamp_timeout(requested: Any, ceiling: int) -> int:
    """A call's ``timeout_ms`` clamped to ``[MIN_TIMEOUT_MS, ceiling]`` (±inf included)."""
    if requested is None or requested >= ceiling:  # +inf lands here
        return ceiling
    if requested <= MIN_TIMEOUT_MS:  # -inf lands here
        return MIN_TIMEOUT_MS
    return int(requested)


def working_dir(scope: SessionScope | None) -> Path | str:
    """The absolute directory the script runs in, or the refusal text saying what is wrong.

    Checked before anything starts, so a missing or unusable cwd is refused at once.
    """
    try:
        raw = scope.cwd if scope is not None and scope.cwd is not None else os.getcwd()
    except FileNotFoundError:
        return BAD_CWD.format(path="of the host process", problem="no longer exists", fix=_CWD_FIX)
    try:
        path = Path(os.path.abspath(os.fspath(raw)))
        st = os.stat(path)
    except (TypeError, ValueError):  # not a path at all, or a NUL byte in it
        return BAD_CWD.format(path=repr(raw), problem="is not a usable path", fix=_CWD_FIX)
    except FileNotFoundError:
        return BAD_CWD.format(path=path, problem="does not exist", fix=_CWD_FIX)
    except OSError as exc:
        problem = f"cannot be used ({exc.strerror or exc})"
        return BAD_CWD.format(path=path, problem=problem, fix=_CWD_FIX)
    if not stat.S_ISDIR(st.st_mode):
        return BAD_CWD.format(path=path, problem="is not a directory", fix=_CWD_FIX)
    if not os.access(path, os.X_OK):
        return BAD_CWD.format(path=path, problem="cannot be entered (no permission)", fix=_CWD_FIX)
    return path
