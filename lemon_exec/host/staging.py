"""A private on-disk staging area for one host process.

Layout (every directory 0700, every file 0600, all owned by this user)::

    <base>/lemon-exec-<random>/     the root, one per host process
        owner                       JSON {"pid", "created", "version"}: lets later
                                    processes tell a dead owner's root from a live one
        runtime/                    kernel connection files
        spill/                      output spill files (lemon-exec-output-*)
        work/                       per-run workspaces

Anything that is not exactly as expected fails closed with ``RefusedError``. Removal is
always bounded (a script can create millions of files) and never follows symlinks (a script
can plant a link to somewhere it should not be able to make us delete). A root a script
deleted is made again by :meth:`StagingRoot.ensure`, with the same checks.

Stale roots: a root whose validated owner marker names a dead process is removed by the next
process that starts (:func:`sweep_stale_roots`), but only when it is empty: nothing but the
owner marker, the kernel index and empty known subdirectories. A non-empty stale root is
never traversed or removed; only its ``spill/`` directory is read, entry by entry, by the
spill reaper (:mod:`lemon_exec.host.reaper`), after which a later start removes it. Roots
without a readable, well-formed marker, or whose owner is alive, are never touched.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import stat
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

from lemon_exec._constants import REMOVE_TREE_MAX_ENTRIES, SPILL_PREFIX, STAGING_ROOT_PREFIX
from lemon_exec.errors import RefusedError

__all__ = [
    "OWNER_MARKER",
    "StagingRoot",
    "remove_tree",
    "staging_base",
    "sweep_stale_roots",
    "write_private_file",
]

logger = logging.getLogger(__name__)

OWNER_MARKER = "owner"
_SPILL_DIR = "spill"
#: Spill files stay readable this long, also after the process that wrote them is gone.
SPILL_MAX_AGE_S = 86_400.0
_MARKER_VERSION = 1
_MARKER_MAX_BYTES = 4096

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _NOFOLLOW | _CLOEXEC

# Deepest directory nesting remove_tree descends into; each level holds one open fd.
_MAX_DEPTH = 256
# Directory entries read per listing, so memory stays small whatever a directory holds.
_LIST_BATCH = 1024


def _refuse(reason: str) -> RefusedError:
    return RefusedError(f"execute_code: could not create a private workspace: {reason}")


def staging_base(base: Path | str | None = None) -> Path:
    """The directory staging roots go in: ``base``, else ``$TMPDIR``, else ``/tmp``; validated.

    Read from the environment on every call, never through :func:`tempfile.gettempdir`: that
    caches its answer and, when ``TMPDIR`` is unusable, silently falls back to other
    directories (``/tmp``, ``/var/tmp``, the working directory). Here an unusable directory
    fails closed with a ``RefusedError`` naming it (and ``TMPDIR`` when it came from there).
    A symlink is followed and its target validated; the resolved path is returned, so a later
    swap of the link changes nothing. An empty ``TMPDIR`` counts as unset, as in ``tempfile``.
    """
    if base is not None:
        return _check_base(Path(base), f"the staging base {base}")
    tmpdir = os.environ.get("TMPDIR", "")
    if not tmpdir:
        return _check_base(Path("/tmp"), "/tmp (TMPDIR is unset)")
    return _check_base(Path(os.path.abspath(tmpdir)), f"TMPDIR={tmpdir}")


def _check_base(path: Path, name: str) -> Path:
    """``path`` resolved, if it is a directory we may safely create private roots in."""
    fix = "; set TMPDIR to a writable directory on a local filesystem"
    try:
        resolved = Path(os.path.realpath(path))
        st = os.stat(resolved)
    except FileNotFoundError:
        raise _refuse(f"{name} does not exist{fix}") from None
    except OSError as exc:
        raise _refuse(f"{name} cannot be used ({exc.strerror or exc}){fix}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise _refuse(f"{name} is not a directory{fix}")
    if not os.access(resolved, os.W_OK | os.X_OK):
        raise _refuse(f"{name} is not writable{fix}")
    mode = stat.S_IMODE(st.st_mode)
    # Others who can write here (or own it) can rename or replace our root in it; /tmp is
    # safe only thanks to the sticky bit and root ownership.
    if st.st_uid not in (0, os.getuid()):
        raise _refuse(f"{name} is owned by uid {st.st_uid}, neither us nor root{fix}")
    if mode & 0o022 and not mode & stat.S_ISVTX:
        raise _refuse(f"{name} is writable by other users and lacks the sticky bit{fix}")
    return resolved


def _check_private_dir(path: Path) -> None:
    """Fail closed unless ``path`` is a real directory, owned by us, mode exactly 0700.

    ``runtime/`` included: jupyter_client would add the sticky bit to the directory of a
    connection file it writes, so :mod:`lemon_exec.host.connfile` writes them instead.
    """
    try:
        st = os.lstat(path)
    except OSError as exc:
        raise _refuse(f"cannot inspect {path}: {exc.strerror or exc}") from None
    if stat.S_ISLNK(st.st_mode):
        raise _refuse(f"{path} is a symlink")
    if not stat.S_ISDIR(st.st_mode):
        raise _refuse(f"{path} is not a directory")
    if st.st_uid != os.getuid():
        raise _refuse(f"{path} is owned by uid {st.st_uid}, not {os.getuid()}")
    mode = stat.S_IMODE(st.st_mode)
    if mode != 0o700:
        raise _refuse(f"{path} has mode {mode:04o}, not 0700")


def _ensure_private_dir(path: Path) -> None:
    """Create ``path`` (0700) if it is missing; then :func:`_check_private_dir` it."""
    try:
        os.mkdir(path, 0o700)  # never follows or reuses what is there: EEXIST instead
    except FileExistsError:
        pass
    except OSError as exc:
        raise _refuse(f"cannot create {path}: {exc.strerror or exc}") from None
    _check_private_dir(path)


def write_private_file(directory: Path, name: str, data: bytes | str) -> Path:
    """Create ``directory/name`` holding ``data``, mode 0600, failing if the name exists.

    ``O_EXCL | O_NOFOLLOW`` means an existing file *or symlink* at the name is an error
    (``FileExistsError``) rather than something we write through. ``name`` must be a plain
    file name. Text is written as UTF-8.
    """
    if not name or name in (".", "..") or os.sep in name or (os.altsep and os.altsep in name):
        raise ValueError(f"not a plain file name: {name!r}")
    payload = data.encode("utf-8") if isinstance(data, str) else data
    path = Path(directory) / name
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC
    fd = os.open(path, flags, 0o600)
    try:
        mode = stat.S_IMODE(os.fstat(fd).st_mode)
        if mode & 0o077:  # only a very odd umask could get here, but never leak
            raise _refuse(f"{path} was created with mode {mode:04o}")
        view = memoryview(payload)
        while view:
            view = view[os.write(fd, view) :]
    except BaseException:
        os.close(fd)
        path.unlink(missing_ok=True)
        raise
    os.close(fd)
    return path


# --- bounded removal ----------------------------------------------------------------------------


class _Budget:
    """Entries a removal may still visit, shared across the whole walk."""

    def __init__(self, entries: int) -> None:
        self.left = entries


def remove_tree(path: Path | str, max_entries: int = REMOVE_TREE_MAX_ENTRIES) -> bool:
    """Remove ``path`` and everything under it, visiting at most ``max_entries`` entries.

    Symlinks are unlinked, never followed: the walk holds each directory open with
    ``O_NOFOLLOW`` and works relative to it, so swapping a directory for a link mid-walk
    cannot redirect it. Returns True when ``path`` is gone (or never existed). When the bound
    (or the depth limit, or an error) stops it, returns False, leaving the rest in place with
    ``path`` itself reset to 0700 so what remains stays owner-only.
    """
    path = os.fspath(path)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return True
    if not stat.S_ISDIR(st.st_mode):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        return True
    try:
        fd = os.open(path, _DIR_FLAGS)
    except FileNotFoundError:
        return True
    except OSError as exc:  # e.g. swapped for a symlink since the lstat
        logger.warning("execute_code: could not remove %s: %s", path, exc)
        return False
    try:
        done = _clear_dir(fd, _Budget(max_entries), depth=1)
        if not done:
            _make_owner_only(fd)
    finally:
        os.close(fd)
    if not done:
        return False
    try:
        os.rmdir(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        logger.warning("execute_code: could not remove %s: %s", path, exc)
        return False
    return True


def _make_owner_only(fd: int) -> None:
    try:
        if os.fstat(fd).st_uid == os.getuid():
            os.fchmod(fd, 0o700)
    except OSError:
        pass


def _clear_dir(fd: int, budget: _Budget, depth: int, keep: frozenset[str] = frozenset()) -> bool:
    """Empty the directory open at ``fd`` (except names in ``keep``); True when it is empty."""
    failed: set[str] = set(keep)
    while True:
        batch, more = _list_batch(fd, budget, failed)
        progress = False
        for name, is_dir in batch:
            if _remove_entry(fd, name, is_dir, budget, depth):
                progress = True
            else:
                failed.add(name)
                if budget.left <= 0:
                    return False
        if not more:
            return not (failed - keep)
        if not progress and budget.left <= 0:
            return False


def _list_batch(fd: int, budget: _Budget, skip: set[str]) -> tuple[list[tuple[str, bool]], bool]:
    """Read up to one batch of entries not in ``skip``; also say whether more may remain."""
    batch: list[tuple[str, bool]] = []
    with os.scandir(fd) as entries:
        for entry in entries:
            if entry.name in skip:
                continue
            if budget.left <= 0 or len(batch) >= _LIST_BATCH:
                return batch, True
            budget.left -= 1
            try:
                is_dir = entry.is_dir(follow_symlinks=False)
            except OSError:
                is_dir = False
            batch.append((entry.name, is_dir))
    return batch, False


def _remove_entry(parent: int, name: str, is_dir: bool, budget: _Budget, depth: int) -> bool:
    try:
        if not is_dir:
            os.unlink(name, dir_fd=parent)
            return True
        if depth >= _MAX_DEPTH:
            return False
        try:
            fd = os.open(name, _DIR_FLAGS, dir_fd=parent)
        except OSError as exc:
            if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                raise
            # Replaced by a file or symlink since it was listed: unlink that instead.
            os.unlink(name, dir_fd=parent)
            return True
        try:
            emptied = _clear_dir(fd, budget, depth + 1)
            if not emptied:
                _make_owner_only(fd)
        finally:
            os.close(fd)
        if emptied:
            os.rmdir(name, dir_fd=parent)
        return emptied
    except FileNotFoundError:
        return True
    except OSError as exc:
        logger.debug("execute_code: could not remove %s: %s", name, exc)
        return False


# --- owner markers and stale roots --------------------------------------------------------------


def _read_marker_pid(root: Path) -> int | None:
    """The PID in ``root``'s owner marker, or None unless the marker is exactly as we write it."""
    marker = root / OWNER_MARKER
    try:
        # O_NONBLOCK: a FIFO planted as the marker must not hang the sweep in open().
        fd = os.open(marker, os.O_RDONLY | _NOFOLLOW | _CLOEXEC | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if (
            not stat.S_ISREG(st.st_mode)
            or st.st_uid != os.getuid()
            or stat.S_IMODE(st.st_mode) != 0o600
            or st.st_size > _MARKER_MAX_BYTES
        ):
            return None
        raw = os.read(fd, _MARKER_MAX_BYTES + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return None
    pid = data.get("pid") if isinstance(data, dict) else None
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return None
    return pid


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # PermissionError and anything odd: assume alive, touch nothing
    return True


def _is_own_private_dir(path: Path) -> bool:
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return (
        stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and stat.S_IMODE(st.st_mode) == 0o700
    )


def _stale_roots(
    base: Path,
    *,
    max_candidates: int,
    budget: _Budget | None = None,
    exclude: Path | None = None,
    stop_after: int | None = None,
) -> list[Path]:
    """Sibling roots in ``base`` whose owner PID is dead.

    At most ``max_candidates`` ``lemon-exec-*`` entries are examined; with ``budget``, every
    entry of ``base`` scanned also costs one. Stops once ``stop_after`` roots are found.
    """
    found: list[Path] = []
    candidates = 0
    try:
        with os.scandir(base) as entries:
            for entry in entries:
                if candidates >= max_candidates or (budget is not None and budget.left <= 0):
                    break
                if budget is not None:
                    budget.left -= 1
                if not entry.name.startswith(STAGING_ROOT_PREFIX):
                    continue
                root = Path(entry.path)
                if exclude is not None and root == exclude:
                    continue
                candidates += 1
                if not _is_own_private_dir(root):
                    continue
                pid = _read_marker_pid(root)
                if pid is not None and not _pid_alive(pid):
                    found.append(root)
                    if stop_after is not None and len(found) >= stop_after:
                        break
    except OSError as exc:
        logger.warning("execute_code: cannot scan %s for stale workspaces: %s", base, exc)
    return found


def sweep_stale_roots(base: Path | str | None = None, *, max_roots: int = 64) -> int:
    """Remove empty sibling staging roots left behind by dead processes; return how many went.

    At most ``max_roots`` candidate ``lemon-exec-*`` directories are examined. Only a root
    that is empty by :func:`_remove_if_empty` goes; any other stale root is left alone,
    untraversed (its spill files are the spill reaper's; the rest is kept, owner-only).
    """
    base_path = Path(base) if base is not None else Path(tempfile.gettempdir())
    removed = 0
    for root in _stale_roots(base_path, max_candidates=max_roots):
        if _remove_if_empty(root):
            removed += 1
    return removed


#: What an empty root may still hold: the owner marker, the index, and empty directories.
_EMPTY_ROOT_FILES = frozenset({OWNER_MARKER, "kernels.json"})
_EMPTY_ROOT_DIRS = frozenset({"runtime", _SPILL_DIR, "work", "pypath"})


def _remove_if_empty(root: Path) -> bool:
    """Remove a stale ``root`` holding only its marker, its index and empty known directories.

    Never recursive: each known directory is checked for a first entry, nothing deeper, and
    anything else (an unknown name, a symlink, a non-empty directory) leaves the root as it
    is. The owner marker goes last, so a removal that fails midway is retried next start.
    """
    try:
        fd = os.open(root, _DIR_FLAGS)
    except OSError:
        return False
    try:
        names: list[str] = []
        with os.scandir(fd) as entries:
            for entry in entries:
                if len(names) >= len(_EMPTY_ROOT_FILES) + len(_EMPTY_ROOT_DIRS):
                    return False
                names.append(entry.name)
        for name in names:
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            if name in _EMPTY_ROOT_FILES and stat.S_ISREG(st.st_mode):
                continue
            if name not in _EMPTY_ROOT_DIRS or not stat.S_ISDIR(st.st_mode):
                return False
            sub = os.open(name, _DIR_FLAGS, dir_fd=fd)
            try:
                with os.scandir(sub) as entries:
                    if next(entries, None) is not None:
                        return False
            finally:
                os.close(sub)
        for name in sorted(names, key=lambda n: n == OWNER_MARKER):
            if name in _EMPTY_ROOT_DIRS:
                os.rmdir(name, dir_fd=fd)  # fails if something appeared meanwhile
            else:
                os.unlink(name, dir_fd=fd)
    except OSError as exc:
        logger.debug("execute_code: left stale workspace %s: %s", root, exc)
        return False
    finally:
        os.close(fd)
    try:
        os.rmdir(root)
    except OSError as exc:
        logger.debug("execute_code: left stale workspace %s: %s", root, exc)
        return False
    return True


def _remove_root(root: Path, *, spill_max_age_s: float = SPILL_MAX_AGE_S) -> bool:
    """Bounded removal of a root, keeping its owner marker until everything else is gone.

    Spill files younger than ``spill_max_age_s`` are kept (a result names them, and the spec
    keeps them readable for 24 hours); the root then stays, holding only the marker and
    those files, until later processes' spill reapers remove them and a later start then
    removes the empty root.
    """
    try:
        fd = os.open(root, _DIR_FLAGS)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    try:
        budget = _Budget(REMOVE_TREE_MAX_ENTRIES)
        if not _clear_dir(fd, budget, depth=1, keep=frozenset({OWNER_MARKER, _SPILL_DIR})):
            return False
        spill = root / _SPILL_DIR
        _reap_dir(spill, time.time() - spill_max_age_s, budget, lambda _path: False)
        try:
            os.rmdir(_SPILL_DIR, dir_fd=fd)
        except FileNotFoundError:
            pass
        except OSError:
            return False  # live spill files remain: keep the root (and its marker) for now
        os.unlink(OWNER_MARKER, dir_fd=fd)
    except FileNotFoundError:
        pass
    except OSError as exc:
        logger.warning("execute_code: could not remove stale workspace %s: %s", root, exc)
        return False
    finally:
        os.close(fd)
    try:
        os.rmdir(root)
    except FileNotFoundError:
        pass
    except OSError as exc:
        logger.warning("execute_code: could not remove stale workspace %s: %s", root, exc)
        return False
    return True


# --- the staging root ---------------------------------------------------------------------------


class StagingRoot:
    """One process's private staging directory; see the module docstring for its layout."""

    def __init__(self, path: Path) -> None:
        """Wrap an already created and validated root; use :meth:`create` to make one."""
        self._path = path
        self._closed = False

    @classmethod
    def create(cls, base: Path | str | None = None) -> StagingRoot:
        """Make and validate a new root under ``base`` (default: ``$TMPDIR``, else ``/tmp``).

        Stale roots of dead processes in ``base`` are swept first (best effort). Raises
        ``RefusedError`` when ``base`` is unusable (see :func:`staging_base`; never a fallback
        to another directory) or the root cannot be made private.
        """
        base_path = staging_base(base)
        try:
            sweep_stale_roots(base_path)
        except Exception as exc:  # sweeping is housekeeping; it must not block startup
            logger.warning("execute_code: sweeping stale workspaces failed: %s", exc)
        try:
            path = Path(tempfile.mkdtemp(prefix=STAGING_ROOT_PREFIX, dir=base_path))
        except OSError as exc:
            raise _refuse(f"cannot create a directory in {base_path}: {exc}") from None
        root = cls(path)
        try:
            _check_private_dir(path)
            marker = {"pid": os.getpid(), "created": time.time(), "version": _MARKER_VERSION}
            try:
                write_private_file(path, OWNER_MARKER, json.dumps(marker))
            except OSError as exc:
                raise _refuse(f"cannot write owner marker in {path}: {exc}") from None
            for sub in (root.runtime_dir, root.spill_dir, root.work_dir):
                try:
                    os.mkdir(sub, 0o700)  # umask can only clear bits; validated below
                except OSError as exc:
                    raise _refuse(f"cannot create {sub}: {exc}") from None
                _check_private_dir(sub)
        except BaseException:
            # Clean up only what is still verifiably ours; otherwise at most an empty rmdir.
            if _is_own_private_dir(path):
                remove_tree(path)
            else:
                with contextlib.suppress(OSError):
                    os.rmdir(path)
            raise
        return root

    @property
    def path(self) -> Path:
        """The root directory."""
        return self._path

    @property
    def runtime_dir(self) -> Path:
        """Where kernel connection files go."""
        return self._path / "runtime"

    @property
    def spill_dir(self) -> Path:
        """Where output spill files go."""
        return self._path / _SPILL_DIR

    @property
    def work_dir(self) -> Path:
        """Parent of the per-run workspaces."""
        return self._path / "work"

    def ensure(self) -> None:
        """Recreate whatever of the root a script deleted, then validate all of it.

        A script runs with our permissions and can ``shutil.rmtree`` the root that holds its
        workspace; without this every later call would be refused. Missing directories are
        made again exactly as :meth:`create` makes them (``mkdir`` 0700, which fails on
        anything already there, then validated) and a missing owner marker is rewritten.
        Anything present but not as expected (a symlink, another owner, another mode) still
        fails closed with ``RefusedError``. A handful of ``lstat`` calls when nothing is
        missing.
        """
        if self._closed:
            raise _refuse(f"{self._path} is closed")
        for directory in (self._path, self.runtime_dir, self.spill_dir, self.work_dir):
            _ensure_private_dir(directory)
        marker = self._path / OWNER_MARKER
        try:
            os.lstat(marker)
        except FileNotFoundError:
            data = {"pid": os.getpid(), "created": time.time(), "version": _MARKER_VERSION}
            try:
                write_private_file(self._path, OWNER_MARKER, json.dumps(data))
            except OSError as exc:
                raise _refuse(f"cannot write owner marker in {self._path}: {exc}") from None
        except OSError as exc:
            raise _refuse(f"cannot inspect {marker}: {exc.strerror or exc}") from None

    def new_workspace(self) -> Path:
        """Create and validate a fresh, empty 0700 directory for one run."""
        try:
            path = Path(tempfile.mkdtemp(prefix="run-", dir=self.work_dir))
        except OSError as exc:
            raise _refuse(f"cannot create a directory in {self.work_dir}: {exc}") from None
        _check_private_dir(path)
        return path

    def write_private_file(self, directory: Path, name: str, data: bytes | str) -> Path:
        """Same as the module function :func:`write_private_file`."""
        return write_private_file(directory, name, data)

    def remove_workspace(self, path: Path) -> bool:
        """Bounded removal of a run's workspace; see :func:`remove_tree`."""
        return remove_tree(path, REMOVE_TREE_MAX_ENTRIES)

    def close(self) -> None:
        """Remove the root (bounded), keeping spill files younger than 24 hours.

        A result's ``full_output_path`` stays readable after the tool closes; a later
        process's spill reaper removes the files once they expire, and a start after that
        the then empty root. Safe to call more than once.
        """
        if self._closed:
            return
        self._closed = True
        if not _remove_root(self._path):
            logger.info(
                "execute_code: keeping %s for its spill files (or it was too large to remove "
                "in one pass); later processes reap its expired spill files",
                self._path,
            )

    def __enter__(self) -> StagingRoot:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"StagingRoot({str(self._path)!r})"


def _reap_dir(
    directory: Path, cutoff: float, budget: _Budget, is_active: Callable[[Path], bool]
) -> int:
    """Remove expired spill files in ``directory``, spending ``budget`` per entry examined.

    The directory is opened with ``O_NOFOLLOW`` and entries are removed relative to it, so a
    spill directory swapped for a symlink cannot point the reaper somewhere else.
    """
    try:
        fd = os.open(directory, _DIR_FLAGS)
    except FileNotFoundError:
        return 0
    except OSError as exc:
        logger.warning("execute_code: cannot scan %s for old spill files: %s", directory, exc)
        return 0
    removed = 0
    try:
        with os.scandir(fd) as entries:
            for entry in entries:
                if budget.left <= 0:
                    break
                budget.left -= 1
                if not entry.name.startswith(SPILL_PREFIX):
                    continue
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                if (
                    not stat.S_ISREG(st.st_mode)
                    or st.st_uid != os.getuid()
                    or st.st_mtime >= cutoff
                    or is_active(directory / entry.name)
                ):
                    continue
                try:
                    os.unlink(entry.name, dir_fd=fd)
                    removed += 1
                except FileNotFoundError:
                    pass
                except OSError as exc:
                    logger.debug("execute_code: could not remove %s: %s", entry.name, exc)
    except OSError as exc:
        logger.warning("execute_code: cannot scan %s for old spill files: %s", directory, exc)
    finally:
        os.close(fd)
    return removed
