"""Tests for lemon_exec.host.cell.output: sanitizing and bounded capture with spill files."""

from __future__ import annotations

import os
import stat
import tracemalloc
from pathlib import Path

import pytest

from lemon_exec.host.cell.output import (
    CapturedOutput,
    OutputCapture,
    format_truncated_output,
    sanitize,
)

pytestmark = pytest.mark.timeout(60)

PREFIX = "lemon-exec-output-"


def capture_all(max_bytes: int, spill_dir: Path, *chunks: str) -> CapturedOutput:
    capture = OutputCapture(max_bytes, spill_dir)
    for chunk in chunks:
        capture.write(chunk)
    return capture.finish()


def spill_files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.iterdir() if p.name.startswith(PREFIX))


# --- sanitize -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "clean"),
    [
        ("plain text\n\tindented", "plain text\n\tindented"),
        ("\x1b[31mred\x1b[0m and \x1b[1;38;5;208mbold\x1b[m", "red and bold"),
        ("\x1b[2K\x1b[1Aup", "up"),  # erase line, cursor up
        ("\x1b[?25lhidden cursor\x1b[?25h", "hidden cursor"),
        ("\x1b]0;window title\x07after", "after"),  # OSC ended by BEL
        ("\x1b]2;title\x1b\\after", "after"),  # OSC ended by ST
        ("\x1b]8;;https://example.com\x1b\\link\x1b]8;;\x1b\\", "link"),  # hyperlink
        ("\x1bPq#0;2;0;0;0\x1b\\sixel gone", "sixel gone"),  # DCS
        ("\x1b7saved\x1b8", "saved"),  # two-character ESC sequences
        ("\x1b(Bcharset", "charset"),  # ESC with an intermediate byte
        ("lone escape\x1b", "lone escape"),
        ("a\x00b\x07c\x08d\x0be\x0cf\x1fg", "abcdefg"),  # C0 controls
        ("del\x7fete", "delete"),
        ("c1\x80\x85\x9b\x9fend", "c1end"),  # C1 controls
        ("caf\u00e9 \u00a0 \u4e2d\u6587 \U0001f600", "caf\u00e9 \u00a0 \u4e2d\u6587 \U0001f600"),
        ("lone \ud800 and \udfff", "lone \ufffd and \ufffd"),
    ],
)
def test_sanitize(raw: str, clean: str) -> None:
    assert sanitize(raw) == clean


@pytest.mark.parametrize(
    ("raw", "clean"),
    [
        ("a\r\nb\r\n", "a\nb\n"),
        ("progress 10%\rprogress 20%\r", "progress 10%\nprogress 20%\n"),
        ("a\r\rb", "a\n\nb"),
        ("line\r\x1b[K\n", "line\n"),  # erase-line between \r and \n: still one newline
    ],
)
def test_carriage_returns(raw: str, clean: str) -> None:
    assert sanitize(raw) == clean


def every_split(text: str) -> list[list[str]]:
    return [[text[:i], text[i:]] for i in range(len(text) + 1)]


@pytest.mark.parametrize(
    "text",
    [
        "red: \x1b[1;31mALERT\x1b[0m done\n",
        "title \x1b]0;some title\x07 after\r\n",
        "st \x1b]8;;http://x\x1b\\link\x1b]8;;\x1b\\ end",
        "cr\r\nlf and cr\r end\r",
        "charset \x1b(B x \x1b7 y",
    ],
)
def test_escape_split_across_chunks(tmp_path: Path, text: str) -> None:
    expected = sanitize(text)
    for chunks in every_split(text):
        assert capture_all(10_000, tmp_path, *chunks).text == expected, chunks
    one_char_chunks = list(text)
    assert capture_all(10_000, tmp_path, *one_char_chunks).text == expected


def test_unterminated_osc_does_not_hold_output_forever(tmp_path: Path) -> None:
    capture = OutputCapture(1_000_000, tmp_path)
    capture.write("before \x1b]0;")
    for _ in range(10):
        capture.write("y" * 1000)
    result = capture.finish()
    assert result.text.startswith("before ")
    assert "y" * 1000 in result.text  # past the carry limit the rest shows as text


# --- capture without truncation --------------------------------------------------------------


