"""The host's shell and control sockets to one local kernel, and the session that signs.

These are the two sockets jupyter_client's ``AsyncKernelClient.start_channels(shell=True,
control=True)`` would open (DEALER, the session's id as identity, linger 1 s, curve keys when
the connection has them), without the client, its channel objects and their traitlets: those
were about a third of the host's CPU per per-call run, and their reference cycles a good part
of what the host's garbage collector then had to walk while other calls waited.
"""

from __future__ import annotations

from typing import Any

import zmq
import zmq.asyncio
from jupyter_client.manager import AsyncKernelManager
from jupyter_client.session import Session

#: As jupyter_client: closing never waits long for unsent messages of a dead kernel.
_LINGER_MS = 1000


class KernelSockets:
    """``shell`` and ``control`` connected to ``km``'s kernel, signed by its ``session``."""

    def __init__(self, km: AsyncKernelManager, context: zmq.asyncio.Context) -> None:
        self.session: Session = km.session
        identity = self.session.bsession
        self.shell = _connect(km, context, km.shell_port, identity)
        try:
            self.control = _connect(km, context, km.control_port, identity)
        except BaseException:
            self.shell.close(linger=0)
            raise

    def send(self, socket: zmq.asyncio.Socket, msg: dict[str, Any]) -> None:
        self.session.send(socket, msg)

    def close(self) -> None:
        for socket in (self.shell, self.control):
            if not socket.closed:
                socket.close(linger=0)


def _connect(
    km: AsyncKernelManager, context: zmq.asyncio.Context, port: int, identity: bytes
) -> zmq.asyncio.Socket:
    tcp = km.transport == "tcp"
    url = f"tcp://{km.ip}:{port}" if tcp else f"{km.transport}://{km.ip}-{port}"
    socket = context.socket(zmq.DEALER)
    socket.linger = _LINGER_MS
    socket.identity = identity
    public = km.curve_publickey
    if public is not None:  # authenticates the kernel and encrypts, as upstream
        socket.curve_secretkey = km.curve_secretkey
        socket.curve_publickey = public
        socket.curve_serverkey = public
    socket.connect(url)
    return socket
