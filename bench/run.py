#!/usr/bin/env python3
"""Benchmark lemon_exec's execute_code against the alternatives (issues 5 and 17).

Run ``python bench/run.py`` (about 5 minutes), ``--quick`` (about 2), ``--json`` for one JSON
object on stdout (everything else goes to stderr), ``--only NAME[,NAME]`` for a subset
(figure or group names, see ``--list``). Compared commands are measured side by side in one
run and alternated, so that a noisy machine slows both alike. ``--scaling`` measures how cost
grows instead (bench/scaling.py; ``--plot DIR`` for PNGs). What each figure means is in
``docs/benchmarks.md``.

Every kernel this script starts is stopped on the way out, on errors and Ctrl-C included.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# ``python bench/run.py`` puts bench/ first on sys.path; the modules beside this one are
# imported as the ``bench`` package, so the checkout's root must be on it too (last, so that
# a PYTHONPATH naming another lemon_exec still wins).
_ROOT = str(Path(__file__).resolve().parents[1])
if _ROOT not in sys.path:
    sys.path.append(_ROOT)

from bench.close import bench_close  # noqa: E402
from bench.common import (  # noqa: E402
    MIB,
    RESULT_MARKER,
    TRIVIAL_CELL,
    TRIVIAL_SCRIPT,
    RawKernel,
    Report,
    alternate,
    has_setting,
    lemon_config,
    log,
    percentile,
    python_subprocess,
    script_json,
    sleep_until,
    summarize,
    timed_ms,
    timed_run,
    wait_quiet,
)
from bench.machine import loadavg, machine_info  # noqa: E402
from bench.memory import (  # noqa: E402
    RssSampler,
    cmdline,
    descendants,
    hwm_kib,
    parent_pid,
    pss_uss_of,
    pss_uss_of_single,
    rss_kib,
    tree_pss_uss_mib,
    tree_rss_mib,
)
from bench.peers import file_bridge_rtts, fresh_kernel_call  # noqa: E402
from bench.peers_figures import PEER_FIGURES, PEER_TARGETS  # noqa: E402
from bench.peers_group import bench_peers  # noqa: E402
from bench.scaling import SWEEPS, Grid, run_scaling  # noqa: E402
from lemon_exec import ExecuteCode, ExecuteCodeConfig, SessionScope  # noqa: E402

# -- figures and targets --------------------------------------------------------------------------

#: Every figure of issue 5, in report order: name -> (unit, group that measures it).
FIGURES: dict[str, tuple[str, str]] = {
    "per_call_p50_ms": ("ms", "per_call"),
    "python_subprocess_p50_ms": ("ms", "per_call"),
    "per_call_ratio": ("x", "per_call"),
    "per_call_sustained_per_s": ("runs/s", "sustained"),
    "cold_start_p50_ms": ("ms", "cold"),
    "session_rtt_p50_ms": ("ms", "session"),
    "raw_jupyter_rtt_p50_ms": ("ms", "session"),
    "session_ratio": ("x", "session"),
    "helper_rtt_p50_ms": ("ms", "helpers"),
    "batch_100_ms": ("ms", "helpers"),
    "text_mb_per_s": ("MiB/s", "helpers"),
    "image_100kb_rtt_ms": ("ms", "images"),  # issue 29
    "text_100kb_rtt_ms": ("ms", "images"),
    "image_over_text_ms": ("ms", "images"),
    "mcp_helper_overhead_ms": ("ms", "mcp"),  # issue 14
    "mcp_batch20_ratio": ("x", "mcp"),
    "flood_host_rss_growth_mb": ("MiB", "flood"),
    "idle_kernel_rss_mb": ("MiB", "idle"),
    "sessions16_cells_per_s": ("cells/s", "sessions16"),
    "per_call_concurrent8_p95_ms": ("ms", "concurrent8"),  # issue 17
    "sessions64_idle_pss_mb": ("MiB", "sessions64"),
    "sessions128_idle_pss_mb": ("MiB", "sessions64"),  # issue 31
    "raw_fresh_kernel_per_call_ms": ("ms", "fresh_kernel"),
    "per_call_vs_fresh_kernel": ("x", "fresh_kernel"),
    "file_bridge_rtt_ms": ("ms", "helpers"),
    "helper_vs_file_bridge": ("x", "helpers"),
    "sandboxed_per_call_p50_ms": ("ms", "sandbox"),
    "sandbox_ratio": ("x", "sandbox"),
    "gateway_per_call_p50_ms": ("ms", "gateway"),  # issue 16
    "gateway_helper_rtt_p50_ms": ("ms", "gateway"),
    "gateway_session_rtt_p50_ms": ("ms", "gateway"),
    "raw_gateway_rtt_p50_ms": ("ms", "gateway"),
    "gateway_session_ratio": ("x", "gateway"),
    **{name: (unit, "peers") for name, (unit, _step) in PEER_FIGURES.items()},  # issue 31
    "aclose_ms": ("ms", "close"),  # issue 31
    "loop_stall_burst8_ms": ("ms", "close"),
}

#: Targets: figure -> (comparison, limit). Issue 17 (round two) tightened issue 5's where it
#: names them; the rest are issue 5's (and 14's, 15's), which must not regress.
TARGETS: dict[str, tuple[str, float]] = {
    "per_call_ratio": ("<=", 0.5),
    "per_call_sustained_per_s": (">=", 40.0),
    "per_call_concurrent8_p95_ms": ("<=", 30.0),
    "cold_start_p50_ms": ("<=", 120.0),
    "session_ratio": ("<=", 1.3),
    "helper_rtt_p50_ms": ("<=", 0.5),
    "batch_100_ms": ("<=", 25.0),
    "text_mb_per_s": (">=", 200.0),
    "image_over_text_ms": ("<=", 5.0),  # issue 29
    "mcp_helper_overhead_ms": ("<=", 1.0),  # issue 14
    "mcp_batch20_ratio": ("<=", 3.0),
    "flood_host_rss_growth_mb": ("<=", 64.0),
    "idle_kernel_rss_mb": ("<=", 60.0),
    "sessions64_idle_pss_mb": ("<=", 640.0),
    "sessions128_idle_pss_mb": ("<=", 768.0),  # issue 31
    "sandbox_ratio": ("<=", 1.5),  # issue 15
    "gateway_session_ratio": ("<=", 1.3),  # issue 16
    **PEER_TARGETS,  # issue 31
    "aclose_ms": ("<=", 100.0),  # issue 31
}

GROUPS: tuple[str, ...] = (
    "per_call",
    "sustained",
    "cold",
    "session",
    "helpers",
    "images",
    "mcp",
    "flood",
    "idle",
    "sessions16",
    "concurrent8",
    "sessions64",
    "fresh_kernel",
    "sandbox",
    "gateway",
    "peers",
    "close",
)

FLOOD_SCRIPT = (
    "import sys; chunk = 'x' * 1023 + '\\n'; [sys.stdout.write(chunk) for _ in range(100 * 1024)]"
)
FLOOD_BYTES = 100 * 1024 * 1024


@dataclass(frozen=True)
class Plan:
    """How many samples each measurement takes (full run or ``--quick``)."""

    quick: bool
    per_call_pairs: int
    per_call_spacing_s: float
    sustained_s: float
    cold_samples: int
    session_pairs: int
    helper_calls: int
    helper_runs: int
    batch_reps: int
    text_blocks: int
    text_runs: int
    flood_runs: int
    sessions16_s: float
    concurrent_agents: int
    concurrent_s: float
    sessions_idle: int
    fresh_kernel_pairs: int
    file_bridge_calls: int
    settle_s: float
    group_timeout_s: float

    @classmethod
    def make(cls, quick: bool) -> Plan:
        if quick:
            return cls(
                quick=True,
                per_call_pairs=10,
                per_call_spacing_s=0.8,
                sustained_s=5.0,
                cold_samples=3,
                session_pairs=150,
                helper_calls=200,
                helper_runs=1,
                batch_reps=5,
                text_blocks=25,
                text_runs=1,
                flood_runs=1,
                sessions16_s=2.0,
                concurrent_agents=8,
                concurrent_s=5.0,
                sessions_idle=64,  # the figure is about 64: never extrapolated
                fresh_kernel_pairs=4,
                file_bridge_calls=40,
                settle_s=0.7,
                group_timeout_s=60.0,
            )
        return cls(
            quick=False,
            per_call_pairs=80,
            per_call_spacing_s=1.0,
            sustained_s=20.0,
            cold_samples=12,
            session_pairs=500,
            helper_calls=200,
            helper_runs=3,
            batch_reps=10,
            text_blocks=50,
            text_runs=3,
            flood_runs=3,
            sessions16_s=6.0,
            concurrent_agents=8,
            concurrent_s=20.0,
            sessions_idle=64,
            fresh_kernel_pairs=15,
            file_bridge_calls=100,
            settle_s=1.0,
            group_timeout_s=240.0,
        )


def verdict(name: str, value: float | None) -> bool | None:
    if name not in TARGETS or value is None or math.isnan(value):
        return None
    op, limit = TARGETS[name]
    return value <= limit if op == "<=" else value >= limit


def format_table(report: Report) -> str:
    """The human-readable table: figure, value, p90, samples, target, verdict."""
    rows = [("figure", "value", "p90", "n", "target", "result")]
    for name, (unit, _group) in FIGURES.items():
        if name not in report.figures and name not in report.errors:
            continue
        value = report.figures.get(name)
        stat = report.stats.get(name, {})
        target = TARGETS.get(name)
        ok = verdict(name, value)
        rows.append(
            (
                name,
                "error" if value is None else f"{_num(value)} {unit}",
                _num(stat["p90"]) if "p90" in stat else "",
                str(stat["n"]) if "n" in stat else "",
                f"{target[0]} {_num(target[1])}" if target else "",
                "" if ok is None else ("pass" if ok else "FAIL"),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    if report.extra:
        lines.append("")
        lines.append("context:")
        lines.extend(
            f"  {k} = {_num(v) if isinstance(v, float) else v}" for k, v in report.extra.items()
        )
    if report.errors:
        lines.append("")
        lines.append("errors:")
        lines.extend(f"  {k}: {v}" for k, v in report.errors.items())
    return "\n".join(lines)


def _num(value: float) -> str:
    if isinstance(value, int) or (
        isinstance(value, float) and value.is_integer() and abs(value) >= 100
    ):
        return str(int(value))
    return f"{value:.3g}" if abs(value) < 100 else f"{value:.0f}"


# -- the measurements -----------------------------------------------------------------------------


@dataclass
class Context:
    plan: Plan
    report: Report
    workdir: Path
    interpreter: str

    def scope(self, name: str) -> SessionScope:
        return SessionScope(name, "bench", str(self.workdir))


async def bench_per_call(ctx: Context) -> None:
    """per_call_p50_ms against python_subprocess_p50_ms at agent cadence, alternating."""
    plan, report = ctx.plan, ctx.report
    script = ctx.workdir / "script.py"
    script.write_text(TRIVIAL_SCRIPT)
    real_python = os.path.realpath(shutil.which(ctx.interpreter) or ctx.interpreter)
    scope = ctx.scope("bench-per-call")
    lemon_ms: list[float] = []
    sub_ms: list[float] = []
    direct_ms: list[float] = []
    sources: dict[str, int] = {}
    not_quiet = 0
    async with ExecuteCode(lemon_config(kernel_mode="per_call", warm_kernels=1)) as ec:
        await timed_run(ec, TRIVIAL_SCRIPT, scope)  # first call: the pool fills from here
        await asyncio.sleep(plan.settle_s)  # background starts (a fork server...) settle
        await wait_quiet(ec, 1, 30)
        for _ in range(2):  # warm-up pairs, not counted
            await python_subprocess(ctx.interpreter, script, str(ctx.workdir))
            await python_subprocess(real_python, script, str(ctx.workdir))
        start = time.monotonic()
        for i in range(plan.per_call_pairs):
            await sleep_until(start + i * plan.per_call_spacing_s)

            async def baselines() -> None:
                # After a per-call run its spare refills and the used kernel stops in the
                # background; measure the baseline once that is over, not on top of it.
                nonlocal not_quiet
                if not await wait_quiet(ec, 1, plan.per_call_spacing_s * 0.6):
                    not_quiet += 1
                sub_ms.append(await python_subprocess(ctx.interpreter, script, str(ctx.workdir)))
                direct_ms.append(await python_subprocess(real_python, script, str(ctx.workdir)))

            async def lemon() -> None:
                elapsed, result = await timed_run(ec, TRIVIAL_SCRIPT, scope)
                lemon_ms.append(elapsed)
                source = str(result.details.get("kernel_source"))
                sources[source] = sources.get(source, 0) + 1

            first, second = (lemon, baselines) if i % 2 == 0 else (baselines, lemon)
            await first()
            await second()
    lemon_p50 = statistics.median(lemon_ms)
    sub_p50 = statistics.median(sub_ms)
    report.figure("per_call_p50_ms", lemon_p50, lemon_ms)
    report.figure("python_subprocess_p50_ms", sub_p50, sub_ms)
    report.figure("per_call_ratio", lemon_p50 / sub_p50)
    report.context("per_call_spacing_s", plan.per_call_spacing_s)
    report.context("per_call_kernel_sources", sources)
    report.context("per_call_baseline_not_quiet", not_quiet)
    report.context("python_subprocess_interpreter", ctx.interpreter)
    if real_python != ctx.interpreter:
        direct_p50 = statistics.median(direct_ms)
        report.context("python_direct_subprocess_interpreter", real_python)
        report.context("python_direct_subprocess_p50_ms", direct_p50)
        report.context("per_call_ratio_vs_direct", lemon_p50 / direct_p50)


async def bench_sandbox(ctx: Context) -> None:
    """sandboxed_per_call_p50_ms and sandbox_ratio: per-call under bwrap against without.

    Two facades with the default pool (one warm spare), one call per ``per_call_spacing_s``
    alternating between them (which goes first alternates too), each measured once its own
    pool is quiet. A lemon_exec without the ``sandbox`` setting, or a machine where the
    sandbox cannot start, records an error for both figures instead of numbers.
    """
    plan, report = ctx.plan, ctx.report
    if not has_setting("sandbox"):
        raise RuntimeError("this lemon_exec has no sandbox setting (issue 15)")
    # The bench's own working directory, not ctx.workdir: that is under /tmp, which a
    # sandboxed kernel does not see (it gets a private /tmp).
    scope = SessionScope("bench-sandbox", "bench", os.getcwd())
    plain_ms: list[float] = []
    boxed_ms: list[float] = []
    sources: dict[str, dict[str, int]] = {"plain": {}, "sandboxed": {}}
    async with (
        ExecuteCode(lemon_config(kernel_mode="per_call", warm_kernels=1)) as plain,
        ExecuteCode(lemon_config(kernel_mode="per_call", warm_kernels=1, sandbox="bwrap")) as boxed,
    ):
        for ec in (plain, boxed):  # the first call fills the pool (and starts a fork server)
            await timed_run(ec, TRIVIAL_SCRIPT, scope)
        await asyncio.sleep(plan.settle_s)
        start = time.monotonic()
        for i in range(plan.per_call_pairs):
            await sleep_until(start + i * plan.per_call_spacing_s)
            runs = ((plain, plain_ms, "plain"), (boxed, boxed_ms, "sandboxed"))
            for ec, samples, name in runs if i % 2 == 0 else reversed(runs):
                await wait_quiet(ec, 1, plan.per_call_spacing_s * 0.4)
                elapsed, result = await timed_run(ec, TRIVIAL_SCRIPT, scope)
                samples.append(elapsed)
                source = str(result.details.get("kernel_source"))
                sources[name][source] = sources[name].get(source, 0) + 1
    boxed_p50 = statistics.median(boxed_ms)
    plain_p50 = statistics.median(plain_ms)
    report.figure("sandboxed_per_call_p50_ms", boxed_p50, boxed_ms)
    report.figure("sandbox_ratio", boxed_p50 / plain_p50)
    report.context("sandbox_unsandboxed_per_call_p50_ms", plain_p50)
    report.context("sandbox_kernel_sources", sources)


async def bench_sustained(ctx: Context) -> None:
    """per_call_sustained_per_s: back-to-back per-call runs (default pool of one spare)."""
    plan, report = ctx.plan, ctx.report
    scope = ctx.scope("bench-sustained")
    sources: dict[str, int] = {}
    durations: list[float] = []
    async with ExecuteCode(lemon_config(kernel_mode="per_call", warm_kernels=1)) as ec:
        await timed_run(ec, TRIVIAL_SCRIPT, scope)
        await asyncio.sleep(plan.settle_s)
        await wait_quiet(ec, 1, 30)
        start = time.monotonic()
        end = start + plan.sustained_s
        while time.monotonic() < end:
            elapsed, result = await timed_run(ec, TRIVIAL_SCRIPT, scope)
            durations.append(elapsed)
            source = str(result.details.get("kernel_source"))
            sources[source] = sources.get(source, 0) + 1
        wall = time.monotonic() - start
    report.figure("per_call_sustained_per_s", len(durations) / wall)
    report.stats["per_call_sustained_per_s"] = {
        "n": len(durations),
        "seconds": round(wall, 2),
        "run_ms": summarize(durations),
    }
    report.context("sustained_kernel_sources", sources)


async def bench_cold(ctx: Context) -> None:
    """cold_start_p50_ms (no spare) against a plain ipykernel's cold start, alternating.

    In full runs, when this lemon_exec has a ``fork_server`` setting, cold starts without it
    are measured too (context ``cold_start_no_fork_server_p50_ms``), in the same rotation.
    """
    plan, report = ctx.plan, ctx.report
    scope = ctx.scope("bench-cold")
    samples: dict[str, list[float]] = {"lemon": [], "lemon_no_fork": [], "raw": []}
    fork_variant = has_setting("fork_server") and not plan.quick  # context only: full runs
    async with contextlib.AsyncExitStack() as stack:
        lemon = await stack.enter_async_context(
            ExecuteCode(lemon_config(kernel_mode="per_call", warm_kernels=0))
        )
        plain: ExecuteCode | None = None
        if fork_variant:
            plain = await stack.enter_async_context(
                ExecuteCode(lemon_config(kernel_mode="per_call", warm_kernels=0, fork_server=False))
            )
        facades = [lemon] if plain is None else [lemon, plain]

        async def quiet() -> None:
            for ec in facades:
                await wait_quiet(ec, 0, 30)

        for ec in facades:  # warm the host side (imports, staging, a fork server if any)
            await timed_run(ec, TRIVIAL_SCRIPT, scope)
        await asyncio.sleep(plan.settle_s)
        await quiet()
        _, result = await timed_run(lemon, "import os\nprint(os.getppid())", scope)
        parent = int(result.content.strip().splitlines()[-1])
        report.context(
            "cold_start_kernel_parent",
            "host" if parent == os.getpid() else cmdline(parent) or str(parent),
        )

        async def run_lemon(ec: ExecuteCode, key: str) -> None:
            await quiet()
            elapsed, result = await timed_run(ec, TRIVIAL_SCRIPT, scope)
            if result.details.get("kernel_source") != "cold":
                raise RuntimeError(f"expected a cold kernel: {result.details}")
            samples[key].append(elapsed)

        async def run_raw() -> None:
            await quiet()
            t0 = time.perf_counter()
            kernel = await RawKernel.start(ctx.interpreter, str(ctx.workdir))
            try:
                out = await kernel.execute("print(1)")
                samples["raw"].append((time.perf_counter() - t0) * 1000)
            finally:
                await kernel.aclose()
            if out.strip() != "1":
                raise RuntimeError(f"plain ipykernel printed {out!r}")

        steps: list[Callable[[], Awaitable[None]]] = [lambda: run_lemon(lemon, "lemon"), run_raw]
        if plain is not None:
            steps.append(lambda: run_lemon(plain, "lemon_no_fork"))
        for i in range(plan.cold_samples):
            shift = i % len(steps)  # rotate the order every round
            for step in steps[shift:] + steps[:shift]:
                await step()
    report.figure("cold_start_p50_ms", statistics.median(samples["lemon"]), samples["lemon"])
    report.context("raw_jupyter_cold_start_p50_ms", statistics.median(samples["raw"]))
    report.stats["raw_jupyter_cold_start_ms"] = summarize(samples["raw"])
    if samples["lemon_no_fork"]:
        report.context(
            "cold_start_no_fork_server_p50_ms", statistics.median(samples["lemon_no_fork"])
        )
        report.stats["cold_start_no_fork_server_ms"] = summarize(samples["lemon_no_fork"])


async def bench_session(ctx: Context) -> None:
    """session_rtt_p50_ms against raw_jupyter_rtt_p50_ms, alternating, both kernels warm."""
    plan, report = ctx.plan, ctx.report
    scope = ctx.scope("bench-session")
    async with ExecuteCode(lemon_config(kernel_mode="session", warm_kernels=0)) as ec:
        raw = await RawKernel.start(ctx.interpreter, str(ctx.workdir))
        try:
            for _ in range(20):  # warm-up
                await timed_run(ec, TRIVIAL_CELL, scope)
                await raw.execute(TRIVIAL_CELL)

            async def lemon() -> float:
                return (await timed_run(ec, TRIVIAL_CELL, scope))[0]

            lemon_ms, raw_ms = await alternate(
                plan.session_pairs, lemon, lambda: timed_ms(raw.execute(TRIVIAL_CELL))
            )
        finally:
            await raw.aclose()
    lemon_p50 = statistics.median(lemon_ms)
    raw_p50 = statistics.median(raw_ms)
    report.figure("session_rtt_p50_ms", lemon_p50, lemon_ms)
    report.figure("raw_jupyter_rtt_p50_ms", raw_p50, raw_ms)
    report.figure("session_ratio", lemon_p50 / raw_p50)


HELPER_RTT_SCRIPT = """\
import json, time
path = {path!r}
for _ in range(20):
    read(path)
