"""The version rule of kernel/ipykernel_patches.py: every reach into ipykernel's internals is
listed, checked, and on an unknown version either fails the kernel's start (essential) or is
skipped with a warning (speed only)."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from lemon_exec.kernel import ipykernel_patches as patches

pytestmark = pytest.mark.timeout(60)

UNKNOWN = {"ipykernel": "8.0.0", "IPython": "9.18.1"}


def test_the_installed_versions_are_the_known_ones() -> None:
    # CI runs what pyproject pins: if this fails, the patches were not checked against it.
    assert patches.is_known(patches.installed_versions())
    assert patches.check() == frozenset()


def test_every_listed_seam_exists_in_the_installed_versions() -> None:
    # A misspelt or vanished name would make the rule misjudge an unknown version.
    missing = [
        f"{patch.name}: {module}.{name}"
        for patch in patches.PATCHES
        for module, name in patch.needs
        if not patches._has(module, name)
    ]
    assert missing == []
    assert len({patch.name for patch in patches.PATCHES}) == len(patches.PATCHES)


@pytest.mark.parametrize(
    ("versions", "known"),
    [
        ({"ipykernel": "7.4.0", "IPython": "9.0.1"}, True),
        ({"ipykernel": "7.12.0rc1", "IPython": "9.18.1"}, True),
        ({"ipykernel": "7.3.9", "IPython": "9.18.1"}, False),
        ({"ipykernel": "8.0.0", "IPython": "9.18.1"}, False),
        ({"ipykernel": "7.4.0", "IPython": "10.0.0.dev0"}, False),
        ({"ipykernel": "", "IPython": "9.18.1"}, False),
    ],
)
def test_known_versions(versions: dict[str, str], known: bool) -> None:
    assert patches.is_known(versions) is known


def _patch(essential: bool, present: bool) -> patches.Patch:
    name = "Kernel.do_execute" if present else "Kernel._no_such_private_method"
    return patches.Patch("probe", (("ipykernel.kernelbase", name),), essential, "the probe")


def test_an_unknown_version_with_every_seam_keeps_every_patch() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert patches.evaluate(UNKNOWN, patches.PATCHES) == frozenset()
        assert patches.evaluate(UNKNOWN, (_patch(True, True),)) == frozenset()


def test_a_speed_only_patch_without_its_seam_is_skipped_with_a_warning() -> None:
    with pytest.warns(RuntimeWarning, match=r"ipykernel 8\.0\.0.*the probe is skipped"):
        disabled = patches.evaluate(UNKNOWN, (_patch(False, False),))
    assert disabled == frozenset({"probe"})


def test_an_essential_patch_without_its_seam_is_fatal() -> None:
    with pytest.raises(patches.UnsupportedKernelVersion) as caught:
        patches.evaluate(UNKNOWN, (_patch(True, False), _patch(False, False)))
    message = str(caught.value)
    assert "ipykernel 8.0.0" in message and "ipykernel >=7.4,<8" in message
    assert "Kernel._no_such_private_method" in message


#: A kernel on an ipykernel whose heartbeat lost the private method BindingHeartbeat needs.
_BROKEN_KERNEL = """
import sys
import ipykernel
from ipykernel import heartbeat
ipykernel.__version__ = "8.0.0"
del heartbeat.Heartbeat._bind_socket
from lemon_exec.kernel.app import LemonKernelApp
LemonKernelApp.launch_instance(argv=["-f", sys.argv[1]])
"""


def test_a_kernel_on_an_unsupported_version_fails_its_start_at_once(tmp_path: Path) -> None:
    connection_file = tmp_path / "kernel.json"
    done = subprocess.run(
        [sys.executable, "-c", _BROKEN_KERNEL, str(connection_file)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1, done.stderr
    assert "UnsupportedKernelVersion" in done.stderr
    assert "Heartbeat._bind_socket" in done.stderr
    assert not connection_file.exists()  # nothing was bound or written


def test_a_kernel_whose_heartbeat_cannot_bind_fails_its_start(tmp_path: Path) -> None:
    """The heartbeat binds in its own thread; a bind that fails (here its ipc path is a
    directory; on a full disk, no inode for the socket's file) fails the start instead of
    leaving a kernel without a heartbeat and a thread's traceback in the first output."""
    ports = {"shell_port": 1, "iopub_port": 2, "stdin_port": 3, "control_port": 4, "hb_port": 5}
    connection_file = tmp_path / "kernel.json"
    connection_file.write_text(
        json.dumps(
            {
                **ports,
                "transport": "ipc",
                "ip": str(tmp_path / "k"),
                "key": "",
                "signature_scheme": "hmac-sha256",
            }
        )
    )
    (tmp_path / "k-5").mkdir()  # the heartbeat's socket path, taken
    done = subprocess.run(
        [sys.executable, "-m", "lemon_exec.kernel", "-f", str(connection_file)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode != 0, done.stderr
    assert "the heartbeat socket could not be bound" in done.stderr, done.stderr
