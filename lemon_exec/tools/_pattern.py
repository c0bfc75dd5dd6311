"""Glob patterns with ``**``, as used by ``find(pattern)`` and ``grep(glob=...)``.

Rules (matching is case-sensitive, on ``/``-separated relative paths):

* A pattern without ``/`` (``*.py``, ``conftest.py``) matches a *name* at any depth.
* Otherwise it matches the whole relative path, segment by segment: ``*``, ``?`` and ``[...]``
  stay inside one segment (as in :mod:`fnmatch`), and a ``**`` segment matches zero or more
  segments (``src/**/test_*.py``).
* ``.`` and empty segments are ignored, so ``./src//*.py`` means ``src/*.py``.

Matching simulates the pattern as a set of positions (an NFA), so its cost is linear in
``segments x path depth`` however many ``**`` a pattern has; consecutive ``**`` collapse into
one, and patterns are capped at :data:`MAX_PATTERN_CHARS` characters and
:data:`MAX_SEGMENTS` segments.
"""

from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatchcase

__all__ = ["MAX_PATTERN_CHARS", "MAX_SEGMENTS", "GlobPattern"]

#: Longest pattern accepted, in characters.
MAX_PATTERN_CHARS = 4096
#: Most path segments in a pattern (after collapsing ``**/**``).
MAX_SEGMENTS = 64

_MAGIC = frozenset("*?[")


@dataclass(frozen=True)
class GlobPattern:
    """A parsed pattern; build it with :meth:`parse`."""

    segments: tuple[str, ...]

    @classmethod
    def parse(cls, pattern: str) -> GlobPattern:
        """Parse ``pattern``; raise ``ValueError`` if it is empty, absolute or too long."""
        if pattern.startswith("/"):
            raise ValueError("pattern must be relative (pass the directory as path)")
        if len(pattern) > MAX_PATTERN_CHARS:
            raise ValueError(f"pattern is longer than {MAX_PATTERN_CHARS} characters")
        segments = tuple(s for s in pattern.split("/") if s not in ("", "."))
        if not segments:
            raise ValueError("pattern is empty")
        if "/" not in pattern.strip("/"):
            segments = ("**", *segments)  # a bare name matches at any depth
        # "**/**" means the same as "**"; collapsing keeps hostile patterns cheap.
        segments = tuple(
            s for i, s in enumerate(segments) if not (s == "**" and i and segments[i - 1] == "**")
        )
        if len(segments) > MAX_SEGMENTS:
            raise ValueError(f"pattern has more than {MAX_SEGMENTS} path segments")
        return cls(segments)

    def literal_prefix(self) -> tuple[str, ...]:
        """Leading segments with no wildcards (never the last one): where a walk can start."""
        prefix: list[str] = []
        for seg in self.segments[:-1]:
            if seg == "**" or _MAGIC.intersection(seg):
                break
            prefix.append(seg)
        return tuple(prefix)

    def strip_prefix(self, count: int) -> GlobPattern:
        """The pattern without its first ``count`` segments (after walking into them)."""
        return GlobPattern(self.segments[count:])

    def mentions_hidden(self) -> bool:
        """True if a segment starts with a literal dot (``.github/*``), so hidden dirs count."""
        return any(seg.startswith(".") for seg in self.segments)

    def matches(self, relpath: str) -> bool:
        """Does the ``/``-separated ``relpath`` match?"""
        return _match(self.segments, tuple(p for p in relpath.split("/") if p))


def _match(pat: tuple[str, ...], parts: tuple[str, ...]) -> bool:
    # The set of pattern positions reachable after each path segment; "**" stays put (it
    # swallows a segment) or is skipped (it matches none). Linear in len(pat) x len(parts).
    states = _closure(pat, {0})
    for part in parts:
        nxt = set()
        for i in states:
            if i == len(pat):
                continue
            if pat[i] == "**":
                nxt.add(i)
            elif fnmatchcase(part, pat[i]):
                nxt.add(i + 1)
        if not nxt:
            return False
        states = _closure(pat, nxt)
    return len(pat) in states


def _closure(pat: tuple[str, ...], states: set[int]) -> set[int]:
    """``states`` plus the positions after any ``**`` run they sit on (a ``**`` may match none)."""
    out = set(states)
    for i in states:
        while i < len(pat) and pat[i] == "**":
            i += 1
            out.add(i)
    return out