samples = []
for _ in range({calls}):
    t0 = time.perf_counter()
    read(path)
    samples.append((time.perf_counter() - t0) * 1000)
text({marker!r} + json.dumps(samples))
"""

BATCH_SCRIPT = """\
import json, time
calls = [("read", {{"path": {path!r}}}) for _ in range(100)]
assert len(batch(calls)) == 100
samples = []
for _ in range({reps}):
    t0 = time.perf_counter()
    out = batch(calls)
    samples.append((time.perf_counter() - t0) * 1000)
    assert len(out) == 100
text({marker!r} + json.dumps(samples))
"""

TEXT_SCRIPT = """\
import json, time
block = "y" * {block_bytes}
text(block)
t0 = time.perf_counter()
for _ in range({blocks}):
    text(block)
elapsed = time.perf_counter() - t0
text({marker!r} + json.dumps({{"seconds": elapsed, "bytes": {blocks} * len(block)}}))
"""


async def bench_helpers(ctx: Context) -> None:
    """helper_rtt_p50_ms, batch_100_ms and text_mb_per_s, each timed inside the script."""
    plan, report = ctx.plan, ctx.report
    tiny = ctx.workdir / "tiny.txt"
    tiny.write_text("hello from the benchmark\n")
    block_bytes = 200_000
    config = lemon_config(
        kernel_mode="session",
        warm_kernels=0,
        max_parallel_rpc=4,
        max_rpc_calls=1_000_000,
        max_rpc_result_bytes=1 << 30,
        max_text_bytes=(plan.text_blocks + 2) * block_bytes * 2,
    )
    scope = ctx.scope("bench-helpers")
    rtt: list[float] = []
    bridge_rtt: list[float] = []
    batches: list[float] = []
    rates: list[float] = []
    async with ExecuteCode(config) as ec:
        await timed_run(ec, "pass", scope)
        for i in range(plan.helper_runs):

            async def lemon() -> None:
                _, result = await timed_run(
                    ec,
                    HELPER_RTT_SCRIPT.format(
                        path=str(tiny), calls=plan.helper_calls, marker=RESULT_MARKER
                    ),
                    scope,
                )
                rtt.extend(script_json(result))

            async def file_bridge() -> None:
                samples, counts = await file_bridge_rtts(
                    ctx.interpreter, ctx.workdir, tiny, plan.file_bridge_calls
                )
                bridge_rtt.extend(samples)
                report.context("file_bridge_pump", counts)

            first, second = (lemon, file_bridge) if i % 2 == 0 else (file_bridge, lemon)
            await first()
            await second()
        _, result = await timed_run(
            ec,
            BATCH_SCRIPT.format(path=str(tiny), reps=plan.batch_reps, marker=RESULT_MARKER),
            scope,
        )
        batches.extend(script_json(result))
        for _ in range(plan.text_runs):
            _, result = await timed_run(
                ec,
                TEXT_SCRIPT.format(
                    block_bytes=block_bytes, blocks=plan.text_blocks, marker=RESULT_MARKER
                ),
                scope,
            )
            data = script_json(result)
            rates.append(data["bytes"] / MIB / data["seconds"])
    report.figure("helper_rtt_p50_ms", statistics.median(rtt), rtt)
    report.figure("file_bridge_rtt_ms", statistics.median(bridge_rtt), bridge_rtt)
    report.figure("helper_vs_file_bridge", statistics.median(rtt) / statistics.median(bridge_rtt))
    report.figure("batch_100_ms", statistics.median(batches), batches)
    report.figure("text_mb_per_s", statistics.median(rates), rates)
    report.context("text_block_bytes", block_bytes)


IMAGE_SCRIPT = """\
import json, time
data = open({path!r}, "rb").read()
block = "y" * len(data)
for _ in range(10):
    image(data)
    text(block)
