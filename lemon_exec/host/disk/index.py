"""The live-kernel index: a 0600 ``kernels.json`` in the host's private staging root.

``lemon-exec kernels`` reads the indexes of running hosts so a person can find a kernel and
attach to it with Jupyter tools. Only the same OS user can read them (the root is 0700), and
a row holds an opaque id, never a session key, code or output. The index is rewritten at most
every 0.2 s, off the hot path, and written on the host's disk worker
(:mod:`lemon_exec.host.disk.worker`), off the event loop.

It also records the host's and its kernel-side processes' PIDs with their start times, so
that if the host is killed and its processes somehow survive it, the next host start can
kill exactly them (:func:`lemon_exec.host.disk.hygiene.sweep_dead_hosts`), never a reused PID,
and delete the connection files the rows name without walking the root.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from lemon_exec._constants import STAGING_ROOT_PREFIX
from lemon_exec.host.disk.worker import DiskWorker
from lemon_exec.proc import supervise
from lemon_exec.proc.host_teardown import INDEX_NAME
from lemon_exec.template.client import servers

_WRITE_DELAY_S = 0.2


@dataclass
class KernelStatus:
    """What the index shows of one kernel; updated by whoever drives it."""

    public_id: str
    mode: str  # per_call | session
    phase: str  # spare | starting | idle | running | stopping
    connection_file: str
    started_unix: float = field(default_factory=time.time)
    last_used_unix: float = field(default_factory=time.time)
    cells: int = 0
    pid: int = 0  # the kernel process, once known


class KernelIndex:
    """The index of one host; rewritten on its disk worker (``disk``), or inline without one."""

    def __init__(
        self,
        root: Path,
        rows: Callable[[], Iterable[KernelStatus]],
        disk: DiskWorker | None = None,
    ) -> None:
        self.path = root / INDEX_NAME
        self._root = root
        self._rows = rows
        self._disk = disk
        self._handle: asyncio.TimerHandle | None = None
        self._host_start = supervise.start_time(os.getpid())

    def touch(self) -> None:
        """Schedule a rewrite (coalesced)."""
        if self._handle is None:
            loop = asyncio.get_running_loop()
            self._handle = loop.call_later(_WRITE_DELAY_S, self.write_now)

    def write_now(self) -> None:
        """Rewrite the index from the rows as they are now (the file work on the worker)."""
        self._handle = None
        rows = [asdict(r) for r in self._rows()]
        pids = [r["pid"] for r in rows], _templates_under(self._root)
        if self._disk is not None:
            self._disk.later(self._write, rows, pids)
        else:
            self._write(rows, pids)

    def _write(self, rows: list[dict[str, Any]], pids: tuple[list[int], list[int]]) -> None:
        data = json.dumps(
            {
                "pid": os.getpid(),
                "host_start": self._host_start,
                "written_unix": time.time(),
                "kernels": rows,
                "processes": _processes(*pids),
            }
        )
        tmp = self.path.with_name(f".{INDEX_NAME}.{os.getpid()}.tmp")
        with contextlib.suppress(OSError):
            fd = os.open(
                tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
            )
            with os.fdopen(fd, "w") as fh:
                fh.write(data)
            os.replace(tmp, self.path)

    def close(self) -> None:
        """No more rewrites (one already queued on the worker ends before the root goes)."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None


def _processes(*pid_lists: Iterable[int]) -> list[dict[str, int]]:
    """``{"pid", "start"}`` of each running process named (one /proc read each)."""
    found: list[dict[str, int]] = []
    for pids in pid_lists:
        for pid in pids:
            started = supervise.start_time(pid) if pid else None
            if started is not None:
                found.append({"pid": pid, "start": started})
    return found


def _templates_under(root: Path) -> list[int]:
    """The fork-server templates this process runs for the staging root ``root``."""
    return [s.pid for s in servers() if s.pid and Path(s.cwd).parent == root]


def read_indexes(base: str | os.PathLike[str] | None = None) -> list[dict[str, Any]]:
    """Rows of every live host of this user under ``base`` (default: the temp dir)."""
    base_path = Path(base if base is not None else tempfile.gettempdir())
    rows: list[dict[str, Any]] = []
    try:
        candidates = sorted(base_path.glob(f"{STAGING_ROOT_PREFIX}*"))
    except OSError:
        return rows
    for root in candidates:
        index = root / INDEX_NAME
        try:
            st = os.lstat(index)
            if st.st_uid != os.getuid() or (st.st_mode & 0o777) != 0o600:
                continue
            with open(index, encoding="utf-8") as fh:
                data = json.load(fh)
            pid = int(data["pid"])
            os.kill(pid, 0)
        except (OSError, ValueError, KeyError, TypeError):
            continue  # unreadable, not ours, or its host is gone
        for row in data.get("kernels", []):
            if isinstance(row, dict):
                rows.append({**row, "host_pid": pid})
    return rows
