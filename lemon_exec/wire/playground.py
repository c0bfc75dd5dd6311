"""The playground host's protocol: how a kernel no lemon_exec host started serves helpers.

A ``lemon-python`` kernel that Jupyter itself started (JupyterLab, nbclient, ``jupyter
execute``) starts a host process of its own on the first helper call of a cell
(docs/playground.md). The two sides share this module:

- The kernel runs ``python -m`` :data:`HOST_MODULE` in a session of its own and writes one
  JSON object to its stdin: :data:`KEY` (the kernel's HMAC key, hex) and :data:`SCHEME`.
- The host answers with one JSON line on its stdout, :data:`READY` (:data:`LINK`: the path of
  a Unix socket in a 0700 directory, removed once the kernel has connected; the helpers,
  tool specs and budgets it serves) or :data:`ERROR`, and writes nothing there after it.
- On the link (kernel/hostlink.py framing, signed with the key) the kernel sends
  :data:`OPEN_MSG_TYPE` before a cell's first frame and :data:`CLOSE_MSG_TYPE` when the
  cell ends; between them the cell's frames and replies are the comm protocol's own.
- The host exits when the link closes: whenever the kernel ends, however it ends.
"""

from __future__ import annotations

#: Set to "0" to turn the playground off: helpers then raise protocol.NO_HOST as before.
ENABLE_ENV = "LEMON_EXEC_PLAYGROUND"
#: A file in ``--mcp-config`` format whose servers' tools the playground serves.
MCP_CONFIG_ENV = "LEMON_EXEC_MCP_CONFIG"

HOST_MODULE = "lemon_exec.host.playground"

#: Keys of the kernel's greeting (stdin) and of the host's ready line (stdout).
KEY = "key"
SCHEME = "signature_scheme"
READY = "ready"
ERROR = "error"
LINK = "link"
HELPERS = "helpers"
TOOLS_DIGEST = "tools_digest"
TOOLS = "tools"
MAX_TEXT_BYTES = "max_text_bytes"
#: How long the kernel waits for the ready line: the host lists its MCP servers' tools first.
READY_TIMEOUT_S = 60.0

#: Kernel → host, content ``{"comm_id", "token", "cwd"}``: a cell's bridge opens.
OPEN_MSG_TYPE = "lemon_playground_open"
#: Kernel → host, content ``{"comm_id"}``: the cell has ended; its calls are cancelled.
CLOSE_MSG_TYPE = "lemon_playground_close"

#: Printed once, on the cell whose helper call started the host.
NOTICE = (
    "lemon_exec: no host is attached to this kernel, so it started one of its own for the "
    "helpers (default tools, policy and per-cell budgets; docs/playground.md). "
    f"{ENABLE_ENV}=0 turns this off."
)
START_FAILED = "the playground host could not start: {reason}"
MANAGED_NO_HOST = (
    "helpers work only in the scripts this kernel's lemon_exec host runs, not in a viewer's "
    "cells (the kernel belongs to an agent's session)"
)
BETWEEN_CELLS = (
    "helpers in a notebook work while a cell runs: this call came from a thread whose cell "
    "has ended"
)
DISABLED_NO_HOST = (
    "no lemon_exec host is attached to this kernel, and the playground host is turned off "
    f"({ENABLE_ENV}=0): unset it to serve helpers in this notebook"
)