shown, written = [], []
for _ in range({reps}):
    t0 = time.perf_counter()
    image(data)
    t1 = time.perf_counter()
    text(block)
    t2 = time.perf_counter()
    shown.append((t1 - t0) * 1000)
    written.append((t2 - t1) * 1000)
text({marker!r} + json.dumps({{"image": shown, "text": written}}))
"""


def noise_png(side: int) -> bytes:
    """A PNG of random RGB pixels (incompressible): about ``3 * side**2`` bytes."""
    import struct
    import zlib

    rows = b"".join(b"\x00" + os.urandom(3 * side) for _ in range(side))

    def chunk(kind: bytes, body: bytes) -> bytes:
        crc = zlib.crc32(kind + body)
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", crc)

    header = struct.pack(">IIBBBBB", side, side, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows, 1))
        + chunk(b"IEND", b"")
    )


async def bench_images(ctx: Context) -> None:
    """image_100kb_rtt_ms and text_100kb_rtt_ms: one image() of a 100 KB PNG and one text()
    of as many bytes, alternating in one script, each timed inside it; image_over_text_ms is
    the difference of their medians (issue 29)."""
    plan, report = ctx.plan, ctx.report
    png = noise_png(182)  # 99,560 pixel bytes: a ~100 KB PNG, under every max_image_edge
    path = ctx.workdir / "noise.png"
    path.write_bytes(png)
    reps = plan.helper_calls
    config = lemon_config(
        kernel_mode="session",
        warm_kernels=0,
        max_images=(reps + 20) * plan.text_runs + 10,
        max_image_bytes=1 << 34,
        max_text_bytes=1 << 34,
    )
    scope = ctx.scope("bench-images")
    shown: list[float] = []
    written: list[float] = []
    async with ExecuteCode(config) as ec:
        await timed_run(ec, "pass", scope)
        for _ in range(plan.text_runs):
            _, result = await timed_run(
                ec, IMAGE_SCRIPT.format(path=str(path), reps=reps, marker=RESULT_MARKER), scope
            )
            data = script_json(result)
            shown.extend(data["image"])
            written.extend(data["text"])
    report.figure("image_100kb_rtt_ms", statistics.median(shown), shown)
    report.figure("text_100kb_rtt_ms", statistics.median(written), written)
    report.figure("image_over_text_ms", statistics.median(shown) - statistics.median(written))
    report.context("image_png_bytes", len(png))


#: The upstream MCP server of the test suite (stdio; tools echo and slow).
MCP_UPSTREAM = Path(__file__).resolve().parents[1] / "tests" / "mcp_upstream" / "server.py"

MCP_RTT_SCRIPT = """\
import json, time
for _ in range(5):
    tools.up.echo(text="x")
