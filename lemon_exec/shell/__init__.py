"""The shell tool: a shell session that remembers its working directory between calls.

This is the engine behind the ``code-execution-tools`` MCP server's ``execute_command`` and
``restart_session`` tools. Each command runs in a fresh ``/bin/bash -c`` subprocess started in
the session's working directory; the directory the command finished in (found with an EXIT
trap, also after ``exit N``) becomes the start of the next call. Nothing else carries over.

Settings, read on every call:

* ``DPTTOOLS_SANDBOX_TIMEOUT`` (default 30): default timeout and ceiling, in seconds.
* ``DPTTOOLS_OUTPUT_TRUNCATION_LIMIT`` (default 50000): characters kept of stdout and of
  stderr each.

Linux and macOS only. The Windows (cmd.exe) branch of the spec is out of scope: this package
always uses ``/bin/bash`` and POSIX process groups.

See ``docs/shell.md`` for the full behaviour.
"""

from __future__ import annotations

from ._result import CommandResult
from ._session import ShellSession

__all__ = ["CommandResult", "ShellSession"]
