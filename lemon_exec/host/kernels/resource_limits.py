"""Resource limits of every kernel and its descendants: memory, processes, open files.

Settings ``kernel_memory_mb``, ``kernel_max_processes`` and ``kernel_max_open_files`` (0:
unlimited). Each kernel gets its own cgroup when one can be created: cgroup v2 (``memory.max``
with ``memory.swap.max = 0``, ``pids.max``) or the v1 ``memory`` and ``pids`` hierarchies
(``memory.limit_in_bytes`` plus ``memory.memsw.limit_in_bytes`` where swap accounting exists,
``pids.max``). The cgroups sit under ``lemon-<host pid>`` in a writable parent: the host's own
cgroup (v1, or v2 when its controllers are delegated to it) or ``$LEMON_EXEC_CGROUP_PARENT``
(a delegated v2 directory, e.g. one systemd made for the user).

Everything is done from the host, after the kernel started and before any script runs: the
kernel's process tree is moved into its cgroup, and rlimits are set on it with ``prlimit``.
That works the same for cold starts, fork-server children and sandboxed (bwrap) kernels,
whose ``/sys`` may not be writable from inside. A cgroup is removed (every process in it
killed first) when its kernel stops.

Where no cgroup is writable the fallback is rlimits: ``RLIMIT_AS`` for memory (an allocation
over the limit raises ``MemoryError`` in Python) and ``RLIMIT_NPROC`` for processes, which
the Linux kernel does not enforce for root. So as root without a cgroup a process limit is
refused (:class:`LimitsUnavailable`) rather than silently not enforced. ``RLIMIT_NOFILE``
limits open files, always.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import resource
import secrets
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

from lemon_exec.errors import RefusedError
from lemon_exec.proc import supervise

log = logging.getLogger(__name__)

#: A delegated cgroup v2 directory to create kernel cgroups in (else the host's own cgroup).
PARENT_ENV = "LEMON_EXEC_CGROUP_PARENT"
#: ``0`` turns cgroups off: rlimits only (the fallback; tests use it).
CGROUPS_ENV = "LEMON_EXEC_CGROUPS"

_MB = 2**20
_KILL_ROUNDS_S = 2.0


class LimitsUnavailable(RefusedError):
    """A configured limit that neither a cgroup nor an rlimit can enforce here."""


@dataclass(frozen=True)
class LimitSpec:
    """The configured limits; 0 means unlimited."""

    memory_mb: int = 0
    max_processes: int = 0
    max_open_files: int = 0

    @property
    def any(self) -> bool:
        return bool(self.memory_mb or self.max_processes or self.max_open_files)


@dataclass
class KernelCgroup:
    """One kernel's cgroup: one directory (v2) or one per v1 hierarchy."""

    dirs: list[Path]
    memory_mb: int
    _oom_seen: int = field(default=0)

    def add(self, pid: int) -> None:
        for d in self.dirs:
            (d / "cgroup.procs").write_text(str(pid))

    def pids(self) -> set[int]:
        found: set[int] = set()
        for d in self.dirs:
            with contextlib.suppress(OSError, ValueError):
                found.update(int(p) for p in (d / "cgroup.procs").read_text().split())
        return found

    def oom_kills(self) -> int:
        """How many processes the memory limit's OOM killer killed in this cgroup so far."""
        if not self.memory_mb:
            return 0
        for d in self.dirs:
            for name in ("memory.events", "memory.oom_control"):  # v2, v1
                with contextlib.suppress(OSError, ValueError):
                    for line in (d / name).read_text().splitlines():
                        key, _, value = line.partition(" ")
                        if key == "oom_kill":
                            return int(value)
        return 0

    def memory_limit_hit(self) -> bool:
        """Whether an OOM kill happened since the last ask (the kernel's death was one)."""
        count = self.oom_kills()
        hit = count > self._oom_seen
        self._oom_seen = count
        return hit

    def remove(self) -> None:
        """Kill every process still in the cgroup, then remove it (never raises)."""
        deadline = time.monotonic() + _KILL_ROUNDS_S
        while True:
            pids = self.pids()
            if not pids or time.monotonic() > deadline:
                break
            for pid in pids:  # stop first so that none forks while the rest are killed
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGSTOP)
            for pid in pids:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.005)
        for d in self.dirs:
            _rmdir(d)


