"""Smoke test of the benchmark (bench/run.py): it runs and reports well-formed JSON.

No timing is asserted here: timings live in the benchmark, never in a test.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "bench" / "run.py"

#: The cheap subset: both groups' figures must be in the JSON (a group reports all its own).
EXPECTED = (
    "per_call_p50_ms",
    "python_subprocess_p50_ms",
    "per_call_ratio",
    "helper_rtt_p50_ms",
    "batch_100_ms",
    "text_mb_per_s",
)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_quick_json_subset(leak_watch: Any) -> None:
    proc = subprocess.Popen(
        [
            sys.executable,
            str(BENCH),
            "--quick",
            "--json",
            "--only",
            "helper_rtt_p50_ms,per_call_p50_ms",
        ],
        cwd=REPO,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    leak_watch.add_pid(proc.pid)  # its staging roots must be gone at the end of the session
    try:
        out, err = proc.communicate(timeout=170)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, f"bench failed ({proc.returncode}):\n{err[-3000:]}"
    data = json.loads(out)  # stdout holds exactly one JSON object
    for name in EXPECTED:
        assert _is_number(data.get(name)), f"{name} is not a number: {data.get(name)!r}"
    assert "cold_start_p50_ms" not in data  # --only ran just the selected groups
    assert data["errors"] == {}
    machine = data["machine"]
    for key in ("cores", "python", "platform", "jupyter_client", "ipykernel", "lemon_exec"):
        assert machine.get(key), f"machine.{key} missing"
    assert isinstance(machine["cores"], int)
    targets = data["targets"]
    assert targets["per_call_ratio"]["op"] == "<="
    assert _is_number(targets["helper_rtt_p50_ms"]["value"])
    assert data["stats"]["per_call_p50_ms"]["n"] > 0
    assert "per_call_p50_ms" in err  # the readable table went to stderr
