"""The functions pre-imported into every script: helpers, text(), notify(), batch(), tools.

Each helper's keyword names are its tool's parameter names, so ``read(path=p)`` and
``batch([("read", {"path": p})])`` make the same call. Tools the host registered beyond the
five become helpers too (``namespace.py``): top-level names as functions, ``server.tool``
names under ``tools.<server>``; batch() takes every one by its registered name. Without a
lemon_exec host (the kernel started by a plain Jupyter front end) text() and notify() print,
and helpers raise ToolError.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterable, Mapping
from functools import partial
from typing import Any

from lemon_exec.kernel import cells, images
from lemon_exec.kernel import namespace as tools_namespace
from lemon_exec.kernel.bridge import CellBridge, ToolError
from lemon_exec.wire.protocol import HELPER_NAMES, NO_HOST, STALE_THREAD
from lemon_exec.wire.text_budget import normalize_text

#: batch() never has more calls than this in flight; the host runs max_parallel_rpc at once.
BATCH_MAX_IN_FLIGHT = 16


def _bridge() -> CellBridge | None:
    bridge = cells.STATE.bridge
    if bridge is not None and cells.thread_generation() != bridge.generation:
        raise ToolError(STALE_THREAD)
    return bridge


def _call(tool: str, **params: Any) -> str:
    bridge = _bridge()
    if bridge is None:
        raise ToolError(NO_HOST)
    # None means "the tool's default", so it is left out: read(path=p) == read(p, None, None).
    return _send(bridge, tool, {k: v for k, v in params.items() if v is not None})


class _Captured(BaseException):
    """The call a helper was about to send (batch() runs helpers to learn their calls).

    A BaseException, so that no ``except Exception`` in a helper can swallow it.
    """

    def __init__(self, tool: str, params: dict[str, Any]) -> None:
        super().__init__(tool)
        self.tool = tool
        self.params = params


#: Per thread: what a helper's bridge call does instead of sending (set inside batch()).
_intercept = threading.local()


def _send(bridge: CellBridge, tool: str, params: dict[str, Any]) -> str:
    """Every helper's one bridge call: sent, or handled by batch()'s interception."""
    hook: Callable[[str, dict[str, Any]], str] | None = getattr(_intercept, "hook", None)
    if hook is not None:
        return hook(tool, params)
    return bridge.call(tool, params)


def read(path: str, offset: int | None = None, limit: int | None = None) -> str:
    """Return the text of a file; ``offset`` is a 1-based start line, ``limit`` a line count."""
    return _call("read", path=path, offset=offset, limit=limit)


def grep(
    pattern: str,
    path: str = ".",
    glob: str | None = None,
    ignore_case: bool = False,
    max_results: int | None = None,
) -> str:
    """Search files under ``path`` for a regex; lines come back as ``path:line:text``."""
    return _call(
        "grep",
        pattern=pattern,
        path=path,
        glob=glob,
        ignore_case=ignore_case or None,
        max_results=max_results,
    )


def find(pattern: str, path: str = ".") -> str:
    """Find files matching a recursive glob (``**/*.py``) under ``path``, one per line."""
    return _call("find", pattern=pattern, path=path)


def ls(path: str = ".") -> str:
    """List a directory, one entry per line, directories ending in ``/``."""
    return _call("ls", path=path)


def webfetch(url: str, extract_mode: str = "markdown", max_chars: int | None = None) -> str:
    """Fetch a URL and return its readable text (``extract_mode`` 'markdown' or 'text')."""
    return _call("webfetch", url=url, extract_mode=extract_mode, max_chars=max_chars)


HELPERS: dict[str, Callable[..., str]] = {
    "read": read,
    "grep": grep,
    "find": find,
    "ls": ls,
    "webfetch": webfetch,
}

#: The helpers enabled for the current cell, by registered name (set by install()).
_enabled: dict[str, Callable[..., str]] = dict(HELPERS)


class ToolSetupError(Exception):
    """The cell setup names registered tools whose specs this kernel never received."""


def _call_registered(tool: str, params: dict[str, Any]) -> str:
    bridge = _bridge()
    if bridge is None:
        raise ToolError(NO_HOST)
    return _send(bridge, tool, params)


#: The registered tools beyond the five, built once per digest: (digest, name -> function,
#: notes on upstream tools the host could not offer).
_extras: tuple[str | None, dict[str, Callable[..., str]], list[str]] = (None, {}, [])
#: The ``tools`` object of the last install(), keyed by what it was built from.
_tools_cache: tuple[tuple[Any, ...], Any] | None = None
#: Top-level names install() put into the namespace for registered tools (removed when gone).
_installed: dict[str, Callable[..., str]] = {}


def text(value: object) -> None:
    """Add a block to the script's result. Only text() blocks reach the model as the result."""
    bridge = _bridge()
    if bridge is None:
        print(normalize_text(value))
        return
    bridge.text(value)


def notify(message: object) -> None:
    """Stream a progress message to the caller while the script runs (max 64, 4 KiB each)."""
    bridge = _bridge()
    if bridge is None:
        print(f"notify: {normalize_text(message)}", file=sys.stderr)
        return
    bridge.notify(message)


def image(obj: object, *, format: str | None = None, alt: str | None = None) -> None:
    """Show an image to the model: a matplotlib figure (or plt), a PIL image, a path, or bytes.

    ``format`` (png, jpeg, gif, webp, svg or a MIME type) is what to save a figure or PIL
    image as, or what raw bytes are; ``alt`` describes the image. Acknowledged like text().
    """
    data, mime = images.to_image(obj, format)
    bridge = _bridge()
    if bridge is None:
        images.display_inline(data, mime, images.alt_text(alt))
        return
    bridge.image(data, mime, images.alt_text(alt))


def batch(calls: Iterable[tuple[str, dict[str, Any]]]) -> list[str]:
    """Run helper calls in parallel; results in input order, first failure re-raised.

    An item that is not a valid call (not a pair, an unknown helper, params not a dict) is
    that item's failure: the valid items still run, and the error raised is the first
    failure in input order, whichever kind it is.
    """
    jobs = list(calls)
    outcomes: list[tuple[bool, Any]] = [(False, None)] * len(jobs)
    # Each helper is run once to learn the call it makes (its frame is never sent), the
    # calls go out pipelined from this thread, and each helper is run again with its answer
    # to shape its result (a structured tool's JSON becomes objects) as a direct call would.
    captured: list[tuple[int, Callable[[], Any], _Captured]] = []
    for index, job in enumerate(jobs):
        try:
            run = _batch_target(index, job)
            outcomes[index] = (True, _with_hook(_capture, run))  # made no call: its result
        except _Captured as call:
            captured.append((index, run, call))
        except Exception as exc:  # the item's own failure (a wrong keyword, no host, ...)
            outcomes[index] = (False, exc)
    if captured:
        bridge = _bridge()
        assert bridge is not None  # else every helper raised NO_HOST instead of a call
        answers = bridge.call_many(
            [(call.tool, call.params) for _i, _r, call in captured], BATCH_MAX_IN_FLIGHT
        )
        for (index, run, _call), answer in zip(captured, answers, strict=True):
            try:
                outcomes[index] = (True, _with_hook(partial(_answer, answer), run))
            except Exception as exc:
                outcomes[index] = (False, exc)
    for ok, value in outcomes:
        if not ok:
            raise value
    return [value for _, value in outcomes]


def _capture(tool: str, params: dict[str, Any]) -> str:
    raise _Captured(tool, params)


def _answer(answer: str | ToolError, _tool: str, _params: dict[str, Any]) -> str:
    if isinstance(answer, ToolError):
        raise answer
    return answer


def _with_hook(hook: Callable[[str, dict[str, Any]], str], run: Callable[[], Any]) -> Any:
    _intercept.hook = hook
    try:
        return run()
    finally:
        _intercept.hook = None


def _batch_target(index: int, job: object) -> Callable[[], Any]:
    """The call item ``index`` makes; raises ToolError (that item's failure) when invalid."""
    if not (isinstance(job, tuple | list) and len(job) == 2):
        raise ToolError(f"batch() item {index} must be a (tool_name, params_dict) pair")
    name, params = job
    helper = _enabled.get(name) if isinstance(name, str) else None
    if helper is None:
        raise ToolError(f"batch() item {index}: unknown or disabled helper {name!r}")
    if not isinstance(params, dict):
        raise ToolError(f"batch() item {index}: params must be a dict, got {type(params).__name__}")

    def run() -> Any:
        try:
            return helper(**params)
        except TypeError as exc:  # a wrong keyword is the model's mistake: say so as a ToolError
            raise ToolError(f"batch() item {index}: {exc}") from None

    return run


def prebuild() -> None:
    """Build the ``tools`` object of the five helpers now (the fork-server template).

    install() keeps the last one it built; a kernel forked from the template finds this one
    there instead of building its own (``inspect.signature`` of each helper, and the template
    pages that touches: ~0.1 MiB per kernel).
    """
    global _tools_cache
    enabled = {name: HELPERS[name] for name in HELPER_NAMES}
    _tools_cache = ((HELPER_NAMES, None), tools_namespace.build_namespace(enabled))


def install(
    namespace: dict[str, Any],
    enabled: Iterable[str] | None = None,
    tools_digest: str | None = None,
    tool_specs: Iterable[Mapping[str, Any]] | None = None,
) -> None:
    """Put ToolError, text, notify, batch, ``tools`` and the enabled helpers into ``namespace``.

    ``tools_digest`` and ``tool_specs`` describe the registered tools beyond the five (the
    cell setup's ``tools_digest`` / ``tools``); specs come only with a digest this kernel has
    not seen. Raises :class:`ToolSetupError` for an unknown digest without specs.
    """
    global _extras, _tools_cache
    names = HELPER_NAMES if enabled is None else tuple(n for n in HELPER_NAMES if n in enabled)
    notes: list[str] = []
    if tool_specs is not None:
        tool_specs = list(tool_specs)
    if tools_digest is None:
        extras: dict[str, Callable[..., str]] = {}
    elif tool_specs is not None:
        extras = tools_namespace.build_functions(tool_specs, _call_registered)
        notes = tools_namespace.spec_notes(tool_specs)
        _extras = (tools_digest, extras, notes)
    elif _extras[0] == tools_digest:
        extras, notes = _extras[1], _extras[2]
    else:
        raise ToolSetupError(
            f"the cell setup names registered tools (digest {tools_digest}) this kernel never "
            "received"
        )
    _enabled.clear()
    _enabled.update({n: HELPERS[n] for n in names})
    _enabled.update(extras)
    key = (names, tools_digest)
    if _tools_cache is None or _tools_cache[0] != key:
        _tools_cache = (key, tools_namespace.build_namespace(_enabled, notes))
    namespace.update(
        {
            "ToolError": ToolError,
            "text": text,
            "notify": notify,
            "image": image,
            "batch": batch,
            "tools": _tools_cache[1],
        }
    )
    for name in HELPER_NAMES:
        if name in _enabled:
            namespace[name] = HELPERS[name]
        elif namespace.get(name) is HELPERS[name]:
            del namespace[name]  # disabled helpers are absent, but never delete user objects
    for name, func in list(_installed.items()):
        if extras.get(name) is not func and namespace.get(name) is func:
            del namespace[name]  # a registered tool gone since the last cell
    _installed.clear()
    for name, func in extras.items():
        if "." not in name:
            namespace[name] = _installed[name] = func
