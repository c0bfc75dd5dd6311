"""``lemon-exec run FILE [-- ARGS]``: run one script through the execute_code tool.

Like ``python FILE``, the script's printed output (stdout and stderr, merged in order) streams
live to stdout, its tracebacks name FILE, and ``sys.argv`` is ``[FILE, *ARGS]``. When it ends,
the rest of the tool result follows on stdout: the headline of a failure, notes, and the
``text()`` blocks (the printed output is not repeated). ``--json`` prints the whole result as
one JSON object instead, and streams nothing but ``notify()`` lines (on stderr).

Images the script showed with ``image()`` are written to files (see
:mod:`lemon_exec.cli.images`) and each path is named on stderr, so stdout stays the script's
output and its result. ``--json`` carries them base64 in the object instead (``images``) and
writes files only when ``--images-dir`` asks for them.

Running the command is the user's explicit opt-in, so the tool is enabled unless a config
file or the environment turns it off explicitly (``ExecuteCodeConfig.load(...,
default_enabled=True)``); the library default stays disabled.

Exit status: 0 when the script succeeded, 1 when it failed (exception, non-zero exit, timeout,
crash), 2 for usage and configuration errors (unreadable script, bad config, refused call),
130 after Ctrl-C and 143 after SIGTERM (the run is aborted and cleaned up first).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import os
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lemon_exec.cli.images import describe, prepare_images_dir, save_images, script_stem
from lemon_exec.cli.live import LiveOutput, unstreamed_content, write_text
from lemon_exec.config import ExecuteCodeConfig
from lemon_exec.errors import LemonExecError
from lemon_exec.facade import ExecuteCode
from lemon_exec.result import ExecuteCodeResult
from lemon_exec.scope import ScriptSource
from lemon_exec.tools import ToolRegistry

__all__ = ["register", "run_command"]

EXIT_OK = 0
EXIT_SCRIPT_FAILED = 1
EXIT_USAGE = 2

#: Exit status after each signal that aborts a run: 128 + signal number, as shells report.
_SIGNAL_EXIT = {signal.SIGINT: 130, signal.SIGTERM: 143}

_PROG = "lemon-exec"


def register(subparsers: Any) -> None:
    """Add the ``run`` subcommand to the ``lemon-exec`` parser."""
    parser = subparsers.add_parser(
        "run",
        help="run a Python script as the execute_code tool would",
        description=(
            "Run a Python script in a fresh lemon-python kernel with the execute_code helpers "
            "(read, grep, find, ls, webfetch, text, notify, batch) and print the tool result. "
            "The script runs in the current directory; its printed output streams live to "
            "stdout, and the text() blocks and a failure's headline follow when it ends. "
            "execute_code is enabled unless the config file or LEMON_EXECUTE_CODE_ENABLED "
            "disables it."
        ),
        epilog=(
            "exit status: 0 script succeeded, 1 script failed or timed out, "
            "2 usage or configuration error, 130 interrupted (Ctrl-C)"
        ),
    )
    parser.add_argument("file", metavar="FILE", help="the script to run, or - to read stdin")
    parser.add_argument(
        "--mcp-config",
        metavar="FILE",
        default=None,
        help='JSON file {"mcpServers": {...}}: each server\'s tools become helpers in the '
        "script, tools.<server>.<tool>(...)",
    )
    parser.add_argument(
        "script_args",
        nargs="*",
        metavar="ARGS",
        help="arguments for the script, after --: sys.argv is [FILE, ARGS...]",
    )
    parser.add_argument(
        "--timeout-ms",
        type=int,
        default=None,
        metavar="MS",
        help="wall-time limit of this run in milliseconds (at least 1000); overrides "
        "timeout_ms from the config file and the environment",
    )
    parser.add_argument(
        "--config",
        metavar="PATH",
        default=None,
        help="TOML file with a [runtime.tools.execute_code] table",
    )
    parser.add_argument(
        "--sandbox",
        action="store_true",
        help='run kernels under bubblewrap (sandbox = "bwrap"; see docs/sandbox.md): no '
        "network, read-only filesystem, hidden credential stores; refused when bwrap "
        "is missing",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        dest="as_json",
        help='print the result as one JSON object {"content", "details", "trust"} (and '
        '"images", base64, when the script showed any)',
    )
    parser.add_argument(
        "--images-dir",
        metavar="DIR",
        default=None,
        help="write the images the script shows to DIR (made if missing) as FILE-1.png, ...; "
        "an existing file is never replaced. Default: beside the output spill file (kept "
        "24 h), or no files with --json. Each path is printed on stderr",
    )
    parser.set_defaults(func=run_command)


def run_command(args: argparse.Namespace) -> int:
    """Run ``args.file`` and print its result; return the exit status."""
    script = _read_script(args.file)
    if script is None:
        return EXIT_USAGE
    if not script.strip():
        _error(f"script {_display_name(args.file)} is empty; nothing to run")
        return EXIT_USAGE
    try:
        config = ExecuteCodeConfig.load(
            args.config, default_enabled=True, sandbox="bwrap" if args.sandbox else None
        )
    except LemonExecError as exc:
        _error(str(exc))
        return EXIT_USAGE
    images_dir: Path | None = None
    if args.images_dir is not None:
        try:
            images_dir = prepare_images_dir(args.images_dir)
        except OSError as exc:
            _error(f"--images-dir {args.images_dir}: {exc.strerror or exc}")
            return EXIT_USAGE
    registry = None
    if args.mcp_config is not None:
        from lemon_exec.tools._mcp_config import registry_with_mcp_servers

        try:
            registry = registry_with_mcp_servers(args.mcp_config)
        except LemonExecError as exc:
            _error(str(exc))
            return EXIT_USAGE
    # One run cannot use a spare or a fork-server template: starting either would only cost
    # a second Python process (measured: ~2x the CPU of the whole command) for nothing.
    config.warm_kernels = 0
    config.fork_server = False
    timeout_ms: int | None = args.timeout_ms
    if timeout_ms is not None:
        # The flag wins over file and environment, like any command-line option; the call's
        # own clamp keeps the 1000 ms floor.
        config.timeout_ms = max(timeout_ms, 1000)

    # As `python FILE ARGS` would: sys.argv[0] is FILE as typed, tracebacks name it too.
    script_args = [a for a in args.script_args]
    if script_args[:1] == ["--"]:  # argparse keeps a "--" that follows a positional
        script_args = script_args[1:]
    source = _SourceName(
        filename="<stdin>" if args.file == "-" else args.file,
        argv=(args.file, *script_args),
    )
    live = None if args.as_json else LiveOutput(sys.stdout)
    images = None if args.as_json and images_dir is None else _ImageSink(images_dir, args.file)

    try:
        result, signum = asyncio.run(
            _run(script, config, timeout_ms, source, live, registry, images)
        )
    except LemonExecError as exc:  # e.g. the private staging directory could not be made
        _error(str(exc))
        return EXIT_USAGE

    refused = bool(result.details.get("error")) and result.details.get("exit_code") is None
    try:
        if args.as_json:
            _write(json.dumps(result.to_dict(), ensure_ascii=False, default=str) + "\n")
        elif not refused:
            assert live is not None
            live.end_line()
            rest = unstreamed_content(result, live)
            if rest:
                _write(("\n" if live.wrote_any else "") + rest.rstrip("\n") + "\n")
    except BrokenPipeError:
        _silence_stdout()
    if images is not None:
        images.report()
    if signum is not None:
        return _SIGNAL_EXIT.get(signum, 128 + int(signum))
    if refused:
        _error(result.content)
        return EXIT_USAGE
    if images is not None and images.failed:
        return EXIT_SCRIPT_FAILED  # the script's images did not reach the user
    return EXIT_OK if result.ok else EXIT_SCRIPT_FAILED


class _ImageSink:
    """Saves a result's images (``--images-dir``, else the spill directory) and reports them."""

    def __init__(self, directory: Path | None, filename: str) -> None:
        self._directory = directory
        self._stem = script_stem(filename)
        self._lines: list[str] = []
        self.failed = False

    def save(self, result: ExecuteCodeResult, spill_dir: Path | None) -> None:
        """Write the images; called while the facade (and so its spill directory) is open."""
        if not result.images:
            return
        directory = self._directory if self._directory is not None else spill_dir
        if directory is None:  # pragma: no cover - a result with images had a staging root
            self._fail(f"{len(result.images)} image(s) not saved: no directory to put them in")
            return
        try:
            paths = save_images(
                result.images, directory, stem=self._stem, private=self._directory is None
            )
        except (OSError, LemonExecError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
            self._fail(f"cannot save the script's images in {directory}: {reason}")
            return
        self._lines = [
            describe(n, image, path)
            for n, (image, path) in enumerate(zip(result.images, paths, strict=True), start=1)
        ]

    def report(self) -> None:
        for line in self._lines:
            _note(line)

    def _fail(self, message: str) -> None:
        self.failed = True
        self._lines = []
        _error(message)


@dataclass(frozen=True)
class _SourceName:
    filename: str  # what tracebacks call the script
    argv: tuple[str, ...]  # sys.argv in the script


async def _run(
    script: str,
    config: ExecuteCodeConfig,
    timeout_ms: int | None,
    source: _SourceName,
    live: LiveOutput | None,
    registry: ToolRegistry | None = None,
    images: _ImageSink | None = None,
) -> tuple[ExecuteCodeResult, signal.Signals | None]:
    """Run ``script``; Ctrl-C or SIGTERM aborts the run. Returns the result and the signal."""
    loop = asyncio.get_running_loop()
    abort = asyncio.Event()
    received: list[signal.Signals] = []

    def on_signal(signum: signal.Signals) -> None:
        if not received:
            received.append(signum)
        abort.set()
        # A second Ctrl-C gets Python's default behaviour back, so a stuck cleanup can still
        # be interrupted (KeyboardInterrupt, exit 130 from the CLI's main).
        loop.remove_signal_handler(signum)

    installed: list[signal.Signals] = []
    for signum in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(signum, on_signal, signum)
            installed.append(signum)
    try:
        async with ExecuteCode(config, tools=registry) as tool:
            # The spill file a result names outlives the tool (24 h; see host/disk/staging.py).
            result = await tool.run(
                script,
                timeout_ms=timeout_ms,
                on_update=_notify,
                abort=abort,
                on_output=None if live is None else live.write,
                source=ScriptSource(source.filename, source.argv),
            )
            if images is not None:
                # Before the facade closes: its staging root keeps the spill directory (and
                # what is in it) only while something is there.
                images.save(result, tool.diagnostics.spill_dir)
    finally:
        for signum in installed:
            loop.remove_signal_handler(signum)
    return result, (received[0] if received else None)


def _notify(message: str) -> None:
    """Show a notify() partial update live, one line each (it already reads ``notify: ...``)."""
    with contextlib.suppress(OSError):
        sys.stderr.write(f"{message}\n")
        sys.stderr.flush()


def _note(message: str) -> None:
    """One informational line on stderr (``lemon-exec: image 1 (...): PATH``)."""
    with contextlib.suppress(OSError):
        sys.stderr.write(f"{_PROG}: {message}\n")
        sys.stderr.flush()


def _silence_stdout() -> None:
    """The reader went away (e.g. `| head`); don't let Python complain at exit either."""
    with contextlib.suppress(OSError):
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def _read_script(name: str) -> str | None:
    """The script's source, decoded like Python decodes a file; None after reporting why not."""
    try:
        if name == "-":
            data = sys.stdin.buffer.read()
        else:
            with open(name, "rb") as handle:
                data = handle.read()
    except OSError as exc:
        _error(f"cannot read script {_display_name(name)}: {exc.strerror or exc}")
        return None
    try:
        # Honours a PEP 263 coding line and a BOM, as `python FILE` would.
        return importlib.util.decode_source(data)
    except (SyntaxError, UnicodeDecodeError, LookupError) as exc:
        _error(f"cannot read script {_display_name(name)}: not valid source text ({exc})")
        return None


def _display_name(name: str) -> str:
    return "from stdin" if name == "-" else name


def _error(message: str) -> None:
    """One actionable line on stderr."""
    line = " ".join(message.split())
    with contextlib.suppress(OSError):
        sys.stderr.write(f"{_PROG}: {line}\n")
        sys.stderr.flush()


def _write(text: str) -> None:
    write_text(sys.stdout, text)
