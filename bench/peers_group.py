"""The ``peers`` group (issue 31): lemon_exec side by side with the tools it competes with.

In one run, each comparison alternating which side goes first:

- **ipybox 0.9** (bench/peers_ipybox.py, its own venv and process): a warm session's
  ``print(1)`` round trip; a script's MCP tool call (ipybox's generated ``echo.run()`` against
  lemon_exec's ``tools.up.echo()``, the same tiny stdio server, timed inside the script);
  start to first result (a new ``CodeExecutor`` against a new ``ExecuteCode`` facade, each
  to the result of ``print(1)``); idle PSS of 1 and of 16 sessions;
- **a fresh ipykernel per call** through nbclient (bench/peers.py) against a per-call run;
- **``python3 -c "print(1)"``** as a subprocess against a per-call run.

Each comparison reports lemon_exec's figure, the peer's and their ratio (lemon_exec over the
peer); the ratio's ``stats`` are over the ratios of the alternating pairs (rounds for MCP).
A peer that cannot be installed or started leaves its figures ``null`` with the reason under
``errors`` (and the run's exit status 1): never a silent skip.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.common import (
    RESULT_MARKER,
    Report,
    lemon_config,
    log,
    script_json,
    summarize,
    timed_run,
)
from bench.memory import descendants, parent_pid, pss_uss_kib
from bench.peers import fresh_kernel_call, pool_settled, python_c
from bench.peers_figures import PEER_FIGURES
from bench.peers_ipybox import IpyboxDriver, PeerUnavailable, ensure_venv
from lemon_exec import ExecuteCode, ExecuteCodeConfig, SessionScope

UPSTREAM = Path(__file__).resolve().parents[1] / "tests" / "mcp_upstream" / "server.py"

LEMON_MCP_SCRIPT = """\
import json, time
samples = []
for _ in range({calls}):
    t0 = time.perf_counter()
    tools.up.echo(text="x")
    samples.append((time.perf_counter() - t0) * 1000)
text({marker!r} + json.dumps(samples))
"""

IPYBOX_MCP_SCRIPT = """\
import json, time
from mcptools.up import echo
samples = []
for _ in range({calls}):
    t0 = time.perf_counter()
    echo.run(echo.Params(text="x"))
    samples.append((time.perf_counter() - t0) * 1000)
