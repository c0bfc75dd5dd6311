"""Process memory from /proc: RSS, PSS and USS of a process and its descendants."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Sequence
from pathlib import Path


def rss_kib(pid: int | str = "self") -> int:
    """VmRSS of a process in KiB (0 when it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


def hwm_kib() -> int:
    """VmHWM (peak RSS) of this process in KiB."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return 0


def descendants(pid: int) -> list[int]:
    """``pid``'s children, grandchildren, ... (from /proc/PID/task/*/children)."""
    found: list[int] = []
    stack = [pid]
    while stack:
        current = stack.pop()
        task_dir = Path(f"/proc/{current}/task")
        with contextlib.suppress(OSError):
            for task in task_dir.iterdir():
                with contextlib.suppress(OSError, ValueError):
                    for child in (task / "children").read_text().split():
                        found.append(int(child))
                        stack.append(int(child))
    return found


def parent_pid(pid: int) -> int:
    """``pid``'s parent (from /proc/PID/stat)."""
    with open(f"/proc/{pid}/stat") as stat:
        return int(stat.read().rpartition(")")[2].split()[1])


def tree_rss_mib(pid: int) -> tuple[float, int]:
    """RSS of ``pid`` plus all its descendants in MiB, and how many processes that was."""
    pids = [pid, *descendants(pid)]
    return sum(rss_kib(p) for p in pids) / 1024, len(pids)


def tree_pss_uss_mib(pid: int) -> tuple[float, float] | None:
    """PSS and USS (private pages) of ``pid`` plus descendants in MiB, from smaps_rollup.

    A forked kernel shares its parent's pages copy-on-write; RSS counts them whole in every
    process, PSS divides them among the sharers and USS leaves them out.
    """
    pss = uss = 0
    for p in [pid, *descendants(pid)]:
        found = pss_uss_kib(p)
        if found is None:
            return None
        pss += found[0]
        uss += found[1]
    return pss / 1024, uss / 1024


def pss_uss_kib(pid: int) -> tuple[int, int] | None:
    """PSS and USS (Private_Clean + Private_Dirty) of one process in KiB, from smaps_rollup."""
    pss = uss = 0
    try:
        with open(f"/proc/{pid}/smaps_rollup") as fh:
            for line in fh:
                key, _, rest = line.partition(":")
                if key == "Pss":
                    pss += int(rest.split()[0])
                elif key in ("Private_Clean", "Private_Dirty"):
                    uss += int(rest.split()[0])
    except (OSError, ValueError):
        return None
    return pss, uss


def cmdline(pid: int) -> str:
    """A process's command line, shortened (empty when it is gone)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return ""
    return " ".join(part.decode(errors="replace") for part in raw.split(b"\0") if part)[:120]


class RssSampler:
    """Samples this process's VmRSS every ``interval`` seconds on a thread; keeps the peak."""

    def __init__(self, interval: float = 0.02) -> None:
        self.interval = interval
        self.peak_kib = rss_kib()
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.peak_kib = max(self.peak_kib, rss_kib())
            self.samples += 1

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak_kib = max(self.peak_kib, rss_kib())


def pss_uss_of(pids: Sequence[int]) -> tuple[float, float]:
    """Summed PSS and USS in MiB of ``pids`` (each with its descendants); gone ones count 0."""
    pss = uss = 0.0
    for pid in pids:
        found = tree_pss_uss_mib(pid)
        if found is not None:
            pss += found[0]
            uss += found[1]
    return pss, uss


def pss_uss_of_single(pids: Sequence[int]) -> tuple[float, float]:
    """Summed PSS and USS in MiB of exactly ``pids`` (no descendants; gone ones count 0)."""
    found = [pss_uss_kib(p) for p in pids]
    return (
        sum(f[0] for f in found if f) / 1024,
        sum(f[1] for f in found if f) / 1024,
    )
