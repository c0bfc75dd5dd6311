"""The peers lemon_exec is measured against side by side (issue 17).

- ``fresh_kernel_call``: a fresh plain ipykernel per call, the way AutoGen's
  ``JupyterCodeExecutor`` (and ipybox-style executors) use one: an nbclient ``NotebookClient``
  on a new notebook, ``async_setup_kernel()`` (start the kernel, start a client,
  ``wait_for_ready``), ``async_execute_cell`` of the code, and leaving the context, which
  shuts the kernel down (nbclient's default graceful shutdown) and cleans up its files.
- ``python_c``: ``python3 -c "print(1)"`` as a subprocess, output captured.
- ``FileBridge``: the seed's file-polling helper bridge, minimal but faithful: the script
  writes ``req-<id>.json`` (id, token, tool, params) atomically into an owner-only rpc
  directory and polls for ``res-<id>.json`` every 20 ms; the host's pump sweeps the directory
  every 25 ms, checks the token in constant time and the id against replays, renames the
  request to its ``req-<id>.claim`` marker, runs the tool, writes the response atomically
  (0600, temporary name then rename) and removes the marker. The script is a real
  ``python3`` subprocess; the pump runs on the bench's event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import os
import re
import secrets
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import plain_kernel_manager

#: The seed's intervals: the script's poll for a response, the host pump's sweep.
SCRIPT_POLL_S = 0.020
PUMP_SWEEP_S = 0.025


async def fresh_kernel_call(interpreter: str, cwd: str, code: str = "print(1)\n") -> str:
    """Run ``code`` in a fresh plain ipykernel through nbclient; return its stdout.

    The kernel is started, made ready, used once and shut down, all inside this call.
    """
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.v4.new_notebook()
    client = NotebookClient(
        nb,
        km=plain_kernel_manager(interpreter, kernel_name="python3"),
        timeout=60,
        allow_errors=True,
        resources={"metadata": {"path": cwd}},
    )
    async with client.async_setup_kernel(stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL):
        cell = nbformat.v4.new_code_cell(code)
        nb.cells.append(cell)
        out = await client.async_execute_cell(cell, cell_index=0)
    return "".join(
        o.get("text", "") for o in out.get("outputs", []) if o["output_type"] == "stream"
    )


#: The script side of the file bridge: ``read()`` through req/res files, timed in the script.
FILE_BRIDGE_SCRIPT = """\
import json, os, sys, time

RPC, TOKEN, PATH = sys.argv[1], os.environ["BENCH_BRIDGE_TOKEN"], sys.argv[2]
WARMUP, CALLS, POLL = int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
seq = 0