samples = []
for _ in range({calls}):
    t0 = time.perf_counter()
    tools.up.echo(text="x")
    samples.append((time.perf_counter() - t0) * 1000)
text({marker!r} + json.dumps(samples))
"""

MCP_BATCH_SCRIPT = """\
import json, time
t0 = time.perf_counter()
tools.up.slow(ms=100)
one = time.perf_counter() - t0
t0 = time.perf_counter()
assert len(batch([("up.slow", {{"ms": 100}})] * 20)) == 20
twenty = time.perf_counter() - t0
text({marker!r} + json.dumps({{"one": one, "twenty": twenty}}))
"""

#: Rounds of the MCP round-trip comparison: the plain client's calls and the script's are
#: taken in turn, each going first every other round, so a drift in the machine's speed
#: (this 2-core VM moves by tens of percent within a minute) slows both alike.
MCP_ROUNDS = 6


async def bench_mcp(ctx: Context) -> None:
    """mcp_helper_overhead_ms: a script's call of an upstream stdio MCP tool minus the same
    call through a plain MCP client (p50 each, taken in alternating rounds);
    mcp_batch20_ratio: batch() of 20 calls of a tool that sleeps 100 ms, over one such call."""
    from mcp import Client, StdioServerParameters

    from lemon_exec.tools import default_registry

    per_round = max(10, ctx.plan.helper_calls // MCP_ROUNDS)
    params = StdioServerParameters(command=sys.executable, args=[str(MCP_UPSTREAM)])
    registry = default_registry()
    registry.add_mcp_server("up", command=sys.executable, args=[str(MCP_UPSTREAM)])
    config = lemon_config(
        kernel_mode="session", warm_kernels=0, max_parallel_rpc=20, max_rpc_calls=1_000_000
    )
    scope = ctx.scope("bench-mcp")
    direct: list[float] = []
    via_script: list[float] = []
    async with Client(params) as client, ExecuteCode(config, tools=registry) as ec:
        for _ in range(20):
            await client.call_tool("echo", {"text": "x"})
        await timed_run(ec, MCP_RTT_SCRIPT.format(calls=20, marker=RESULT_MARKER), scope)

        async def plain() -> float:
            for _ in range(per_round):
                t0 = time.perf_counter()
                await client.call_tool("echo", {"text": "x"})
                direct.append((time.perf_counter() - t0) * 1000)
            return 0.0

        async def script() -> float:
            code = MCP_RTT_SCRIPT.format(calls=per_round, marker=RESULT_MARKER)
            _, result = await timed_run(ec, code, scope)
            via_script.extend(script_json(result))
            return 0.0

        await alternate(MCP_ROUNDS, plain, script)
        _, result = await timed_run(ec, MCP_BATCH_SCRIPT.format(marker=RESULT_MARKER), scope)
        data = script_json(result)
    overhead = statistics.median(via_script) - statistics.median(direct)
    ctx.report.figure("mcp_helper_overhead_ms", overhead, via_script)
    ctx.report.figure("mcp_batch20_ratio", data["twenty"] / data["one"])
    ctx.report.context("mcp_direct_p50_ms", statistics.median(direct))
    ctx.report.context("mcp_script_p50_ms", statistics.median(via_script))


async def bench_flood(ctx: Context) -> None:
    """flood_host_rss_growth_mb, measured in a fresh host process (a clean RSS baseline)."""
    plan, report = ctx.plan, ctx.report
    growth: list[float] = []
    hwm_growth: list[float] = []
    seconds: list[float] = []
    for _ in range(plan.flood_runs):
        data = await run_child("flood", ctx.workdir, plan)
        growth.append(data["growth_mib"])
        if data.get("hwm_growth_mib") is not None:
            hwm_growth.append(data["hwm_growth_mib"])
        seconds.append(data["seconds"])
        report.context("flood_truncated", data["truncated"])
        report.context("flood_rss_samples", data["samples"])
    report.figure("flood_host_rss_growth_mb", max(growth), growth)
    report.context("flood_ms", statistics.median(seconds) * 1000)
    report.context("flood_mib_per_s", FLOOD_BYTES / MIB / statistics.median(seconds))
    if hwm_growth:
        report.context("flood_host_hwm_growth_mb", max(hwm_growth))


async def child_flood(workdir: Path, settle_s: float) -> dict[str, Any]:
    """In a fresh process: warm up, then print 100 MiB and watch this process's RSS."""
    scope = SessionScope("bench-flood", "bench", str(workdir))
    async with ExecuteCode(lemon_config(kernel_mode="per_call", warm_kernels=1)) as ec:
        await timed_run(ec, "print('warm-up ' * 1000)", scope)
        await asyncio.sleep(settle_s)
        await wait_quiet(ec, 1, 30)
        gc.collect()
        before = rss_kib()
        hwm_reset = _reset_hwm()
        with RssSampler(0.02) as sampler:
            t0 = time.perf_counter()
            result = await ec.run(FLOOD_SCRIPT, scope=scope)
            seconds = time.perf_counter() - t0
        hwm = hwm_kib() if hwm_reset else None
        if result.details.get("exit_code") != 0:
            raise RuntimeError(f"flood script failed: {result.content[:300]!r}")
        return {
            "growth_mib": (sampler.peak_kib - before) / 1024,
            "hwm_growth_mib": None if hwm is None else (hwm - before) / 1024,
            "before_mib": before / 1024,
            "seconds": seconds,
            "samples": sampler.samples,
            "truncated": bool(result.details.get("truncated")),
        }


