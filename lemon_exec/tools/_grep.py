"""``grep(pattern, path='.', glob=None, ignore_case=False, max_results=None)``: regex search."""

from __future__ import annotations

import os
import pathlib
import re
import stat
from collections.abc import Iterator
from typing import Any

from lemon_exec.errors import ToolFailure

from ._paths import (
    BINARY_SNIFF_BYTES,
    WalkStats,
    display_join,
    is_binary_bytes,
    name_for,
    resolve,
    stat_or_fail,
    walk,
)
from ._pattern import GlobPattern
from ._types import ToolCall, ToolSpec

__all__ = [
    "DEFAULT_MAX_RESULTS",
    "INLINE_MAX_BYTES",
    "INLINE_MAX_PATTERN",
    "MAX_FILES_SEARCHED",
    "MAX_FILE_BYTES",
    "MAX_LINE_CHARS",
    "MAX_RESULTS_CAP",
    "MAX_WALK_ENTRIES",
    "TIME_LIMIT_S",
    "grep",
    "is_quick",
    "spec",
]

#: Matching lines returned when ``max_results`` is not given.
DEFAULT_MAX_RESULTS = 200
#: Hard cap on ``max_results``; larger values are lowered to it.
MAX_RESULTS_CAP = 2000
#: A matching line longer than this many characters is cut (minified files).
MAX_LINE_CHARS = 500
#: Files opened in one search before it stops with a note.
MAX_FILES_SEARCHED = 20_000
#: Directory entries visited in one search before it stops with a note.
MAX_WALK_ENTRIES = 200_000
#: Files larger than this are skipped (and counted in a note): 32 MiB.
MAX_FILE_BYTES = 32 * 1024 * 1024
#: Seconds one search may run (in a worker process) before it is killed.
TIME_LIMIT_S = 60.0
#: A literal pattern (no regex syntax) up to this long, in one regular file up to
#: INLINE_MAX_BYTES, is searched on the event loop: linear time, no process hop.
INLINE_MAX_PATTERN = 100
INLINE_MAX_BYTES = 64 * 1024

_REGEX_SYNTAX = frozenset(".^$*+?{}[]\\|()")

DESCRIPTION = f"""\
Search files for a Python `re` regular expression, line by line. `path` is a file or a
directory searched recursively (default: the working directory); hidden directories (.git,
.venv, ...), symlinked directories, binary files and files over {MAX_FILE_BYTES // 2**20} MiB
are skipped. `glob` filters files: a bare pattern like `*.py` matches names at any depth, one
with `/` matches the path relative to `path` (`src/**/*.py`). Returns `path:lineno:line` lines
(path joined to the given `path`, ready for read()), lines cut at {MAX_LINE_CHARS} characters;
"" when nothing matches. Stops at `max_results` matches (default {DEFAULT_MAX_RESULTS}, at
most {MAX_RESULTS_CAP}) or {MAX_FILES_SEARCHED} files, ending with a `[truncated: ...]` note.
A search is stopped after {TIME_LIMIT_S:g} s: avoid nested quantifiers like `(a+)+`, which can
take exponential time."""


def spec() -> ToolSpec:
    """The registry entry for ``grep``."""
    return ToolSpec(
        name="grep",
        func=grep,
        description=DESCRIPTION,
        parameters=("pattern", "path", "glob", "ignore_case", "max_results"),
        required=("pattern",),
        param_types={
            "pattern": str,
            "path": str,
            "glob": str,
            "ignore_case": bool,
            "max_results": int,
        },
        defaults={"path": ".", "glob": None, "ignore_case": False, "max_results": None},
        inline=is_quick,
        time_limit_s=TIME_LIMIT_S,
        isolated=True,
    )


def is_quick(params: Any, call: ToolCall) -> bool:
    """Whether ``grep`` may run inline: a short literal pattern and one small regular file.

    Any regex syntax goes to a worker process: even a 28-byte line can make a pattern like
    ``(a+)+$`` backtrack for seconds, holding the GIL.
    """
    pattern = params["pattern"]
    if len(pattern) > INLINE_MAX_PATTERN or not _REGEX_SYNTAX.isdisjoint(pattern):
        return False
    path = params.get("path")
    st = resolve("." if path is None else path, call.cwd).stat()
    return stat.S_ISREG(st.st_mode) and st.st_size <= INLINE_MAX_BYTES


