"""The lemon-python kernel spec, built in memory for a chosen interpreter.

The shipped ``kernelspec/lemon-python/kernel.json`` lets Jupyter front ends start the kernel
under the Python they run in. The host instead builds the spec for the configured interpreter
and hands it to jupyter_client through a KernelSpecManager, the documented seam for "which
kernel, how launched" (a provisioner in kernel.json metadata can move kernels elsewhere).
"""

from __future__ import annotations

import os
from pathlib import Path

from jupyter_client.kernelspec import KernelSpec, KernelSpecManager, NoSuchKernel
from traitlets import Dict, Unicode

KERNEL_NAME = "lemon-python"

#: The directory holding the ``lemon_exec`` package; kernels get only it on their path.
PACKAGE_PARENT = str(Path(__file__).resolve().parents[2])


def kernel_pythonpath(staging_pypath: Path) -> str:
    """A directory that holds only ``lemon_exec`` (a symlink), for the kernel's PYTHONPATH.

    Putting the host's site-packages on another interpreter's path would mix two Pythons'
    packages; a directory with just our package avoids that.
    """
    link = staging_pypath / "lemon_exec"
    if not link.exists():
        staging_pypath.mkdir(mode=0o700, exist_ok=True)
        os.symlink(Path(PACKAGE_PARENT) / "lemon_exec", link)
    return str(staging_pypath)


class LemonKernelSpecManager(KernelSpecManager):
    """Serves the ``lemon-python`` spec for one interpreter; other names as usual."""

    interpreter = Unicode(help="Absolute path of the Python interpreter that runs the kernel.")
    env = Dict(help="Extra environment variables for the kernel process.")
    fork_server_id = Unicode(
        "", help="Id of a ForkServer to launch through (empty: a plain Popen launch)."
    )

    def get_kernel_spec(self, kernel_name: str) -> KernelSpec:
        if kernel_name != KERNEL_NAME:
            return super().get_kernel_spec(kernel_name)
        if not self.interpreter:
            raise NoSuchKernel(kernel_name)
        return KernelSpec(
            argv=[self.interpreter, "-m", "lemon_exec.kernel", "-f", "{connection_file}"],
            display_name="Python 3 (lemon_exec)",
            language="python",
            interrupt_mode="signal",
            env=dict(self.env),
            metadata=self._metadata(),
        )

    def _metadata(self) -> dict[str, object]:
        metadata: dict[str, object] = {"debugger": False}
        if self.fork_server_id:
            metadata["kernel_provisioner"] = {
                "provisioner_name": "lemon-forkserver",
                "config": {"server_id": self.fork_server_id},
            }
        return metadata
