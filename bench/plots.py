"""PNG plots of the scaling run (``--plot DIR``; matplotlib, the ``bench`` extra)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

#: Sweep -> file name of its plot.
PLOT_FILES: dict[str, str] = {
    "output_size": "scaling-output-size.png",
    "helper_calls": "scaling-helper-calls.png",
    "sessions_memory": "scaling-sessions-memory.png",
    "agents_throughput": "scaling-agents-throughput.png",
}

#: Sweeps drawn as side-by-side panels (the others: one).
PANELS: dict[str, int] = {"agents_throughput": 2}

#: Bounds drawn on the memory plot: 64 idle session kernels (issue 17), 128 (issue 31).
SESSIONS_PSS_TARGETS_MB: dict[int, float] = {64: 640.0, 128: 768.0}


def _series(rows: Sequence[dict[str, Any]], key: str) -> dict[str, list[dict[str, Any]]]:
    """``rows`` grouped by their ``key`` value, in order of first appearance."""
    out: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        out.setdefault(str(row[key]), []).append(row)
    return out


def write_plots(results: dict[str, Any], directory: Path) -> dict[str, Path]:
    """One PNG per sweep present in ``results``; returns sweep -> path."""
    import matplotlib

    matplotlib.use("Agg")  # no display; also keeps a test run headless
    import matplotlib.pyplot as plt

    directory.mkdir(parents=True, exist_ok=True)
    written: dict[str, Path] = {}
    for sweep, name in PLOT_FILES.items():
        rows = results.get(sweep)
        if not rows:
            continue
        panels = PANELS.get(sweep, 1)
        fig, axes = plt.subplots(1, panels, figsize=(6.4 * panels, 4.0), dpi=100, squeeze=False)
        try:
            _DRAW[sweep](axes[0] if panels > 1 else axes[0][0], rows)
            for ax in axes[0]:
                ax.grid(True, which="both", alpha=0.3)
            fig.tight_layout()
            path = directory / name
            fig.savefig(path, format="png", metadata={"Software": None})
            written[sweep] = path
        finally:
            plt.close(fig)
    return written


def _draw_output(ax: Any, rows: Sequence[dict[str, Any]]) -> None:
    for via, group in _series(rows, "via").items():
        ax.plot([r["bytes"] for r in group], [r["p50_ms"] for r in group], "o-", label=via)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("output per run (bytes)")
    ax.set_ylabel("per-call latency p50 (ms)")
    ax.set_title("Per-call latency against output size")
    ax.legend(title="written with")


def _draw_helpers(ax: Any, rows: Sequence[dict[str, Any]]) -> None:
    for mode, group in _series(rows, "mode").items():
        ax.plot([r["calls"] for r in group], [r["p50_ms"] for r in group], "o-", label=mode)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("read() calls per script")
    ax.set_ylabel("cell wall clock p50 (ms)")
    ax.set_title("Script time against helper calls")
    ax.legend()


def _draw_sessions(ax: Any, rows: Sequence[dict[str, Any]]) -> None:
    xs = [r["kernels"] for r in rows]
    ax.plot(xs, [r["pss_mb"] for r in rows], "o-", label="total PSS")
    ax.plot(xs, [r["uss_mb"] for r in rows], "s--", label="total USS")
    for kernels, bound in SESSIONS_PSS_TARGETS_MB.items():
        if kernels in xs:
            ax.plot([kernels], [bound], "v", color="grey", label=f"bound at {kernels} kernels")
    ax.set_ylim(bottom=0)
    ax.set_xlabel("live idle session kernels")
    ax.set_ylabel("MiB")
    ax.set_title("Memory against live session kernels")
    ax.legend()


def _draw_agents(axes: Any, rows: Sequence[dict[str, Any]]) -> None:
    """Runs/s (left) and p95 (right) against callers, lemon_exec beside ``python3 -c``."""
    xs = [r["agents"] for r in rows]
    rate, tail = axes
    both = all("python_runs_per_s" in r for r in rows)
    rate.plot(xs, [r["runs_per_s"] for r in rows], "o-", label="lemon_exec")
    tail.plot(xs, [r["p95_ms"] for r in rows], "o-", label="lemon_exec")
    if both:
        rate.plot(xs, [r["python_runs_per_s"] for r in rows], "s--", label="python3 -c")
        tail.plot(xs, [r["python_p95_ms"] for r in rows], "s--", label="python3 -c")
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs, [str(x) for x in xs])
        ax.set_xlabel("concurrent callers (closed loop, print(1))")
        ax.legend()
    rate.set_ylim(bottom=0)
    rate.set_ylabel("completed runs per second")
    rate.set_title("Throughput against concurrent callers")
    tail.set_yscale("log")
    tail.set_ylabel("p95 latency (ms)")
    tail.set_title("p95 latency against concurrent callers")


_DRAW = {
    "output_size": _draw_output,
    "helper_calls": _draw_helpers,
    "sessions_memory": _draw_sessions,
    "agents_throughput": _draw_agents,
}
