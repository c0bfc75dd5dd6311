"""Fixed numbers and names, on the ground floor so that every side can share them.

The first group is fixed by the execute_code spec: they are deliberately *not* settings, so
no config file or environment variable can change them. The second group is lemon_exec's own
naming, kept here so that the writer (``host.cell.output``) and the removers
(``host.disk.spill_reaper``, ``host.disk.staging``) of a file cannot drift apart.
"""

from __future__ import annotations

from pathlib import Path

# --- Fixed by the spec: not configurable. ---------------------------------------------------

# A kernel that is not ready within this many seconds counts as failed to start.
STARTUP_TIMEOUT_S = 10.0

# After an interrupt (timeout, abort), a kernel gets this long to settle before it is killed.
GRACE_S = 1.0

# The comm frame cap is lemon_exec.wire.protocol.FRAME_CAP_BYTES (the kernel imports it).

# --- lemon_exec's own names and bounds. ------------------------------------------------------

# The installed ``lemon_exec`` package directory: what kernels put on their path (their
# staging root links it) and what a sandboxed kernel must still see.
PACKAGE_DIR = Path(__file__).resolve().parent

# Name prefix of the per-process private staging roots under the temp directory.
STAGING_ROOT_PREFIX = "lemon-exec-"

# Name prefix of output spill files; the reaper only ever deletes files with this prefix.
SPILL_PREFIX = "lemon-exec-output-"

# Most directory entries one bounded tree removal visits before it gives up.
REMOVE_TREE_MAX_ENTRIES = 10_000

# Defaults of `lemon-exec mcp --http`'s bounds on slow and idle clients (lemon_exec.mcp.HttpLimits;
# here so that the CLI's help states them without importing the mcp package).
HTTP_HEADER_TIMEOUT_S = 10.0
HTTP_BODY_TIMEOUT_S = 30.0
HTTP_KEEP_ALIVE_TIMEOUT_S = 5.0
HTTP_MAX_CONNECTIONS = 100