print({marker!r} + json.dumps(samples))
"""


@dataclass(frozen=True)
class Counts:
    """Samples per comparison (full run or ``--quick``)."""

    session_pairs: int
    mcp_rounds: int
    mcp_calls: int
    start_samples: int
    fresh_pairs: int
    python_pairs: int
    sessions: int = 16  # the figure is about 16: never extrapolated
    settle_s: float = 2.0

    @classmethod
    def make(cls, quick: bool) -> Counts:
        if quick:
            return cls(session_pairs=40, mcp_rounds=2, mcp_calls=20, start_samples=1,
                       fresh_pairs=2, python_pairs=6)  # fmt: skip
        return cls(session_pairs=200, mcp_rounds=6, mcp_calls=30, start_samples=5,
                   fresh_pairs=10, python_pairs=40)  # fmt: skip


@dataclass
class Peers:
    report: Report
    workdir: Path
    interpreter: str
    counts: Counts

    def scope(self, name: str) -> SessionScope:
        return SessionScope(name, "bench", str(self.workdir))

    def compare(
        self,
        lemon_name: str,
        peer_name: str,
        ratio_name: str,
        lemon: Sequence[float],
        peer: Sequence[float],
        ratios: Sequence[float],
    ) -> None:
        """Both sides' p50 with their samples, and the ratio of the p50s with the pairs'."""
        self.report.figure(lemon_name, statistics.median(lemon), lemon)
        self.report.figure(peer_name, statistics.median(peer), peer)
        self.report.figure(ratio_name, statistics.median(lemon) / statistics.median(peer))
        self.report.stats[ratio_name] = summarize(ratios)


async def in_turn(
    i: int, first: Callable[[], Awaitable[None]], second: Callable[[], Awaitable[None]]
) -> None:
    """``first`` then ``second`` on even ``i``, the other way round on odd ones."""
    for step in (first, second) if i % 2 == 0 else (second, first):
        await step()


# -- per-call peers: a fresh ipykernel, python3 -c ------------------------------------------------


async def per_call_peers(p: Peers) -> None:
    lemon_fresh: list[float] = []
    lemon_py: list[float] = []
    fresh: list[float] = []
    py: list[float] = []
    cwd = str(p.workdir)
    scope = p.scope("bench-peers-per-call")
    async with ExecuteCode(lemon_config(kernel_mode="per_call", warm_kernels=1)) as ec:

        async def lemon(into: list[float]) -> None:
            await pool_settled(ec, 1, 10)  # each side starts once the pool has settled
            into.append((await timed_run(ec, "print(1)\n", scope))[0])

        async def timed_fresh() -> None:
            await pool_settled(ec, 1, 10)
            t0 = time.perf_counter()
            out = await fresh_kernel_call(p.interpreter, cwd)
            fresh.append((time.perf_counter() - t0) * 1000)
            if out.strip() != "1":
                raise RuntimeError(f"fresh kernel printed {out!r}")

        async def timed_python() -> None:
            await pool_settled(ec, 1, 10)
            py.append(await python_c(p.interpreter, cwd))

        await timed_run(ec, "print(1)\n", scope)  # the pool (and fork server) fill from here
        await fresh_kernel_call(p.interpreter, cwd)  # warm-ups, not counted
        await python_c(p.interpreter, cwd)
        for i in range(p.counts.python_pairs):
            await in_turn(i, lambda: lemon(lemon_py), timed_python)
        for i in range(p.counts.fresh_pairs):
            await in_turn(i, lambda: lemon(lemon_fresh), timed_fresh)
    both = lemon_py + lemon_fresh
    p.report.figure("peers_per_call_ms", statistics.median(both), both)
    p.report.figure("peers_python_c_ms", statistics.median(py), py)
    p.report.figure(
        "peers_per_call_vs_python_c", statistics.median(lemon_py) / statistics.median(py)
    )
    p.report.stats["peers_per_call_vs_python_c"] = summarize(
        [a / b for a, b in zip(lemon_py, py, strict=True)]
    )
    p.report.figure("peers_fresh_kernel_ms", statistics.median(fresh), fresh)
    p.report.figure(
        "peers_per_call_vs_fresh_kernel", statistics.median(lemon_fresh) / statistics.median(fresh)
    )
    p.report.stats["peers_per_call_vs_fresh_kernel"] = summarize(
        [a / b for a, b in zip(lemon_fresh, fresh, strict=True)]
    )


# -- ipybox ---------------------------------------------------------------------------------------


async def ipybox_session_and_mcp(p: Peers, driver: IpyboxDriver, root: Path) -> list[str]:
    """Session round trips, then MCP calls, on one warm session each side; returns the steps
    that failed with their reasons recorded."""
    from lemon_exec.tools import default_registry

    registry = default_registry()
    registry.add_mcp_server("up", command=sys.executable, args=[str(UPSTREAM)])
    config = lemon_config(kernel_mode="session", warm_kernels=0, max_rpc_calls=1_000_000)
    scope = p.scope("bench-peers-session")
    failed: list[str] = []
    await driver.request("start", name="main", working_dir=str(root))
    try:
        async with ExecuteCode(config, tools=registry) as ec:
            try:
                await _session_rtt(p, driver, ec, scope)
            except Exception as exc:  # the MCP comparison still runs
                _fail(p.report, "ipybox_session", exc)
                failed.append("ipybox_session")
            try:
                await _mcp_calls(p, driver, ec, scope, root)
            except Exception as exc:
                _fail(p.report, "ipybox_mcp", exc)
                failed.append("ipybox_mcp")
    finally:
        await driver.request("stop", name="main")
    return failed


async def _session_rtt(
    p: Peers, driver: IpyboxDriver, ec: ExecuteCode, scope: SessionScope
) -> None:
    lemon: list[float] = []
    peer: list[float] = []
    lost = 0

    async def one_lemon() -> None:
        lemon.append((await timed_run(ec, "print(1)\n", scope))[0])

    async def one_peer() -> None:
        nonlocal lost
        reply = await driver.request("execute", name="main", code="print(1)")
        peer.append(reply["ms"])
        lost += reply["text"] != "1"

    for i in range(10):  # warm-up
        await in_turn(i, one_lemon, one_peer)
    lemon.clear()
    peer.clear()
    lost = 0
    for i in range(p.counts.session_pairs):
        await in_turn(i, one_lemon, one_peer)
    ratios = [a / b for a, b in zip(lemon, peer, strict=True)]
    p.compare("peers_session_rtt_ms", "peers_ipybox_session_rtt_ms", "peers_session_vs_ipybox",
              lemon, peer, ratios)  # fmt: skip
    # ipybox returns on execute_reply; a stream message arriving after it is lost.
    p.report.context("peers_ipybox_output_lost", lost)


async def _mcp_calls(
    p: Peers, driver: IpyboxDriver, ec: ExecuteCode, scope: SessionScope, root: Path
) -> None:
    calls = p.counts.mcp_calls
    lemon: list[float] = []
    peer: list[float] = []
    ratios: list[float] = []

    async def lemon_round() -> list[float]:
        code = LEMON_MCP_SCRIPT.format(calls=calls, marker=RESULT_MARKER)
        samples: list[float] = script_json((await timed_run(ec, code, scope))[1])
        return samples

    async def peer_round() -> list[float]:
        code = IPYBOX_MCP_SCRIPT.format(calls=calls, marker=RESULT_MARKER)
        text = (await driver.request("execute", name="main", code=code))["text"] or ""
        found = [ln for ln in text.splitlines() if ln.startswith(RESULT_MARKER)]
        if not found:
            raise RuntimeError(f"no {RESULT_MARKER} line from ipybox: {text[:300]!r}")
        samples: list[float] = json.loads(found[-1][len(RESULT_MARKER) :])
        return samples

    await lemon_round()  # warm-ups: each side starts its MCP server here
    await peer_round()
    got: dict[str, list[float]] = {}

    async def a() -> None:
        got["lemon"] = await lemon_round()

    async def b() -> None:
        got["peer"] = await peer_round()

    for i in range(p.counts.mcp_rounds):
        await in_turn(i, a, b)
        lemon.extend(got["lemon"])
        peer.extend(got["peer"])
        ratios.append(statistics.median(got["lemon"]) / statistics.median(got["peer"]))
    p.compare("peers_mcp_call_ms", "peers_ipybox_mcp_call_ms", "peers_mcp_vs_ipybox",
              lemon, peer, ratios)  # fmt: skip


async def ipybox_start(p: Peers, driver: IpyboxDriver, root: Path) -> None:
    """A new executor/facade to the result of ``print(1)``; each closed after (untimed)."""
    lemon: list[float] = []
    peer: list[float] = []
    config = ExecuteCodeConfig(enabled=True, timeout_ms=60_000, kernel_mode="session")

    async def one_lemon() -> None:
        t0 = time.perf_counter()
        async with ExecuteCode(config) as ec:
            await timed_run(ec, "print(1)\n", p.scope("bench-peers-first"))
            lemon.append((time.perf_counter() - t0) * 1000)

    async def one_peer() -> None:
        name = f"first-{len(peer)}"
        try:
            reply = await driver.request(
                "start", name=name, working_dir=str(root), first="print(1)"
            )
        finally:
            await driver.request("stop", name=name)
        peer.append(reply["first_ms"])

    for i in range(p.counts.start_samples):
        await in_turn(i, one_lemon, one_peer)
    ratios = [a / b for a, b in zip(lemon, peer, strict=True)]
    p.compare("peers_start_first_ms", "peers_ipybox_start_first_ms", "peers_start_vs_ipybox",
              lemon, peer, ratios)  # fmt: skip


async def ipybox_memory(p: Peers, driver: IpyboxDriver, root: Path) -> None:
    """PSS of every process 1 and 16 idle sessions need beyond the calling process: lemon_exec's
    kernels and fork-server template; ipybox's kernel gateways and kernels (its tool servers
    live in the calling process: their growth is context). One side at a time, so that they
    do not share pages."""
    n = p.counts.sessions
    lemon: dict[int, float] = {}
    kernels: list[int] = []
    config = lemon_config(kernel_mode="session", warm_kernels=0, max_live_kernels=n)
    async with ExecuteCode(config) as ec:
        gate = asyncio.Semaphore(8)

        async def lemon_session(i: int) -> None:
            async with gate:
                code = "import os\nprint(os.getpid())"
                _, result = await timed_run(ec, code, p.scope(f"bench-peers-idle-{i}"))
                kernels.append(int(result.content.strip().splitlines()[-1]))

        for count, start in ((1, 0), (n, 1)):
            await asyncio.gather(*(lemon_session(i) for i in range(start, count)))
            await asyncio.sleep(p.counts.settle_s)
            # This facade's processes only: the kernels, their children and the fork-server
            # template that forked them (not whatever else this process has running).
            ours = {*kernels, *(c for k in kernels for c in descendants(k))}
            ours |= {t for t in (parent_pid(k) for k in kernels) if t != os.getpid()}
            lemon[count] = _pss_mib(sorted(ours))
        others = set(descendants(os.getpid())) - ours - {driver.pid, *descendants(driver.pid)}
        p.report.context("peers_other_children", len(others))
    peer: dict[int, float] = {}
    driver_before = _pss_mib([driver.pid])
    gate = asyncio.Semaphore(2)

    async def peer_session(i: int) -> None:
        async with gate:
            await driver.request("start", name=f"idle-{i}", working_dir=str(root), first="x = 1")

    try:
        for count, start in ((1, 0), (n, 1)):
            await asyncio.gather(*(peer_session(i) for i in range(start, count)))
            await asyncio.sleep(p.counts.settle_s)
            peer[count] = _pss_mib(descendants(driver.pid))
        growth = _pss_mib([driver.pid]) - driver_before
        p.report.context("peers_ipybox_caller_pss_growth16_mb", growth)
    finally:
        for i in range(n):
            await driver.request("stop", name=f"idle-{i}")
    for count, tag in ((1, "idle1"), (n, "idle16")):
        p.report.figure(f"peers_{tag}_pss_mb", lemon[count])
        p.report.figure(f"peers_ipybox_{tag}_pss_mb", peer[count])
        p.report.figure(f"peers_{tag}_vs_ipybox", lemon[count] / peer[count])


def _pss_mib(pids: Sequence[int]) -> float:
    found = [pss_uss_kib(q) for q in pids]
    return sum(f[0] for f in found if f) / 1024


def _fail(report: Report, step: str, exc: BaseException) -> None:
    message = f"{type(exc).__name__}: {exc}"[:500]
    log(f"peers {step} failed: {message}")
    for name, (_unit, s) in PEER_FIGURES.items():
        if s == step and name not in report.figures:
            report.errors.setdefault(name, message)


class PeersFailed(RuntimeError):
    """Some comparisons were not measured; their figures' reasons are under ``errors``."""


