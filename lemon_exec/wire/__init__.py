"""The lemon comm protocol and its framing: what host and kernel both speak.

Standard library only (``zmq_frames`` aside, which only the host imports): the kernel side
imports this package in every kernel. ``protocol`` holds the constants, error texts, frames
and replies; the other modules each hold one part of the protocol beside it.
"""
