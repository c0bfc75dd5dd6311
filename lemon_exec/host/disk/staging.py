"""A private on-disk staging area for one host process.

Layout (every directory 0700, every file 0600, all owned by this user)::

    <base>/lemon-exec-<random>/     the root, one per host process
        owner                       JSON {"pid", "created", "version"}: lets later
                                    processes tell a dead owner's root from a live one
        spill/                      output spill files (lemon-exec-output-*)
        work/                       per-run workspaces

Its kernels' connection files and sockets are not here but in its runtime directory, of the
same name, under the fixed per-user runtime base (:mod:`lemon_exec.host.disk.runtime_base`):
``/tmp/lemon-exec.<uid>/lemon-exec-<random>/``, where every sandbox view masks them.

Anything that is not exactly as expected fails closed with ``RefusedError``. Removal is
always bounded (a script can create millions of files) and never follows symlinks (a script
can plant a link to somewhere it should not be able to make us delete). A root a script
deleted is made again by :meth:`StagingRoot.ensure`, with the same checks. The generic
pieces are :mod:`lemon_exec.proc.private_fs` (private directories, files, owner markers) and
:mod:`lemon_exec.proc.tree_removal` (bounded removal).

Stale roots of dead processes are swept when a root is created
(:mod:`lemon_exec.host.disk.stale_roots`); their spill files are the spill reaper's
(:mod:`lemon_exec.host.disk.spill_reaper`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import TracebackType

from lemon_exec._constants import REMOVE_TREE_MAX_ENTRIES, SPILL_PREFIX, STAGING_ROOT_PREFIX
from lemon_exec.host.disk.dir_watch import DirWatch
from lemon_exec.host.disk.runtime_base import base_path as runtime_base_path
from lemon_exec.host.disk.runtime_base import runtime_base, runtime_dir_of, sweep_stale_runtime_dirs
from lemon_exec.host.disk.staging_base import staging_base
from lemon_exec.host.disk.stale_roots import sweep_stale_roots
from lemon_exec.proc.private_fs import (
    DIR_FLAGS,
    OWNER_MARKER,
    check_private_dir,
    describe_os_error,
    ensure_private_dir,
    is_own_private_dir,
    refused,
    write_owner_marker,
    write_private_file,
)
from lemon_exec.proc.tree_removal import Budget, clear_dir, remove_tree

__all__ = ["SPILL_MAX_AGE_S", "StagingRoot", "runtime_dir_of"]

logger = logging.getLogger(__name__)

_SPILL_DIR = "spill"
#: Spill files stay readable this long, also after the process that wrote them is gone.
SPILL_MAX_AGE_S = 86_400.0


# --- the staging root ---------------------------------------------------------------------------


class StagingRoot:
    """One process's private staging directory; see the module docstring for its layout."""

    def __init__(self, path: Path) -> None:
        """Wrap an already created and validated root; use :meth:`create` to make one."""
        self._path = path
        self._closed = False
        #: Tells whether anything :meth:`ensure` looks at changed since it last passed.
        self._watch = DirWatch.open()

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
            raise refused(
                f"cannot create a directory in {base_path}: {describe_os_error(exc)}"
            ) from None
        root = cls(path)
        made_runtime = False
        try:
            check_private_dir(path)
            write_owner_marker(path)
            for sub in (root.spill_dir, root.work_dir):
                try:
                    os.mkdir(sub, 0o700)  # umask can only clear bits; validated below
                except OSError as exc:
                    raise refused(f"cannot create {sub}: {describe_os_error(exc)}") from None
                check_private_dir(sub)
            # Keys and sockets: under the fixed runtime base, never under ``base``.
            sweep_stale_runtime_dirs(runtime_base())
            try:
                os.mkdir(root.runtime_dir, 0o700)
            except OSError as exc:
                raise refused(f"cannot create {root.runtime_dir}: {exc}") from None
            made_runtime = True
            check_private_dir(root.runtime_dir)
            write_owner_marker(root.runtime_dir)
        except BaseException:
            # Clean up only what is still verifiably ours; otherwise at most an empty rmdir.
            for made in (path, root.runtime_dir) if made_runtime else (path,):
                if is_own_private_dir(made):
                    remove_tree(made)
                else:
                    with contextlib.suppress(OSError):
                        os.rmdir(made)
            raise
        return root

    @property
    def path(self) -> Path:
        """The root directory."""
        return self._path

    @property
    def runtime_dir(self) -> Path:
        """Where kernel connection files and sockets go (under the runtime base)."""
        return runtime_dir_of(self._path)

    @property
    def spill_dir(self) -> Path:
        """Where output spill files go."""
        return self._path / _SPILL_DIR

    @property
    def work_dir(self) -> Path:
        """Parent of the per-run workspaces."""
        return self._path / "work"

    @property
    def pypath_dir(self) -> Path:
        """The kernels' ``PYTHONPATH`` directory (its ``lemon_exec`` link: the engine's)."""
        return self._path / "pypath"

    def intact(self) -> bool:
        """Whether nothing :meth:`ensure` looks at changed since a check last passed.

        Answered without touching the disk (one non-blocking read of an inotify descriptor,
        :mod:`lemon_exec.host.disk.dir_watch`), so a call may skip the check when it is
        True. Always False where inotify is missing, and once closed.
        """
        return self._watch is not None and not self._closed and self._watch.intact()

    @contextlib.contextmanager
    def checking(self) -> Iterator[None]:
        """Around :meth:`ensure` (and the engine's check of ``pypath``): afterwards
        :meth:`intact` is True until something it checks changes."""
        if self._watch is None:
            yield
            return
        base = runtime_base_path()
        with self._watch.checking(
            {
                base: frozenset({self._path.name}),
                self._path: frozenset({OWNER_MARKER, _SPILL_DIR, "work", "pypath"}),
                self.runtime_dir: frozenset({OWNER_MARKER}),
                self.spill_dir: frozenset(),
                self.work_dir: frozenset(),
                self.pypath_dir: frozenset({"lemon_exec"}),
            }
        ):
            yield

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
            raise refused(f"{self._path} is closed")
        runtime_base()
        for directory in (self._path, self.runtime_dir, self.spill_dir, self.work_dir):
            ensure_private_dir(directory)
        for owned in (self._path, self.runtime_dir):
            marker = owned / OWNER_MARKER
            try:
                os.lstat(marker)
            except FileNotFoundError:
                write_owner_marker(owned)
            except OSError as exc:
                raise refused(f"cannot inspect {marker}: {exc.strerror or exc}") from None

    def new_workspace(self, script: str | None = None) -> Path:
        """Create and validate a fresh 0700 directory for one run, holding ``script.py``.

        Every failure, a full disk included, is a ``RefusedError`` naming the cause, and
        leaves nothing behind: the run is refused before any code starts.
        """
        try:
            path = Path(tempfile.mkdtemp(prefix="run-", dir=self.work_dir))
        except OSError as exc:
            raise refused(
                f"cannot create a directory in {self.work_dir}: {describe_os_error(exc)}"
            ) from None
        try:
            check_private_dir(path)
            if script is not None:
                try:
                    write_private_file(path, "script.py", script)
                except OSError as exc:
                    raise refused(
                        f"cannot write {path / 'script.py'}: {describe_os_error(exc)}"
                    ) from None
        except BaseException:
            self.remove_workspace(path)
            raise
        return path

    def write_private_file(self, directory: Path, name: str, data: bytes | str) -> Path:
        """Same as :func:`lemon_exec.proc.private_fs.write_private_file`."""
        return write_private_file(directory, name, data)

    def remove_workspace(self, path: Path) -> bool:
        """Bounded removal of a run's workspace (:mod:`lemon_exec.proc.tree_removal`)."""
        return remove_tree(path, REMOVE_TREE_MAX_ENTRIES)

    def remove_bare_workspace(self, path: Path) -> bool:
        """Remove a workspace that holds nothing but its ``script.py``: two system calls, cheap
        enough for the event loop (a hop to the disk worker costs more, up to the GIL's 5 ms
        switch interval). False, and nothing lost, when the run left more there: that needs
        :meth:`remove_workspace`."""
        try:
            fd = os.open(path, DIR_FLAGS)  # never through a symlink put in its place
        except FileNotFoundError:
            return True
        except OSError:
            return False
        try:
            with contextlib.suppress(FileNotFoundError):
                os.unlink("script.py", dir_fd=fd)
        except OSError:
            return False
        finally:
            os.close(fd)
        try:
            os.rmdir(path)
        except FileNotFoundError:
            return True
        except OSError:  # not empty (or swapped meanwhile): the bounded walk decides
            return False
        return True

    def close(self) -> None:
        """Remove the root (bounded), keeping spill files younger than 24 hours.

        A result's ``full_output_path`` stays readable after the tool closes; a later
        process's spill reaper removes the files once they expire, and a start after that
        the then empty root. Safe to call more than once.
        """
        if self._closed:
            return
        self._closed = True
        if self._watch is not None:
            self._watch.close()
        if is_own_private_dir(self.runtime_dir):
            remove_tree(self.runtime_dir, REMOVE_TREE_MAX_ENTRIES)
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


# --- removing a root on close -------------------------------------------------------------------


def _remove_root(root: Path, *, spill_max_age_s: float = SPILL_MAX_AGE_S) -> bool:
    """Bounded removal of a root, keeping its owner marker until everything else is gone.

    Spill files younger than ``spill_max_age_s`` are kept (a result names them, and the spec
    keeps them readable for 24 hours); the root then stays, holding only the marker and
    those files, until later processes' spill reapers remove them and a later start then
    removes the empty root.
    """
    try:
        fd = os.open(root, DIR_FLAGS)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    try:
        budget = Budget(REMOVE_TREE_MAX_ENTRIES)
        if not clear_dir(fd, budget, depth=1, keep=frozenset({OWNER_MARKER, _SPILL_DIR})):
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


def _reap_dir(
    directory: Path, cutoff: float, budget: Budget, is_active: Callable[[Path], bool]
) -> int:
    """Remove expired spill files in ``directory``, spending ``budget`` per entry examined.

    The directory is opened with ``O_NOFOLLOW`` and entries are removed relative to it, so a
    spill directory swapped for a symlink cannot point the reaper somewhere else.
    """
    try:
        fd = os.open(directory, DIR_FLAGS)
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
