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

#: issue 17's bound on 64 idle session kernels, drawn on the memory plot.
SESSIONS64_PSS_TARGET_MB = 640.0


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
        fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=100)
        try:
            _DRAW[sweep](ax, rows)
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
    if max(xs) >= 64:
        ax.axhline(
            SESSIONS64_PSS_TARGET_MB,
            color="grey",
            linestyle=":",
            label="issue 17 bound at 64 kernels",
        )
    ax.set_ylim(bottom=0)
    ax.set_xlabel("live idle session kernels")
    ax.set_ylabel("MiB")
    ax.set_title("Memory against live session kernels")
    ax.legend()


def _draw_agents(ax: Any, rows: Sequence[dict[str, Any]]) -> None:
    xs = [r["agents"] for r in rows]
    ax.plot(xs, [r["runs_per_s"] for r in rows], "o-", color="C0", label="runs/s")
    ax.set_xscale("log", base=2)
    ax.set_xticks(xs, [str(x) for x in xs])
    ax.set_xlabel("concurrent agents (back-to-back per-call runs)")
    ax.set_ylabel("completed runs per second", color="C0")
    ax.set_title("Throughput against concurrent agents")
    latency = ax.twinx()
    latency.plot(xs, [r["p95_ms"] for r in rows], "s--", color="C1", label="p95 latency")
    latency.set_ylabel("p95 latency (ms)", color="C1")
    ax.set_ylim(bottom=0)
    latency.set_ylim(bottom=0)
    handles = ax.get_legend_handles_labels()[0] + latency.get_legend_handles_labels()[0]
    ax.legend(handles=handles, loc="upper left")


_DRAW = {
    "output_size": _draw_output,
    "helper_calls": _draw_helpers,
    "sessions_memory": _draw_sessions,
    "agents_throughput": _draw_agents,
}
