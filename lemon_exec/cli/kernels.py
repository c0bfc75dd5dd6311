"""``lemon-exec kernels`` and ``lemon-exec attach``: find and open live lemon_exec kernels.

Every running lemon_exec host keeps an index of its live kernels (``kernels.json``, mode
0600, in its private 0700 staging root; see :mod:`lemon_exec.host.disk.index`). ``kernels``
lists the rows of every host of the current OS user; ``attach ID`` replaces this process
with ``jupyter console --existing CONNECTION_FILE`` on one of them (a unique prefix of the
id is enough). See ``docs/inspection.md``.

Exit status: 0 on success, 1 when no kernel matches (or several do), 2 for usage errors.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import sys
import time
from collections.abc import Sequence
from typing import Any

from lemon_exec.host.disk.index import read_indexes

__all__ = ["attach_command", "find_kernel", "kernel_rows", "kernels_command", "register"]

EXIT_OK = 0
EXIT_NOT_FOUND = 1
EXIT_USAGE = 2

_COLUMNS = ("ID", "MODE", "PHASE", "AGE", "IDLE", "CELLS", "HOST PID", "CONNECTION FILE")


def register(subparsers: Any) -> None:
    """Add the ``kernels`` and ``attach`` subcommands."""
    listing = subparsers.add_parser(
        "kernels",
        help="list the live kernels of running lemon_exec hosts",
        description=(
            "List the live kernels of every running lemon_exec host of the current user: "
            "opaque id, mode, phase, age, idle time, cells run, host PID and connection "
            "file. Open one with `lemon-exec attach ID`."
        ),
    )
    listing.add_argument(
        "--json", action="store_true", dest="as_json", help="print a JSON array instead of a table"
    )
    _add_tmpdir(listing)
    listing.set_defaults(func=kernels_command)

    attach = subparsers.add_parser(
        "attach",
        help="open a Jupyter console on a live kernel",
        description=(
            "Replace this process with `jupyter console --existing CONNECTION_FILE` on the "
            "kernel whose id starts with ID. Your executions there are ordinary IPython "
            "cells: they see the agent's variables, and they never appear in the agent's "
            "results. Leave with Ctrl-D, `exit` or `quit`: a kernel a lemon_exec host manages "
            "keeps running (it ignores exit and refuses shutdown requests)."
        ),
    )
    attach.add_argument("kernel_id", metavar="ID", help="a kernel id, or a unique prefix of one")
    attach.add_argument(
        "--print",
        action="store_true",
        dest="print_only",
        help="only print the command (and the connection file), do not run it",
    )
    attach.add_argument(
        "--qtconsole",
        action="store_true",
        help="open `jupyter qtconsole` instead of `jupyter console`",
    )
    _add_tmpdir(attach)
    attach.set_defaults(func=attach_command)


def _add_tmpdir(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--tmpdir",
        metavar="DIR",
        default=None,
        help="where the hosts' staging roots live (default: the temp dir, $TMPDIR or /tmp)",
    )


# --- listing -------------------------------------------------------------------------------------


def kernel_rows(base: str | None = None, *, now: float | None = None) -> list[dict[str, Any]]:
    """The live kernels of this user's running hosts, oldest first, with ages in seconds."""
    now = time.time() if now is None else now
    rows = []
    for raw in read_indexes(base):
        started = _number(raw.get("started_unix"), now)
        last_used = _number(raw.get("last_used_unix"), started)
        rows.append(
            {
                "id": str(raw.get("public_id", "")),
                "mode": str(raw.get("mode", "")),
                "phase": str(raw.get("phase", "")),
                "age_s": round(max(0.0, now - started), 1),
                "idle_s": round(max(0.0, now - last_used), 1),
                "cells": int(_number(raw.get("cells"), 0)),
                "host_pid": raw.get("host_pid"),
                "connection_file": str(raw.get("connection_file", "")),
                "started_unix": started,
                "last_used_unix": last_used,
            }
        )
    rows.sort(key=lambda r: (r["started_unix"], r["id"]))
    return rows


