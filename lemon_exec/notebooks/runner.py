"""Run a notebook as an execute_code scenario and write the results into its outputs.

Each non-empty code cell is one ``ExecuteCode.run`` call. By default all calls share one
session (one :class:`~lemon_exec.SessionScope` per notebook run), so state carries from cell
to cell exactly as it does for an agent. Cell metadata under ``lemon`` tunes a call::

    {"lemon": {"timeout_ms": 2000, "reset": true, "mode": "per_call",
               "session": "subagent", "expect": {"exit_code": 1}}}

and notebook metadata under ``lemon`` tunes the scenario::

    {"lemon": {"config": {"max_rpc_calls": 3}, "cwd": "tmp",
               "normalize": [["seed=\\\\d+", "seed=<n>"]]}}

``expect`` is a details flag (``"timed_out"``), a dict of details values
(``{"exit_code": 1, "state_retained": true}``) or a list of those; without it a call is
expected to succeed (``exit_code`` 0). See ``docs/notebooks.md``.
"""

from __future__ import annotations

import asyncio
import contextlib
import difflib
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nbformat
from nbformat import NotebookNode
from nbformat.v4 import new_output

from lemon_exec.config import SETTING_KEYS, ExecuteCodeConfig
from lemon_exec.details import Outcome, outcome_of
from lemon_exec.facade import ExecuteCode
from lemon_exec.notebooks.normalize import SCENARIO_DIR_PREFIX, Normalizer, Record
from lemon_exec.scope import SessionScope
from lemon_exec.tools import ToolRegistry

__all__ = [
    "METADATA_KEY",
    "CallRecord",
    "CellOptions",
    "ScenarioError",
    "ScenarioOptions",
    "ScenarioResult",
    "compare_outputs",
    "is_scenario",
    "load_notebook",
    "render_markdown",
    "run_scenario",
    "run_scenario_sync",
    "save_notebook",
    "status_line",
    "stored_record",
    "write_outputs",
]

#: Key of the cell and notebook metadata entries this runner reads.
METADATA_KEY = "lemon"

#: The kernelspec scenario notebooks declare, so JupyterLab opens them with lemon-python.
KERNELSPEC = {"name": "lemon-python", "display_name": "Python 3 (lemon_exec)", "language": "python"}

#: ``metadata.lemon.output`` values that mark the outputs this runner writes.
RESULT_OUTPUT = "result"
RECORD_OUTPUT = "record"

#: The status line's word for an outcome that is not an exit code.
_OUTCOME_WORDS: dict[Outcome, str] = {"timeout": "timed out", "protocol_fault": "protocol fault"}
_MODES = ("session", "per_call")
_CELL_KEYS = frozenset({"timeout_ms", "reset", "mode", "expect", "session"})
_NOTEBOOK_KEYS = frozenset({"config", "cwd", "normalize"})


class ScenarioError(ValueError):
    """The notebook's ``lemon`` metadata is invalid; nothing was run."""


# --- options -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CellOptions:
    """What one code cell's ``metadata.lemon`` asks for."""

    timeout_ms: int | None = None
    reset: bool = False
    mode: str | None = None  # None: the notebook's default mode
    expect: Any = None  # None: exit_code 0
    session: str = "main"

    @classmethod
    def from_metadata(cls, metadata: Mapping[str, Any], where: str) -> CellOptions:
        raw = metadata.get(METADATA_KEY) or {}
        if not isinstance(raw, Mapping):
            raise ScenarioError(f"{where}: metadata.lemon must be an object")
        unknown = sorted(set(raw) - _CELL_KEYS)
        if unknown:
            raise ScenarioError(
                f"{where}: unknown metadata.lemon key(s): {', '.join(unknown)} "
                f"(known: {', '.join(sorted(_CELL_KEYS))})"
            )
        timeout_ms = raw.get("timeout_ms")
        if timeout_ms is not None and (
            isinstance(timeout_ms, bool) or not isinstance(timeout_ms, int)
        ):
            raise ScenarioError(f"{where}: timeout_ms must be an integer")
        reset = raw.get("reset", False)
        if not isinstance(reset, bool):
            raise ScenarioError(f"{where}: reset must be true or false")
        mode = raw.get("mode")
        if mode is not None and mode not in _MODES:
            raise ScenarioError(f"{where}: mode must be one of {', '.join(_MODES)}")
        session = raw.get("session", "main")
        if not isinstance(session, str) or not session:
            raise ScenarioError(f"{where}: session must be a non-empty string")
        expect = raw.get("expect")
        _validate_expect(expect, where)
        return cls(timeout_ms, reset, mode, expect, session)

    def describe(self) -> str:
        """A short summary for progress lines (empty for the defaults)."""
        parts = []
        if self.mode:
            parts.append(self.mode)
        if self.reset:
            parts.append("reset")
        if self.timeout_ms is not None:
            parts.append(f"timeout {self.timeout_ms} ms")
        if self.session != "main":
            parts.append(f"session {self.session}")
        return ", ".join(parts)


