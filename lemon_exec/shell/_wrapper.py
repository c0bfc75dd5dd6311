"""Launch a user command with ``/bin/bash -c`` and learn the directory it finished in.

The command string is passed to ``bash -c`` untouched, so it behaves exactly as in a plain
``bash -c "command"`` (same ``$0`` and empty ``$@``, line numbers, error messages, ``set -x``
output). The directory is captured by an EXIT trap that bash installs *before* running the
command: ``BASH_ENV`` points at a per-call init file, which non-interactive bash sources
first. The init file

* unsets ``BASH_ENV`` again, so nested bash scripts do not source it (a ``BASH_ENV`` the
  caller had set is restored and sourced instead);
* sets a trap that writes ``pwd -P`` to a private file and re-exits with the status it found,
  so the command's exit code is unchanged and nothing is added to stdout or stderr.

The trap runs however the shell ends: normally, through ``exit N`` or ``set -e``, or by a
terminating signal such as the timeout's SIGTERM. Because output never carries the directory,
the command's output cannot spoof it. Everything lives in a fresh 0700 temporary directory
that is removed after the call.

Known gaps, in which case the session keeps the directory the command started in: a command
that replaces its shell with ``exec``, replaces the EXIT trap, or SIGKILLs its own shell.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass

BASH = "/bin/bash"

# ``$0`` of the command, as for ``bash -c "command"`` typed at a prompt.
_ARG0 = "bash"


@dataclass(frozen=True)
class Launch:
    """Everything needed to start one command."""

    argv: list[str]
    env: dict[str, str]
    # Where the EXIT trap writes the final directory; read it with ``read_cwd_file``.
    cwd_file: str


@contextlib.contextmanager
def prepared_launch(command: str) -> Iterator[Launch]:
    """Prepare the init file for one call; remove it (and the report) afterwards."""
    workdir = tempfile.mkdtemp(prefix="lemon-shell-")  # mode 0700
    try:
        cwd_file = os.path.join(workdir, "cwd")
        init_file = os.path.join(workdir, "init.sh")
        env = dict(os.environ)
        # POSIX mode makes bash ignore BASH_ENV, so it is switched on only in the init file.
        init = _init_script(cwd_file, env.pop("BASH_ENV", None), env.pop("POSIXLY_CORRECT", None))
        fd = os.open(init_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8", errors="surrogateescape") as handle:
            handle.write(init)
        env["BASH_ENV"] = init_file
        yield Launch(argv=[BASH, "-c", command, _ARG0], env=env, cwd_file=cwd_file)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _init_script(cwd_file: str, bash_env: str | None, posixly_correct: str | None) -> str:
    """Return the text of the init file that ``BASH_ENV`` points at."""
    # The first group silences ``set -x`` tracing of the trap itself; ``builtin`` bypasses
    # user functions named pwd/printf/set/exit; ``>|`` bypasses ``set -o noclobber``;
    # ``printf $PWD`` covers a directory deleted under the shell, where ``pwd -P`` fails.
    trap_body = (
        "{ __lemon_status=$?; builtin set +xv; } 2>/dev/null; "
        '{ builtin pwd -P || builtin printf "%s\\n" "$PWD"; } >| '
        f"{shlex.quote(cwd_file)} 2>/dev/null; "
        'builtin exit "$__lemon_status"'
    )
    lines = ["builtin unset BASH_ENV"]
    if bash_env:
        lines.append(f"BASH_ENV={shlex.quote(bash_env)}; builtin export BASH_ENV")
        lines.append('if [ -r "$BASH_ENV" ]; then builtin . "$BASH_ENV"; fi')
    lines.append(f"builtin trap {shlex.quote(trap_body)} EXIT")
    if posixly_correct is not None:
        lines.append(
            f"POSIXLY_CORRECT={shlex.quote(posixly_correct)}; builtin export POSIXLY_CORRECT"
        )
    return "\n".join(lines) + "\n"


def read_cwd_file(path: str) -> str | None:
    """Return the directory the trap wrote, or ``None`` if it wrote nothing usable."""
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError:
        return None
    # pwd ends its output with exactly one newline; a directory name may itself end in one.
    if data.endswith(b"\n"):
        data = data[:-1]
    if not data.startswith(b"/"):
        return None
    # fsdecode keeps undecodable bytes (surrogateescape), so the path round-trips to Popen.
    return os.fsdecode(data)
