"""Limits the kernel and the host agree on. Standard library only: the kernel imports it."""

from __future__ import annotations

#: Largest IOPub message, in bytes (all frames together), that a kernel publishes and the host
#: accepts. The kernel publishes a short note instead of anything larger
#: (:mod:`lemon_exec.kernel.app`); the host drops any larger frame unread, as a backstop
#: (:mod:`lemon_exec.host.kernels.local.kernel`). Legitimate traffic stays far below: stream
#: output comes in 64 KiB chunks, bridge frames are at most 256 KiB.
MAX_MESSAGE_BYTES = 32 * 2**20