def _number(value: Any, default: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return default
    return float(value)


def format_duration(seconds: float) -> str:
    """``42s``, ``3m05s``, ``2h07m``, ``1d04h``."""
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def format_table(rows: Sequence[dict[str, Any]]) -> str:
    """The rows as an aligned text table (the last column is left unpadded)."""
    cells = [list(_COLUMNS)]
    for r in rows:
        cells.append(
            [
                r["id"],
                r["mode"],
                r["phase"],
                format_duration(r["age_s"]),
                format_duration(r["idle_s"]),
                str(r["cells"]),
                str(r["host_pid"]),
                r["connection_file"],
            ]
        )
    widths = [max(len(line[i]) for line in cells) for i in range(len(_COLUMNS) - 1)]
    return "\n".join(
        "  ".join(value.ljust(width) for value, width in zip(line, widths, strict=False))
        + "  "
        + line[-1]
        for line in cells
    )


def kernels_command(args: argparse.Namespace) -> int:
    """Print the live kernels as a table or as JSON."""
    rows = kernel_rows(args.tmpdir)
    if args.as_json:
        print(json.dumps(rows, indent=2))
    elif not rows:
        print(
            f"no live lemon_exec kernels (of this user, under {args.tmpdir or 'the temp dir'})",
            file=sys.stderr,
        )
    else:
        print(format_table(rows))
    return EXIT_OK


# --- attaching -----------------------------------------------------------------------------------


class KernelLookupError(LookupError):
    """No kernel, or more than one, matches the id prefix."""


def find_kernel(prefix: str, rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The one row whose id is ``prefix`` or starts with it."""
    prefix = prefix.strip()
    if not prefix:
        raise KernelLookupError("an empty id matches nothing")
    exact = [r for r in rows if r["id"] == prefix]
    if len(exact) == 1:
        return exact[0]
    matches = [r for r in rows if r["id"].startswith(prefix)]
    if not matches:
        known = ", ".join(r["id"] for r in rows) or "none are running"
        raise KernelLookupError(f"no live kernel id starts with {prefix!r} (live: {known})")
    if len(matches) > 1:
        raise KernelLookupError(
            f"{prefix!r} matches {len(matches)} kernels ("
            + ", ".join(r["id"] for r in matches)
            + "); give more of the id"
        )
    return matches[0]


def console_command(connection_file: str, *, qtconsole: bool = False) -> list[str]:
    """The argv that opens a Jupyter console on ``connection_file``."""
    app = "qtconsole" if qtconsole else "console"
    jupyter = shutil.which("jupyter")
    base = [jupyter] if jupyter else [sys.executable, "-m", "jupyter"]
    return [*base, app, "--existing", connection_file]


def attach_command(args: argparse.Namespace) -> int:
    """Exec ``jupyter console --existing`` on the kernel ``args.kernel_id`` names."""
    try:
        row = find_kernel(args.kernel_id, kernel_rows(args.tmpdir))
    except KernelLookupError as exc:
        print(f"lemon-exec attach: {exc}", file=sys.stderr)
        return EXIT_NOT_FOUND
    connection_file = row["connection_file"]
    if not os.path.isfile(connection_file):
        print(
            f"lemon-exec attach: the connection file of kernel {row['id']} is gone "
            f"({connection_file}); the kernel has probably just stopped",
            file=sys.stderr,
        )
        return EXIT_NOT_FOUND
    argv = console_command(connection_file, qtconsole=args.qtconsole)
    if args.print_only:
        print(shlex.join(argv))
        return EXIT_OK
    print(
        f"Attaching to kernel {row['id']} ({row['mode']}, {row['phase']}, "
        f"{row['cells']} cells run).",
        file=sys.stderr,
    )
    if row["mode"] != "session":
        print("Note: this is a per-call kernel; it is stopped when its call ends.", file=sys.stderr)
    print(
        "Leave with Ctrl-D, `exit` or `quit`. The kernel belongs to the agent's session: "
        "it keeps running, with its state.",
        file=sys.stderr,
    )
    sys.stderr.flush()
    sys.stdout.flush()
    try:
        os.execvp(argv[0], argv)
    except OSError as exc:
        print(
            f"lemon-exec attach: cannot run {argv[0]}: {exc}; install jupyter_console "
            f"or run: {shlex.join(argv)}",
            file=sys.stderr,
        )
        return EXIT_USAGE
    return EXIT_OK  # pragma: no cover - execvp does not return
