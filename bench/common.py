"""Shared pieces of the benchmark: statistics, the report, lemon_exec helpers and a plain
ipykernel driven by plain jupyter_client (the peer the session figures compare against)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lemon_exec import ExecuteCode, ExecuteCodeConfig, SessionScope

TRIVIAL_SCRIPT = "print(1)\n"
TRIVIAL_CELL = "x = 1"
MIB = 1024 * 1024
RESULT_MARKER = "BENCH_JSON:"


# -- statistics and reporting ---------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) by linear interpolation between closest ranks."""
    if not values:
        return math.nan
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def summarize(values: Sequence[float]) -> dict[str, float | int]:
    """p50, p90, min, max and sample count of ``values``."""
    return {
        "p50": round(percentile(values, 50), 3),
        "p90": round(percentile(values, 90), 3),
        "min": round(min(values), 3) if values else math.nan,
        "max": round(max(values), 3) if values else math.nan,
        "n": len(values),
    }


@dataclass
class Report:
    """Figures (issue 5's names), their sample statistics, context numbers and errors."""

    figures: dict[str, float] = field(default_factory=dict)
    stats: dict[str, dict[str, Any]] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)

    def figure(self, name: str, value: float, samples: Sequence[float] | None = None) -> None:
        self.figures[name] = round(float(value), 3)
        if samples is not None:
            self.stats[name] = summarize(samples)

    def context(self, name: str, value: Any) -> None:
        self.extra[name] = round(value, 3) if isinstance(value, float) else value


def log(message: str) -> None:
    """Progress goes to stderr, so that ``--json`` leaves stdout to the JSON object."""
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# -- lemon_exec helpers ---------------------------------------------------------------------------


def lemon_config(**overrides: Any) -> ExecuteCodeConfig:
    """An enabled config with a 60 s timeout, ``overrides`` applied."""
    values: dict[str, Any] = {
        "enabled": True,
        "timeout_ms": 60_000,
        "warm_kernels": 1,
        "max_live_kernels": 16,
    }
    values.update(overrides)
    return ExecuteCodeConfig(**values)


def has_setting(name: str) -> bool:
    """Whether this lemon_exec has the setting ``name`` (the engine changes under us)."""
    return name in ExecuteCodeConfig.class_trait_names()


async def wait_quiet(ec: ExecuteCode, spares: int, timeout: float, sessions: int = 0) -> bool:
    """Wait until ``spares`` spares are ready and no other kernel is starting or stopping."""
    deadline = time.monotonic() + timeout
    while True:
        snap = ec.snapshot()
        if snap["spares"] >= spares and snap["kernels_total"] <= spares + sessions:
            return True
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.01)


async def timed_run(ec: ExecuteCode, script: str, scope: SessionScope) -> tuple[float, Any]:
    """Wall-clock milliseconds of one ``ec.run`` and its result (which must have succeeded)."""
    t0 = time.perf_counter()
    result = await ec.run(script, scope=scope)
    elapsed = (time.perf_counter() - t0) * 1000
    if result.details.get("exit_code") != 0:
        raise RuntimeError(f"script failed: {result.content[:500]!r} {result.details}")
    return elapsed, result


def script_json(result: Any) -> Any:
    """The JSON a benchmark script reported with ``text(BENCH_JSON:...)``."""
    found = [line for line in result.content.splitlines() if line.startswith(RESULT_MARKER)]
    if not found:
        raise RuntimeError(f"no {RESULT_MARKER} line in result: {result.content[:500]!r}")
    return json.loads(found[-1][len(RESULT_MARKER) :])


