"""Run a notebook as an execute_code scenario (and the public face of ``lemon_exec.notebooks``).

Each non-empty code cell is one ``ExecuteCode.run`` call. By default all calls share one
session (one :class:`~lemon_exec.SessionScope` per notebook run), so state carries from cell
to cell exactly as it does for an agent. What the notebook's and the cells' ``lemon`` metadata
may ask for is in :mod:`lemon_exec.notebooks.options`; how results become cell outputs and are
compared with stored ones, in :mod:`lemon_exec.notebooks.outputs`. Both are re-exported here,
the module callers use (``from lemon_exec.notebooks import runner``; see ``docs/notebooks.md``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import nbformat
from nbformat import NotebookNode

from lemon_exec.facade import ExecuteCode
from lemon_exec.notebooks.normalize import SCENARIO_DIR_PREFIX, Normalizer
from lemon_exec.notebooks.options import (
    METADATA_KEY,
    MODES,
    CellOptions,
    ScenarioError,
    ScenarioOptions,
    check_expectations,
    placeholders,
)
from lemon_exec.notebooks.outputs import (
    CallRecord,
    ScenarioResult,
    compare_outputs,
    render_markdown,
    status_line,
    stored_record,
    write_outputs,
)
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
    "load_notebook",
    "render_markdown",
    "run_scenario",
    "run_scenario_sync",
    "save_notebook",
    "status_line",
    "stored_record",
    "write_outputs",
]


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


def _code_cells(nb: NotebookNode) -> list[tuple[int, NotebookNode]]:
    return [
        (i, c)
        for i, c in enumerate(nb.cells)
        if c.get("cell_type") == "code" and str(c.get("source", "")).strip()
    ]


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
    configs = {mode: options.build_config(mode) for mode in MODES}
    own_tmp = options.cwd == "tmp"
    if own_tmp:
        cwd = Path(tempfile.mkdtemp(prefix=SCENARIO_DIR_PREFIX)).resolve()
    else:
        cwd = Path(path).resolve().parent if path is not None else Path.cwd().resolve()
    normalizer = Normalizer(placeholders(options, path, cwd), options.normalize)
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
                images=list(result.images),
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


def run_scenario_sync(nb: NotebookNode, **kwargs: Any) -> ScenarioResult:
    """Blocking :func:`run_scenario` (runs its own event loop)."""
    return asyncio.run(run_scenario(nb, **kwargs))
