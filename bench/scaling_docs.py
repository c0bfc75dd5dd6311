"""The scaling run's Markdown tables, written into docs/benchmarks.md between two markers.

Everything between ``BEGIN`` and ``END`` is replaced by a rerun; the rest of the page is left
as it is. A page without the markers gets them (and the tables) appended.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.peers_figures import PEER_FIGURES, PEER_ROWS, PEER_TARGETS

BEGIN = "<!-- scaling:begin (written by python bench/run.py --scaling; edits here are lost) -->"
END = "<!-- scaling:end -->"

#: Sweep -> (heading, columns as (key, header)), in page order.
TABLES: dict[str, tuple[str, tuple[tuple[str, str], ...]]] = {
    "output_size": (
        "Per-call latency against output size",
        (
            ("bytes", "output"),
            ("via", "written with"),
            ("p50_ms", "p50 ms"),
            ("max_ms", "max ms"),
            ("mib_per_s", "MiB/s"),
            ("n", "n"),
        ),
    ),
    "helper_calls": (
        "Script time against helper calls per script",
        (
            ("calls", "read() calls"),
            ("mode", "mode"),
            ("p50_ms", "p50 ms"),
            ("per_call_ms", "ms per call"),
            ("n", "n"),
        ),
    ),
    "sessions_memory": (
        "Memory against live session kernels",
        (
            ("kernels", "kernels"),
            ("pss_mb", "total PSS MiB"),
            ("pss_per_kernel_mb", "PSS per kernel"),
            ("uss_mb", "USS MiB"),
            ("rss_mb", "RSS MiB"),
            ("template_pss_mb", "template PSS MiB"),
        ),
    ),
    "agents_throughput": (
        "Throughput against concurrent agents",
        (
            ("agents", "callers (closed loop, `print(1)`)"),
            ("runs_per_s", "lemon_exec runs/s"),
            ("python_runs_per_s", "`python3 -c` runs/s"),
            ("p50_ms", "lemon p50 ms"),
            ("p95_ms", "lemon p95 ms"),
            ("python_p95_ms", "`python3 -c` p95 ms"),
            ("n", "lemon runs"),
        ),
    ),
}

PEERS_TITLE = "Peers"


def _cell(key: str, value: Any) -> str:
    if key == "bytes" and isinstance(value, int):
        return human_bytes(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return str(value)


def human_bytes(size: int) -> str:
    """1000 -> "1 KB", 10_000_000 -> "10 MB" (decimal units, as the issue names them)."""
    for unit, scale in (("MB", 1000**2), ("KB", 1000)):
        if size >= scale and size % scale == 0:
            return f"{size // scale:,} {unit}"
    return f"{size:,} B"


def markdown_table(rows: Sequence[dict[str, Any]], columns: Sequence[tuple[str, str]]) -> str:
    lines = [
        "| " + " | ".join(header for _, header in columns) + " |",
        "| " + " | ".join("---" for _ in columns) + " |",
    ]
    for row in rows:
        lines.append("| " + " | ".join(_cell(k, row.get(k, "")) for k, _ in columns) + " |")
    return "\n".join(lines)


def scaling_markdown(
    results: dict[str, Any], images: dict[str, str] | None = None, heading_level: int = 3
) -> str:
    """The tables (and images, sweep -> path relative to the page) as one Markdown block."""
    hashes = "#" * heading_level
    parts: list[str] = []
    machine = results.get("machine", {})
    run = results.get("run", {})
    if machine or run:
        parts.append(
            f"Measured {run.get('date', '?')} ({results.get('grid', '?')} grid, "
            f"{run.get('seconds', '?')} s) on {machine.get('cores', '?')} cores "
            f"({machine.get('cpu_model', '?')}), Python {machine.get('python', '?')}, "
            f"lemon_exec at `{(machine.get('lemon_exec_git') or {}).get('commit', '?')}`; "
            f"load average {machine.get('loadavg_start', '?')} → "
            f"{machine.get('loadavg_end', '?')}."
        )
    for sweep, (title, columns) in TABLES.items():
        if sweep in results:
            parts.append(f"{hashes} {title}")
            parts.append(markdown_table(results[sweep], columns))
            if images and sweep in images:
                parts.append(f"![{title}]({images[sweep]})")
        elif sweep in results.get("errors", {}):
            parts.append(f"{hashes} {title}")
            parts.append(f"Not measured: {results['errors'][sweep]}")
    if "peers" in results:
        parts.append(f"{hashes} {PEERS_TITLE}")
        parts.append(peers_markdown(results["peers"]))
    elif "peers" in results.get("errors", {}):
        parts.append(f"{hashes} {PEERS_TITLE}")
        parts.append(f"Not measured: {results['errors']['peers']}")
    return "\n\n".join(parts)


def _measured(peers: dict[str, Any], name: str) -> str:
    """``p50 unit (p90 …)`` of one figure, or why it is missing."""
    value = peers.get("figures", {}).get(name)
    if value is None:
        return "not measured"
    unit = PEER_FIGURES[name][0]
    p90 = peers.get("stats", {}).get(name, {}).get("p90")
    return f"{_fmt(value)} {unit}" + (f" (p90 {_fmt(p90)})" if p90 is not None else "")


def _fmt(value: float) -> str:
    return f"{value:.3g}" if abs(value) < 100 else f"{value:,.0f}"


def _ratio(peers: dict[str, Any], name: str) -> tuple[str, str, str]:
    """The ratio cell (with its verdict), its spread and its target."""
    value = peers.get("figures", {}).get(name)
    spread = peers.get("stats", {}).get(name, {})
    target = PEER_TARGETS.get(name)
    cell = "not measured" if value is None else f"{_fmt(value)}x"
    if target and value is not None:
        ok = value <= target[1] if target[0] == "<=" else value >= target[1]
        cell += " (pass)" if ok else " (miss)"
    spread_cell = ""
    if spread.get("n"):
        spread_cell = (
            f"{_fmt(spread['p90'])}; {_fmt(spread['min'])}..{_fmt(spread['max'])} (n={spread['n']})"
        )
    return cell, spread_cell, f"{target[0]} {target[1]:g}x" if target else ""


def peers_markdown(peers: dict[str, Any]) -> str:
    """The peer table: each comparison's two sides, their ratio and its spread."""
    lines = [
        "| peer | measure | lemon_exec p50 | peer p50 | ratio (lemon_exec / peer) | "
        "ratio spread: p90; min..max | target |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for peer, what, ours, theirs, ratio in PEER_ROWS:
        cells = (
            peer,
            what,
            _measured(peers, ours),
            _measured(peers, theirs),
            *_ratio(peers, ratio),
        )
        lines.append("| " + " | ".join(cells) + " |")
    reasons = sorted(set(peers.get("errors", {}).values()))
    if reasons:
        lines += ["", "Not measured: " + "; ".join(reasons)]
    extra = peers.get("extra", {})
    info = extra.get("peers_ipybox")
    if isinstance(info, dict):
        lines += [
            "",
            f"ipybox {info.get('ipybox', '?')} (jupyter-kernel-gateway "
            f"{info.get('jupyter_kernel_gateway', '?')}, mcp {info.get('mcp', '?')}), in its "
            f"own venv; it lost the output of {extra.get('peers_ipybox_output_lost', '?')} of "
            f"{peers.get('stats', {}).get('peers_ipybox_session_rtt_ms', {}).get('n', '?')} "
            "session round trips (a stream message after its `execute_reply`).",
        ]
    return "\n".join(lines)


def replace_block(page: str, block: str) -> str:
    """``page`` with the text between the markers replaced by ``block`` (appended if absent)."""
    wrapped = f"{BEGIN}\n\n{block.strip()}\n\n{END}"
    start = page.find(BEGIN)
    end = page.find(END, start + 1) if start >= 0 else -1
    if start < 0 or end < 0:
        return page.rstrip("\n") + "\n\n" + wrapped + "\n"
    return page[:start] + wrapped + page[end + len(END) :]


def write_docs(page: Path, results: dict[str, Any], plots: dict[str, Path] | None = None) -> None:
    """Write the tables into ``page``; link the plots that live beside it (so Sphinx finds
    them); plots elsewhere are left out of the page."""
    images: dict[str, str] = {}
    for sweep, path in (plots or {}).items():
        rel = os.path.relpath(path.resolve(), page.resolve().parent)
        if not rel.startswith(".."):
            images[sweep] = Path(rel).as_posix()
    text = page.read_text(encoding="utf-8") if page.exists() else "# Benchmarks\n"
    page.write_text(replace_block(text, scaling_markdown(results, images)), encoding="utf-8")
