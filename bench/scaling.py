"""How cost grows (issue 17): ``python bench/run.py --scaling``.

Four sweeps, each on its own ``ExecuteCode`` facade:

- ``output_size``: per-call latency (host wall clock of ``ExecuteCode.run``) against the size
  of the script's output, 1 KB to 100 MB, written two ways: ``print`` (``sys.stdout.write``
  of 1 KiB lines in 64 KiB blocks: the IOPub stream, capped in the result at
  ``max_output_bytes`` and spilled to a file) and ``text()`` (blocks of up to 200,000 bytes:
  the result channel, with ``max_text_bytes`` raised to hold it all);
- ``helper_calls``: the wall clock of a cell making N ``read()`` calls of a 25-byte file, one
  after another (``serial``) or as one ``batch()`` (``batched``, ``max_parallel_rpc=4``), in a
  warm session kernel;
- ``sessions_memory``: total PSS of N live idle session kernels (each with its children),
  grown one step at a time on one facade;
- ``agents_throughput``: N agents (asyncio tasks) on one per-call facade with the default
  config, each running ``print(1)`` back to back (a closed loop); completed runs per second
  and latency, beside N callers running ``python3 -c "print(1)"`` subprocesses back to back,
  in alternating segments of the same run;
- ``peers``: the benchmark's ``peers`` group (bench/peers_group.py: ipybox, a fresh
  ipykernel per call, ``python3 -c``), so that one command writes every table of the page.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import statistics
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common import (
    MIB,
    TRIVIAL_SCRIPT,
    Report,
    lemon_config,
    log,
    percentile,
    timed_run,
    wait_quiet,
)
from bench.memory import descendants, pss_uss_of, pss_uss_of_single, tree_rss_mib
from bench.peers import pool_settled, python_c
from bench.peers_group import PeersFailed, bench_peers
from lemon_exec import ExecuteCode, ExecuteCodeConfig, SessionScope

KB = 1000
MB = 1000 * 1000


@dataclass(frozen=True)
class Grid:
    """The points of each sweep and how many samples each point takes."""

    kind: str
    output_sizes: tuple[int, ...]
    output_reps: int
    helper_calls: tuple[int, ...]
    helper_reps: int
    session_counts: tuple[int, ...]
    session_settle_s: float
    agent_counts: tuple[int, ...]
    agent_seconds: float
    agent_rounds: int
    peers: bool

    @classmethod
    def make(cls, kind: str) -> Grid:
        sizes = (1 * KB, 10 * KB, 100 * KB, 1 * MB, 10 * MB, 100 * MB)
        if kind == "smoke":  # the test suite's: every code path, a few seconds
            return cls(
                kind, (1 * KB, 10 * KB), 1, (1, 10), 1, (1, 2), 0.2, (1, 2), 0.5, 1, False
            )  # fmt: skip
        if kind == "quick":
            return cls(
                kind, sizes, 1, (1, 10, 100, 1000), 1, (1, 2, 4, 8, 16, 32, 64), 0.7,
                (1, 4, 16, 64), 3.0, 1, True,
            )  # fmt: skip
        # Issue 31's points: 1, 4, 16, 64 callers; 16, 64, 128 sessions (and the steps between).
        return cls(
            "full", sizes, 3, (1, 10, 100, 1000), 3, (1, 2, 4, 8, 16, 32, 64, 128), 2.0,
            (1, 4, 16, 64), 10.0, 2, True,
        )  # fmt: skip


PRINT_SCRIPT = """\
import sys
line = "x" * 1023 + "\\n"
n = {size} // 1024
block = line * 64
for _ in range(n // 64):
    sys.stdout.write(block)
sys.stdout.write(line * (n % 64) + "y" * ({size} % 1024))
"""

TEXT_SCRIPT = """\
size, step = {size}, 200_000
block = "y" * step
while size >= step:
    text(block)
    size -= step
if size:
    text("y" * size)
"""


def _reps(grid: Grid, size: int) -> int:
    """Fewer samples of the largest outputs (seconds each), at least one."""
    if size >= 100 * MB:
        return max(1, grid.output_reps - 1)
    return grid.output_reps


async def sweep_output_size(grid: Grid, workdir: Path) -> list[dict[str, Any]]:
    config = lemon_config(
        kernel_mode="per_call",
        warm_kernels=1,
        max_text_bytes=max(grid.output_sizes) * 2 + MIB,
        timeout_ms=300_000,
    )
    scope = SessionScope("bench-scale-output", "bench", str(workdir))
    rows: list[dict[str, Any]] = []
    async with ExecuteCode(config) as ec:
        await timed_run(ec, TRIVIAL_SCRIPT, scope)
        await wait_quiet(ec, 1, 30)
        for size in grid.output_sizes:
            samples: dict[str, list[float]] = {"print": [], "text": []}
            for i in range(_reps(grid, size)):
                order = ("print", "text") if i % 2 == 0 else ("text", "print")
                for via in order:
                    template = PRINT_SCRIPT if via == "print" else TEXT_SCRIPT
                    await wait_quiet(ec, 1, 30)
                    elapsed, _ = await timed_run(ec, template.format(size=size), scope)
                    samples[via].append(elapsed)
            for via, values in samples.items():
                p50 = statistics.median(values)
                rows.append(
                    {
                        "bytes": size,
                        "via": via,
                        "p50_ms": round(p50, 2),
                        "max_ms": round(max(values), 2),
                        "n": len(values),
                        "mib_per_s": float(f"{size / MIB / (p50 / 1000):.3g}"),
                    }
                )
            log(f"scaling output {size:>11,} B: print {rows[-2]['p50_ms']} ms, "
                f"text {rows[-1]['p50_ms']} ms")  # fmt: skip
    return rows


SERIAL_SCRIPT = """\
path = {path!r}
for _ in range({calls}):
    read(path)
"""

BATCHED_SCRIPT = """\
out = batch([("read", {{"path": {path!r}}})] * {calls})
assert len(out) == {calls}
"""


async def sweep_helper_calls(grid: Grid, workdir: Path) -> list[dict[str, Any]]:
    tiny = workdir / "scale-tiny.txt"
    tiny.write_text("hello from the benchmark\n")
    config = lemon_config(
        kernel_mode="session",
        warm_kernels=0,
        max_parallel_rpc=4,
        max_rpc_calls=1_000_000,
        max_rpc_result_bytes=1 << 30,
    )
    scope = SessionScope("bench-scale-helpers", "bench", str(workdir))
    rows: list[dict[str, Any]] = []
    async with ExecuteCode(config) as ec:
        await timed_run(ec, SERIAL_SCRIPT.format(path=str(tiny), calls=20), scope)  # warm-up
        for calls in grid.helper_calls:
            samples: dict[str, list[float]] = {"serial": [], "batched": []}
            for i in range(grid.helper_reps):
                order = ("serial", "batched") if i % 2 == 0 else ("batched", "serial")
                for mode in order:
                    template = SERIAL_SCRIPT if mode == "serial" else BATCHED_SCRIPT
                    elapsed, _ = await timed_run(
                        ec, template.format(path=str(tiny), calls=calls), scope
                    )
                    samples[mode].append(elapsed)
            for mode, values in samples.items():
                p50 = statistics.median(values)
                rows.append(
                    {
                        "calls": calls,
                        "mode": mode,
                        "p50_ms": round(p50, 2),
                        "per_call_ms": round(p50 / calls, 3),
                        "n": len(values),
                    }
                )
            log(f"scaling helpers {calls:>5}: serial {rows[-2]['p50_ms']} ms, "
                f"batched {rows[-1]['p50_ms']} ms")  # fmt: skip
    return rows


async def _start_session(ec: ExecuteCode, scope: SessionScope) -> int:
    _, result = await timed_run(ec, "import os\nprint(os.getpid())", scope)
    return int(result.content.strip().splitlines()[-1])


async def sweep_sessions_memory(grid: Grid, workdir: Path) -> list[dict[str, Any]]:
    most = max(grid.session_counts)
    config = lemon_config(kernel_mode="session", warm_kernels=0, max_live_kernels=most)
    rows: list[dict[str, Any]] = []
    pids: list[int] = []
    async with ExecuteCode(config) as ec:
        gate = asyncio.Semaphore(8)

        async def start(i: int) -> int:
            async with gate:
                return await _start_session(
                    ec, SessionScope(f"bench-scale-s{i}", "bench", str(workdir))
                )

        for count in grid.session_counts:
            pids.extend(await asyncio.gather(*(start(i) for i in range(len(pids), count))))
            live = ec.snapshot()["live"]
            if live != count:
                raise RuntimeError(f"expected {count} live session kernels, found {live}")
            await asyncio.sleep(grid.session_settle_s)
            pss, uss = pss_uss_of(pids)
            kernels = set(pids)
            for p in pids:
                kernels.update(descendants(p))
            others = [p for p in descendants(os.getpid()) if p not in kernels]
            rows.append(
                {
                    "kernels": count,
                    "pss_mb": round(pss, 1),
                    "pss_per_kernel_mb": round(pss / count, 2),
                    "uss_mb": round(uss, 1),
                    "rss_mb": round(sum(tree_rss_mib(p)[0] for p in pids), 1),
                    "template_pss_mb": round(pss_uss_of_single(others)[0], 1),
                }
            )
            log(f"scaling sessions {count:>3}: {rows[-1]['pss_mb']} MiB PSS")
    return rows


async def sweep_agents(grid: Grid, workdir: Path) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for agents in grid.agent_counts:
        rows.append(await _agents_point(agents, grid, workdir))
        log(f"scaling agents {agents:>2}: {rows[-1]['runs_per_s']} runs/s, "
            f"python3 -c {rows[-1]['python_runs_per_s']} runs/s")  # fmt: skip
    return rows


async def _closed_loop(
    callers: int, seconds: float, run: Callable[[int], Awaitable[float]]
) -> tuple[list[float], float]:
    """``callers`` tasks calling ``run(i)`` back to back for ``seconds``: samples and wall."""
    samples: list[float] = []
    start = time.monotonic()
    end = start + seconds

    async def caller(i: int) -> None:
        while time.monotonic() < end:
            samples.append(await run(i))

    await asyncio.gather(*(caller(i) for i in range(callers)))
    return samples, time.monotonic() - start


async def _agents_point(agents: int, grid: Grid, workdir: Path) -> dict[str, Any]:
    """``agents`` callers on a fresh per-call facade, in ``agent_rounds`` rounds each of a
    lemon_exec segment and a ``python3 -c`` segment (which goes first alternates)."""
    # The default config (warm_kernels, max_concurrent_per_call): a runtime's facade.
    config = ExecuteCodeConfig(enabled=True, timeout_ms=60_000, kernel_mode="per_call")
    interpreter = config.resolve_python()
    segment = grid.agent_seconds / grid.agent_rounds
    lemon: list[float] = []
    python: list[float] = []
    walls = {"lemon": 0.0, "python": 0.0}
    async with ExecuteCode(config) as ec:
        scopes = [
            SessionScope(f"bench-scale-agent-{i}", "bench", str(workdir)) for i in range(agents)
        ]
        await timed_run(ec, TRIVIAL_SCRIPT, SessionScope("warm", "bench", str(workdir)))

        async def lemon_run(i: int) -> float:
            return (await timed_run(ec, TRIVIAL_SCRIPT, scopes[i]))[0]

        async def python_run(i: int) -> float:
            return await python_c(interpreter, str(workdir))

        async def lemon_segment() -> None:
            await pool_settled(ec, config.warm_kernels, 30)
            samples, wall = await _closed_loop(agents, segment, lemon_run)
            lemon.extend(samples)
            walls["lemon"] += wall

        async def python_segment() -> None:
            await pool_settled(ec, config.warm_kernels, 30)  # lemon_exec's cleanup is over
            samples, wall = await _closed_loop(agents, segment, python_run)
            python.extend(samples)
            walls["python"] += wall

        for i in range(grid.agent_rounds):
            first, second = (
                (lemon_segment, python_segment) if i % 2 == 0 else (python_segment, lemon_segment)
            )
            await first()
            await second()
    return {
        "agents": agents,
        "runs_per_s": round(len(lemon) / walls["lemon"], 2),
        "p50_ms": round(percentile(lemon, 50), 1),
        "p95_ms": round(percentile(lemon, 95), 1),
        "n": len(lemon),
        "python_runs_per_s": round(len(python) / walls["python"], 2),
        "python_p50_ms": round(percentile(python, 50), 1),
        "python_p95_ms": round(percentile(python, 95), 1),
        "python_n": len(python),
    }


async def sweep_peers(grid: Grid, workdir: Path) -> dict[str, Any]:
    """The benchmark's peers group; a comparison it could not make is under ``errors``."""
    report = Report()
    interpreter = lemon_config().resolve_python()
    with contextlib.suppress(PeersFailed):  # the reasons are in report.errors
        await bench_peers(report, workdir, interpreter, quick=grid.kind != "full")
    return {
        "figures": report.figures,
        "stats": report.stats,
        "extra": report.extra,
        "errors": report.errors,
    }


SWEEPS: dict[str, Callable[[Grid, Path], Awaitable[Any]]] = {
    "output_size": sweep_output_size,
    "helper_calls": sweep_helper_calls,
    "sessions_memory": sweep_sessions_memory,
    "agents_throughput": sweep_agents,
    "peers": sweep_peers,
}


async def run_scaling(
    grid: Grid, workdir: Path, only: Sequence[str] | None = None
) -> dict[str, Any]:
    """Every sweep (or ``only`` these) in order; a failed sweep is recorded, not raised."""
    results: dict[str, Any] = {"grid": grid.kind, "errors": {}}
    for name, sweep in SWEEPS.items():
        if (only and name not in only) or (name == "peers" and not grid.peers):
            continue
        t0 = time.monotonic()
        log(f"scaling {name} ...")
        try:
            results[name] = out = await sweep(grid, workdir)
            if isinstance(out, dict) and out.get("errors"):
                results["errors"][name] = "; ".join(f"{k}: {v}" for k, v in out["errors"].items())[
                    :2000
                ]
        except Exception as exc:
            results["errors"][name] = f"{type(exc).__name__}: {exc}"[:500]
            log(f"scaling {name} failed: {results['errors'][name]}")
        log(f"scaling {name} done in {time.monotonic() - t0:.1f} s")
    return results