def grep(params: dict[str, Any], call: ToolCall) -> str:
    """Run the search (sync: the host runs it in a worker process, or inline if quick)."""
    pattern: str = params["pattern"]
    raw: str = "." if params.get("path") is None else params["path"]
    glob_text: str | None = params.get("glob")
    ignore_case = bool(params.get("ignore_case"))
    requested = params.get("max_results")
    max_results = DEFAULT_MAX_RESULTS if requested is None else requested
    if max_results < 1:
        raise ToolFailure(f"grep: max_results must be >= 1, got {max_results}")
    clamped = max_results > MAX_RESULTS_CAP
    max_results = min(max_results, MAX_RESULTS_CAP)

    try:
        regex = re.compile(pattern, re.IGNORECASE if ignore_case else 0)
    except re.error as e:
        raise ToolFailure(f"grep: invalid regex {pattern!r}: {e}") from None
    glob = None
    if glob_text:
        try:
            glob = GlobPattern.parse(glob_text)
        except ValueError as e:
            raise ToolFailure(f"grep: invalid glob {glob_text!r}: {e}") from None

    root = resolve(raw, call.cwd)
    st = stat_or_fail("grep", raw, root)
    search = _Search(regex, max_results)
    if stat.S_ISDIR(st.st_mode):
        search.directory(root, raw, glob)
    elif stat.S_ISREG(st.st_mode):
        # A glob applies to the file's own name, as it would to a file found in a directory.
        if glob is None or glob.matches(root.name):
            search.single_file(root, raw)
    else:
        raise ToolFailure(f"grep: {name_for(raw, root)} is not a regular file or directory")
    return search.render(clamped)


class _Search:
    """Accumulates matching lines and the reasons a search stopped early."""

    def __init__(self, regex: re.Pattern[str], max_results: int) -> None:
        self.regex = regex
        self.max_results = max_results
        self.lines: list[str] = []
        self.hit_max_results = False
        self.hit_file_limit = False
        self.hit_walk_limit = False
        self.skipped_large = 0
        self.unreadable = 0

    def single_file(self, path: pathlib.Path, raw: str) -> None:
        try:
            if path.stat().st_size > MAX_FILE_BYTES:
                raise ToolFailure(
                    f"grep: {name_for(raw, path)} is larger than {MAX_FILE_BYTES // 2**20} MiB"
                )
            with open(path, "rb") as f:
                if is_binary_bytes(f.read(BINARY_SNIFF_BYTES)):
                    raise ToolFailure(f"grep: {name_for(raw, path)} is a binary file")
                f.seek(0)
                self._scan(f, raw)
        except PermissionError:
            raise ToolFailure(f"grep: permission denied: {name_for(raw, path)}") from None
        except OSError as e:
            raise ToolFailure(f"grep: cannot read {name_for(raw, path)}: {e.strerror}") from None

    def directory(self, root: pathlib.Path, raw: str, glob: GlobPattern | None) -> None:
        stats = WalkStats()
        searched = 0
        for rel, entry in walk(root, max_entries=MAX_WALK_ENTRIES, stats=stats):
            try:
                # is_file() follows a symlink to a file: harmless, and often wanted.
                if not entry.is_file():
                    continue
            except OSError:
                continue
            if glob is not None and not glob.matches(rel):
                continue
            if searched >= MAX_FILES_SEARCHED:
                self.hit_file_limit = True
                return
            searched += 1
            self._scan_path(entry.path, display_join(raw, rel))
            if self.hit_max_results:
                return  # stop scanning early: the caller has all it asked for
        self.hit_walk_limit = stats.truncated

    def _scan_path(self, path: str, shown: str) -> None:
        try:
            with open(path, "rb") as f:
                if _file_size(f) > MAX_FILE_BYTES:
                    self.skipped_large += 1
                    return
                if is_binary_bytes(f.read(BINARY_SNIFF_BYTES)):
                    return
                f.seek(0)
                self._scan(f, shown)
        except OSError:
            self.unreadable += 1

    def _scan(self, f: Any, shown: str) -> None:
        for lineno, line in _lines(f):
            if self.regex.search(line):
                if len(line) > MAX_LINE_CHARS:
                    line = line[:MAX_LINE_CHARS] + " [...]"
                self.lines.append(f"{shown}:{lineno}:{line}")
                if len(self.lines) >= self.max_results:
                    self.hit_max_results = True
                    return

    def render(self, clamped: bool) -> str:
        notes = []
        if self.hit_max_results:
            extra = f" (max_results is capped at {MAX_RESULTS_CAP})" if clamped else ""
            notes.append(
                f"[truncated: stopped at {self.max_results} matches{extra}; "
                "narrow the pattern, path or glob, or raise max_results]"
            )
        if self.hit_file_limit:
            notes.append(
                f"[truncated: stopped after searching {MAX_FILES_SEARCHED} files; "
                "narrow the path or glob]"
            )
        if self.hit_walk_limit:
            notes.append(
                f"[truncated: stopped after visiting {MAX_WALK_ENTRIES} directory entries; "
                "narrow the path]"
            )
        if self.skipped_large:
            notes.append(
                f"[skipped {self.skipped_large} files larger than {MAX_FILE_BYTES // 2**20} MiB]"
            )
        if self.unreadable:
            notes.append(f"[skipped {self.unreadable} unreadable files]")
        return "\n".join(self.lines + notes)


def _lines(f: Any) -> Iterator[tuple[int, str]]:
    """Decoded lines without their line ending, numbered from 1."""
    for lineno, raw_line in enumerate(f, start=1):
        yield lineno, raw_line.decode("utf-8", errors="replace").rstrip("\r\n")


def _file_size(f: Any) -> int:
    return os.fstat(f.fileno()).st_size