def test_small_output_is_kept_whole(tmp_path: Path) -> None:
    result = capture_all(100, tmp_path, "hello ", "\x1b[32mworld\x1b[0m\n")
    assert result == CapturedOutput("hello world\n", False, 12, 0, None)
    assert spill_files(tmp_path) == []
    assert format_truncated_output(result) == "hello world\n"


def test_empty_output(tmp_path: Path) -> None:
    assert capture_all(10, tmp_path) == CapturedOutput("", False, 0, 0, None)


def test_exactly_max_bytes_is_not_truncated(tmp_path: Path) -> None:
    result = capture_all(1000, tmp_path, "x" * 600, "y" * 400)
    assert not result.truncated
    assert result.text == "x" * 600 + "y" * 400
    assert result.total_bytes == 1000
    assert spill_files(tmp_path) == []


def test_one_byte_over_is_truncated(tmp_path: Path) -> None:
    result = capture_all(1000, tmp_path, "x" * 1001)
    assert result.truncated
    assert result.total_bytes == 1001
    assert result.omitted_bytes == 1
    assert result.text == "x" * 400 + "\n... [1 bytes truncated] ...\n" + "x" * 600


def test_total_counts_sanitized_bytes(tmp_path: Path) -> None:
    result = capture_all(1000, tmp_path, "\x1b[31m" * 100 + "é")
    assert result.total_bytes == 2
    assert not result.truncated


# --- truncation -------------------------------------------------------------------------------


def numbered_lines(count: int) -> str:
    return "".join(f"line {i:06d}\n" for i in range(count))  # 12 bytes a line


def test_head_and_tail_split_40_60(tmp_path: Path) -> None:
    text = numbered_lines(10_000)  # 120,000 bytes
    result = capture_all(50_000, tmp_path, text)
    head, marker_and_tail = result.text.split("\n... [", 1)
    count, tail = marker_and_tail.split(" bytes truncated] ...\n", 1)
    assert len(head.encode()) == 20_000
    assert len(tail.encode()) == 30_000
    assert text.startswith(head)
    assert text.endswith(tail)
    assert int(count) == 120_000 - 50_000 == result.omitted_bytes
    assert result.total_bytes == 120_000


def test_marker_counts_exactly_what_is_missing(tmp_path: Path) -> None:
    chunks = [f"chunk {i} " * (i % 7 + 1) + "\n" for i in range(3000)]
    text = "".join(chunks)
    result = capture_all(5000, tmp_path, *chunks)
    marker = f"\n... [{result.omitted_bytes} bytes truncated] ...\n"
    head, tail = result.text.split(marker)
    assert len(head.encode()) + result.omitted_bytes + len(tail.encode()) == len(text.encode())
    assert text.startswith(head) and text.endswith(tail)


@pytest.mark.parametrize("char", ["é", "中", "\U0001f600"])
@pytest.mark.parametrize("max_bytes", [10, 11, 12, 13, 100, 101, 1001])
def test_multibyte_characters_are_never_split(tmp_path: Path, char: str, max_bytes: int) -> None:
    text = "a" + char * 1000
    result = capture_all(max_bytes, tmp_path, *[text[i : i + 7] for i in range(0, len(text), 7)])
    assert result.truncated
    marker = f"\n... [{result.omitted_bytes} bytes truncated] ...\n"
    head, tail = result.text.split(marker)
    assert "\ufffd" not in result.text
    assert len(head.encode()) <= max_bytes * 2 // 5
    assert len(tail.encode()) <= max_bytes - max_bytes * 2 // 5
    assert set(tail) <= {char}
    assert text.startswith(head) and text.endswith(tail)
    total = len(text.encode())
    assert len(head.encode()) + result.omitted_bytes + len(tail.encode()) == total


# --- spill files ------------------------------------------------------------------------------


def test_spill_file_is_private_and_holds_everything(tmp_path: Path) -> None:
    raw_chunks = [f"\x1b[3{i % 8}mrow {i}\x1b[0m\r\n" for i in range(2000)]
    result = capture_all(1000, tmp_path, *raw_chunks)
    assert result.spill_path is not None
    assert result.spill_path.parent == tmp_path
    assert result.spill_path.name.startswith(PREFIX)
    assert len(result.spill_path.name) > len(PREFIX) + 8  # a random token follows
    st = os.lstat(result.spill_path)
    assert stat.S_ISREG(st.st_mode)
    assert stat.S_IMODE(st.st_mode) == 0o600
    whole = sanitize("".join(raw_chunks))
    assert result.spill_path.read_text(encoding="utf-8") == whole
    assert result.total_bytes == len(whole.encode())
    assert spill_files(tmp_path) == [result.spill_path]