@dataclass(frozen=True)
class ScenarioOptions:
    """What the notebook's ``metadata.lemon`` asks for."""

    config: dict[str, Any] = field(default_factory=dict)
    cwd: str = "tmp"  # "tmp" (a fresh temporary folder) or "notebook" (the notebook's folder)
    normalize: tuple[tuple[str, str], ...] = ()

    @classmethod
    def from_metadata(cls, metadata: Mapping[str, Any]) -> ScenarioOptions:
        raw = metadata.get(METADATA_KEY) or {}
        if not isinstance(raw, Mapping):
            raise ScenarioError("notebook metadata.lemon must be an object")
        unknown = sorted(set(raw) - _NOTEBOOK_KEYS)
        if unknown:
            raise ScenarioError(
                f"unknown notebook metadata.lemon key(s): {', '.join(unknown)} "
                f"(known: {', '.join(sorted(_NOTEBOOK_KEYS))})"
            )
        config = dict(raw.get("config") or {})
        bad = sorted(set(config) - set(SETTING_KEYS))
        if bad:
            raise ScenarioError(f"metadata.lemon.config: unknown setting(s): {', '.join(bad)}")
        cwd = raw.get("cwd", "tmp")
        if cwd not in ("tmp", "notebook"):
            raise ScenarioError('metadata.lemon.cwd must be "tmp" or "notebook"')
        rules = raw.get("normalize") or []
        if not isinstance(rules, list) or not all(
            isinstance(r, list) and len(r) == 2 and all(isinstance(p, str) for p in r)
            for r in rules
        ):
            raise ScenarioError("metadata.lemon.normalize must be a list of [regex, replacement]")
        return cls(config, cwd, tuple((r[0], r[1]) for r in rules))

    def build_config(self, mode: str) -> ExecuteCodeConfig:
        """The facade config for ``mode``: defaults, the notebook's overrides, the mode.

        Unless the notebook says otherwise, kernels run under the interpreter running the
        scenario and no warm spares are kept (a spare would make ``kernel_source`` vary).
        """
        values: dict[str, Any] = {"warm_kernels": 0, "python_path": sys.executable, **self.config}
        values.update(enabled=True, kernel_mode=mode)
        try:
            return ExecuteCodeConfig(**values)
        except Exception as exc:  # a traitlets TraitError names the bad value
            raise ScenarioError(f"metadata.lemon.config: {exc}") from None

    @property
    def default_mode(self) -> str:
        return "per_call" if self.config.get("kernel_mode") == "per_call" else "session"


def _validate_expect(expect: Any, where: str) -> None:
    items = expect if isinstance(expect, list) else [expect]
    for item in items:
        if item is None and expect is None:
            continue
        if isinstance(item, str):
            continue
        if isinstance(item, Mapping) and all(isinstance(k, str) for k in item):
            continue
        raise ScenarioError(
            f"{where}: expect must be a details flag, an object of details "
            "values, or a list of those"
        )


def check_expectations(expect: Any, details: Mapping[str, Any]) -> list[str]:
    """The unmet expectations of one call (empty when it went as expected)."""
    items = (
        [{"exit_code": 0}] if expect is None else (expect if isinstance(expect, list) else [expect])
    )
    failures: list[str] = []
    for item in items:
        if isinstance(item, str):
            if item == "ok":
                item = {"exit_code": 0}
            elif not details.get(item):
                failures.append(f"expected {item}, but details[{item!r}] is {details.get(item)!r}")
                continue
            else:
                continue
        for key, want in item.items():
            got = details.get(key)
            if got != want:
                failures.append(f"expected details[{key!r}] == {want!r}, got {got!r}")
    return failures


# --- results -------------------------------------------------------------------------------------


