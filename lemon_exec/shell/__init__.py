"""The shell tool: a shell session that remembers its working directory between calls.

This is the engine behind the ``code-execution-tools`` MCP server's ``execute_command`` and
``restart_session`` tools. Each command runs in a fresh ``/bin/bash -c`` subprocess started in
the session's working directory, under a small wrapper (``_reaper``) that is a child
subreaper and traces bash only to read, from ``/proc``, the directory bash finished in; that
directory becomes the start of the next call. Nothing else carries over. Optionally every
command runs in the execute_code kernels' bubblewrap sandbox.

Settings, read on every call:

* ``DPTTOOLS_SANDBOX_TIMEOUT`` (default 30): default timeout and ceiling, in seconds.
* ``DPTTOOLS_OUTPUT_TRUNCATION_LIMIT`` (default 50000): characters kept of stdout and of
  stderr each.

Linux only. The Windows (cmd.exe) branch of the spec is out of scope: this package always
uses ``/bin/bash``.

See ``docs/shell.md`` for the full behaviour.
"""

from __future__ import annotations

from ._result import CommandResult
from ._session import ShellSession

__all__ = ["CommandResult", "ShellSession"]
