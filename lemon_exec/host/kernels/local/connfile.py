"""A kernel manager that writes its connection file without touching the directory's mode.

jupyter_client's ``write_connection_file`` adds the sticky bit to the directory holding the
file (``chmod`` after the fact, meant for the shared Jupyter runtime directory, so that only
a file's owner may remove it). Our connection files live in the host's private runtime
directory (:mod:`lemon_exec.host.disk.runtime_base`), which must stay exactly 0700 as
created: nobody else can enter it, so the sticky bit adds nothing, and a chmod after
creation is what the staging contract rules out. This manager writes the same file itself,
created at 0600 with ``O_EXCL | O_NOFOLLOW`` (never through a planted file or link), and
leaves the directory alone.

It also connects no control socket of its own when the kernel starts: jupyter_client keeps
one for a polite shutdown request, which lemon_exec never sends (it kills its kernels and
talks to control on its own sockets, :mod:`lemon_exec.host.kernels.local.sockets`), and
connects one on demand if a shutdown or interrupt request is ever sent through it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from jupyter_client.manager import AsyncKernelManager

from lemon_exec.proc.private_fs import write_private_file

_PORT_NAMES = ("shell_port", "iopub_port", "stdin_port", "control_port", "hb_port")


class PrivateKernelManager(AsyncKernelManager):
    """``AsyncKernelManager`` whose ipc connection file leaves its directory's mode alone,
    and that opens no control socket at start (see the module doc)."""

    async def _async_post_start_kernel(self, **kw: Any) -> None:
        # Upstream's, without the eager _connect_control_socket: one zmq socket less to
        # make, connect and close per kernel.
        self.start_restarter()
        assert self.provisioner is not None
        await self.provisioner.post_launch(**kw)

    def write_connection_file(self, **kwargs: Any) -> None:
        if self._connection_file_written and os.path.exists(self.connection_file):
            return
        if self.transport != "ipc":  # tcp ports need jupyter_client's port picking
            super().write_connection_file(**kwargs)
            return
        # ipc "ports" are suffixes of the socket path: the first free ones, as upstream picks.
        taken = {getattr(self, name) for name in _PORT_NAMES}
        n = 1
        for name in _PORT_NAMES:
            if getattr(self, name) > 0:
                continue
            while n in taken or os.path.exists(f"{self.ip}-{n}"):
                n += 1
            setattr(self, name, n)
            taken.add(n)
        info: dict[str, Any] = {name: getattr(self, name) for name in _PORT_NAMES}
        info.update(
            ip=self.ip,
            key=self.session.key.decode(),
            transport=self.transport,
            signature_scheme=self.session.signature_scheme,
            kernel_name=self.kernel_name,
        )
        for name in ("curve_publickey", "curve_secretkey"):
            value = getattr(self, name, None)
            if value is not None:
                info[name] = value.decode("ascii")
        info.update(kwargs)
        directory, name = os.path.split(self.connection_file)
        write_private_file(Path(directory), name, json.dumps(info, indent=2))
        self._connection_file_written = True
