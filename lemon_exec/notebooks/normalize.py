"""Normalisation of execute_code results, so that two runs of one scenario compare equal.

A result carries things that change from run to run: temporary directories, the host's
staging root, durations, kernel ids, PIDs, memory addresses, timestamps. :class:`Normalizer`
replaces each with a stable placeholder. Normalising is idempotent (normalising a normalised
record changes nothing), so golden outputs may be stored normalised or raw.

Kernel ids are numbered in order of first appearance (``<kernel-1>``, ``<kernel-2>``, ...)
rather than erased, so a golden output still shows whether two calls shared a kernel.
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TypeVar

from lemon_exec._constants import SPILL_PREFIX, STAGING_ROOT_PREFIX

__all__ = ["SCENARIO_DIR_PREFIX", "Normalizer", "Record"]

#: Prefix of the temporary working directory a scenario runs in (see the runner).
SCENARIO_DIR_PREFIX = "lemon-scenario-"

#: A path key of :class:`Normalizer`'s ``paths`` (a TypeVar: ``Mapping`` is invariant in
#: its keys, so a ``dict[str, str]`` would not match ``Mapping[str | PathLike[str], str]``).
_PathT = TypeVar("_PathT", bound="str | os.PathLike[str]")

#: A comparable, JSON-ready view of one call: what the model read, what the caller saw.
Record = dict[str, Any]

#: One path segment: no separator, no whitespace, no quoting or bracketing characters.
_SEGMENT = r"[^\s'\"<>:,;()\[\]{}/]+"

_KERNEL_PLACEHOLDER = re.compile(r"<kernel-\d+>")

# Order matters: whole paths first, then the pieces that can appear anywhere.
_GENERIC_RULES: tuple[tuple[re.Pattern[str], str], ...] = (
    # The host's private staging root (mkdtemp: prefix + 8 characters), wherever it lives.
    (
        re.compile(
            rf"(?:/{_SEGMENT})*/{re.escape(STAGING_ROOT_PREFIX)}(?!output-)[A-Za-z0-9_]{{8}}"
            r"(?![A-Za-z0-9_])"
        ),
        "<staging>",
    ),
    # A scenario's temporary working directory.
    (
        re.compile(rf"(?:/{_SEGMENT})*/{re.escape(SCENARIO_DIR_PREFIX)}[A-Za-z0-9_]+"),
        "<cwd>",
    ),
    # Output spill files and per-kernel file names.
    (re.compile(rf"{re.escape(SPILL_PREFIX)}[0-9a-f]{{8,}}"), f"{SPILL_PREFIX}<id>"),
    (re.compile(r"\bkernel-[0-9a-f]{12,}"), "kernel-<id>"),
    (re.compile(r"\brun-[A-Za-z0-9_]{8}\b"), "run-<id>"),
    # Memory addresses (object reprs) and UUIDs.
    (re.compile(r"\b0x[0-9a-fA-F]{6,}\b"), "0x<addr>"),
    (
        re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b"),
        "<uuid>",
    ),
    # Timestamps, then clock times, then fractional durations.
    (
        re.compile(r"\b\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?"),
        "<datetime>",
    ),
    (re.compile(r"\b\d\d:\d\d:\d\d(?:[.,]\d+)?\b"), "<time>"),
    (
        re.compile(r"\b\d+\.\d+ ?(?:ms|s|sec|secs|seconds|milliseconds)\b"),
        "<duration>",
    ),
    # Process ids mentioned as such ("pid 1234", "PID=1234", "pid: 1234").
    (re.compile(r"(?i)\b(pid)(\s*[=:]?\s*)\d+\b"), r"\1\2<pid>"),
)

# Details keys whose values vary from run to run or machine to machine, replaced wholesale.
_VOLATILE_DETAILS = {"duration_ms": "<ms>", "queue_wait_ms": "<ms>", "python": "<python>"}
# Details keys present on some machines only (e.g. whether the venv was activated): left out.
_MACHINE_DETAILS = frozenset({"python_fallback"})


class Normalizer:
    """Replace the run-specific parts of results with placeholders.

    ``paths`` maps concrete paths (the scenario's working directory, the notebook's folder)
    to placeholders; each is also matched in its symlink-resolved form. ``rules`` are extra
    ``(regex, replacement)`` pairs applied after the built-in ones (a notebook can add its
    own in ``metadata.lemon.normalize``). One normaliser should see a whole scenario, so that
    kernel ids keep one number each.
    """

    def __init__(
        self,
        paths: Mapping[_PathT, str] | None = None,
        rules: Iterable[Sequence[str]] = (),
    ) -> None:
        pairs: dict[str, str] = {}
        for key, placeholder in (paths or {}).items():
            raw: str | os.PathLike[str] = key
            for form in {os.fspath(raw), os.path.realpath(os.fspath(raw))}:
                if form and form != os.sep:
                    pairs[form.rstrip(os.sep)] = placeholder
        # Longest first, so a folder inside another one is replaced as the inner one.
        self._paths = sorted(pairs.items(), key=lambda item: len(item[0]), reverse=True)
        self._rules = [*_GENERIC_RULES, *_compile_rules(rules), *_temp_rules()]
        self._kernels: dict[str, str] = {}

    # -- text -----------------------------------------------------------------------------

    def text(self, value: str) -> str:
        """Normalise a piece of text (content, a notify message, a path)."""
        for raw, placeholder in self._paths:
            value = value.replace(raw, placeholder)
        for kernel_id, placeholder in self._kernels.items():
            value = value.replace(kernel_id, placeholder)
        for pattern, replacement in self._rules:
            value = pattern.sub(replacement, value)
        return value

    def kernel(self, kernel_id: str) -> str:
        """The stable placeholder of ``kernel_id`` (numbered in order of appearance)."""
        if _KERNEL_PLACEHOLDER.fullmatch(kernel_id):
            return kernel_id
        placeholder = self._kernels.get(kernel_id)
        if placeholder is None:
            placeholder = f"<kernel-{len(self._kernels) + 1}>"
            self._kernels[kernel_id] = placeholder
        return placeholder

    # -- structures -----------------------------------------------------------------------

    def details(self, details: Mapping[str, Any]) -> dict[str, Any]:
        """Normalise a result's ``details`` (keys sorted, volatile values replaced)."""
        out: dict[str, Any] = {}
        if isinstance(details.get("kernel_id"), str):
            self.kernel(details["kernel_id"])  # number it before any text mentions it
        for key in sorted(details):
            value = details[key]
            if key in _MACHINE_DETAILS:
                continue
            if key in _VOLATILE_DETAILS and value is not None:
                out[key] = _VOLATILE_DETAILS[key]
            elif key == "kernel_id" and isinstance(value, str):
                out[key] = self.kernel(value)
            else:
                out[key] = self._value(value)
        return out

    def _value(self, value: Any) -> Any:
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, Mapping):
            return {str(k): self._value(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self._value(v) for v in value]
        return value

    def record(self, record: Mapping[str, Any]) -> Record:
        """Normalise a record (``content``, ``notify``, ``details``, ``trust``, ``images``)."""
        details = self.details(record.get("details") or {})
        out: Record = {
            "content": self.text(str(record.get("content", ""))),
            "notify": [self.text(str(m)) for m in record.get("notify") or []],
            "trust": record.get("trust", "trusted"),
            "details": details,
        }
        if record.get("images"):
            # Image metadata: only the alt text can hold a path or a temporary name.
            out["images"] = [self._value(dict(image)) for image in record["images"]]
        return out


def _compile_rules(rules: Iterable[Sequence[str]]) -> list[tuple[re.Pattern[str], str]]:
    compiled: list[tuple[re.Pattern[str], str]] = []
    for rule in rules:
        if len(rule) != 2 or not all(isinstance(part, str) for part in rule):
            raise ValueError(f"a normalisation rule must be [regex, replacement], got {rule!r}")
        try:
            compiled.append((re.compile(rule[0]), rule[1]))
        except re.error as exc:
            raise ValueError(f"bad normalisation regex {rule[0]!r}: {exc}") from None
    return compiled


def _temp_rules() -> list[tuple[re.Pattern[str], str]]:
    """Other mkdtemp()/mkstemp() names under the temp dir: ``<tmp>``."""
    bases = {tempfile.gettempdir(), os.path.realpath(tempfile.gettempdir())}
    alternatives = "|".join(
        re.escape(b.rstrip(os.sep)) for b in sorted(bases, key=len, reverse=True)
    )
    return [(re.compile(rf"(?:{alternatives})/tmp[A-Za-z0-9_]{{8}}(?![A-Za-z0-9_])"), "<tmp>")]
