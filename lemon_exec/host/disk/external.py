"""Publishing session kernels to Jupyter Server as external kernels.

Jupyter Server (2.7.3+, with ``--ServerApp.allow_external_kernels=True``) lists every
connection file in its ``external_connection_dir``. When ``LEMON_EXEC_JUPYTER_EXTERNAL_DIR``
names such a directory, a host links each session kernel's connection file into it as
``lemon-<kernel>.json`` and removes the link when it stops the kernel (docs/inspection.md).

Links, not copies: the connection file lives in the host's private runtime directory and is
deleted whenever its kernel goes (a clean stop, or the host-death teardown), so a link left
by a host that died dangles at once, and Jupyter (which lists only regular files) drops the
kernel. Dangling ``lemon-*.json`` links are swept on the next publish and by the host-death
teardown (:mod:`lemon_exec.proc.host_teardown`, which names them).
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

from lemon_exec.proc.host_teardown import LINK_PREFIX, sweep_dangling_links

log = logging.getLogger(__name__)

#: The environment variable naming the directory to publish session kernels in.
EXTERNAL_DIR_ENV = "LEMON_EXEC_JUPYTER_EXTERNAL_DIR"


def external_dir() -> Path | None:
    """The configured directory, or None when publishing is off."""
    value = os.environ.get(EXTERNAL_DIR_ENV, "").strip()
    return Path(value).expanduser() if value else None


def publish(kernel_id: str, connection_file: Path) -> Path | None:
    """Link ``connection_file`` into the external directory; the link, or None (never raises)."""
    directory = external_dir()
    if directory is None:
        return None
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        problem = _unsafe(directory)
        if problem:
            log.warning("execute_code: not publishing kernels in %s: %s", directory, problem)
            return None
        sweep_dangling(directory)
        link = directory / f"{LINK_PREFIX}{kernel_id}.json"
        os.symlink(connection_file, link)
        return link
    except OSError as exc:
        log.warning("execute_code: could not publish a kernel in %s: %s", directory, exc)
        return None


def sweep_dangling(directory: Path | None = None) -> int:
    """Remove ``lemon-*.json`` links whose connection file is gone; how many (never raises)."""
    directory = directory if directory is not None else external_dir()
    return 0 if directory is None else sweep_dangling_links(directory)


def _unsafe(directory: Path) -> str:
    """Why ``directory`` must not hold our links ('' when it is fine)."""
    st = os.lstat(directory)
    if not stat.S_ISDIR(st.st_mode):
        return "not a directory (or a symlink)"
    if st.st_uid != os.getuid():
        return "owned by another user"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return "writable by other users"
    return ""