def _reset_hwm() -> bool:
    """Reset VmHWM to the current RSS (Linux >= 4.0: write 5 to clear_refs)."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


async def bench_idle(ctx: Context) -> None:
    """idle_kernel_rss_mb of a session kernel (and of a plain ipykernel, for context)."""
    report = ctx.report
    scope = ctx.scope("bench-idle")
    async with ExecuteCode(lemon_config(kernel_mode="session", warm_kernels=0)) as ec:
        _, result = await timed_run(ec, "import os\nprint(os.getpid())", scope)
        pid = int(result.content.strip().splitlines()[-1])
        raw = await RawKernel.start(ctx.interpreter, str(ctx.workdir))
        try:
            raw_pid = int((await raw.execute("import os\nprint(os.getpid())")).strip())
            await asyncio.sleep(1.0)  # let both settle into idle
            lemon_mib, lemon_procs = tree_rss_mib(pid)
            lemon_pss = tree_pss_uss_mib(pid)
            raw_mib, raw_procs = tree_rss_mib(raw_pid)
            raw_pss = tree_pss_uss_mib(raw_pid)
            mine = {raw_pid, *descendants(raw_pid)}
            helpers = [
                {"pid": p, "rss_mib": round(rss_kib(p) / 1024, 1), "cmd": cmdline(p)}
                for p in descendants(os.getpid())
                if p not in mine
            ]
        finally:
            await raw.aclose()
    report.figure("idle_kernel_rss_mb", lemon_mib)
    report.context("idle_kernel_processes", lemon_procs)
    if lemon_pss is not None:
        report.context("idle_kernel_pss_mb", lemon_pss[0])
        report.context("idle_kernel_uss_mb", lemon_pss[1])
    report.context("raw_ipykernel_idle_rss_mb", raw_mib)
    report.context("raw_ipykernel_processes", raw_procs)
    if raw_pss is not None:
        report.context("raw_ipykernel_idle_pss_mb", raw_pss[0])
    report.context("host_child_processes", helpers)


async def bench_sessions16(ctx: Context) -> None:
    """sessions16_cells_per_s: 16 session kernels each running trivial cells back to back."""
    plan, report = ctx.plan, ctx.report
    scopes = [ctx.scope(f"bench-s16-{i}") for i in range(16)]
    counts = [0] * 16
    async with ExecuteCode(
        lemon_config(kernel_mode="session", warm_kernels=0, max_live_kernels=16)
    ) as ec:
        await timed_run(ec, "x = 0", scopes[0])  # the first start brings up a fork server
        await asyncio.sleep(plan.settle_s)
        t0 = time.monotonic()
        await asyncio.gather(*(timed_run(ec, "x = 0", s) for s in scopes[1:]))
        report.context("sessions16_start_15_s", time.monotonic() - t0)
        for _ in range(1 if plan.quick else 3):  # warm-up rounds
            await asyncio.gather(*(timed_run(ec, "x += 1", s) for s in scopes))
        start = time.monotonic()
        end = start + plan.sessions16_s

        async def worker(i: int) -> None:
            while time.monotonic() < end:
                await timed_run(ec, "x += 1", scopes[i])
                counts[i] += 1

        await asyncio.gather(*(worker(i) for i in range(16)))
        wall = time.monotonic() - start
        live = ec.snapshot()["live"]
    report.figure("sessions16_cells_per_s", sum(counts) / wall)
    report.stats["sessions16_cells_per_s"] = {
        "n": sum(counts),
        "seconds": round(wall, 2),
        "per_session_min": min(counts),
        "per_session_max": max(counts),
    }
    report.context("sessions16_live_kernels", live)


#: Seed of the agents' phases in per_call_concurrent8_p95_ms: the same schedule every run.
AGENT_PHASE_SEED = 17


async def bench_concurrent8(ctx: Context) -> None:
    """per_call_concurrent8_p95_ms: 8 agents sharing one per-call facade, each issuing a
    per-call run every second (agent cadence), for 20 s (``--quick``: 5 s).

    Each agent is an asyncio task over the same ``ExecuteCode`` (as an agent runtime shares
    its tool), with the default config (whatever ``warm_kernels`` is). Agents start at
    fixed pseudo-random phases within the first second (seeded: the same schedule every
    run), so runs overlap the way independent agents' do rather than all at once. A run
    that takes longer than the period delays only its own agent's next run (started at
    once; the missed ticks are skipped, not caught up in a burst).
    """
    import random

    plan, report = ctx.plan, ctx.report
    agents = plan.concurrent_agents
    rng = random.Random(AGENT_PHASE_SEED)
    phases = sorted(rng.random() for _ in range(agents))
    samples: list[float] = []
    sources: dict[str, int] = {}
    late = 0
    # warm_kernels is not overridden: the default pool, as a runtime would have it.
    config = ExecuteCodeConfig(enabled=True, timeout_ms=60_000, kernel_mode="per_call")
    async with ExecuteCode(config) as ec:
        scope = ctx.scope("bench-concurrent")
        await timed_run(ec, TRIVIAL_SCRIPT, scope)  # first call: pool and fork server start
        await asyncio.sleep(plan.settle_s)
        await wait_quiet(ec, config.warm_kernels, 30)
        start = time.monotonic() + 0.05
        end = start + plan.concurrent_s

        async def agent(i: int) -> None:
            nonlocal late
            agent_scope = ctx.scope(f"bench-agent-{i}")
            tick = start + phases[i]
            while tick < end:
                await sleep_until(tick)
                elapsed, result = await timed_run(ec, TRIVIAL_SCRIPT, agent_scope)
                samples.append(elapsed)
                source = str(result.details.get("kernel_source"))
                sources[source] = sources.get(source, 0) + 1
                tick += 1.0
                if time.monotonic() > tick:  # overran its second: next run at once, no burst
                    late += 1
                    tick = time.monotonic()

        await asyncio.gather(*(agent(i) for i in range(agents)))
    report.figure("per_call_concurrent8_p95_ms", percentile(samples, 95), samples)
    report.stats["per_call_concurrent8_p95_ms"]["p95"] = round(percentile(samples, 95), 3)
    report.context("concurrent8_agents", agents)
    report.context("concurrent8_seconds", plan.concurrent_s)
    report.context("concurrent8_p50_ms", percentile(samples, 50))
    report.context("concurrent8_warm_kernels", config.warm_kernels)
    report.context("concurrent8_kernel_sources", sources)
    report.context("concurrent8_late_starts", late)


async def start_sessions(
    ec: ExecuteCode, scopes: Sequence[SessionScope], parallel: int = 8
) -> list[int]:
    """Start one session kernel per scope (``parallel`` at a time); return their PIDs."""
    gate = asyncio.Semaphore(parallel)

    async def one(scope: SessionScope) -> int:
        async with gate:
            _, result = await timed_run(ec, "import os\nprint(os.getpid())", scope)
        return int(result.content.strip().splitlines()[-1])

    return list(await asyncio.gather(*(one(s) for s in scopes)))


#: The larger count bench_sessions64 grows to after measuring ``Plan.sessions_idle`` (issue 31).
SESSIONS_IDLE_LARGE = 128


async def bench_sessions64(ctx: Context) -> None:
    """sessions64_idle_pss_mb, sessions128_idle_pss_mb: total PSS of 64, then 128, idle
    session kernels (each with its children).

    PSS divides pages shared copy-on-write (with the fork-server template, between the
    kernels) among their sharers, so the sum is what the kernels cost the machine; the
    template itself is not counted here (context ``sessions64_template_pss_mb``). The first
    64 are measured, 64 more started beside them, and all 128 measured again.
    """
    plan, report = ctx.plan, ctx.report
    count, large = plan.sessions_idle, max(plan.sessions_idle, SESSIONS_IDLE_LARGE)
    scopes = [ctx.scope(f"bench-s64-{i}") for i in range(large)]
    config = lemon_config(kernel_mode="session", warm_kernels=0, max_live_kernels=large)
    async with ExecuteCode(config) as ec:
        await timed_run(ec, "pass", scopes[0])  # the first start brings up a fork server
        t0 = time.monotonic()
        pids = await start_sessions(ec, scopes[:count])
        report.context("sessions64_start_s", time.monotonic() - t0)
        idle = await _idle_sessions_memory(ec, pids, plan.settle_s)
        report.figure("sessions64_idle_pss_mb", idle["pss"])
        report.context("sessions64_kernels", count)
        report.context("sessions64_pss_per_kernel_mb", idle["pss"] / count)
        report.context("sessions64_uss_mb", idle["uss"])
        report.context("sessions64_rss_mb", idle["rss"])
        report.context("sessions64_template_pss_mb", idle["template_pss"])
        report.context("sessions64_cold_started", idle["cold"])
        if large == count:
            return
        t0 = time.monotonic()
        pids += await start_sessions(ec, scopes[count:])
        report.context("sessions128_start_s", time.monotonic() - t0)
        idle = await _idle_sessions_memory(ec, pids, plan.settle_s)
    report.figure("sessions128_idle_pss_mb", idle["pss"])
    report.context("sessions128_kernels", large)
    report.context("sessions128_pss_per_kernel_mb", idle["pss"] / large)
    report.context("sessions128_uss_mb", idle["uss"])
    report.context("sessions128_cold_started", idle["cold"])


async def _idle_sessions_memory(
    ec: ExecuteCode, pids: Sequence[int], settle_s: float
) -> dict[str, float]:
    """PSS, USS and RSS (MiB) of the session kernels ``pids`` once idle; the template's PSS."""
    if len(set(pids)) != len(pids) or ec.snapshot()["live"] != len(pids):
        raise RuntimeError(f"expected {len(pids)} live session kernels: {ec.snapshot()}")
    await asyncio.sleep(max(2.0, settle_s))  # let them settle into idle
    # Kernels this process launched itself (cold): the fork server failed or stalled.
    cold = sum(1 for p in pids if parent_pid(p) == os.getpid())
    pss, uss = pss_uss_of(pids)
    rss = sum(tree_rss_mib(p)[0] for p in pids)
    kernels = set(pids)
    for p in pids:
        kernels.update(descendants(p))
    others = [p for p in descendants(os.getpid()) if p not in kernels]
    other_pss, _ = pss_uss_of_single(others)
    return {"pss": pss, "uss": uss, "rss": rss, "template_pss": other_pss, "cold": cold}


