"""``lemon-exec notebook run IN.ipynb``: run a notebook as an execute_code scenario.

Each non-empty code cell is one execute_code call in one session (see ``docs/notebooks.md``).
The results go into the cell outputs of ``-o OUT.ipynb`` (or of IN with ``--inplace``);
``--check`` compares them with the outputs IN already holds, as the pytest plugin does.

Exit status: 0 when every call met its expectations (and, with ``--check``, matched the
stored outputs), 1 otherwise, 2 for usage errors (unreadable notebook, bad metadata,
nbformat missing).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

__all__ = ["register", "run_command"]

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2


def register(subparsers: Any) -> None:
    """Add the ``notebook`` subcommand (with its ``run`` action) to the parser."""
    parser = subparsers.add_parser(
        "notebook",
        help="run notebooks as execute_code scenarios",
        description="Notebook scenarios: every code cell is one execute_code call in one session.",
    )
    actions = parser.add_subparsers(dest="notebook_command", metavar="ACTION")
    actions.required = True
    run = actions.add_parser(
        "run",
        help="execute a scenario notebook through the execute_code engine",
        description=(
            "Run each non-empty code cell of IN as one execute_code call (one session per "
            "notebook; cell metadata 'lemon' may set timeout_ms, reset, mode, session and "
            "expect) and write each call's result, notify messages and details into the "
            "cell outputs."
        ),
        epilog="exit status: 0 all calls went as expected, 1 an expectation or --check "
        "failed, 2 usage error",
    )
    run.add_argument("notebook", metavar="IN.ipynb", help="the scenario notebook")
    target = run.add_mutually_exclusive_group()
    target.add_argument(
        "-o", "--output", metavar="OUT.ipynb", default=None, help="write the executed notebook here"
    )
    target.add_argument(
        "--inplace", action="store_true", help="write the executed notebook back to IN"
    )
    run.add_argument(
        "--normalize",
        action="store_true",
        help="write normalised outputs (placeholders for paths, durations, "
        "kernel ids), as stored golden outputs are",
    )
    run.add_argument(
        "--check",
        action="store_true",
        help="compare the results with the outputs IN holds (normalised); exit 1 on any difference",
    )
    run.add_argument(
        "--keep-cwd",
        action="store_true",
        help="keep the scenario's temporary working folder and print its path",
    )
    run.add_argument("-q", "--quiet", action="store_true", help="print only failures")
    run.set_defaults(func=run_command)


def run_command(args: argparse.Namespace) -> int:
    """Run the scenario and report; see the module docstring for the exit status."""
    try:
        from lemon_exec.notebooks import runner
    except ImportError as exc:  # nbformat is the notebook extra
        print(
            f"lemon-exec notebook: {exc.name or exc} is not installed; install "
            "lemon_exec[notebook] (nbformat)",
            file=sys.stderr,
        )
        return EXIT_USAGE
    path = Path(args.notebook)
    try:
        nb = runner.load_notebook(path)
    except (OSError, ValueError) as exc:
        print(f"lemon-exec notebook: cannot read {path}: {exc}", file=sys.stderr)
        return EXIT_USAGE

    def progress(call: runner.CallRecord) -> None:
        if args.quiet and not call.failures:
            return
        status = runner.status_line(call.details, call.trust, len(call.notify), len(call.images))
        extra = call.options.describe()
        print(f"[{call.execution_count}] {call.summary}" + (f"  ({extra})" if extra else ""))
        print(f"    {_plain(status)}")
        for failure in call.failures:
            print(f"    FAILED: {failure}")

    try:
        result = runner.run_scenario_sync(nb, path=path, progress=progress, keep_cwd=args.keep_cwd)
    except runner.ScenarioError as exc:
        print(f"lemon-exec notebook: {path}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    status = EXIT_OK if result.ok else EXIT_FAILED
    if args.check:
        problems = runner.compare_outputs(nb, result)
        for problem in problems:
            print(f"MISMATCH {problem}")
        if problems:
            status = EXIT_FAILED
    out = path if args.inplace else (Path(args.output) if args.output else None)
    if out is not None:
        runner.write_outputs(nb, result, normalized=args.normalize)
        runner.save_notebook(nb, out)
        if not args.quiet:
            print(f"wrote {out}")
    if args.keep_cwd:
        print(f"working folder kept: {result.cwd}")
    if not args.quiet or status:
        total = len(result.calls)
        failed = sum(1 for c in result.calls if c.failures)
        print(f"{total - failed} of {total} calls went as expected")
    return status


def _plain(markdown: str) -> str:
    """The status line without Markdown emphasis, for a terminal."""
    return markdown.replace("**", "").replace("`", "")
