"""``lemon-exec kernelspec install``: register lemon-python with Jupyter, for any Jupyter.

The written kernel.json names this interpreter by absolute path (``sys.executable``), so a
Jupyter installed in another environment (JupyterLab from pipx, VS Code's Jupyter, a system
Jupyter) starts the kernel with the Python that has lemon_exec. ``python -m lemon_exec.kernel
install`` does the same (:func:`main`).

Exit status: 0 installed, 1 the destination cannot be written (e.g. the system-wide
directory without root: use --user or --sys-prefix), 2 usage errors (a bad --name).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["install_gateway_kernelspec", "install_kernelspec", "main", "register"]

#: A kernelspec name, as jupyter_client accepts it.
_NAME = re.compile(r"[a-z0-9._-]+")

EXIT_WRITE = 1
EXIT_USAGE = 2

_INSTALL_DESCRIPTION = (
    "Install the lemon-python kernelspec. Its kernel.json names this Python by absolute path "
    f"({sys.executable}), so any Jupyter, from any environment, starts the kernel with the "
    "interpreter that has lemon_exec. Without --user, --sys-prefix or --prefix it installs "
    "system-wide, as `jupyter kernelspec install` does."
)
_INSTALL_EPILOG = (
    "exit status: 0 installed, 1 the destination cannot be written, 2 usage error. "
    "An existing kernelspec of the same name is replaced."
)


def register(subparsers: Any) -> None:
    """Add the ``kernelspec`` subcommand to the ``lemon-exec`` parser."""
    parser = subparsers.add_parser(
        "kernelspec",
        help="install the lemon-python Jupyter kernelspec",
        description="Manage the lemon-python Jupyter kernelspec.",
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION")
    actions.required = True
    install = actions.add_parser(
        "install",
        help="install lemon-python for Jupyter, run by this Python",
        description=_INSTALL_DESCRIPTION,
        epilog=_INSTALL_EPILOG,
    )
    add_install_options(install)
    install.set_defaults(func=install_command)


def add_install_options(parser: argparse.ArgumentParser) -> None:
    """The install options (shared with ``python -m lemon_exec.kernel install``)."""
    from lemon_exec.host.kernels.kernelspec import DISPLAY_NAME, KERNEL_NAME

    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "--user",
        action="store_true",
        help="install for the current user (the Jupyter data directory) instead of system-wide",
    )
    where.add_argument(
        "--sys-prefix",
        action="store_true",
        help=f"install into this Python's prefix ({sys.prefix}): for Jupyter in this venv",
    )
    where.add_argument(
        "--prefix",
        metavar="PREFIX",
        default=None,
        help="install into PREFIX/share/jupyter/kernels (put PREFIX/share/jupyter on the "
        "other Jupyter's JUPYTER_PATH)",
    )
    where.add_argument(
        "--for-gateway",
        metavar="DIR",
        default=None,
        help="write a kernelspec for Jupyter Enterprise Gateway into DIR/NAME (DIR: a kernels "
        "directory the gateway reads, e.g. /usr/local/share/jupyter/kernels); see "
        "docs/scale-out.md",
    )
    parser.add_argument(
        "--kubernetes-image",
        metavar="IMAGE",
        default=None,
        help="with --for-gateway: kernels run as pods of IMAGE (built from the Dockerfile) "
        "through the gateway's Kubernetes process proxy, instead of as local processes",
    )
    parser.add_argument(
        "--name",
        default=KERNEL_NAME,
        help=f"the kernelspec's name (default: {KERNEL_NAME}); letters, digits, '.', '_', '-'",
    )
    parser.add_argument(
        "--display-name",
        default=DISPLAY_NAME,
        help=f"the name front ends show (default: {DISPLAY_NAME!r})",
    )


def install_command(args: argparse.Namespace) -> int:
    """Install as ``args`` say; print where. Returns the exit status."""
    prefix = sys.prefix if args.sys_prefix else args.prefix
    if args.kubernetes_image is not None and args.for_gateway is None:
        print(
            "lemon-exec kernelspec install: --kubernetes-image needs --for-gateway DIR",
            file=sys.stderr,
        )
        return EXIT_USAGE
    try:
        if args.for_gateway is not None:
            destination = install_gateway_kernelspec(
                args.for_gateway,
                name=args.name,
                display_name=args.display_name,
                kubernetes_image=args.kubernetes_image,
            )
        else:
            destination = install_kernelspec(
                name=args.name, display_name=args.display_name, user=args.user, prefix=prefix
            )
    except ValueError as exc:
        print(f"lemon-exec kernelspec install: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as exc:
        print(
            f"lemon-exec kernelspec install: cannot write the kernelspec: {exc}; "
            "install with --user (or --sys-prefix) instead",
            file=sys.stderr,
        )
        return EXIT_WRITE
    print(f"Installed kernelspec {args.name.lower()} in {destination}")
    if args.kubernetes_image is not None:
        print(f"  kernels run as pods of {args.kubernetes_image} (Kubernetes process proxy)")
    else:
        print(f"  interpreter: {os.path.abspath(sys.executable)}")
    return 0


def install_kernelspec(
    *,
    name: str | None = None,
    display_name: str | None = None,
    user: bool = False,
    prefix: str | None = None,
    interpreter: str | None = None,
) -> str:
    """Write the lemon-python kernelspec; return the directory it is in.

    ``interpreter`` defaults to this Python (``sys.executable``, absolute). ``user`` and
    ``prefix`` choose the location as for ``jupyter kernelspec install`` (neither: system
    wide). Raises ``ValueError`` for a bad name, ``OSError`` when it cannot be written.
    """
    from jupyter_client.kernelspec import KernelSpecManager

    from lemon_exec.host.kernels.kernelspec import DISPLAY_NAME, KERNEL_NAME, kernel_json

    python = os.path.abspath(interpreter or sys.executable)
    spec = kernel_json(python, display_name=display_name or DISPLAY_NAME)
    with tempfile.TemporaryDirectory(prefix="lemon-kernelspec-") as source:
        Path(source, "kernel.json").write_text(json.dumps(spec, indent=2) + "\n")
        _copy_logos(Path(source))
        return str(
            KernelSpecManager().install_kernel_spec(
                source, kernel_name=name or KERNEL_NAME, user=user, prefix=prefix
            )
        )


def install_gateway_kernelspec(
    directory: str,
    *,
    name: str | None = None,
    display_name: str | None = None,
    kubernetes_image: str | None = None,
    interpreter: str | None = None,
) -> str:
    """Write lemon-python for Enterprise Gateway into ``directory/name``; return that path.

    Enterprise Gateway reads kernelspecs from its Jupyter data path; ``directory`` is one of
    its ``kernels`` directories. Raises ``ValueError`` for a bad name, ``OSError`` when it
    cannot be written.
    """
    from lemon_exec.host.kernels.kernelspec import DISPLAY_NAME, KERNEL_NAME, gateway_kernel_json

    name = (name or KERNEL_NAME).lower()
    if not _NAME.fullmatch(name):
        raise ValueError(f"invalid kernelspec name {name!r}: use letters, digits, '.', '_', '-'")
    spec = gateway_kernel_json(
        os.path.abspath(interpreter or sys.executable),
        kubernetes_image=kubernetes_image,
        display_name=display_name or DISPLAY_NAME,
    )
    destination = Path(directory) / name
    destination.mkdir(parents=True, exist_ok=True)
    (destination / "kernel.json").write_text(json.dumps(spec, indent=2) + "\n")
    _copy_logos(destination)
    return str(destination)


def main(argv: list[str] | None = None) -> int:
    """``python -m lemon_exec.kernel install [options]``."""
    parser = argparse.ArgumentParser(
        prog="python -m lemon_exec.kernel install",
        description=_INSTALL_DESCRIPTION,
        epilog=_INSTALL_EPILOG,
    )
    add_install_options(parser)
    return install_command(parser.parse_args(argv))


def _copy_logos(directory: Path) -> None:
    # ipykernel's Python logos, so front ends show the usual icon; cosmetic, so optional.
    try:
        from ipykernel.kernelspec import RESOURCES
    except ImportError:  # pragma: no cover - ipykernel is a dependency
        return
    for logo in Path(RESOURCES).glob("logo-*"):
        shutil.copy(logo, directory / logo.name)
