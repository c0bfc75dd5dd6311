"""Bounded, sanitized capture of a script's output.

Output reaches the model as plain text, so terminal control sequences are stripped first
(:func:`sanitize`). :class:`OutputCapture` then keeps at most ``max_bytes`` of it in memory
(the first 40% and a rolling last 60%, counted in UTF-8 bytes) however much is written, and
once the cap is exceeded streams the sanitized output to a private spill file, itself capped
at ``max_spill_bytes`` (past that, output is only counted). Notes about output the host
refused (e.g. an oversized message) are appended after the kept text.

Carriage returns: ``\\r\\n`` becomes ``\\n``, and so does a lone ``\\r``. Progress bars that
redraw a line with ``\\r`` therefore show each redraw on its own line; the alternative
(dropping ``\\r``) would glue the redraws together into one unreadable line.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import re
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from lemon_exec._constants import SPILL_PREFIX
from lemon_exec._sizes import format_size
from lemon_exec.proc.private_fs import describe_os_error

__all__ = [
    "DEFAULT_MAX_SPILL_BYTES",
    "CapturedOutput",
    "OutputCapture",
    "format_truncated_output",
    "sanitize",
]

logger = logging.getLogger(__name__)

#: Default cap of one run's spill file (setting ``max_spill_bytes``).
DEFAULT_MAX_SPILL_BYTES = 64 * 2**20

# Stray control characters, and whole escape sequences where the control is ESC. The pattern
# starts with one character class so the regex engine can scan plain text quickly (about 3x
# faster than an alternation of ESC forms); the lookbehind then extends a match only for ESC.
_REMOVE = re.compile(
    r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]"  # C0 but \t \n \r (handled later); DEL; C1
    r"(?:(?<=\x1b)(?:"
    r"\[[\x30-\x3f]*[\x20-\x2f]*[\x40-\x7e]"  # CSI: ESC [ params intermediates final
    # OSC, DCS, SOS, PM, APC: ended by BEL or ST (ESC \); a bare ESC also ends them, as in
    # terminals, and an unterminated one runs to the end of the text.
    r"|[\]PX^_][^\x07\x1b]*(?:\x07|\x1b\\)?"
    r"|[\x20-\x2f]*[\x30-\x7e]"  # any other ESC sequence: ESC [intermediates] final
    r"))?"
)

# What a chunk may end with when a sequence has started but not finished yet.
_INCOMPLETE = re.compile(r"\x1b(?:\[[\x30-\x3f]*[\x20-\x2f]*|[\]PX^_][^\x07\x1b]*|[\x20-\x2f]*)?")

_SURROGATE = re.compile(r"[\ud800-\udfff]")

# Longest unfinished sequence held back between chunks. Past it the sequence is treated as
# finished (and dropped) so a stray "ESC ]" cannot make the capture hold output forever.
_MAX_CARRY = 4096


def sanitize(text: str) -> str:
    """Strip terminal control sequences and control characters from a complete text.

    Removes ANSI CSI, OSC/DCS/SOS/PM/APC strings, other ESC sequences, C0 controls other
    than tab and newline, DEL and C1 controls (U+0080-U+009F). ``\\r\\n`` and lone ``\\r``
    become ``\\n``; lone surrogates become U+FFFD.
    """
    stream = _StreamSanitizer()
    return stream.feed(text) + stream.finish()


class _StreamSanitizer:
    """:func:`sanitize` for text arriving in chunks: sequences may straddle chunk ends."""

    def __init__(self) -> None:
        self._carry = ""  # an escape sequence begun but not finished
        self._pending_cr = False  # a "\r" that may yet turn out to start "\r\n"

    def feed(self, text: str) -> str:
        data = self._carry + text
        self._carry = ""
        start = data.rfind("\x1b", max(0, len(data) - _MAX_CARRY))
        if start >= 0 and _INCOMPLETE.fullmatch(data, start):
            data, self._carry = data[:start], data[start:]
        return self._newlines(_REMOVE.sub("", data), final=False)

    def finish(self) -> str:
        data, self._carry = self._carry, ""
        return self._newlines(_REMOVE.sub("", data), final=True)

    def _newlines(self, text: str, *, final: bool) -> str:
        # Done after sequence removal so "\r<ESC>[K\n" is one newline, chunked or not.
        if self._pending_cr:
            text = "\r" + text
            self._pending_cr = False
        if not final and text.endswith("\r"):
            text = text[:-1]
            self._pending_cr = True
        if "\r" in text:
            text = text.replace("\r\n", "\n").replace("\r", "\n")
        if not text.isascii() and _SURROGATE.search(text):  # isascii(): a cheap fast path
            text = _SURROGATE.sub("\ufffd", text)
        return text


@dataclass(frozen=True)
class CapturedOutput:
    """What a capture kept.

    ``text`` is at most ``max_bytes`` plus the truncation marker, then one line per note.
    """

    text: str
    truncated: bool
    total_bytes: int  # every sanitized byte written, kept or not
    omitted_bytes: int  # bytes cut from the middle; 0 unless truncated
    spill_path: Path | None  # file holding the sanitized output, when truncated
    spill_bytes: int = 0  # bytes in the spill file
    spill_capped: bool = False  # the spill file stopped at max_spill_bytes
    notes: tuple[str, ...] = ()  # also the last lines of ``text``


def format_truncated_output(captured: CapturedOutput) -> str:
    """Return ``captured.text``, plus a last line naming the spill file when there is one."""
    if captured.spill_path is None:
        return captured.text
    separator = "" if captured.text.endswith("\n") or not captured.text else "\n"
    if captured.spill_capped:
        line = (
            f"[Output saved to: {captured.spill_path} (only the first "
            f"{format_size(captured.spill_bytes)} of {format_size(captured.total_bytes)}: "
            "the spill file is capped by max_spill_bytes)]"
        )
    else:
        line = f"[Full output saved to: {captured.spill_path}]"
    return f"{captured.text}{separator}{line}"


class OutputCapture:
    """Collect output chunks with memory bounded by ``max_bytes``.

    While the sanitized output fits in ``max_bytes`` it is kept whole. From the first byte
    over, only the first 40% and the last 60% are kept (never splitting a UTF-8 character),
    and everything is streamed to a spill file created then, mode 0600, in ``spill_dir``,
    until it holds ``max_spill_bytes`` (disk use is bounded too; later output is counted in
    ``total_bytes`` but not stored). If that file cannot be created or written, capture goes
    on without it.
    """

    def __init__(
        self,
        max_bytes: int,
        spill_dir: Path,
        *,
        max_spill_bytes: int = DEFAULT_MAX_SPILL_BYTES,
        prefix: str = SPILL_PREFIX,
    ) -> None:
        if max_bytes < 1:
            raise ValueError(f"max_bytes must be at least 1, not {max_bytes}")
        self._max = max_bytes
        self._spill_cap = max(max_bytes, max_spill_bytes)  # the spill holds at least the kept
        self._spilled = 0
        self._spill_capped = False
        self._notes: list[str] = []
        self._head_cap = max_bytes * 2 // 5
        self._tail_cap = max_bytes - self._head_cap
        self._spill_dir = Path(spill_dir)
        self._prefix = prefix
        self._sanitizer = _StreamSanitizer()
        self._kept = bytearray()  # the whole output until truncated, then only the head
        self._tail = bytearray()  # rolling end of the output once truncated
        self._total = 0
        self._truncated = False
        self._spill: BinaryIO | None = None
        self._spill_path: Path | None = None
        self._result: CapturedOutput | None = None

    def write(self, text: str) -> None:
        """Add a chunk of output (any size; chunks must arrive in order)."""
        if self._result is not None:
            raise RuntimeError("OutputCapture.write() called after finish()")
        self._take(self._sanitizer.feed(text))

    def add_note(self, note: str) -> None:
        """Add a line for the reader about output the host refused; shown after the text."""
        if self._result is None:
            self._notes.append(note)

    def finish(self) -> CapturedOutput:
        """Flush, close the spill file and return what was kept. Safe to call twice."""
        if self._result is None:
            self._take(self._sanitizer.finish())
            self._close_spill()
            self._result = self._build()
        return self._result

    def close(self) -> None:
        """Finish without needing the result, e.g. from ``finally``; the spill file is kept."""
        self.finish()

    def __enter__(self) -> OutputCapture:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # --- internals --------------------------------------------------------------------------

    def _close_spill(self) -> None:
        if self._spill is not None:
            spill, self._spill = self._spill, None
            try:
                spill.close()
            except OSError as exc:
                self._drop_spill(exc)

    def _take(self, text: str) -> None:
        if not text:
            return
        data = text.encode("utf-8")  # surrogates were already replaced, so this is safe
        self._total += len(data)
        if self._truncated:
            self._spill_write(data)
            self._push_tail(data)
        elif self._total <= self._max:
            self._kept += data
        else:
            self._overflow(data)

    def _overflow(self, data: bytes) -> None:
        """First byte past the cap: split into head and tail and start the spill file."""
        self._truncated = True
        self._open_spill()
        self._spill_write(self._kept)
        self._spill_write(data)
        whole = self._kept + data
        cut = self._head_cap
        while cut > 0 and whole[cut] & 0xC0 == 0x80:  # back off to a character start
            cut -= 1
        self._kept = whole[:cut]
        self._push_tail(memoryview(whole)[cut:])

    def _push_tail(self, data: bytes | memoryview) -> None:
        if len(data) >= self._tail_cap:
            self._tail = bytearray(data[-self._tail_cap :])
            return
        self._tail += data
        if len(self._tail) > 2 * self._tail_cap:  # trim in bulk so appends stay amortised O(1)
            del self._tail[: -self._tail_cap]

    def _build(self) -> CapturedOutput:
        captured = self._build_text()
        if not self._notes:
            return captured
        text = captured.text
        if text and not text.endswith("\n"):
            text += "\n"
        text += "\n".join(self._notes)
        return dataclasses.replace(captured, text=text, notes=tuple(self._notes))

    def _build_text(self) -> CapturedOutput:
        if not self._truncated:
            return CapturedOutput(self._kept.decode("utf-8"), False, self._total, 0, None)
        tail = self._tail[-self._tail_cap :]
        start = 0
        while start < len(tail) and tail[start] & 0xC0 == 0x80:  # skip a split character
            start += 1
        tail = tail[start:]
        omitted = self._total - len(self._kept) - len(tail)
        text = (
            self._kept.decode("utf-8")
            + f"\n... [{omitted} bytes truncated] ...\n"
            + tail.decode("utf-8")
        )
        return CapturedOutput(
            text,
            True,
            self._total,
            omitted,
            self._spill_path,
            spill_bytes=self._spilled if self._spill_path is not None else 0,
            spill_capped=self._spill_capped and self._spill_path is not None,
        )

    def _open_spill(self) -> None:
        flags = (
            os.O_WRONLY
            | os.O_CREAT
            | os.O_EXCL
            | getattr(os, "O_NOFOLLOW", 0)
            | getattr(os, "O_CLOEXEC", 0)
        )
        for _ in range(5):  # a clash of 64 random bits means something odd; don't spin
            path = self._spill_dir / f"{self._prefix}{secrets.token_hex(8)}"
            try:
                fd = os.open(path, flags, 0o600)  # 0600 from birth: never chmod afterwards
            except FileExistsError:
                continue
            except OSError as exc:
                logger.warning("execute_code: cannot create output spill file: %s", exc)
                self._spill_failed(exc)
                return
            self._spill = os.fdopen(fd, "wb")
            self._spill_path = path
            return
        logger.warning("execute_code: cannot create output spill file in %s", self._spill_dir)

    def _spill_write(self, data: bytes | bytearray) -> None:
        if self._spill is None or self._spill_capped:
            return
        room = self._spill_cap - self._spilled
        if len(data) > room:
            while room > 0 and data[room] & 0xC0 == 0x80:  # never split a character
                room -= 1
            data = data[:room]
            self._spill_capped = True
        try:
            self._spill.write(data)
        except OSError as exc:
            self._drop_spill(exc)
            return
        self._spilled += len(data)

    def _spill_failed(self, exc: OSError) -> None:
        """Tell the reader that the output beyond the cap is gone (a full disk, typically)."""
        self.add_note(
            f"[The full output could not be saved to a file: {describe_os_error(exc)}; "
            "only the part shown above is kept.]"
        )

    def _drop_spill(self, exc: OSError) -> None:
        """A spill file missing part of the output would mislead; remove it instead."""
        logger.warning("execute_code: output spill file failed, discarding it: %s", exc)
        self._spill_failed(exc)
        spill, self._spill = self._spill, None
        if spill is not None:
            with contextlib.suppress(OSError):
                spill.close()
        if self._spill_path is not None:
            with contextlib.suppress(OSError):
                self._spill_path.unlink()
            self._spill_path = None
