"""Live script output for ``lemon-exec run``, and what of the result is left to print after it.

The script's printed output streams to the terminal while it runs (``LiveOutput``). The tool
result repeats that output (it is what the model reads), so once the run ends the command
prints only the rest of it (``unstreamed_content``): a failure's headline, notes, and the
``text()`` blocks. Locating the output inside the result is done conservatively: when in
doubt, the whole result is printed again; nothing is ever dropped.
"""

from __future__ import annotations

import contextlib
from typing import TextIO

from lemon_exec.envelope import parse_envelope
from lemon_exec.host.cell.output import sanitize
from lemon_exec.host.run.results import DIAGNOSTICS_HEADER
from lemon_exec.result import ExecuteCodeResult

__all__ = ["LiveOutput", "unstreamed_content", "write_text"]

#: Most characters of streamed output kept to recognise it in the result. The result holds
#: at most ``max_output_bytes`` of output whole; past that it is truncated anyway, and only
#: the beginning is needed to find it.
_KEEP_CHARS = 8 * 2**20
#: Lengths of the output's beginning searched for when the output is not a plain suffix.
_PROBES = (4096, 512, 64)


class LiveOutput:
    """Writes output chunks to ``stream`` as they arrive and remembers what it wrote."""

    def __init__(self, stream: TextIO) -> None:
        self._stream: TextIO | None = stream
        self._chunks: list[str] = []
        self._kept = 0
        self.overflowed = False  # more arrived than _KEEP_CHARS: only the beginning is kept
        self.wrote_any = False
        self._at_line_start = True

    @property
    def text(self) -> str:
        """The output streamed so far (its first ``_KEEP_CHARS`` characters)."""
        if len(self._chunks) > 1:
            self._chunks = ["".join(self._chunks)]
        return self._chunks[0] if self._chunks else ""

    def write(self, chunk: str) -> None:
        """Show ``chunk`` now; the facade's ``on_output`` callback."""
        if not chunk:
            return
        self.wrote_any = True
        self._at_line_start = chunk.endswith("\n")
        if self._kept < _KEEP_CHARS:
            piece = chunk[: _KEEP_CHARS - self._kept]
            self._chunks.append(piece)
            self._kept += len(piece)
            self.overflowed = len(piece) < len(chunk)
        else:
            self.overflowed = True
        self._emit(chunk)

    def end_line(self) -> None:
        """Finish a last line the script left open, so what follows starts on its own line."""
        if self.wrote_any and not self._at_line_start:
            self._at_line_start = True
            self._emit("\n")

    def _emit(self, text: str) -> None:
        stream = self._stream
        if stream is None:
            return
        try:
            write_text(stream, text)
        except (BrokenPipeError, ValueError):  # the reader went away (`| head`): stop showing
            self._stream = None
        except OSError:
            with contextlib.suppress(OSError):
                stream.flush()
            self._stream = None


def write_text(stream: TextIO, text: str) -> None:
    """Write and flush ``text``; a terminal that cannot encode a character gets a
    replacement instead of costing the run its output (or a finished run a crash)."""
    try:
        stream.write(text)
    except UnicodeEncodeError:
        encoding = getattr(stream, "encoding", None) or "ascii"
        stream.write(text.encode(encoding, "replace").decode(encoding))
    stream.flush()


def unstreamed_content(result: ExecuteCodeResult, live: LiveOutput) -> str:
    """``result.content`` without the printed output ``live`` already showed.

    What remains is what the output did not show: the headline of a failure, notes, the
    ``text()`` blocks (inside the untrusted-content envelope when the result has one). When
    the output cannot be found in the content, the whole content is returned.
    """
    content = result.content
    if not live.wrote_any:
        return content
    envelope = parse_envelope(content)
    if envelope is None:
        body, wrap = content, None
    else:
        # The envelope is "<start line>\n<notice>\n\n<body>\n\n<end line>".
        notice, _, body = envelope[1].partition("\n\n")
        start_line = content.partition("\n")[0]
        end_line = content.rpartition("\n")[2]
        wrap = (start_line + "\n" + notice, end_line)
    cut = _output_start(body, live, result)
    if cut is None:
        return content
    rest = body[:cut].rstrip("\n")
    if wrap is None or not rest:
        return rest
    return f"{wrap[0]}\n\n{rest}\n\n{wrap[1]}"


def _output_start(body: str, live: LiveOutput, result: ExecuteCodeResult) -> int | None:
    """Where the output section starts in ``body``; None when it cannot be found."""
    # With text() blocks the output comes last, under its own header; without, it is last.
    header = DIAGNOSTICS_HEADER + "\n" if result.details.get("text_blocks") else ""
    output = sanitize(live.text)  # the result holds the output sanitized
    if not live.overflowed and not result.details.get("truncated"):
        tail = header + output
        if tail and body.endswith(tail):
            return len(body) - len(tail)
    # Truncated, or with a note appended: find its beginning. The first match, because the
    # parts before the output are short (headline, notes) or end before the header.
    for size in _PROBES:
        probe = header + output[:size]
        if not output[:size].strip():
            break
        found = body.find(probe)
        if found >= 0:
            return found
    return None