async def bench_fresh_kernel(ctx: Context) -> None:
    """raw_fresh_kernel_per_call_ms against lemon_exec's per-call run, alternating.

    The peer starts a fresh plain ipykernel for every call through nbclient, as AutoGen's
    JupyterCodeExecutor does (bench/peers.py): start, wait ready, execute, shut down. The
    lemon side is a per-call run with the default pool, measured once the pool is quiet.
    """
    plan, report = ctx.plan, ctx.report
    scope = ctx.scope("bench-fresh")
    lemon_ms: list[float] = []
    fresh_ms: list[float] = []
    async with ExecuteCode(lemon_config(kernel_mode="per_call", warm_kernels=1)) as ec:
        await timed_run(ec, TRIVIAL_SCRIPT, scope)
        await asyncio.sleep(plan.settle_s)
        out = await fresh_kernel_call(ctx.interpreter, str(ctx.workdir))  # warm-up, uncounted
        if out.strip() != "1":
            raise RuntimeError(f"fresh kernel printed {out!r}")
        for i in range(plan.fresh_kernel_pairs):

            async def lemon() -> None:
                await wait_quiet(ec, 1, 10)
                lemon_ms.append((await timed_run(ec, TRIVIAL_SCRIPT, scope))[0])

            async def fresh() -> None:
                await wait_quiet(ec, 1, 10)
                t0 = time.perf_counter()
                await fresh_kernel_call(ctx.interpreter, str(ctx.workdir))
                fresh_ms.append((time.perf_counter() - t0) * 1000)

            first, second = (lemon, fresh) if i % 2 == 0 else (fresh, lemon)
            await first()
            await second()
    fresh_p50 = statistics.median(fresh_ms)
    lemon_p50 = statistics.median(lemon_ms)
    report.figure("raw_fresh_kernel_per_call_ms", fresh_p50, fresh_ms)
    report.figure("per_call_vs_fresh_kernel", lemon_p50 / fresh_p50)
    report.context("fresh_kernel_lemon_per_call_p50_ms", lemon_p50)


