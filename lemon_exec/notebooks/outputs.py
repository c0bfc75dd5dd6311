"""A scenario run's results, and their place in the notebook: written as cell outputs, read back,
compared.

Each call's cell gets a stream of its notify messages, an ``execute_result`` (the content as
the model reads it, with a Markdown status line), one ``display_data`` per image the script
showed (:mod:`lemon_exec.notebooks.images`) and a ``display_data`` record (details, trust,
notify), marked in ``metadata.lemon.output`` so that they can be found again. A later
run compares its normalised results with the stored ones.
"""

from __future__ import annotations

import contextlib
import difflib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nbformat import NotebookNode
from nbformat.v4 import new_output

from lemon_exec.details import Outcome, outcome_of
from lemon_exec.images import ImageBlock
from lemon_exec.notebooks.images import image_metadata, image_outputs, stored_images
from lemon_exec.notebooks.normalize import Normalizer, Record
from lemon_exec.notebooks.options import (
    METADATA_KEY,
    CellOptions,
    ScenarioOptions,
    placeholders,
)

__all__ = [
    "KERNELSPEC",
    "CallRecord",
    "ScenarioResult",
    "compare_outputs",
    "outputs_for",
    "render_markdown",
    "status_line",
    "stored_record",
    "write_outputs",
]

#: The kernelspec scenario notebooks declare, so JupyterLab opens them with lemon-python.
KERNELSPEC = {"name": "lemon-python", "display_name": "Python 3 (lemon_exec)", "language": "python"}

#: ``metadata.lemon.output`` values that mark the outputs a run writes.
RESULT_OUTPUT = "result"
RECORD_OUTPUT = "record"

#: The status line's word for an outcome that is not an exit code.
_OUTCOME_WORDS: dict[Outcome, str] = {"timeout": "timed out", "protocol_fault": "protocol fault"}


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
    #: The images the call's script showed (``ExecuteCodeResult.images``), in order.
    images: list[ImageBlock] = field(default_factory=list)

    def record(self) -> Record:
        """The comparable record (not normalised); ``images`` only when there are any."""
        record: Record = {
            "content": self.content,
            "notify": list(self.notify),
            "trust": self.trust,
            "details": dict(self.details),
        }
        if self.images:
            record["images"] = [image_metadata(image) for image in self.images]
        return record

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


def status_line(
    details: Mapping[str, Any], trust: str = "trusted", notify: int = 0, images: int = 0
) -> str:
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
    if images:
        parts.append(f"{images} image{'' if images == 1 else 's'}")
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
        details,
        str(record.get("trust", "trusted")),
        len(record.get("notify") or []),
        len(record.get("images") or []),
    )
    return f"{status}\n\n{fence}text\n{content.rstrip(chr(10))}\n{fence}\n"


def _longest_backtick_run(text: str) -> int:
    longest = run = 0
    for ch in text:
        run = run + 1 if ch == "`" else 0
        longest = max(longest, run)
    return longest


def outputs_for(
    record: Mapping[str, Any],
    execution_count: int,
    failures: list[str] | None = None,
    images: list[ImageBlock] | None = None,
) -> list[NotebookNode]:
    """The cell outputs of one call: notify stream, result, images, record (and failures).

    ``images`` are the pictures of the images ``record["images"]`` describes.
    """
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
    if images:
        outputs.extend(image_outputs(images, record.get("images") or []))
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
        cell.outputs = outputs_for(record, call.execution_count, call.failures, call.images)
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
    record: Record = {
        "content": content,
        "notify": list(stored.get("notify") or []),
        "trust": stored.get("trust", "trusted"),
        "details": dict(stored.get("details") or {}),
    }
    images = stored_images(cell)
    if images:
        record["images"] = images
    return record


def compare_outputs(nb: NotebookNode, result: ScenarioResult) -> list[str]:
    """Differences between the outputs stored in ``nb`` and a fresh run (empty: a match)."""
    options = ScenarioOptions.from_metadata(nb.metadata)
    # The stored side's temporary folder is unknown: the generic rules catch it.
    expected_normalizer = Normalizer(placeholders(options, result.path, None), options.normalize)
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
