"""What a scenario notebook's ``lemon`` metadata asks for, checked, and what a call must meet.

Cell metadata under ``lemon`` tunes a call::

    {"lemon": {"timeout_ms": 2000, "reset": true, "mode": "per_call",
               "session": "subagent", "expect": {"exit_code": 1}}}

and notebook metadata under ``lemon`` tunes the scenario::

    {"lemon": {"config": {"max_rpc_calls": 3}, "cwd": "tmp",
               "normalize": [["seed=\\\\d+", "seed=<n>"]]}}

``expect`` is a details flag (``"timed_out"``), a dict of details values
(``{"exit_code": 1, "state_retained": true}``) or a list of those; without it a call is
expected to succeed (``exit_code`` 0). Invalid metadata is a :class:`ScenarioError`, raised
before anything runs. See ``docs/notebooks.md``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lemon_exec.config import SETTING_KEYS, ExecuteCodeConfig

__all__ = [
    "METADATA_KEY",
    "MODES",
    "CellOptions",
    "ScenarioError",
    "ScenarioOptions",
    "check_expectations",
    "placeholders",
]

#: Key of the cell and notebook metadata entries a scenario is read from.
METADATA_KEY = "lemon"

#: The modes a cell may run in.
MODES = ("session", "per_call")
_CELL_KEYS = frozenset({"timeout_ms", "reset", "mode", "expect", "session"})
_NOTEBOOK_KEYS = frozenset({"config", "cwd", "normalize"})


class ScenarioError(ValueError):
    """The notebook's ``lemon`` metadata is invalid; nothing was run."""


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
        if mode is not None and mode not in MODES:
            raise ScenarioError(f"{where}: mode must be one of {', '.join(MODES)}")
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


def placeholders(
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