async def bench_peers(report: Report, workdir: Path, interpreter: str, quick: bool) -> None:
    """Every comparison; raises ``PeersFailed`` at the end when one could not be measured."""
    p = Peers(report, workdir, interpreter, Counts.make(quick))
    failed: list[str] = []
    try:
        await per_call_peers(p)
    except Exception as exc:
        _fail(report, "per_call", exc)
        failed.append("per_call")
    steps = ("ipybox_session", "ipybox_mcp", "ipybox_start", "ipybox_memory")
    try:
        python = await asyncio.to_thread(ensure_venv)
        driver = await IpyboxDriver.start(python, workdir)
    except (PeerUnavailable, OSError, RuntimeError, TimeoutError) as exc:
        for step in steps:
            _fail(report, step, PeerUnavailable(f"ipybox unavailable: {exc}"))
        failed.extend(steps)
    else:
        report.context("peers_ipybox", driver.info)
        root = workdir / "ipybox-root"
        try:
            tools = [sys.executable, str(UPSTREAM)]
            await driver.request(
                "generate", server="up", params={"command": tools[0], "args": tools[1:]},
                root=str(root / "mcptools"),
            )  # fmt: skip
            failed += await ipybox_session_and_mcp(p, driver, root)
            for step, run in (("ipybox_start", ipybox_start), ("ipybox_memory", ipybox_memory)):
                try:
                    await run(p, driver, root)
                except Exception as exc:
                    _fail(report, step, exc)
                    failed.append(step)
        except Exception as exc:
            for step in steps:
                _fail(report, step, exc)
            failed.extend(steps)
        finally:
            await driver.aclose()
    if failed:
        raise PeersFailed(f"not measured: {', '.join(dict.fromkeys(failed))}")