@dataclass
class CallRecord:
    """One cell's execute_code call and what came back."""

    cell_index: int
    execution_count: int
    source: str
    options: CellOptions
    content: str
    details: dict[str, Any]
    trust: str
    notify: list[str]
    failures: list[str] = field(default_factory=list)

    def record(self) -> Record:
        """The comparable record (not normalised)."""
        return {
            "content": self.content,
            "notify": list(self.notify),
            "trust": self.trust,
            "details": dict(self.details),
        }

    @property
    def summary(self) -> str:
        first = next((line for line in self.source.splitlines() if line.strip()), "")
        return first if len(first) <= 60 else first[:57] + "..."


@dataclass
class ScenarioResult:
    """The calls of one scenario run, and the normalised view of each."""

    path: Path | None
    cwd: Path
    calls: list[CallRecord]
    normalized: list[Record]

    @property
    def ok(self) -> bool:
        """True when every call met its expectations."""
        return not any(call.failures for call in self.calls)

    def failures(self) -> list[str]:
        return [
            f"cell {c.execution_count} ({c.summary!r}): {msg}"
            for c in self.calls
            for msg in c.failures
        ]


# --- notebooks -----------------------------------------------------------------------------------


def load_notebook(path: str | os.PathLike[str]) -> NotebookNode:
    """Read a notebook (upgraded to nbformat 4)."""
    nb: NotebookNode = nbformat.read(os.fspath(path), as_version=4)  # nbformat is unannotated
    return nb


