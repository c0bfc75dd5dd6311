"""The host's jupyter_client kernel manager (host/kernels/local/connfile.py): what it does
not do for every kernel, and that jupyter_client's own requests still work without it."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from lemon_exec.host.kernels.local.kernel import ManagedKernel

pytestmark = [pytest.mark.kernel, pytest.mark.timeout(120)]


def test_a_kernel_starts_without_a_control_socket_and_still_shuts_down_politely(
    tmp_path: Path,
) -> None:
    async def body() -> None:
        runtime = tmp_path / "runtime"
        runtime.mkdir(mode=0o700)
        kernel = await ManagedKernel.start(
            interpreter=sys.executable, cwd=str(tmp_path), runtime_dir=runtime
        )
        try:
            km = kernel._km
            assert km._control_socket is None  # none made, connected and closed per kernel
            # jupyter_client connects one on demand for the shutdown request.
            await km.shutdown_kernel(now=False)
            assert km._control_socket is None  # closed again by its cleanup
            assert not await km.is_alive()
        finally:
            await kernel.kill()

    asyncio.run(body())