class Limiter:
    """Applies one :class:`LimitSpec` to every kernel the local backend starts."""

    def __init__(self, spec: LimitSpec) -> None:
        self.spec = spec
        self._parents: list[tuple[Path, int]] | None = None  # (host's lemon dir, version)
        self._live: list[KernelCgroup] = []

    def prepare(self) -> KernelCgroup | None:
        """A fresh cgroup for the next kernel (None: rlimits only, or nothing to limit).

        Raises :class:`LimitsUnavailable` when a limit can be enforced neither way.
        """
        spec = self.spec
        if not (spec.memory_mb or spec.max_processes):
            return None
        group = self._create()
        if group is None and spec.max_processes and os.geteuid() == 0:
            raise LimitsUnavailable(
                f"execute_code: kernel_max_processes = {spec.max_processes} cannot be enforced "
                "here: no writable cgroup with the pids controller was found, and RLIMIT_NPROC "
                "does not apply to root. Fix: run as a non-root user, give the host a writable "
                f"(delegated) cgroup v2 directory in ${PARENT_ENV}, or set kernel_max_processes "
                "= 0"
            )
        return group

    def place(self, pid: int | None, group: KernelCgroup | None) -> None:
        """Put a started kernel's process tree under the limits (before any script runs)."""
        if pid is None or not self.spec.any:
            return
        tree = [pid, *supervise.descendants(pid)]
        for p in tree:
            if group is not None:
                group.add(p)
            self._rlimits(p, cgroup=group is not None)

    def release(self, group: KernelCgroup | None) -> None:
        if group is not None:
            group.remove()
            with contextlib.suppress(ValueError):
                self._live.remove(group)

    def close(self) -> None:
        """Remove every cgroup left (their kernels are gone) and the host's lemon dirs."""
        for group in list(self._live):
            self.release(group)
        for parent, _version in self._parents or []:
            _rmdir(parent)
        self._parents = None

    # -- internals ---------------------------------------------------------------------------

    def _rlimits(self, pid: int, *, cgroup: bool) -> None:
        spec = self.spec
        limits: list[tuple[int, int]] = []
        if spec.max_open_files:
            limits.append((resource.RLIMIT_NOFILE, spec.max_open_files))
        if not cgroup and spec.memory_mb:
            limits.append((resource.RLIMIT_AS, spec.memory_mb * _MB))
        if not cgroup and spec.max_processes and os.geteuid() != 0:
            # Per real uid: processes the user already runs count too (documented).
            limits.append((resource.RLIMIT_NPROC, spec.max_processes))
        for which, value in limits:
            try:
                resource.prlimit(pid, which, (value, value))
            except ProcessLookupError:
                return
            except (OSError, ValueError) as exc:  # e.g. above the hard limit, as non-root
                raise LimitsUnavailable(
                    f"execute_code: could not set a kernel resource limit ({exc})"
                ) from exc

    def _create(self) -> KernelCgroup | None:
        if self._parents is None:
            self._parents = self._find_parents()
        if not self._parents:
            return None
        name = f"k-{secrets.token_hex(6)}"
        made: list[Path] = []
        try:
            for parent, version in self._parents:
                d = parent / name
                d.mkdir()
                made.append(d)
                _configure(d, version, self.spec)
        except OSError as exc:
            for d in made:
                _rmdir(d)
            log.warning("execute_code: could not create a kernel cgroup: %s", exc)
            return None
        group = KernelCgroup(made, self.spec.memory_mb)
        self._live.append(group)
        return group

    def _find_parents(self) -> list[tuple[Path, int]]:
        if os.environ.get(CGROUPS_ENV, "1") == "0":
            return []
        needed = {
            c for c, n in (("memory", self.spec.memory_mb), ("pids", self.spec.max_processes)) if n
        }
        explicit = os.environ.get(PARENT_ENV)
        v2 = [Path(explicit)] if explicit else _v2_candidates()
        for base in v2:
            found = _make_lemon_dir(base, needed, version=2)
            if found is not None:
                return [found]
        if explicit:
            log.warning(
                "execute_code: %s=%s is not a usable cgroup v2 directory", PARENT_ENV, explicit
            )
        made: list[tuple[Path, int]] = []
        for controller in sorted(needed):  # v1: one hierarchy per controller
            v1_base = _v1_base(controller)
            found = _make_lemon_dir(v1_base, {controller}, version=1) if v1_base else None
            if found is None:
                for d, _version in made:
                    _rmdir(d)
                return []
            made.append(found)
        return made