def save_notebook(nb: NotebookNode, path: str | os.PathLike[str]) -> None:
    """Write ``nb`` atomically, in nbformat's usual layout."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        nbformat.write(nb, os.fspath(tmp), version=4)
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def is_scenario(metadata: Mapping[str, Any]) -> bool:
    """Whether notebook metadata marks a lemon scenario (a ``lemon`` entry or kernelspec)."""
    spec = metadata.get("kernelspec") or {}
    return METADATA_KEY in metadata or (
        isinstance(spec, Mapping) and spec.get("name") == KERNELSPEC["name"]
    )


def _code_cells(nb: NotebookNode) -> list[tuple[int, NotebookNode]]:
    return [
        (i, c)
        for i, c in enumerate(nb.cells)
        if c.get("cell_type") == "code" and str(c.get("source", "")).strip()
    ]


# --- running -------------------------------------------------------------------------------------


async def run_scenario(
    nb: NotebookNode,
    *,
    path: str | os.PathLike[str] | None = None,
    progress: Callable[[CallRecord], None] | None = None,
    keep_cwd: bool = False,
    tools: ToolRegistry | None = None,
) -> ScenarioResult:
    """Run every non-empty code cell of ``nb`` as one execute_code call, in order.

    ``path`` is where the notebook lives (for ``cwd: "notebook"`` and messages);
    ``progress`` is called after each call. The scenario's temporary folder is removed
    afterwards unless ``keep_cwd``. ``tools`` is the registry the cells call (as
    ``ExecuteCode(tools=...)``; the five default helpers when None).
    Raises :class:`ScenarioError` for invalid metadata.
    """
    options = ScenarioOptions.from_metadata(nb.metadata)
    name = Path(path).stem if path is not None else "notebook"
    cells = [(i, c, CellOptions.from_metadata(c.metadata, f"cell {i}")) for i, c in _code_cells(nb)]
    configs = {mode: options.build_config(mode) for mode in _MODES}
    own_tmp = options.cwd == "tmp"
    if own_tmp:
        cwd = Path(tempfile.mkdtemp(prefix=SCENARIO_DIR_PREFIX)).resolve()
    else:
        cwd = Path(path).resolve().parent if path is not None else Path.cwd().resolve()
    normalizer = Normalizer(_placeholders(options, path, cwd), options.normalize)
    facades: dict[str, ExecuteCode] = {}
    calls: list[CallRecord] = []
    try:
        for count, (index, cell, cell_options) in enumerate(cells, start=1):
            mode = cell_options.mode or options.default_mode
            facade = facades.get(mode)
            if facade is None:
                facade = facades[mode] = ExecuteCode(configs[mode], tools=tools)
            notes: list[str] = []
            scope = SessionScope(f"scenario:{name}:{cell_options.session}", "notebook", cwd)
            result = await facade.run(
                str(cell.source),
                timeout_ms=cell_options.timeout_ms,
                reset=cell_options.reset,
                scope=scope,
                on_update=notes.append,
            )
            call = CallRecord(
                cell_index=index,
                execution_count=count,
                source=str(cell.source),
                options=cell_options,
                content=result.content,
                details=dict(result.details),
                trust=result.trust,
                notify=notes,
                failures=check_expectations(cell_options.expect, result.details),
            )
            calls.append(call)
            if progress is not None:
                progress(call)
    finally:
        for facade in facades.values():
            with contextlib.suppress(Exception):
                await facade.aclose()
        if own_tmp and not keep_cwd:
            shutil.rmtree(cwd, ignore_errors=True)
    normalized = [normalizer.record(call.record()) for call in calls]
    return ScenarioResult(Path(path) if path is not None else None, cwd, calls, normalized)


def _placeholders(
    options: ScenarioOptions, path: str | os.PathLike[str] | None, cwd: Path | None
) -> dict[str, str]:
    """Concrete paths of a run and their placeholders (the working folder wins)."""
    paths: dict[str, str] = {}
    if path is not None:
        folder = str(Path(path).resolve().parent)
        paths[folder] = "<cwd>" if options.cwd == "notebook" else "<notebook-dir>"
    if cwd is not None:
        paths[str(cwd)] = "<cwd>"
    return paths


def run_scenario_sync(nb: NotebookNode, **kwargs: Any) -> ScenarioResult:
    """Blocking :func:`run_scenario` (runs its own event loop)."""
    return asyncio.run(run_scenario(nb, **kwargs))


# --- outputs -------------------------------------------------------------------------------------


def status_line(details: Mapping[str, Any], trust: str = "trusted", notify: int = 0) -> str:
    """One line of Markdown saying how a call went (outcome, mode, kernel, counts)."""
    parts = [f"**{_outcome(details)}**"]
    mode = details.get("mode")
    reason = details.get("fallback_reason")
    if reason:
        parts.append(f"{mode}, ran per-call (fallback: `{reason}`)")
    elif mode == "session" and details.get("persistent"):
        kernel = details.get("kernel_id")
        label = f"session kernel `{kernel}`" if kernel else "session"
        if "kernel_reused" in details:
            label += " (reused)" if details.get("kernel_reused") else " (new)"
        parts.append(label)
    elif mode:
        parts.append(str(mode))
    if details.get("reset_performed"):
        parts.append("reset")
    if details.get("kernel_lost_reason"):
        parts.append(f"earlier state lost (`{details['kernel_lost_reason']}`)")
    if mode == "session" and details.get("persistent") and not details.get("state_retained"):
        parts.append("**state lost**")
    for key, one, many in (
        ("text_blocks", "text block", "text blocks"),
        ("rpc_calls", "helper call", "helper calls"),
        ("rpc_denied", "denied", "denied"),
        ("rpc_errors", "helper error", "helper errors"),
    ):
        n = details.get(key) or 0
        if n:
            parts.append(f"{n} {one if n == 1 else many}")
    if notify:
        parts.append(f"{notify} notify")
    if details.get("truncated"):
        parts.append("output truncated")
    if trust != "trusted":
        parts.append(f"**{trust}**")
    return " · ".join(parts)


def _outcome(details: Mapping[str, Any]) -> str:
    outcome = outcome_of(details)
    if outcome == "failed":
        return f"exit {details.get('exit_code')}"
    return _OUTCOME_WORDS.get(outcome, outcome)


def render_markdown(record: Mapping[str, Any]) -> str:
    """The Markdown view of a call: a status line, then the content as the model reads it."""
    details = record.get("details") or {}
    content = str(record.get("content", ""))
    fence = "`" * max(3, _longest_backtick_run(content) + 1)
    status = status_line(
        details, str(record.get("trust", "trusted")), len(record.get("notify") or [])
    )
    return f"{status}\n\n{fence}text\n{content.rstrip(chr(10))}\n{fence}\n"


def _longest_backtick_run(text: str) -> int:
    longest = run = 0
    for ch in text:
        run = run + 1 if ch == "`" else 0
        longest = max(longest, run)
    return longest


def outputs_for(
    record: Mapping[str, Any], execution_count: int, failures: list[str] | None = None
) -> list[NotebookNode]:
    """The cell outputs of one call: notify stream, result, record (and failures)."""
    outputs: list[NotebookNode] = []
    notify = list(record.get("notify") or [])
    if notify:
        outputs.append(
            # Each message is already the spec's partial update, "notify: <msg>".
            new_output("stream", name="stdout", text="".join(f"{m}\n" for m in notify))
        )
    outputs.append(
        new_output(
            "execute_result",
            data={
                "text/plain": str(record.get("content", "")),
                "text/markdown": render_markdown(record),
            },
            metadata={METADATA_KEY: {"output": RESULT_OUTPUT}},
            execution_count=execution_count,
        )
    )
    stored = {
        "trust": record.get("trust", "trusted"),
        "notify": notify,
        "details": record.get("details") or {},
    }
    outputs.append(
        new_output(
            "display_data",
            data={
                "application/json": stored,
                "text/plain": json.dumps(stored, indent=1, sort_keys=True),
            },
            metadata={
                METADATA_KEY: {"output": RECORD_OUTPUT},
                "application/json": {"expanded": False},
            },
        )
    )
    if failures:
        outputs.append(
            new_output(
                "stream",
                name="stderr",
                text="".join(f"lemon: expectation not met: {msg}\n" for msg in failures),
            )
        )
    return outputs


def write_outputs(nb: NotebookNode, result: ScenarioResult, *, normalized: bool) -> None:
    """Replace the outputs of the cells that ran (raw or normalised results)."""
    ran = {call.cell_index for call in result.calls}
    for index, cell in enumerate(nb.cells):
        if cell.get("cell_type") == "code" and index not in ran:
            cell.outputs, cell.execution_count = [], None
    for call, norm in zip(result.calls, result.normalized, strict=True):
        cell = nb.cells[call.cell_index]
        record = norm if normalized else call.record()
        cell.outputs = outputs_for(record, call.execution_count, call.failures)
        cell.execution_count = call.execution_count
    spec = nb.metadata.get("kernelspec")
    if not spec:
        nb.metadata["kernelspec"] = dict(KERNELSPEC)


def stored_record(cell: NotebookNode) -> Record | None:
    """The record a cell's outputs hold (as :func:`write_outputs` wrote it), or None."""
    content: str | None = None
    stored: Mapping[str, Any] | None = None
    for output in cell.get("outputs") or []:
        marker = (output.get("metadata") or {}).get(METADATA_KEY) or {}
        data = output.get("data") or {}
        if marker.get("output") == RESULT_OUTPUT:
            plain = data.get("text/plain", "")
            content = "".join(plain) if isinstance(plain, list) else str(plain)
        elif marker.get("output") == RECORD_OUTPUT:
            value = data.get("application/json")
            if isinstance(value, str):  # some writers store JSON as a string
                with contextlib.suppress(ValueError):
                    value = json.loads(value)
            if isinstance(value, Mapping):
                stored = value
    if content is None or stored is None:
        return None
    return {
        "content": content,
        "notify": list(stored.get("notify") or []),
        "trust": stored.get("trust", "trusted"),
        "details": dict(stored.get("details") or {}),
    }