def test_spill_file_created_lazily_only_at_overflow(tmp_path: Path) -> None:
    capture = OutputCapture(100, tmp_path)
    capture.write("x" * 100)
    assert spill_files(tmp_path) == []
    capture.write("y")
    assert len(spill_files(tmp_path)) == 1
    result = capture.finish()
    assert result.spill_path is not None
    assert result.spill_path.read_text() == "x" * 100 + "y"


def test_spill_file_mode_ignores_a_permissive_umask(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        result = capture_all(10, tmp_path, "z" * 50)
    finally:
        os.umask(old)
    assert result.spill_path is not None
    assert stat.S_IMODE(os.stat(result.spill_path).st_mode) == 0o600


def test_capture_goes_on_without_a_spill_dir(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    result = capture_all(10, tmp_path / "missing", "q" * 50)
    assert result.truncated
    assert result.spill_path is None
    assert result.text == (
        "qqqq\n... [40 bytes truncated] ...\nqqqqqq\n[The full output could not be saved to a "
        "file: No such file or directory (ENOENT); only the part shown above is kept.]"
    )
    assert "spill" in caplog.text
    assert format_truncated_output(result) == result.text


def test_format_truncated_output_names_the_spill_file(tmp_path: Path) -> None:
    result = capture_all(10, tmp_path, "w" * 50)
    assert format_truncated_output(result) == (
        f"{result.text}\n[Full output saved to: {result.spill_path}]"
    )
    ends_in_newline = CapturedOutput("a\n", True, 9, 7, Path("/x/y"))
    assert format_truncated_output(ends_in_newline) == "a\n[Full output saved to: /x/y]"


def test_write_after_finish_is_an_error(tmp_path: Path) -> None:
    capture = OutputCapture(10, tmp_path)
    first = capture.finish()
    assert capture.finish() is first
    with pytest.raises(RuntimeError):
        capture.write("late")


def test_context_manager_closes_and_keeps_the_spill(tmp_path: Path) -> None:
    with OutputCapture(10, tmp_path) as capture:
        capture.write("v" * 30 + "\r")
    (spill,) = spill_files(tmp_path)
    assert spill.read_text() == "v" * 30 + "\n"  # the held-back \r was flushed on close
    assert capture.finish().spill_path == spill


def test_max_bytes_must_be_positive(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        OutputCapture(0, tmp_path)


# --- large outputs ------------------------------------------------------------------------------


def test_five_megabytes(tmp_path: Path) -> None:
    text = numbered_lines(5 * 1024 * 1024 // 12)
    result = capture_all(50_000, tmp_path, text)
    assert result.truncated
    assert len(result.text.encode()) < 50_000 + 100
    assert result.total_bytes == len(text)
    assert result.spill_path is not None
    assert result.spill_path.stat().st_size == len(text)
    assert result.text.endswith(text[-1200:])


@pytest.mark.slow
def test_hundred_megabytes_in_chunks_keeps_memory_bounded(tmp_path: Path) -> None:
    # 64,000 clean bytes a chunk, with colour codes to strip and one split across chunks.
    chunk = "\x1b[0m" + ("0123456789abcdef" * 40 + "\x1b[1;31m") * 100 + "\x1b["
    chunk_count = 100 * 1024 * 1024 // 64_000 + 1
    capture = OutputCapture(50_000, tmp_path)
    tracemalloc.start()
    try:
        for _ in range(chunk_count):
            capture.write(chunk)
        result = capture.finish()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 3 * 1024 * 1024, peak
    assert result.total_bytes == chunk_count * 64_000
    assert result.omitted_bytes == result.total_bytes - 50_000
    assert result.spill_path is not None
    # The spill file stops at the default max_spill_bytes (64 MiB); the rest is only counted.
    assert result.spill_capped
    assert result.spill_path.stat().st_size == result.spill_bytes == 64 * 1024 * 1024
