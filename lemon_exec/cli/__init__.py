"""The ``lemon-exec`` command line: one module per subcommand, each with ``register()``.

Each subcommand module defines ``register(subparsers)`` that adds its parser and sets
``func`` (a callable taking the parsed ``argparse.Namespace`` and returning an exit status).
"""

from __future__ import annotations

import argparse
import importlib
import sys

#: Subcommand modules, in the order ``--help`` lists them.
_SUBCOMMANDS = ("run", "mcp", "kernels", "notebook", "kernelspec")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lemon-exec",
        description="Run Python scripts in Jupyter kernels as an agent's execute_code tool.",
    )
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


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("lemon-exec: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