def compare_outputs(nb: NotebookNode, result: ScenarioResult) -> list[str]:
    """Differences between the outputs stored in ``nb`` and a fresh run (empty: a match)."""
    options = ScenarioOptions.from_metadata(nb.metadata)
    # The stored side's temporary folder is unknown: the generic rules catch it.
    expected_normalizer = Normalizer(_placeholders(options, result.path, None), options.normalize)
    problems: list[str] = []
    ran = {call.cell_index for call in result.calls}
    for index, cell in enumerate(nb.cells):
        if cell.get("cell_type") == "code" and index not in ran and cell.get("outputs"):
            problems.append(f"cell {index} has stored outputs but did not run (empty source?)")
    for call, actual in zip(result.calls, result.normalized, strict=True):
        stored = stored_record(nb.cells[call.cell_index])
        where = f"cell {call.execution_count} ({call.summary!r})"
        if stored is None:
            problems.append(
                f"{where}: no stored result to compare with (regenerate with --lemon-regen)"
            )
            continue
        expected = expected_normalizer.record(stored)
        if expected != actual:
            diff = difflib.unified_diff(
                _pretty(expected).splitlines(),
                _pretty(actual).splitlines(),
                "stored",
                "this run",
                lineterm="",
                n=2,
            )
            problems.append(f"{where}: result differs from the stored one\n" + "\n".join(diff))
    return problems


def _pretty(record: Record) -> str:
    """A diff-friendly rendering: content lines verbatim, then the rest as JSON."""
    rest = {k: v for k, v in record.items() if k != "content"}
    return (
        "content:\n"
        + "".join(f"  | {line}\n" for line in record["content"].splitlines())
        + json.dumps(rest, indent=1, sort_keys=True)
    )
