"""The ``lemon-exec`` command line: one module per subcommand, each with ``register()``.

Each subcommand module defines ``register(subparsers)`` that adds its parser and sets
``func`` (a callable taking the parsed ``argparse.Namespace`` and returning an exit status).
"""

from __future__ import annotations

import importlib
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import argparse

# Only builtin modules above: until main() is running, a Ctrl-C would end the command with a
# traceback, so everything else is imported inside main(), where it is caught.

#: Subcommand modules, in the order ``--help`` lists them.
_SUBCOMMANDS = ("run", "mcp", "jobs", "kernels", "notebook", "kernelspec")


def build_parser() -> argparse.ArgumentParser:
    import argparse

    parser = argparse.ArgumentParser(
        prog="lemon-exec",
        description="Run Python scripts in Jupyter kernels as an agent's execute_code tool.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in _SUBCOMMANDS:
        try:
            module = importlib.import_module(f"lemon_exec.cli.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"lemon_exec.cli.{name}":
                continue  # subcommand not built (yet)
            raise
        module.register(sub)
    return parser


def version() -> str:
    """The installed distribution's version; the package's own when it is not installed."""
    import importlib.metadata

    try:
        return importlib.metadata.version("lemon_exec")
    except importlib.metadata.PackageNotFoundError:  # run from a checkout, not installed
        import lemon_exec

        return str(getattr(lemon_exec, "__version__", "unknown"))


def main(argv: list[str] | None = None) -> int:
    try:
        # Inside the try: building the parser imports every subcommand (jupyter_client,
        # asyncio, ...), long enough for an early Ctrl-C to land there.
        parser = build_parser()
        args = parser.parse_args(argv)
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("lemon-exec: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
