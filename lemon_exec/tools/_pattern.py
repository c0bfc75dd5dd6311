"""Glob patterns with ``**``, as used by ``find(pattern)`` and ``grep(glob=...)``.

Rules (matching is case-sensitive, on ``/``-separated relative paths):

* A pattern without ``/`` (``*.py``, ``conftest.py``) matches a *name* at any depth.
* Otherwise it matches the whole relative path, segment by segment: ``*``, ``?`` and ``[...]``
  stay inside one segment (as in :mod:`fnmatch`), and a ``**`` segment matches zero or more
  segments (``src/**/test_*.py``).
* ``.`` and empty segments are ignored, so ``./src//*.py`` means ``src/*.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatchcase
from functools import lru_cache

__all__ = ["GlobPattern"]

_MAGIC = frozenset("*?[")


@dataclass(frozen=True)
class GlobPattern:
    """A parsed pattern; build it with :meth:`parse`."""

    segments: tuple[str, ...]

    @classmethod
    def parse(cls, pattern: str) -> GlobPattern:
        """Parse ``pattern``; raise ``ValueError`` if it is empty or absolute."""
        if pattern.startswith("/"):
            raise ValueError("pattern must be relative (pass the directory as path)")
        segments = tuple(s for s in pattern.split("/") if s not in ("", "."))
        if not segments:
            raise ValueError("pattern is empty")
        if "/" not in pattern.strip("/"):
            segments = ("**", *segments)  # a bare name matches at any depth
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


@lru_cache(maxsize=4096)
def _match(pat: tuple[str, ...], parts: tuple[str, ...]) -> bool:
    # Memoised on (pattern tail, path tail), so several ``**`` cannot blow up exponentially.
    if not pat:
        return not parts
    head, rest = pat[0], pat[1:]
    if head == "**":
        return any(_match(rest, parts[i:]) for i in range(len(parts) + 1))
    return bool(parts) and fnmatchcase(parts[0], head) and _match(rest, parts[1:])
