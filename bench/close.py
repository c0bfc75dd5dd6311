"""The ``close`` group: closing a facade that just ran calls, and the loop's stalls in a burst.

- ``aclose_ms``: wall clock of ``await tool.aclose()`` right after a few runs, as
  ``lemon-exec run`` and an agent server shutting down do it: its used kernels are still
  stopping and its spare refilling in the background. Alternately a per-call facade (one
  spare, the fork-server template: three per-call runs) and a session facade (two session
  runs in two sessions and one per-call run without a scope); p50 over all of them.
- ``loop_stall_burst8_ms``: the longest the event loop went without running a 1 ms ticker
  while 8 per-call runs went at once on a warm facade (what every other caller of the host
  waits through); the median over a few bursts.

Run alone with ``python bench/close.py`` (``--quick``); ``bench/run.py --only close`` runs it
as a group.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # ``python bench/close.py``: the checkout's root on the path
    sys.path.append(str(Path(__file__).resolve().parents[1]))

from bench.common import TRIVIAL_SCRIPT, Report, lemon_config, percentile, timed_run, wait_quiet
from lemon_exec import ExecuteCode, SessionScope

#: Facades closed per mode (``--quick``: fewer).
CLOSE_ROUNDS, CLOSE_ROUNDS_QUICK = 6, 3
#: Bursts of 8 concurrent per-call runs measured for the loop's stalls.
BURSTS, BURSTS_QUICK = 5, 2
BURST_RUNS = 8
_TICK_S = 0.001


async def _close_after_runs(mode: str, workdir: Path, round_: int) -> float:
    """Milliseconds of ``aclose()`` on a facade of ``mode`` that has just run a few calls."""
    tool = ExecuteCode(lemon_config(kernel_mode=mode, warm_kernels=1))
    try:
        if mode == "per_call":
            for i in range(3):
                await timed_run(tool, TRIVIAL_SCRIPT, SessionScope(f"c{round_}-{i}", "bench"))
        else:
            for i in range(2):
                scope = SessionScope(f"close-{round_}-{i}", "bench", str(workdir))
                await timed_run(tool, TRIVIAL_SCRIPT, scope)
            result = await tool.run(TRIVIAL_SCRIPT)  # no scope: an isolated per-call run
            if result.details.get("exit_code") != 0:
                raise RuntimeError(f"script failed: {result.content[:500]!r}")
    except BaseException:
        await tool.aclose()
        raise
    started = time.perf_counter()
    await tool.aclose()
    return (time.perf_counter() - started) * 1000


async def _longest_stall(during: asyncio.Future[object]) -> float:
    """The longest gap (ms) beyond the ticker's own period until ``during`` is done."""
    worst = 0.0
    last = time.perf_counter()
    while not during.done():
        await asyncio.sleep(_TICK_S)
        now = time.perf_counter()
        worst = max(worst, now - last - _TICK_S)
        last = now
    return worst * 1000


async def bench_close(report: Report, quick: bool, workdir: Path) -> None:
    """aclose_ms and loop_stall_burst8_ms (see the module doc)."""
    rounds = CLOSE_ROUNDS_QUICK if quick else CLOSE_ROUNDS
    per_mode: dict[str, list[float]] = {"per_call": [], "session": []}
    for i in range(rounds):
        for mode in ("per_call", "session") if i % 2 == 0 else ("session", "per_call"):
            per_mode[mode].append(await _close_after_runs(mode, workdir, i))
    samples = per_mode["per_call"] + per_mode["session"]
    report.figure("aclose_ms", statistics.median(samples), samples)
    for mode, values in per_mode.items():
        report.context(f"aclose_{mode}_p50_ms", statistics.median(values))
    report.context("aclose_max_ms", max(samples))

    stalls: list[float] = []
    async with ExecuteCode(lemon_config(kernel_mode="per_call", warm_kernels=1)) as tool:
        scope = SessionScope("bench-burst", "bench", str(workdir))
        await timed_run(tool, TRIVIAL_SCRIPT, scope)  # the pool and the template start
        for _ in range(BURSTS_QUICK if quick else BURSTS):
            await wait_quiet(tool, 1, 30)
            burst = asyncio.gather(
                *(timed_run(tool, TRIVIAL_SCRIPT, scope) for _ in range(BURST_RUNS))
            )
            stalls.append(await _longest_stall(burst))
            await burst
    report.figure("loop_stall_burst8_ms", statistics.median(stalls), stalls)
    report.context("loop_stall_burst8_p90_ms", percentile(stalls, 90))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    report = Report()
    with_dir = Path(".").resolve()
    asyncio.run(bench_close(report, args.quick, with_dir))
    print(json.dumps({"figures": report.figures, "extra": report.extra, "stats": report.stats}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
