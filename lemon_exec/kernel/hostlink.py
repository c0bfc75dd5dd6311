"""The kernel's private reply channel: host replies read by a thread of their own.

A host that starts the kernel itself gives it two private ipc addresses (in its environment,
never in the connection file): the IOPub copy it reads (``HOST_IOPUB_ENV``, see app.py) and
this reply channel (``HOST_REPLY_ENV``). The kernel binds a PULL socket there and one daemon
thread blocks on it: a reply reaches the waiting helper after one thread wake-up, instead of
passing through the control thread's event loop. Replies must carry a valid signature under
the session key and name the open cell's comm id, exactly as on the control channel (which
stays the path for hosts that do not set the address, e.g. kernels behind a gateway).
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import zmq

from lemon_exec.kernel import cells, protocol
from lemon_exec.kernel.zmqwire import recv_frames

log = logging.getLogger(__name__)

#: Replies queued in the kernel before the host's send waits (they are read at once).
_REPLY_HWM = 1000


def deliver_reply(session: Any, raw: list[Any]) -> None:
    """Verify one reply message and hand it to the open cell's bridge (else drop it)."""
    try:
        msg = protocol.unpack_signed(session, raw)
    except Exception:  # bad signature or malformed: dropped, like ipykernel does
        log.error("invalid lemon bridge reply", exc_info=True)
        return
    content = msg.get("content")
    bridge = cells.STATE.bridge
    if msg.get("msg_type") != protocol.REPLY_MSG_TYPE or not isinstance(content, dict):
        return
    if bridge is None or content.get("comm_id") != bridge.comm_id:
        return  # a reply for a cell that has ended
    bridge.deliver(content)


def start_reply_reader(context: Any, address: str, session: Any) -> Any:
    """Bind the reply channel at ``address`` and start the thread that reads it."""
    socket = context.socket(zmq.PULL)
    socket.setsockopt(zmq.RCVHWM, _REPLY_HWM)
    socket.setsockopt(zmq.LINGER, 0)
    socket.bind(address)
    thread = threading.Thread(
        target=_serve, args=(socket, session), name="lemon-bridge-replies", daemon=True
    )
    thread.start()
    return socket


def _serve(socket: Any, session: Any) -> None:
    while True:
        try:
            raw = recv_frames(socket, copy=False)
        except zmq.ContextTerminated:
            socket.close(linger=0)
            return
        except zmq.ZMQError as exc:
            if exc.errno == zmq.ENOTSOCK:  # closed at exit
                return
            log.error("bridge reply channel failed", exc_info=True)
            return
        try:
            deliver_reply(session, raw)
        except Exception:  # a bug here must not end the channel
            log.exception("error delivering a bridge reply")
