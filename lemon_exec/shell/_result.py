"""The result dictionary of ``execute_command``."""

from __future__ import annotations

from typing import TypedDict


class CommandResult(TypedDict):
    """What ``execute_command`` returns; serialises to the tool's JSON result as is.

    ``exit_code`` is bash's exit status, ``128 + signum`` when bash was killed by a signal, and
    ``-1`` when the command timed out, was cancelled, or was refused before running.
    """

    stdout: str
    stderr: str
    exit_code: int
    timed_out: bool


def make_result(
    *, stdout: str = "", stderr: str = "", exit_code: int, timed_out: bool = False
) -> CommandResult:
    """Build a ``CommandResult`` (keyword-only, so fields cannot be swapped by accident)."""
    return CommandResult(stdout=stdout, stderr=stderr, exit_code=exit_code, timed_out=timed_out)
