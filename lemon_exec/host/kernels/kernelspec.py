"""The lemon-python kernel spec, built in memory for a chosen interpreter.

The shipped ``kernelspec/lemon-python/kernel.json`` (argv[0] ``python``, which jupyter_client
replaces with its own interpreter) serves Jupyter running in the environment lemon_exec is
installed in. ``lemon-exec kernelspec install`` writes :func:`kernel_json` with this
interpreter's absolute path, for a Jupyter anywhere else. The host builds the spec for the
configured interpreter and hands it to jupyter_client through a KernelSpecManager, the
documented seam for "which kernel, how launched" (a provisioner in kernel.json metadata can
move kernels elsewhere).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from jupyter_client.kernelspec import KernelSpec, KernelSpecManager, NoSuchKernel
from traitlets import Dict, List, Unicode

from lemon_exec._constants import PACKAGE_DIR

KERNEL_NAME = "lemon-python"
DISPLAY_NAME = "Python 3 (lemon_exec)"
#: The kernel's argv after the interpreter.
KERNEL_ARGV_TAIL = ("-m", "lemon_exec.kernel", "-f", "{connection_file}")


def kernel_pythonpath(staging_pypath: Path) -> str:
    """A directory that holds only ``lemon_exec`` (a symlink), for the kernel's PYTHONPATH.

    Putting the host's site-packages on another interpreter's path would mix two Pythons'
    packages; a directory with just our package avoids that.
    """
    link = staging_pypath / "lemon_exec"
    if not link.exists():
        staging_pypath.mkdir(mode=0o700, exist_ok=True)
        os.symlink(PACKAGE_DIR, link)
    return str(staging_pypath)


def kernel_json(interpreter: str, *, display_name: str = DISPLAY_NAME) -> dict[str, Any]:
    """The kernel.json of lemon-python run by ``interpreter`` (the shipped file's shape)."""
    return {
        "argv": [interpreter, *KERNEL_ARGV_TAIL],
        "display_name": display_name,
        "language": "python",
        "interrupt_mode": "signal",
        "metadata": {"debugger": False, "lemon_protocol": 1},
    }


#: Enterprise Gateway's process proxies, by where the kernel runs.
LOCAL_PROCESS_PROXY = "enterprise_gateway.services.processproxies.processproxy.LocalProcessProxy"
KUBERNETES_PROCESS_PROXY = "enterprise_gateway.services.processproxies.k8s.KubernetesProcessProxy"
#: Where Enterprise Gateway's own image keeps its Kubernetes launcher (its python_kubernetes
#: kernelspec): the launcher renders the kernel pod and is the same for every Python image.
EG_KUBERNETES_LAUNCHER = (
    "/usr/local/share/jupyter/kernels/python_kubernetes/scripts/launch_kubernetes.py"
)


def gateway_kernel_json(
    interpreter: str, *, kubernetes_image: str | None = None, display_name: str = DISPLAY_NAME
) -> dict[str, Any]:
    """The kernel.json Enterprise Gateway needs to run lemon-python (docs/scale-out.md).

    Without ``kubernetes_image``: kernels run as processes on the gateway's machine
    (LocalProcessProxy), started by ``interpreter``. With it: each kernel is a pod of that
    image (the Dockerfile's: lemon_exec installed, its command
    :mod:`lemon_exec.kernel.gateway_launcher`), rendered by Enterprise Gateway's Kubernetes
    launcher, which passes the pod the kernel id, response address and public key.
    """
    if kubernetes_image is None:
        spec = kernel_json(interpreter, display_name=display_name)
        spec["metadata"]["process_proxy"] = {"class_name": LOCAL_PROCESS_PROXY}
        return spec
    return {
        "argv": [
            "python",
            EG_KUBERNETES_LAUNCHER,
            "--kernel-id",
            "{kernel_id}",
            "--port-range",
            "{port_range}",
            "--response-address",
            "{response_address}",
            "--public-key",
            "{public_key}",
        ],
        "display_name": display_name,
        "language": "python",
        "metadata": {
            "debugger": False,
            "lemon_protocol": 1,
            "process_proxy": {
                "class_name": KUBERNETES_PROCESS_PROXY,
                "config": {"image_name": kubernetes_image},
            },
        },
        "env": {},
    }


class LemonKernelSpecManager(KernelSpecManager):
    """Serves the ``lemon-python`` spec for one interpreter; other names as usual."""

    interpreter = Unicode(help="Absolute path of the Python interpreter that runs the kernel.")
    env = Dict(help="Extra environment variables for the kernel process.")
    fork_server_id = Unicode(
        "", help="Id of a ForkServer to launch through (empty: a plain Popen launch)."
    )
    argv_prefix = List(
        Unicode(),
        help="Words run before the interpreter: the sandbox launcher (host/kernels/sandbox.py).",
    )

    def get_kernel_spec(self, kernel_name: str) -> KernelSpec:
        if kernel_name != KERNEL_NAME:
            return super().get_kernel_spec(kernel_name)
        if not self.interpreter:
            raise NoSuchKernel(kernel_name)
        spec = kernel_json(self.interpreter)
        spec["argv"] = [*self.argv_prefix, *spec["argv"]]
        spec["env"] = dict(self.env)
        spec["metadata"] = self._metadata()
        return KernelSpec(**spec)

    def _metadata(self) -> dict[str, object]:
        metadata: dict[str, object] = {"debugger": False}
        if self.fork_server_id:
            metadata["kernel_provisioner"] = {
                "provisioner_name": "lemon-forkserver",
                "config": {"server_id": self.fork_server_id},
            }
        return metadata