async def python_subprocess(interpreter: str, script: Path, cwd: str) -> float:
    """Milliseconds to run ``interpreter script`` with captured output, as asyncio does."""
    t0 = time.perf_counter()
    proc = await asyncio.create_subprocess_exec(
        interpreter,
        str(script),
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        out, err = await proc.communicate()
    finally:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
    elapsed = (time.perf_counter() - t0) * 1000
    if proc.returncode != 0 or out.strip() != b"1":
        raise RuntimeError(f"python subprocess failed ({proc.returncode}): {err[-500:]!r}")
    return elapsed


# -- plain jupyter_client on a plain ipykernel ----------------------------------------------------


def plain_kernel_manager(interpreter: str, kernel_name: str = "bench-plain-ipykernel") -> Any:
    """An AsyncKernelManager for ``interpreter -m ipykernel_launcher`` (no installed spec).

    ``kernel_name="python3"`` makes jupyter_client and nbclient treat it as the stock IPython
    kernel (nbclient then adds ``--HistoryManager.hist_file=:memory:``, as for ``python3``).
    """
    from jupyter_client import AsyncKernelManager
    from jupyter_client.kernelspec import KernelSpec, KernelSpecManager

    class _PlainSpecs(KernelSpecManager):  # type: ignore[misc]
        def get_kernel_spec(self, kernel_name: str) -> KernelSpec:
            return KernelSpec(
                argv=[interpreter, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                display_name="plain ipykernel",
                language="python",
            )

    return AsyncKernelManager(kernel_name=kernel_name, kernel_spec_manager=_PlainSpecs())


class RawKernel:
    """A plain ipykernel (``python3 -m ipykernel_launcher``) driven by plain jupyter_client."""

    def __init__(self, km: Any, kc: Any) -> None:
        self.km = km
        self.kc = kc

    @classmethod
    async def start(cls, interpreter: str, cwd: str) -> RawKernel:
        """Start the kernel; ready once it answered kernel_info and IOPub delivered a message.

        That is the fast readiness rule of issue 5 (``wait_for_ready`` would add its 0.2 s of
        IOPub silence), so that cold starts are compared on equal terms.
        """
        km = plain_kernel_manager(interpreter)
        kernel = None
        try:
            await km.start_kernel(cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            kc = km.client()
            kc.start_channels()
            kernel = cls(km, kc)
            await asyncio.wait_for(kernel._ready(), 60)
            return kernel
        except BaseException:
            if kernel is not None:
                await kernel.aclose()
            else:
                with contextlib.suppress(Exception):
                    await km.shutdown_kernel(now=True)
            raise

    async def _ready(self) -> None:
        msg_id = self.kc.kernel_info()

        async def reply() -> None:
            while True:
                msg = await self.kc.get_shell_msg(timeout=60)
                if msg["parent_header"].get("msg_id") == msg_id:
                    return

        async def iopub() -> None:
            await self.kc.get_iopub_msg(timeout=60)  # iopub_welcome (ipykernel >= 7.2) or status

        await asyncio.gather(reply(), iopub())

    async def execute(self, code: str) -> str:
        """Run ``code``; return its stdout once the reply and IOPub ``idle`` have arrived."""
        msg_id = self.kc.execute(code)
        stdout: list[str] = []
        got_reply = False
        got_idle = False

        async def reply() -> None:
            nonlocal got_reply
            while not got_reply:
                msg = await self.kc.get_shell_msg(timeout=60)
                got_reply = msg["parent_header"].get("msg_id") == msg_id

        async def iopub() -> None:
            nonlocal got_idle
            while not got_idle:
                msg = await self.kc.get_iopub_msg(timeout=60)
                if msg["parent_header"].get("msg_id") != msg_id:
                    continue
                if msg["msg_type"] == "stream":
                    stdout.append(msg["content"]["text"])
                got_idle = (
                    msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle"
                )

        await asyncio.gather(reply(), iopub())
        return "".join(stdout)

    @property
    def pid(self) -> int | None:
        return getattr(self.km.provisioner, "pid", None)

    async def aclose(self) -> None:
        with contextlib.suppress(Exception):
            self.kc.stop_channels()
        with contextlib.suppress(Exception):
            await self.km.shutdown_kernel(now=True)


async def timed_ms(awaitable: Awaitable[Any]) -> float:
    """Wall-clock milliseconds ``awaitable`` takes."""
    t0 = time.perf_counter()
    await awaitable
    return (time.perf_counter() - t0) * 1000


async def alternate(
    pairs: int,
    first: Callable[[], Awaitable[float]],
    second: Callable[[], Awaitable[float]],
    *,
    after: Callable[[int], Awaitable[None]] | None = None,
) -> tuple[list[float], list[float]]:
    """Samples of two measurements taken in turn, each going first every other pair (so
    load from other processes slows both alike); ``after(i)`` runs after pair ``i``."""
    a: list[float] = []
    b: list[float] = []
    for i in range(pairs):
        if i % 2 == 0:
            a.append(await first())
            b.append(await second())
        else:
            b.append(await second())
            a.append(await first())
        if after is not None:
            await after(i)
    return a, b


async def sleep_until(when: float) -> None:
    delay = when - time.monotonic()
    if delay > 0:
        await asyncio.sleep(delay)