async def bench_gateway_group(ctx: Context) -> None:
    """The gateway figures (bench/gateway.py): a real Enterprise Gateway on loopback."""
    from bench.gateway import bench_gateway

    plan = ctx.plan
    await bench_gateway(
        ctx.report,
        ctx.workdir,
        pairs=plan.session_pairs // 2,
        per_call_runs=plan.per_call_pairs,
        helper_calls=plan.helper_calls,
    )


async def bench_peers_group(ctx: Context) -> None:
    """The peers figures (bench/peers_group.py): ipybox, a fresh ipykernel, python3 -c."""
    await bench_peers(ctx.report, ctx.workdir, ctx.interpreter, ctx.plan.quick)


BENCHES: dict[str, Callable[[Context], Awaitable[None]]] = {
    "per_call": bench_per_call,
    "sustained": bench_sustained,
    "cold": bench_cold,
    "session": bench_session,
    "helpers": bench_helpers,
    "images": bench_images,
    "mcp": bench_mcp,
    "flood": bench_flood,
    "idle": bench_idle,
    "sessions16": bench_sessions16,
    "concurrent8": bench_concurrent8,
    "sessions64": bench_sessions64,
    "fresh_kernel": bench_fresh_kernel,
    "sandbox": bench_sandbox,
    "gateway": bench_gateway_group,
    "peers": bench_peers_group,
    "close": lambda ctx: bench_close(ctx.report, ctx.plan.quick, ctx.workdir),
}


#: Groups that need longer than ``Plan.group_timeout_s`` (64 kernel starts on 2 loaded cores).
GROUP_TIMEOUT_SCALE: dict[str, float] = {
    "sessions64": 3.0,
    "gateway": 2.0,
    "peers": 10.0,  # may first create ipybox's venv (minutes), then starts 20 ipybox executors
}


# -- child processes ------------------------------------------------------------------------------


