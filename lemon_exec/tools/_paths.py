"""Path helpers shared by the file tools: resolving, naming, sniffing, walking.

There is no sandbox here (the tools are as powerful as the script's own ``open``), but the
recursive walk never follows a symlinked directory, so a link loop cannot trap it.
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Iterator
from dataclasses import dataclass

from lemon_exec.errors import ToolFailure

__all__ = [
    "BINARY_SNIFF_BYTES",
    "WalkStats",
    "display_join",
    "is_binary_bytes",
    "name_for",
    "resolve",
    "stat_or_fail",
    "walk",
]

#: How much of a file is inspected for a NUL byte to decide that it is binary (as git does).
BINARY_SNIFF_BYTES = 8192


def resolve(raw: str, cwd: pathlib.Path) -> pathlib.Path:
    """Expand ``~`` and make ``raw`` absolute against the run's ``cwd`` (symlinks are kept)."""
    # Joined as strings and parsed once: two Path constructions were a tenth of a small
    # read()'s host time.
    path = os.path.expanduser(raw)
    if not os.path.isabs(path):
        path = os.path.join(os.path.expanduser(str(cwd)), path)
    return pathlib.Path(path)


def name_for(raw: str, resolved: pathlib.Path) -> str:
    """How an error message names a path: as given, plus where it resolved to if different."""
    if str(resolved) == raw:
        return repr(raw)
    return f"{raw!r} (resolved to {resolved})"


def stat_or_fail(tool: str, raw: str, resolved: pathlib.Path) -> os.stat_result:
    """``os.stat`` (following symlinks), turning the usual errors into clear ToolFailures."""
    try:
        return resolved.stat()
    except FileNotFoundError:
        raise ToolFailure(f"{tool}: no such file or directory: {name_for(raw, resolved)}") from None
    except PermissionError:
        raise ToolFailure(f"{tool}: permission denied: {name_for(raw, resolved)}") from None
    except OSError as e:
        raise ToolFailure(
            f"{tool}: cannot access {name_for(raw, resolved)}: {e.strerror}"
        ) from None


def is_binary_bytes(head: bytes) -> bool:
    """A NUL byte in the first :data:`BINARY_SNIFF_BYTES` bytes means binary."""
    return b"\0" in head[:BINARY_SNIFF_BYTES]


def display_join(given: str, rel: str) -> str:
    """Name a found file the way ``grep -r``/``find`` would: the given path joined with ``rel``.

    The result can be passed straight back to ``read()``. ``'.'`` is dropped so that the
    default search prints ``src/a.py`` rather than ``./src/a.py``.
    """
    if given in ("", ".", "./"):
        return rel
    return os.path.join(given, rel)


@dataclass
class WalkStats:
    """Counters a walk fills in; ``truncated`` is set when ``max_entries`` stopped it."""

    entries: int = 0
    truncated: bool = False
    errors: int = 0


def walk(
    root: pathlib.Path,
    *,
    max_entries: int,
    stats: WalkStats,
    include_hidden_dirs: bool = False,
) -> Iterator[tuple[str, os.DirEntry[str]]]:
    """Yield ``(relpath, entry)`` for everything under ``root``, depth-first, sorted by name.

    ``relpath`` uses ``/`` separators. Directories are yielded before their contents. The walk
    descends into real directories only: symlinked directories are yielded but never entered,
    and hidden directories (``.git``, ``.venv``, ...) are yielded but not entered unless
    ``include_hidden_dirs``. ``root`` itself is always entered, even if it is a symlink or
    hidden: the caller named it explicitly. Unreadable directories are counted in
    ``stats.errors`` and skipped. The walk stops after ``max_entries`` entries.
    """
    # An explicit stack instead of recursion: directory trees can be deeper than Python's
    # recursion limit.
    stack: list[tuple[str, Iterator[os.DirEntry[str]]]] = []
    children = _sorted_entries(root, stats)
    if children is None:
        return
    stack.append(("", iter(children)))
    while stack:
        prefix, it = stack[-1]
        entry = next(it, None)
        if entry is None:
            stack.pop()
            continue
        if stats.entries >= max_entries:
            stats.truncated = True
            return
        stats.entries += 1
        rel = prefix + entry.name
        yield rel, entry
        if not _descend(entry, include_hidden_dirs):
            continue
        sub = _sorted_entries(pathlib.Path(entry.path), stats)
        if sub is not None:
            stack.append((rel + "/", iter(sub)))


def _descend(entry: os.DirEntry[str], include_hidden_dirs: bool) -> bool:
    if entry.name.startswith(".") and not include_hidden_dirs:
        return False
    try:
        return entry.is_dir(follow_symlinks=False)
    except OSError:
        return False


def _sorted_entries(path: pathlib.Path, stats: WalkStats) -> list[os.DirEntry[str]] | None:
    try:
        with os.scandir(path) as it:
            return sorted(it, key=lambda e: e.name)
    except OSError:
        stats.errors += 1
        return None
