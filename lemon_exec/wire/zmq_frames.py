"""Multipart send and receive on the host's kernel channels, without pyzmq's wrappers.

``Socket.send_multipart`` and ``recv_multipart`` are Python loops over pyzmq's compiled
``send``/``recv`` that build an enum flag per frame and type-check every part: about 15 us
per Jupyter message of 6-7 frames, four times what the frames themselves cost. The host's
shell and control readers call the compiled methods directly with plain integer flags. Same
semantics: every frame but the last carries SNDMORE, and a receive collects frames while
RCVMORE is set.
"""

from __future__ import annotations

from typing import Any

import zmq
from zmq.backend import Socket as _CompiledSocket

_send = _CompiledSocket.send
_recv = _CompiledSocket.recv
_get = _CompiledSocket.get
_SNDMORE = int(zmq.SNDMORE)
_RCVMORE = int(zmq.RCVMORE)
NOBLOCK = int(zmq.NOBLOCK)


def send_frames(socket: Any, frames: list[Any], flags: int = 0, copy: bool = True) -> None:
    """``socket.send_multipart(frames, flags, copy=copy)``; raises zmq.Again like it."""
    more = _SNDMORE | flags
    last = len(frames) - 1
    for index, frame in enumerate(frames):
        _send(socket, frame, more if index < last else flags, copy)


def recv_frames(socket: Any, flags: int = 0, copy: bool = True) -> list[Any]:
    """``socket.recv_multipart(flags, copy=copy)``; raises zmq.Again like it."""
    frames = [_recv(socket, flags, copy)]
    while _get(socket, _RCVMORE):
        frames.append(_recv(socket, flags, copy))
    return frames