async def run_child(name: str, workdir: Path, plan: Plan, timeout: float = 120) -> dict[str, Any]:
    """Run ``bench/run.py --child NAME`` and return the JSON it prints; killed on any exit."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(Path(__file__).resolve()),
        "--child",
        name,
        "--workdir",
        str(workdir),
        *(["--quick"] if plan.quick else []),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=None,
    )
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), timeout)
    finally:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()  # the child closes its kernels on SIGTERM
            try:
                await asyncio.wait_for(proc.wait(), 10)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()
    if proc.returncode != 0:
        raise RuntimeError(f"child {name} exited with {proc.returncode}")
    return json.loads(out)


CHILDREN: dict[str, Callable[[Path, float], Awaitable[dict[str, Any]]]] = {
    "flood": child_flood,
}


# -- driver ---------------------------------------------------------------------------------------


def _cancel_on_sigterm() -> None:
    """Turn SIGTERM into cancellation of the running task, so ``async with`` cleans up."""
    task = asyncio.current_task()
    if task is None:
        return
    with contextlib.suppress(NotImplementedError, RuntimeError):
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)


def select_groups(only: str | None) -> list[str]:
    """The groups to run for ``--only`` (figure or group names, comma separated)."""
    if not only:
        return list(GROUPS)
    wanted: set[str] = set()
    for name in (n.strip() for n in only.split(",") if n.strip()):
        if name in FIGURES:
            wanted.add(FIGURES[name][1])
        elif name in BENCHES:
            wanted.add(name)
        else:
            raise SystemExit(f"bench: unknown figure or group {name!r} (see --list)")
    return [g for g in GROUPS if g in wanted]


async def amain(args: argparse.Namespace) -> dict[str, Any]:
    _cancel_on_sigterm()
    plan = Plan.make(args.quick)
    groups = select_groups(args.only)
    interpreter = lemon_config().resolve_python()
    machine = machine_info(interpreter)
    report = Report()
    started = time.monotonic()
    log(
        f"{'quick' if plan.quick else 'full'} run of {', '.join(groups)}; "
        f"load average {machine['loadavg_start']}"
    )
    with tempfile.TemporaryDirectory(prefix="lemon-bench-") as tmp:
        ctx = Context(plan=plan, report=report, workdir=Path(tmp), interpreter=interpreter)
        for group in groups:
            t0 = time.monotonic()
            log(f"{group} ...")
            try:
                timeout = plan.group_timeout_s * GROUP_TIMEOUT_SCALE.get(group, 1.0)
                await asyncio.wait_for(BENCHES[group](ctx), timeout)
            except (TimeoutError, Exception) as exc:
                message = f"{type(exc).__name__}: {exc}"[:500]
                log(f"{group} failed: {message}")
                for name, (_unit, g) in FIGURES.items():
                    if g == group and name not in report.figures:
                        report.errors.setdefault(name, message)  # a group's own reason wins
            log(f"{group} done in {time.monotonic() - t0:.1f} s")
    machine["loadavg_end"] = loadavg()
    out: dict[str, Any] = {
        name: report.figures.get(name) for name, (_u, g) in FIGURES.items() if g in groups
    }
    out["machine"] = machine
    out["targets"] = {
        name: {"op": op, "value": limit, "pass": verdict(name, report.figures.get(name))}
        for name, (op, limit) in TARGETS.items()
        if FIGURES[name][1] in groups
    }
    out["stats"] = report.stats
    out["extra"] = report.extra
    out["errors"] = report.errors
    out["run"] = {
        "quick": plan.quick,
        "groups": groups,
        "seconds": round(time.monotonic() - started, 1),
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    table = format_table(report)
    print(table, file=sys.stderr if args.json else sys.stdout, flush=True)
    if not args.json:
        print(f"\nmachine: {json.dumps(machine)}\nrun: {json.dumps(out['run'])}", flush=True)
    return out


#: Where a full scaling run writes its tables (``--docs`` overrides).
DOCS_PAGE = Path(_ROOT) / "docs" / "benchmarks.md"


async def scaling_main(args: argparse.Namespace) -> dict[str, Any]:
    """``--scaling``: the four sweeps; tables to stdout, the docs page and ``--plot DIR``."""
    from bench.scaling_docs import scaling_markdown, write_docs

    _cancel_on_sigterm()
    grid = Grid.make(args.scaling_grid or ("quick" if args.quick else "full"))
    only = [n.strip() for n in (args.only or "").split(",") if n.strip()]
    unknown = [n for n in only if n not in SWEEPS]
    if unknown:
        raise SystemExit(f"bench: unknown sweep {unknown[0]!r} (sweeps: {', '.join(SWEEPS)})")
    interpreter = lemon_config().resolve_python()
    machine = machine_info(interpreter)
    started = time.monotonic()
    log(f"scaling run ({grid.kind} grid); load average {machine['loadavg_start']}")
    with tempfile.TemporaryDirectory(prefix="lemon-bench-scaling-") as tmp:
        results = await run_scaling(grid, Path(tmp), only)
    machine["loadavg_end"] = loadavg()
    results["machine"] = machine
    results["run"] = {
        "scaling": True,
        "grid": grid.kind,
        "seconds": round(time.monotonic() - started, 1),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    plots: dict[str, Path] = {}
    if args.plot:
        from bench.plots import write_plots

        plots = write_plots(results, Path(args.plot))
        results["plots"] = {k: str(v) for k, v in plots.items()}
    page = args.docs
    if page is None and grid.kind == "full" and not only:
        page = str(DOCS_PAGE)  # only a complete full run replaces the committed tables
    if page and page != "-":
        write_docs(Path(page), results, plots)
        results["docs"] = page
        log(f"scaling tables written to {page}")
    print(scaling_markdown(results), file=sys.stderr if args.json else sys.stdout, flush=True)
    return results


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer samples (under a minute)")
    parser.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object on stdout; everything else on stderr",
    )
    parser.add_argument(
        "--only",
        metavar="NAME[,NAME]",
        help="run only the groups measuring these figures (or groups)",
    )
    parser.add_argument("--list", action="store_true", help="list figures and groups, then exit")
    parser.add_argument(
        "--scaling",
        action="store_true",
        help="measure how cost grows (output size, helper calls, live sessions, agents) "
        "instead of the figures; --only then names sweeps",
    )
    parser.add_argument(
        "--plot", metavar="DIR", help="with --scaling: write one PNG per sweep into DIR"
    )
    parser.add_argument(
        "--docs",
        metavar="FILE",
        help="with --scaling: write the tables into FILE between its markers ('-': nowhere; "
        "default: docs/benchmarks.md after a complete full run, nowhere otherwise)",
    )
    parser.add_argument(
        "--scaling-grid", choices=("full", "quick", "smoke"), help=argparse.SUPPRESS
    )
    parser.add_argument("--child", choices=sorted(CHILDREN), help=argparse.SUPPRESS)
    parser.add_argument("--workdir", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


async def _child_main(name: str, workdir: Path, plan: Plan) -> dict[str, Any]:
    _cancel_on_sigterm()
    return await CHILDREN[name](workdir, plan.settle_s)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.list:
        for name, (unit, group) in FIGURES.items():
            target = TARGETS.get(name)
            print(
                f"{name:28} {unit:8} group={group:11} "
                f"{'target ' + target[0] + ' ' + _num(target[1]) if target else ''}"
            )
        print(f"scaling sweeps (--scaling [--only SWEEP,...]): {', '.join(SWEEPS)}")
        return 0
    try:
        if args.child:
            workdir = Path(args.workdir or tempfile.gettempdir())
            result = asyncio.run(_child_main(args.child, workdir, Plan.make(args.quick)))
            print(json.dumps(result), flush=True)
            return 0
        out = asyncio.run(scaling_main(args) if args.scaling else amain(args))
    except (KeyboardInterrupt, asyncio.CancelledError):
        log("interrupted; kernels stopped")
        return 130
    if args.json:
        print(json.dumps(out), flush=True)
    return exit_status(out)


def exit_status(out: dict[str, Any]) -> int:
    """1 when a measurement failed or a figure missed its target, else 0."""
    missed = [name for name, t in out.get("targets", {}).items() if t["pass"] is False]
    if missed:
        log(f"missed targets: {', '.join(missed)}")
    return 1 if out["errors"] or missed else 0


if __name__ == "__main__":
    sys.exit(main())
