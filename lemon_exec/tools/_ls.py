"""``ls(path='.')``: one directory's entries."""

from __future__ import annotations

import os
import stat
from typing import Any

from lemon_exec.errors import ToolFailure

from ._paths import name_for, resolve, stat_or_fail
from ._types import ToolCall, ToolSpec

__all__ = ["MAX_ENTRIES", "ls", "spec"]

#: Entries returned by one call; more are cut with a note.
MAX_ENTRIES = 1000

DESCRIPTION = f"""\
List a directory (default: the working directory): entry names sorted, hidden ones included,
directories (and symlinks to directories) with a trailing `/`, one per line; "" for an empty
directory. At most {MAX_ENTRIES} entries, then a `[truncated: ...]` note. A path that is not a
directory raises ToolError (use read() for files)."""


def spec() -> ToolSpec:
    """The registry entry for ``ls``."""
    return ToolSpec(
        name="ls",
        func=ls,
        description=DESCRIPTION,
        parameters=("path",),
        required=(),
        param_types={"path": str},
        defaults={"path": "."},
    )


def ls(params: dict[str, Any], call: ToolCall) -> str:
    """List ``params['path']`` (sync: the host runs it in a thread)."""
    raw: str = "." if params.get("path") is None else params["path"]
    path = resolve(raw, call.cwd)
    st = stat_or_fail("ls", raw, path)
    if not stat.S_ISDIR(st.st_mode):
        # An error rather than echoing the name: a model that ls()-es a file wants read().
        raise ToolFailure(f"ls: {name_for(raw, path)} is not a directory; use read({raw!r})")
    try:
        with os.scandir(path) as it:
            entries = sorted(it, key=lambda e: e.name)
    except PermissionError:
        raise ToolFailure(f"ls: permission denied: {name_for(raw, path)}") from None
    except OSError as e:
        raise ToolFailure(f"ls: cannot list {name_for(raw, path)}: {e.strerror}") from None
    names = [_label(e) for e in entries[:MAX_ENTRIES]]
    if len(entries) > MAX_ENTRIES:
        names.append(f"[truncated: showing {MAX_ENTRIES} of {len(entries)} entries]")
    return "\n".join(names)


def _label(entry: os.DirEntry[str]) -> str:
    try:
        is_dir = entry.is_dir()  # follows symlinks: you can ls() into a link to a directory
    except OSError:
        is_dir = False
    return entry.name + "/" if is_dir else entry.name
