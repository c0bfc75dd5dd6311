"""Byte counts as people read them, for notes in a script's output (ground floor: stdlib only)."""

from __future__ import annotations


def format_size(n: int) -> str:
    """``n`` bytes for people: "512 bytes", "64.0 KiB", "1.0 GiB"."""
    if n < 1024:
        return f"{n} bytes"
    value = float(n)
    for unit in ("KiB", "MiB", "GiB"):
        value /= 1024
        if value < 1024 or unit == "GiB":
            break
    return f"{value:.1f} {unit}"
