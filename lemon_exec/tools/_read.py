"""``read(path, offset=None, limit=None)``: a text file's contents."""

from __future__ import annotations

import stat
from typing import Any

from lemon_exec.errors import ToolFailure

from ._paths import BINARY_SNIFF_BYTES, is_binary_bytes, name_for, resolve, stat_or_fail
from ._types import ToolCall, ToolSpec

__all__ = ["DEFAULT_LIMIT", "MAX_BYTES", "read", "spec"]

#: Lines returned when ``limit`` is not given.
DEFAULT_LIMIT = 2000
#: Most bytes of file content one call returns, whatever ``limit`` says (256 KiB).
MAX_BYTES = 256 * 1024

DESCRIPTION = f"""\
Return the contents of a text file, decoded as UTF-8 (undecodable bytes become U+FFFD).
`path` is relative to the working directory (`~` expands). `offset` is the 1-based line to
start at; `limit` the number of lines (default {DEFAULT_LIMIT}). At most {MAX_BYTES // 1024} KiB
is returned per call; when output is cut, a final line `[truncated: ...]` says which `offset`
continues. An offset past the end returns "". Binary files, directories and missing files
raise ToolError."""


def spec() -> ToolSpec:
    """The registry entry for ``read``."""
    return ToolSpec(
        name="read",
        func=read,
        description=DESCRIPTION,
        parameters=("path", "offset", "limit"),
        required=("path",),
        param_types={"path": str, "offset": int, "limit": int},
        defaults={"offset": None, "limit": None},
        inline=is_small_file,
        path_param="path",
    )


#: Regular files up to this size are read on the event loop (see ToolSpec.inline).
INLINE_MAX_BYTES = 64 * 1024


def is_small_file(params: Any, call: ToolCall) -> bool:
    """Whether ``read`` may run inline: a small regular file (one lstat/stat, no reading)."""
    st = resolve(params["path"], call.cwd).stat()
    return stat.S_ISREG(st.st_mode) and st.st_size <= INLINE_MAX_BYTES


def read(params: dict[str, Any], call: ToolCall) -> str:
    """Read ``params['path']`` (sync: the host runs it in a thread)."""
    raw: str = params["path"]
    offset: int = 1 if params.get("offset") is None else params["offset"]
    limit: int = DEFAULT_LIMIT if params.get("limit") is None else params["limit"]
    if offset < 1:
        raise ToolFailure(f"read: offset must be >= 1 (lines are numbered from 1), got {offset}")
    if limit < 1:
        raise ToolFailure(f"read: limit must be >= 1, got {limit}")

    # The path the policy and approval hooks saw (links resolved), when the host set it.
    path = call.resolved_path or resolve(raw, call.cwd)
    st = stat_or_fail("read", raw, path)
    if stat.S_ISDIR(st.st_mode):
        raise ToolFailure(f"read: {name_for(raw, path)} is a directory; use ls({raw!r}) to list it")
    if not stat.S_ISREG(st.st_mode):
        # FIFOs and devices could block forever or never end.
        raise ToolFailure(f"read: {name_for(raw, path)} is not a regular file")
    try:
        with open(path, "rb") as f:
            if is_binary_bytes(f.read(BINARY_SNIFF_BYTES)):
                raise ToolFailure(f"read: {name_for(raw, path)} is a binary file")
            f.seek(0)
            return _read_lines(f, raw, offset, limit)
    except PermissionError:
        raise ToolFailure(f"read: permission denied: {name_for(raw, path)}") from None
    except OSError as e:
        raise ToolFailure(f"read: cannot read {name_for(raw, path)}: {e.strerror}") from None


def _read_lines(f: Any, raw: str, offset: int, limit: int) -> str:
    """Collect ``limit`` lines from line ``offset`` on, within :data:`MAX_BYTES`."""
    lineno = 0
    # Skip to the offset without holding skipped lines (bounded chunks: a line can be huge).
    while lineno < offset - 1:
        chunk = f.readline(MAX_BYTES)
        if not chunk:
            return ""
        if chunk.endswith(b"\n"):
            lineno += 1
    out: list[bytes] = []
    size = 0
    taken = 0
    note = ""
    while taken < limit:
        line = f.readline(MAX_BYTES - size + 1)
        if not line:
            return _decode(out)
        if size + len(line) > MAX_BYTES:
            room = MAX_BYTES - size
            first = offset + taken
            if room > 0 and taken == 0:
                # A single line longer than the cap: show its head rather than nothing.
                out.append(line[:room])
                note = (
                    f"[truncated: line {first} is longer than {MAX_BYTES} bytes and was cut; "
                    f"continue with read({raw!r}, offset={first + 1})]"
                )
            else:
                note = (
                    f"[truncated: output capped at {MAX_BYTES} bytes after line {first - 1}; "
                    f"continue with read({raw!r}, offset={first})]"
                )
            break
        out.append(line)
        size += len(line)
        taken += 1
    else:
        if not f.read(1):
            return _decode(out)  # exactly `limit` lines were left: nothing was cut
        last = offset + taken - 1
        note = (
            f"[truncated: showing lines {offset}-{last}; "
            f"continue with read({raw!r}, offset={last + 1})]"
        )
    text = _decode(out)
    if text and not text.endswith("\n"):
        text += "\n"
    return text + note


def _decode(chunks: list[bytes]) -> str:
    return b"".join(chunks).decode("utf-8", errors="replace")
