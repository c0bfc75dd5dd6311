"""Smoke test of the benchmark (bench/run.py): it runs and reports well-formed JSON.

No timing is asserted here (timings live in the benchmark, never in a test), apart from the
file-polling bridge's floor: its round trip cannot beat its 20 ms poll, by construction.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "bench" / "run.py"

if str(REPO) not in sys.path:  # bench/ is a package beside tests/, not installed
    sys.path.insert(0, str(REPO))

from bench.peers import FileBridge, file_bridge_rtts  # noqa: E402
from bench.peers_figures import PEER_FIGURES, PEER_ROWS  # noqa: E402
from bench.peers_ipybox import VENV_ENV, PeerUnavailable, ensure_venv  # noqa: E402
from bench.plots import PLOT_FILES, write_plots  # noqa: E402
from bench.scaling_docs import BEGIN, END, replace_block, scaling_markdown, write_docs  # noqa: E402

#: The cheap subset: both groups' figures must be in the JSON (a group reports all its own).
EXPECTED = (
    "per_call_p50_ms",
    "python_subprocess_p50_ms",
    "per_call_ratio",
    "helper_rtt_p50_ms",
    "batch_100_ms",
    "text_mb_per_s",
    "file_bridge_rtt_ms",  # issue 17: the file-polling peer runs in the helpers group
    "helper_vs_file_bridge",
)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.kernel
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
    data = json.loads(out)  # stdout holds exactly one JSON object
    # Exit 1 on a missed target too (a loaded machine may miss one): never on nothing.
    missed = [name for name, t in data["targets"].items() if t["pass"] is False]
    assert data["targets"] and all(t["pass"] is not None for t in data["targets"].values())
    assert proc.returncode == (1 if missed else 0), f"bench exit {proc.returncode}:\n{err[-3000:]}"
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


# -- issue 17: the new figures, the peers' file bridge and the scaling run ------------------------

#: Issue 17's new figures and their targets, as ``--list`` prints them.
ISSUE17 = {
    "per_call_concurrent8_p95_ms": "target <= 30",
    "sessions64_idle_pss_mb": "target <= 640",
    "sessions128_idle_pss_mb": "target <= 768",  # issue 31
    "raw_fresh_kernel_per_call_ms": "",
    "per_call_vs_fresh_kernel": "",
    "file_bridge_rtt_ms": "",
    "helper_vs_file_bridge": "",
    "per_call_ratio": "target <= 0.5",
    "per_call_sustained_per_s": "target >= 40",
    "cold_start_p50_ms": "target <= 120",
    "helper_rtt_p50_ms": "target <= 0.5",
    "batch_100_ms": "target <= 25",
    "text_mb_per_s": "target >= 200",
}

#: Fake results of every sweep, shaped as bench/scaling.py returns them.
FAKE: dict[str, Any] = {
    "grid": "fake",
    "errors": {},
    "output_size": [
        {
            "bytes": b,
            "via": v,
            "p50_ms": 10.0 * i + 1,
            "max_ms": 11.0 * i + 1,
            "n": 3,
            "mib_per_s": 1.5,
        }
        for i, b in enumerate((1000, 10_000, 100_000_000))
        for v in ("print", "text")
    ],
    "helper_calls": [
        {"calls": c, "mode": m, "p50_ms": c * 0.5 + 3, "per_call_ms": 0.5, "n": 3}
        for c in (1, 10, 1000)
        for m in ("serial", "batched")
    ],
    "sessions_memory": [
        {
            "kernels": k,
            "pss_mb": 10.0 * k,
            "pss_per_kernel_mb": 10.0,
            "uss_mb": 9.0 * k,
            "rss_mb": 40.0 * k,
            "template_pss_mb": 20.0,
        }
        for k in (1, 2, 64)
    ],
    "agents_throughput": [
        {
            "agents": a,
            "runs_per_s": 8.0 * a,
            "p50_ms": 12.0,
            "p95_ms": 30.0,
            "n": 80 * a,
            "python_runs_per_s": 9.5 * a,
            "python_p50_ms": 11.0,
            "python_p95_ms": 41.5,
            "python_n": 95 * a,
        }
        for a in (1, 4, 16, 64)
    ],
    # The peers group's report: measured, a missed target, and a peer that was not there.
    "peers": {
        "figures": {
            "peers_session_rtt_ms": 4.5,
            "peers_ipybox_session_rtt_ms": 51.8,
            "peers_session_vs_ipybox": 0.087,
            "peers_mcp_call_ms": 4.0,
            "peers_ipybox_mcp_call_ms": 7.6,
            "peers_mcp_vs_ipybox": 0.526,
            "peers_per_call_ms": 6.8,
            "peers_python_c_ms": 18.3,
            "peers_per_call_vs_python_c": 0.372,
        },
        "stats": {
            "peers_session_vs_ipybox": {
                "p50": 0.09,
                "p90": 0.12,
                "min": 0.05,
                "max": 0.3,
                "n": 200,
            },
            "peers_ipybox_session_rtt_ms": {
                "p50": 51.8,
                "p90": 60.1,
                "min": 40,
                "max": 90,
                "n": 200,
            },
        },
        "extra": {"peers_ipybox": {"ipybox": "0.9.2"}, "peers_ipybox_output_lost": 7},
        "errors": {"peers_idle1_pss_mb": "PeerUnavailable: no venv here"},
    },
}


def test_peers_table_shows_ratios_spreads_targets_and_misses() -> None:
    block = scaling_markdown(FAKE)
    peers = block.split("### Peers", 1)[1]
    assert "| ipybox 0.9 | session round trip, `print(1)` | 4.5 ms | 51.8 ms (p90 60.1) |" in peers
    assert "| 0.087x (pass) | 0.12; 0.05..0.3 (n=200) | <= 0.1x |" in peers
    assert "| 0.526x (miss) |" in peers  # the MCP call's target is 0.5
    assert "| idle PSS, 1 session | not measured | not measured | not measured |" in peers
    assert "Not measured: PeerUnavailable: no venv here" in peers
    assert "lost the output of 7 of 200 session round trips" in peers
    assert peers.count("\n| ") == 2 + len(PEER_ROWS)  # header, separator, one row each
    assert "| 64 | 512.0 | 608.0 | 12.0 | 30.0 | 41.5 |" in block  # callers beside python3 -c
    failed = {**FAKE, "errors": {"peers": "boom"}}
    del failed["peers"]
    assert "### Peers\n\nNot measured: boom" in scaling_markdown(failed)


def test_ipybox_venv_named_but_missing_is_an_error_not_an_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    missing = tmp_path / "no-such-venv"
    monkeypatch.setenv(VENV_ENV, str(missing))
    with pytest.raises(PeerUnavailable, match="ipybox is not installed") as raised:
        ensure_venv()
    assert str(missing) in str(raised.value) and "pip install 'ipybox>=0.9,<0.10'" in str(
        raised.value
    )
    assert not missing.exists()  # a venv named by the variable is never created


@pytest.mark.slow
@pytest.mark.timeout(150)
@pytest.mark.kernel
def test_peers_group_reports_a_missing_ipybox(tmp_path: Path, leak_watch: Any) -> None:
    """The cheap peers (python3 -c, a fresh ipykernel) are measured; ipybox, pointed at a venv
    that does not exist, is reported figure by figure with the reason, and the run fails."""
    env = {**os.environ, VENV_ENV: str(tmp_path / "missing-venv")}
    proc = subprocess.Popen(
        [sys.executable, str(BENCH), "--quick", "--json", "--only", "peers"],
        cwd=REPO,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    leak_watch.add_pid(proc.pid)
    try:
        out, err = proc.communicate(timeout=140)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 1, (
        f"expected a failed measurement ({proc.returncode}):\n{err[-3000:]}"
    )
    data = json.loads(out)
    assert data["run"]["groups"] == ["peers"]
    measured = ("peers_per_call_ms", "peers_python_c_ms", "peers_per_call_vs_python_c",
                "peers_fresh_kernel_ms", "peers_per_call_vs_fresh_kernel")  # fmt: skip
    for name in measured:
        assert _is_number(data[name]), f"{name}: {data[name]!r} ({data['errors'].get(name)})"
    ratio = data["stats"]["peers_per_call_vs_python_c"]
    assert ratio["n"] == 6 and ratio["min"] <= ratio["p50"] <= ratio["max"]
    ipybox = [n for n in PEER_FIGURES if n not in measured]
    assert len(ipybox) == 15
    for name in ipybox:
        assert data[name] is None
        assert "ipybox is not installed" in data["errors"][name], data["errors"][name]
    assert set(data["errors"]) == set(ipybox)
    assert data["targets"]["peers_session_vs_ipybox"] == {"op": "<=", "value": 0.1, "pass": None}
    assert data["targets"]["peers_mcp_vs_ipybox"]["value"] == 0.5


def test_a_missed_target_or_a_failed_measurement_exits_1() -> None:
    from bench.run import exit_status

    met = {"pass": True, "op": "<=", "value": 1.0}
    missed = {"pass": False, "op": "<=", "value": 1.0}
    assert exit_status({"targets": {"a": met}, "errors": {}}) == 0
    assert exit_status({"targets": {"a": met, "b": missed}, "errors": {}}) == 1
    assert exit_status({"targets": {"a": met}, "errors": {"c": "boom"}}) == 1
    assert exit_status({"errors": {}}) == 0  # a --scaling run has no targets


def test_the_gateway_group_finds_the_suites_gateway_outside_pytest() -> None:
    # The benchmark runs outside pytest, without tests/ on sys.path.
    code = "from bench.gateway import suite_gateway; print(suite_gateway().__name__)"
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "running_gateway"


def test_list_names_issue17_figures_and_targets() -> None:
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--list"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    lines = {line.split()[0]: line for line in proc.stdout.splitlines() if line.strip()}
    for name, target in ISSUE17.items():
        assert name in lines, f"{name} missing from --list:\n{proc.stdout}"
        if target:
            assert lines[name].rstrip().endswith(target), lines[name]
    assert "output_size" in proc.stdout and "agents_throughput" in proc.stdout


def test_scaling_tables_replace_only_their_block(tmp_path: Path) -> None:
    block = scaling_markdown(FAKE)
    assert "| 100 MB | text | 21.0 |" in block  # sizes in the issue's units
    assert "| 1,000 | batched | 503.0 |" in block
    assert "![" not in block  # no images unless given
    page = tmp_path / "page.md"
    page.write_text("# Title\n\nintro\n")
    write_docs(page, FAKE)
    first = page.read_text()
    assert first.startswith("# Title\n\nintro\n") and first.count(BEGIN) == 1
    page.write_text(first + "\n## After\n\nkept\n")
    changed = {**FAKE, "sessions_memory": [{**FAKE["sessions_memory"][0], "pss_mb": 777.5}]}
    write_docs(page, changed)
    second = page.read_text()
    assert second.count(BEGIN) == 1 and second.count(END) == 1  # replaced, not appended
    assert "777.5" in second and "| 64 |" not in second.split("Memory against")[1][:400]
    assert second.startswith("# Title\n\nintro\n") and second.endswith("## After\n\nkept\n")
    assert replace_block(second, "x").count(BEGIN) == 1


def test_plots_are_pngs_and_linked_only_beside_the_page(tmp_path: Path) -> None:
    beside = tmp_path / "docs" / "benchmarks"
    plots = write_plots(FAKE, beside)
    assert set(plots) == set(PLOT_FILES)
    for path in plots.values():
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 5000
    page = tmp_path / "docs" / "benchmarks.md"
    write_docs(page, FAKE, plots)
    text = page.read_text()
    for name in PLOT_FILES.values():
        assert f"](benchmarks/{name})" in text
    # The same plots in another folder (copied: rendering them again costs seconds).
    (tmp_path / "elsewhere").mkdir()
    elsewhere = {k: Path(shutil.copy(v, tmp_path / "elsewhere")) for k, v in plots.items()}
    write_docs(page, FAKE, elsewhere)
    assert "![" not in page.read_text()  # Sphinx could not resolve them from the page


def test_file_bridge_answers_refuses_bad_token_and_replays(tmp_path: Path) -> None:
    rpc = tmp_path / "rpc"
    rpc.mkdir(mode=0o700)
    data = tmp_path / "data.txt"
    data.write_text("payload")
    bridge = FileBridge(rpc, token="right")
    requests = [
        (1, {"id": 1, "token": "right", "tool": "read", "params": {"path": str(data)}}),
        (2, {"id": 2, "token": "wrong", "tool": "read", "params": {"path": str(data)}}),
        (3, {"id": 3, "token": "right", "tool": "nope", "params": {}}),
    ]
    for req_id, body in requests:
        (rpc / f"req-{req_id}.json").write_text(json.dumps(body))
    bridge.sweep()
    replies = {i: json.loads((rpc / f"res-{i}.json").read_text()) for i in (1, 2, 3)}
    assert replies[1] == {"id": 1, "ok": True, "content": "payload"}
    assert replies[2]["ok"] is False and "token" in replies[2]["error"]
    assert replies[3]["ok"] is False and "unknown tool" in replies[3]["error"]
    (rpc / "req-1.json").write_text(json.dumps(requests[0][1]))  # the same id again
    bridge.sweep()
    assert json.loads((rpc / "res-1.json").read_text())["error"] == "replayed id"
    assert sorted(p.name for p in rpc.iterdir()) == ["res-1.json", "res-2.json", "res-3.json"]
    assert bridge.calls == 2  # claimed and dispatched: 1 and 3; 2 and the replay were refused


def test_file_bridge_round_trip_pays_its_polling(tmp_path: Path) -> None:
    import asyncio

    data = tmp_path / "tiny.txt"
    data.write_text("x" * 25)
    samples, counts = asyncio.run(
        file_bridge_rtts(sys.executable, tmp_path, data, calls=10, warmup=2)
    )
    assert len(samples) == 10 and counts == {**counts, "calls": 12, "errors": 0}
    # A response waits for the next 25 ms sweep, then for the script's next 20 ms poll: a
    # round trip cannot beat the poll (only a sweep landing between the script's write and
    # its first look could), which is what the peer figure is about.
    assert sorted(samples)[len(samples) // 2] >= 19.0, samples


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.kernel
def test_scaling_smoke_writes_tables_and_plots(tmp_path: Path, leak_watch: Any) -> None:
    page = tmp_path / "benchmarks.md"
    page.write_text("# Benchmarks\n")
    proc = subprocess.Popen(
        [
            sys.executable,
            str(BENCH),
            "--scaling",
            "--scaling-grid",
            "smoke",
            "--json",
            "--plot",
            str(tmp_path / "benchmarks"),
            "--docs",
            str(page),
        ],
        cwd=REPO,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    leak_watch.add_pid(proc.pid)
    try:
        out, err = proc.communicate(timeout=110)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, f"scaling smoke failed ({proc.returncode}):\n{err[-3000:]}"
    data = json.loads(out)
    assert data["errors"] == {}
    assert [r["bytes"] for r in data["output_size"]] == [1000, 1000, 10_000, 10_000]
    assert {r["mode"] for r in data["helper_calls"]} == {"serial", "batched"}
    assert [r["kernels"] for r in data["sessions_memory"]] == [1, 2]
    assert all(_is_number(r["pss_mb"]) and r["pss_mb"] > 0 for r in data["sessions_memory"])
    assert [r["agents"] for r in data["agents_throughput"]] == [1, 2]
    assert all(r["n"] > 0 and r["python_n"] > 0 for r in data["agents_throughput"])
    assert all(_is_number(r["python_p95_ms"]) for r in data["agents_throughput"])
    assert "peers" not in data  # the smoke grid leaves the peers out (the test above has them)
    text = page.read_text()
    assert text.count(BEGIN) == 1 and "Throughput against concurrent agents" in text
    for name in PLOT_FILES.values():
        assert (tmp_path / "benchmarks" / name).read_bytes()[:4] == b"\x89PNG"
        assert f"](benchmarks/{name})" in text
