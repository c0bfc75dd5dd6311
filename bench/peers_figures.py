"""The peers group's figures, targets and docs table (issue 31; measured by bench/peers_group.py).

Kept apart from the measurements so that the docs writer and ``--list`` need no kernel.
"""

from __future__ import annotations

#: Figure -> (unit, step); the step that fails leaves its figures null with its reason.
PEER_FIGURES: dict[str, tuple[str, str]] = {
    "peers_session_rtt_ms": ("ms", "ipybox_session"),
    "peers_ipybox_session_rtt_ms": ("ms", "ipybox_session"),
    "peers_session_vs_ipybox": ("x", "ipybox_session"),
    "peers_mcp_call_ms": ("ms", "ipybox_mcp"),
    "peers_ipybox_mcp_call_ms": ("ms", "ipybox_mcp"),
    "peers_mcp_vs_ipybox": ("x", "ipybox_mcp"),
    "peers_start_first_ms": ("ms", "ipybox_start"),
    "peers_ipybox_start_first_ms": ("ms", "ipybox_start"),
    "peers_start_vs_ipybox": ("x", "ipybox_start"),
    "peers_idle1_pss_mb": ("MiB", "ipybox_memory"),
    "peers_ipybox_idle1_pss_mb": ("MiB", "ipybox_memory"),
    "peers_idle1_vs_ipybox": ("x", "ipybox_memory"),
    "peers_idle16_pss_mb": ("MiB", "ipybox_memory"),
    "peers_ipybox_idle16_pss_mb": ("MiB", "ipybox_memory"),
    "peers_idle16_vs_ipybox": ("x", "ipybox_memory"),
    "peers_per_call_ms": ("ms", "per_call"),
    "peers_fresh_kernel_ms": ("ms", "per_call"),
    "peers_per_call_vs_fresh_kernel": ("x", "per_call"),
    "peers_python_c_ms": ("ms", "per_call"),
    "peers_per_call_vs_python_c": ("x", "per_call"),
}

#: Issue 31's targets: lemon_exec over ipybox.
PEER_TARGETS: dict[str, tuple[str, float]] = {
    "peers_session_vs_ipybox": ("<=", 0.1),
    "peers_mcp_vs_ipybox": ("<=", 0.5),
}

#: The docs' peer table: (peer, what, lemon figure, peer figure, ratio figure).
PEER_ROWS: tuple[tuple[str, str, str, str, str], ...] = (
    ("ipybox 0.9", "session round trip, `print(1)`", "peers_session_rtt_ms",
     "peers_ipybox_session_rtt_ms", "peers_session_vs_ipybox"),
    ("ipybox 0.9", "MCP tool call from a script", "peers_mcp_call_ms",
     "peers_ipybox_mcp_call_ms", "peers_mcp_vs_ipybox"),
    ("ipybox 0.9", "start to first result", "peers_start_first_ms",
     "peers_ipybox_start_first_ms", "peers_start_vs_ipybox"),
    ("ipybox 0.9", "idle PSS, 1 session", "peers_idle1_pss_mb",
     "peers_ipybox_idle1_pss_mb", "peers_idle1_vs_ipybox"),
    ("ipybox 0.9", "idle PSS, 16 sessions", "peers_idle16_pss_mb",
     "peers_ipybox_idle16_pss_mb", "peers_idle16_vs_ipybox"),
    ("fresh ipykernel per call (nbclient)", "per-call `print(1)`", "peers_per_call_ms",
     "peers_fresh_kernel_ms", "peers_per_call_vs_fresh_kernel"),
    ("`python3 -c`", "per-call `print(1)`", "peers_per_call_ms",
     "peers_python_c_ms", "peers_per_call_vs_python_c"),
)  # fmt: skip
