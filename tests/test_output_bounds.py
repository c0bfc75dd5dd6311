"""Output cannot exhaust the host: spill cap, per-message cap, and deadlines under a flood.

Issue 10, items 5 and 10. The flood and memory tests run real kernels; the memory test runs
the host itself in a subprocess so its peak RSS (VmHWM) is its own.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from lemon_exec import ExecuteCode, ExecuteCodeConfig, SessionScope
from lemon_exec.host.cell.output import OutputCapture, format_truncated_output

pytestmark = pytest.mark.timeout(120)

MiB = 2**20


# --- spill cap (pure logic) ---------------------------------------------------------------------


def test_spill_file_stops_at_max_spill_bytes(tmp_path: Path) -> None:
    capture = OutputCapture(100, tmp_path, max_spill_bytes=10_000)
    for _ in range(100):
        capture.write("y" * 999 + "\n")
    captured = capture.finish()
    assert captured.truncated and captured.spill_capped
    assert captured.total_bytes == 100_000  # counted, though not stored
    assert captured.spill_path is not None
    assert captured.spill_path.stat().st_size == captured.spill_bytes == 10_000
    shown = format_truncated_output(captured)
    assert "only the first 9.8 KiB of 97.7 KiB" in shown and "max_spill_bytes" in shown
    assert "Full output saved" not in shown


def test_spill_cap_never_splits_a_character(tmp_path: Path) -> None:
    capture = OutputCapture(10, tmp_path, max_spill_bytes=11)
    capture.write("é" * 20)  # 2 bytes each: 11 falls inside one
    captured = capture.finish()
    assert captured.spill_path is not None
    assert captured.spill_path.read_bytes().decode("utf-8") == "é" * 5


def test_output_under_the_spill_cap_is_saved_whole(tmp_path: Path) -> None:
    capture = OutputCapture(10, tmp_path, max_spill_bytes=1000)
    capture.write("z" * 500)
    captured = capture.finish()
    assert not captured.spill_capped
    assert captured.spill_path is not None and captured.spill_path.stat().st_size == 500
    assert "[Full output saved to:" in format_truncated_output(captured)


def test_notes_follow_the_kept_text(tmp_path: Path) -> None:
    capture = OutputCapture(1000, tmp_path)
    capture.write("before")
    capture.add_note("[a 1.0 GiB message from the kernel was dropped]")
    captured = capture.finish()
    assert captured.text == "before\n[a 1.0 GiB message from the kernel was dropped]"
    assert captured.notes == ("[a 1.0 GiB message from the kernel was dropped]",)


def test_max_spill_bytes_is_a_setting() -> None:
    assert ExecuteCodeConfig().max_spill_bytes == 64 * MiB
    env = {"LEMON_EXECUTE_CODE_MAX_SPILL_BYTES": "1048576"}
    assert ExecuteCodeConfig.load(environ=env).max_spill_bytes == MiB


# --- host memory against huge messages (subprocess host) ----------------------------------------

HOST = textwrap.dedent(
    """
    import json, re, sys
    from lemon_exec import ExecuteCode, ExecuteCodeConfig

    def peak_mib():
        status = open("/proc/self/status").read()
        return int(re.search(r"VmHWM:\\s+(\\d+)", status).group(1)) / 1024

    config = ExecuteCodeConfig(
        enabled=True, timeout_ms=60000, warm_kernels=0, python_path=sys.executable
    )
    with ExecuteCode(config) as ec:
        ec.run_sync("print('warm')")
        before = peak_mib()
        result = ec.run_sync(sys.argv[1])
        print(json.dumps({"before": before, "after": peak_mib(), "result": result.to_dict()}))
    """
)


def run_host(script: str) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", HOST, script], capture_output=True, text=True, timeout=110
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.kernel
def test_a_256_mib_display_does_not_balloon_the_host() -> None:
    # Before the per-message cap the host's peak RSS rose by ~1.28 GiB here.
    report = run_host(
        "from IPython.display import display\n"
        "display({'text/plain': 'x' * 256 * 2**20}, raw=True)\n"
    )
    grown = report["after"] - report["before"]
    assert grown < 100, f"host peak RSS grew by {grown:.0f} MiB"
    assert report["result"]["details"]["exit_code"] == 0


@pytest.mark.slow
@pytest.mark.kernel
def test_a_1_gib_print_keeps_the_host_small_and_the_spill_capped() -> None:
    report = run_host("import sys\nsys.stdout.write('x' * 2**30)\nprint('tail')")
    grown = report["after"] - report["before"]
    assert grown < 600, f"host peak RSS grew by {grown:.0f} MiB"
    result = report["result"]
    assert result["details"]["exit_code"] == 0
    assert result["content"].rstrip().splitlines()[-2].endswith("tail")
    assert "only the first 64.0 MiB of 1.0 GiB" in result["content"]


# --- deadlines under an output flood ------------------------------------------------------------

FLOODS = {
    "print": "while True:\n    print('x' * 1000)\n",
    # A child process writing to the kernel's file descriptors: the heaviest IOPub load.
    "child": "import subprocess\nsubprocess.run(['yes', 'x' * 1000])\n",
}


@pytest.fixture(scope="module")
def flood_tool() -> Iterator[ExecuteCode]:
    config = ExecuteCodeConfig(
        enabled=True, timeout_ms=60_000, warm_kernels=1, python_path=sys.executable
    )
    with ExecuteCode(config) as facade:
        yield facade


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["per_call", "session"])
@pytest.mark.parametrize("flood", sorted(FLOODS))
@pytest.mark.kernel
def test_a_flood_times_out_on_time(
    flood_tool: ExecuteCode, tmp_path: Path, mode: str, flood: str
) -> None:
    kwargs: dict = {"timeout_ms": 3000}
    if mode == "session":
        kwargs["scope"] = SessionScope(f"flood-{flood}", "agent", cwd=str(tmp_path))
        flood_tool.config.kernel_mode = "session"
    try:
        started = time.monotonic()
        result = flood_tool.run_sync(FLOODS[flood], **kwargs)
        took = time.monotonic() - started
    finally:
        flood_tool.config.kernel_mode = "per_call"
    assert result.content.startswith("Script timed out after 3000ms."), result.content[:200]
    assert took < 4.0, f"reported {took:.2f} s after the call (deadline 3 s)"
    assert "x" * 1000 in result.content  # partial output kept
    assert result.details["truncated"] is True