def call(tool, params):
    global seq
    seq += 1
    req = {"id": seq, "token": TOKEN, "tool": tool, "params": params}
    tmp = os.path.join(RPC, f".req-{seq}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump(req, fh)
    os.replace(tmp, os.path.join(RPC, f"req-{seq}.json"))
    res = os.path.join(RPC, f"res-{seq}.json")
    while True:
        try:
            fh = open(res)
        except FileNotFoundError:
            time.sleep(POLL)
            continue
        with fh:
            reply = json.load(fh)
        os.unlink(res)
        break
    if not reply["ok"]:
        raise RuntimeError(reply["error"])
    return reply["content"]


def read(path):
    return call("read", {"path": path})


for _ in range(WARMUP):
    read(PATH)
samples = []
for _ in range(CALLS):
    t0 = time.perf_counter()
    read(PATH)
    samples.append((time.perf_counter() - t0) * 1000)
print(json.dumps(samples))
"""

_REQUEST = re.compile(r"req-(\d+)\.json")


class FileBridge:
    """The host side: an owner-only rpc directory and a pump sweeping it every 25 ms."""

    def __init__(self, rpc_dir: Path, token: str, sweep_s: float = PUMP_SWEEP_S) -> None:
        self.rpc_dir = rpc_dir
        self.token = token
        self.sweep_s = sweep_s
        self.seen: set[int] = set()
        self.calls = 0
        self.errors = 0

    def sweep(self) -> None:
        """One sweep: answer every request in the directory, in id order."""
        names = [
            (int(m.group(1)), n) for n in os.listdir(self.rpc_dir) if (m := _REQUEST.fullmatch(n))
        ]
        for req_id, name in sorted(names):
            path = self.rpc_dir / name
            try:
                with open(path, "rb") as fh:
                    req = json.loads(fh.read())
            except (OSError, ValueError):
                continue  # not fully there yet (the script renames, so this is rare)
            if not hmac.compare_digest(str(req.get("token", "")), self.token):
                self._respond(req_id, {"id": req_id, "ok": False, "error": "bad token"})
                path.unlink(missing_ok=True)
                continue
            if req_id in self.seen or req.get("id") != req_id:
                self._respond(req_id, {"id": req_id, "ok": False, "error": "replayed id"})
                path.unlink(missing_ok=True)
                continue
            self.seen.add(req_id)
            claim = self.rpc_dir / f"req-{req_id}.claim"
            os.replace(path, claim)  # the claim marker: this id is being answered
            self.calls += 1
            self._respond(req_id, self._dispatch(req_id, req))
            claim.unlink(missing_ok=True)

    def _dispatch(self, req_id: int, req: dict[str, Any]) -> dict[str, Any]:
        if req.get("tool") != "read":
            self.errors += 1
            return {"id": req_id, "ok": False, "error": f"unknown tool {req.get('tool')!r}"}
        try:
            content = Path(req["params"]["path"]).read_text()
        except (OSError, KeyError, TypeError) as exc:
            self.errors += 1
            return {"id": req_id, "ok": False, "error": str(exc)}
        return {"id": req_id, "ok": True, "content": content}

    def _respond(self, req_id: int, reply: dict[str, Any]) -> None:
        tmp = self.rpc_dir / f".res-{req_id}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump(reply, fh)
        os.replace(tmp, self.rpc_dir / f"res-{req_id}.json")

    async def pump(self, stop: asyncio.Event) -> None:
        """Sweep, then wait 25 ms (a timer re-armed after each sweep), until ``stop``."""
        while not stop.is_set():
            self.sweep()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), self.sweep_s)


async def file_bridge_rtts(
    interpreter: str, workdir: Path, path: Path, calls: int, warmup: int = 20
) -> tuple[list[float], dict[str, int]]:
    """Milliseconds per ``read(path)`` through the file bridge, timed inside a script."""
    rpc_dir = Path(tempfile.mkdtemp(prefix="rpc-", dir=workdir))  # mkdtemp: 0700
    token = secrets.token_urlsafe(32)
    bridge = FileBridge(rpc_dir, token)
    stop = asyncio.Event()
    pump = asyncio.create_task(bridge.pump(stop))
    proc = await asyncio.create_subprocess_exec(
        interpreter,
        "-c",
        FILE_BRIDGE_SCRIPT,
        str(rpc_dir),
        str(path),
        str(warmup),
        str(calls),
        str(SCRIPT_POLL_S),
        cwd=str(workdir),
        env={**os.environ, "BENCH_BRIDGE_TOKEN": token},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    t0 = time.monotonic()
    try:
        out, err = await proc.communicate()
    finally:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
        stop.set()
        await pump
    if proc.returncode != 0:
        raise RuntimeError(f"file bridge script failed ({proc.returncode}): {err[-500:]!r}")
    samples: list[float] = json.loads(out)
    return samples, {
        "calls": bridge.calls,
        "errors": bridge.errors,
        "seconds": round(time.monotonic() - t0, 2),
    }


async def python_c(interpreter: str, cwd: str, code: str = "print(1)") -> float:
    """Milliseconds of ``interpreter -c code`` with captured output (which must be ``1``)."""
    t0 = time.perf_counter()
    proc = await asyncio.create_subprocess_exec(
        interpreter,
        "-c",
        code,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        out, err = await proc.communicate()
    finally:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
    elapsed = (time.perf_counter() - t0) * 1000
    if proc.returncode != 0 or out.strip() != b"1":
        raise RuntimeError(f"{interpreter} -c failed ({proc.returncode}): {err[-500:]!r}")
    return elapsed


async def pool_settled(ec: Any, spares: int, timeout: float) -> bool:
    """Wait until ``ec``'s pool holds at least ``spares`` spares and every live kernel is a
    spare (none starting, running or stopping). Unlike ``common.wait_quiet`` it accepts more
    spares than asked for: after a burst the pool keeps extra ones for a while."""
    deadline = time.monotonic() + timeout
    while True:
        snap = ec.snapshot()
        if snap["spares"] >= spares and snap["kernels_total"] == snap["spares"]:
            return True
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.01)
