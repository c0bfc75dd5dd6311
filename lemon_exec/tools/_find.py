"""``find(pattern, path='.')``: paths matching a recursive glob."""

from __future__ import annotations

import os
import stat
from typing import Any

from lemon_exec.errors import ToolFailure

from ._paths import WalkStats, display_join, name_for, resolve, stat_or_fail, walk
from ._pattern import GlobPattern
from ._types import ToolCall, ToolSpec

__all__ = ["MAX_RESULTS", "MAX_WALK_ENTRIES", "TIME_LIMIT_S", "find", "spec"]

#: Paths returned by one call; more are cut with a note.
MAX_RESULTS = 1000
#: Directory entries visited in one call before it stops with a note.
MAX_WALK_ENTRIES = 200_000
#: Seconds one call may run (in a worker process) before it is killed.
TIME_LIMIT_S = 60.0

DESCRIPTION = f"""\
Find files and directories under `path` (default: the working directory) whose path matches
a glob. A pattern without `/` (`*.py`) matches names at any depth; one with `/` matches the
path relative to `path`, where `**` spans any number of directories (`src/**/test_*.py`).
Matching is case-sensitive. Hidden directories are not entered unless the pattern names one
(`.github/**`); symlinked directories are never entered. Returns matching paths (joined to the
given `path`, ready for read()), sorted, one per line, directories with a trailing `/`; ""
when nothing matches; at most {MAX_RESULTS}, then a `[truncated: ...]` note. Stopped after
{TIME_LIMIT_S:g} s."""


def spec() -> ToolSpec:
    """The registry entry for ``find``."""
    return ToolSpec(
        name="find",
        func=find,
        description=DESCRIPTION,
        parameters=("pattern", "path"),
        required=("pattern",),
        param_types={"pattern": str, "path": str},
        defaults={"path": "."},
        time_limit_s=TIME_LIMIT_S,
        isolated=True,
    )


def find(params: dict[str, Any], call: ToolCall) -> str:
    """Walk ``path`` and list what matches (sync: the host runs it in a worker process)."""
    pattern_text: str = params["pattern"]
    raw: str = "." if params.get("path") is None else params["path"]
    try:
        pattern = GlobPattern.parse(pattern_text)
    except ValueError as e:
        raise ToolFailure(f"find: invalid pattern {pattern_text!r}: {e}") from None

    root = resolve(raw, call.cwd)
    st = stat_or_fail("find", raw, root)
    if not stat.S_ISDIR(st.st_mode):
        raise ToolFailure(f"find: {name_for(raw, root)} is not a directory")

    # Walk only below the pattern's literal leading directories: "src/**/*.py" walks src/.
    prefix = pattern.literal_prefix()
    start = root.joinpath(*prefix)
    rest = pattern.strip_prefix(len(prefix))
    shown_prefix = "".join(seg + "/" for seg in prefix)
    try:
        if prefix and not start.is_dir():
            return ""
    except OSError:
        return ""

    stats = WalkStats()
    found: list[str] = []
    for rel, entry in walk(
        start,
        max_entries=MAX_WALK_ENTRIES,
        stats=stats,
        include_hidden_dirs=pattern.mentions_hidden(),
    ):
        if rest.matches(rel):
            found.append(_shown(raw, shown_prefix + rel, entry))
    # The walk is already sorted by name per directory; sort the strings for a total order.
    found.sort()
    notes = []
    if len(found) > MAX_RESULTS:
        notes.append(
            f"[truncated: showing {MAX_RESULTS} of {len(found)} matches; narrow the pattern]"
        )
        found = found[:MAX_RESULTS]
    if stats.truncated:
        notes.append(
            f"[truncated: stopped after visiting {MAX_WALK_ENTRIES} entries; "
            "results are incomplete, narrow the path]"
        )
    return "\n".join(found + notes)


def _shown(raw: str, rel: str, entry: os.DirEntry[str]) -> str:
    shown = display_join(raw, rel)
    try:
        is_dir = entry.is_dir()  # follows symlinks: a link to a directory is shown as one
    except OSError:
        is_dir = False
    return shown + "/" if is_dir else shown
