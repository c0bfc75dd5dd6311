"""The teardown of a host that died: what it would have removed on a clean close.

A host that ends without closing its facades (SIGKILL) leaves its staging root, the runtime
directory holding its kernels' keys and sockets, and any links to those keys it published
for Jupyter Server. The fork-server template is part of that host's run and outlives it by
a moment: it runs this teardown for its host (:mod:`lemon_exec.template.server`), told where
the runtime directory and the links are when it was started, since it cannot ask a host
that is gone. The host side sweeps what even that missed at its next start
(:mod:`lemon_exec.host.disk.hygiene`) and publishes the links
(:mod:`lemon_exec.host.disk.external`), with the names defined here.

What stays: ``spill/`` (spill files stay readable for 24 hours; the spill reaper empties
it), the owner marker and the index (the next host start reads them, then removes the root
once it is empty). Removal is bounded and never follows a symlink.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from lemon_exec._constants import REMOVE_TREE_MAX_ENTRIES
from lemon_exec.proc import supervise
from lemon_exec.proc.private_fs import DIR_FLAGS, OWNER_MARKER, is_own_private_dir, read_owner_pid
from lemon_exec.proc.tree_removal import Budget, clear_dir, remove_tree

__all__ = ["INDEX_NAME", "LINK_PREFIX", "sweep_dangling_links", "teardown_dead_host"]

log = logging.getLogger(__name__)

#: The live-kernel index in a staging root (:mod:`lemon_exec.host.disk.index`).
INDEX_NAME = "kernels.json"
#: Links published for Jupyter Server are ``<LINK_PREFIX><kernel>.json``.
LINK_PREFIX = "lemon-"
#: What the teardown keeps in the root: spill files (24 h), the marker and index (next start).
_KEEPS = frozenset({OWNER_MARKER, INDEX_NAME, "spill"})
#: At most this many directory entries are looked at by one link sweep.
_SWEEP_MAX_ENTRIES = 4096


def teardown_dead_host(
    root: Path, host_pid: int, runtime_dir: Path | None = None, links_dir: Path | None = None
) -> bool:
    """Remove what the dead ``host_pid`` would have removed on a clean close of ``root``.

    Workspaces, connection files and sockets go from ``root``; ``runtime_dir`` goes whole if
    its own marker names ``host_pid``; the links in ``links_dir`` that now dangle go. True
    when only what stays (see the module doc) is left in ``root``. Nothing happens unless
    ``root`` is ours, private, and its marker names ``host_pid``, which has ended.
    """
    if not _owned_by(root, host_pid):
        return False
    if supervise.running(host_pid):
        return False
    try:
        fd = os.open(root, DIR_FLAGS)
    except OSError:
        return False
    try:
        budget = Budget(REMOVE_TREE_MAX_ENTRIES)
        cleared = clear_dir(fd, budget, depth=1, keep=_KEEPS)
        if runtime_dir is not None and _owned_by(runtime_dir, host_pid):
            cleared = remove_tree(runtime_dir, budget.left) and cleared
        if links_dir is not None:
            sweep_dangling_links(links_dir)  # they pointed at the keys just removed
        return cleared
    except OSError as exc:
        log.warning("execute_code: could not clean up %s: %s", root, exc)
        return False
    finally:
        os.close(fd)


def _owned_by(directory: Path, host_pid: int) -> bool:
    """Whether ``directory`` is ours, private, and its owner marker names ``host_pid``."""
    return is_own_private_dir(directory) and read_owner_pid(directory) == host_pid


def sweep_dangling_links(directory: Path) -> int:
    """Remove ``lemon-*.json`` links whose target is gone; how many (never raises)."""
    removed = 0
    try:
        with os.scandir(directory) as entries:
            for n, entry in enumerate(entries):
                if n >= _SWEEP_MAX_ENTRIES:
                    break
                name = entry.name
                if not (name.startswith(LINK_PREFIX) and name.endswith(".json")):
                    continue
                if entry.is_symlink() and not os.path.exists(entry.path):
                    try:
                        os.unlink(entry.path)
                        removed += 1
                    except FileNotFoundError:
                        continue
    except OSError as exc:
        log.debug("could not sweep %s: %s", directory, exc)
    return removed