def _configure(d: Path, version: int, spec: LimitSpec) -> None:
    if version == 2:
        if spec.memory_mb:
            (d / "memory.max").write_text(str(spec.memory_mb * _MB))
            with contextlib.suppress(OSError):  # no swap accounting: nothing to swap to
                (d / "memory.swap.max").write_text("0")
        if spec.max_processes:
            (d / "pids.max").write_text(str(spec.max_processes))
        return
    # v1: each hierarchy gets the limit of its own controller; one mounted with both has both.
    if spec.memory_mb and (d / "memory.limit_in_bytes").exists():
        (d / "memory.limit_in_bytes").write_text(str(spec.memory_mb * _MB))
        with contextlib.suppress(OSError):  # memsw exists only with swap accounting
            (d / "memory.memsw.limit_in_bytes").write_text(str(spec.memory_mb * _MB))
    if spec.max_processes and (d / "pids.max").exists():
        (d / "pids.max").write_text(str(spec.max_processes))


def _make_lemon_dir(base: Path, needed: set[str], *, version: int) -> tuple[Path, int] | None:
    """``base/lemon-<host pid>``, usable for ``needed`` controllers, or None."""
    try:
        if version == 2:
            controllers = set((base / "cgroup.controllers").read_text().split())
            if not needed <= controllers:
                return None
        enable = " ".join(f"+{c}" for c in sorted(needed))
        if version == 2:  # fails (EBUSY) when base holds processes and enabled none yet
            with contextlib.suppress(OSError):
                (base / "cgroup.subtree_control").write_text(enable)
        d = base / f"lemon-{os.getpid()}"
        d.mkdir(exist_ok=True)
        if version == 2:  # enable the controllers for the kernels' cgroups below it
            try:
                (d / "cgroup.subtree_control").write_text(enable)
            except OSError:
                _rmdir(d)
                raise
        if not os.access(d / "cgroup.procs", os.W_OK):
            _rmdir(d)
            return None
        _sweep_dead_hosts(base)
        return d, version
    except OSError:
        return None


def _sweep_dead_hosts(base: Path) -> None:
    """Remove empty ``lemon-<pid>`` dirs of hosts that are gone (best effort)."""
    with contextlib.suppress(OSError):
        for d in base.glob("lemon-*"):
            pid = d.name[len("lemon-") :]
            if pid.isdigit() and int(pid) != os.getpid() and not supervise.running(int(pid)):
                for child in d.glob("k-*"):
                    KernelCgroup([child], 0).remove()
                _rmdir(d)


def _self_cgroups() -> dict[str, str]:
    """This process's cgroup path per v1 controller, and ``""`` for v2."""
    paths: dict[str, str] = {}
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _hid, controllers, path = line.split(":", 2)
            for c in controllers.split(",") if controllers else [""]:
                paths[c] = path
    return paths


def _mounts(fstype: str) -> list[tuple[Path, set[str]]]:
    found: list[tuple[Path, set[str]]] = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mounts").read_text().splitlines():
            parts = line.split()
            if len(parts) >= 4 and parts[2] == fstype:
                found.append((Path(parts[1]), set(parts[3].split(","))))
    return found


def _v2_candidates() -> list[Path]:
    path = _self_cgroups().get("")
    if path is None:
        return []
    return [mount / path.lstrip("/") for mount, _opts in _mounts("cgroup2")]


def _v1_base(controller: str) -> Path | None:
    path = _self_cgroups().get(controller)
    if path is None:
        return None
    for mount, opts in _mounts("cgroup"):
        if controller in opts:
            return mount / path.lstrip("/")
    return None


def _rmdir(d: Path) -> None:
    for _ in range(50):
        try:
            d.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError as exc:
            if exc.errno != errno.EBUSY:
                log.debug("could not remove cgroup %s: %s", d, exc)
                return
            time.sleep(0.01)  # the last processes are still exiting


__all__ = ["CGROUPS_ENV", "PARENT_ENV", "KernelCgroup", "LimitSpec", "Limiter", "LimitsUnavailable"]
