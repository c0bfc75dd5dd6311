"""The ipybox side of the peers group: run by the ipybox venv's Python, never by ours.

ipybox 0.9 pins dependencies of its own (mcpygen needs ``mcp<2``; lemon_exec needs
``mcp>=2``), so it lives in a venv of its own and this process drives it for the bench
(bench/peers_ipybox.py): one JSON object per line on stdin, one answer per line on stdout as
each completes (requests run concurrently), ``{"id": N, "ok": true, ...}`` or
``{"id": N, "ok": false, "error": "..."}``. Everything else ipybox prints goes to stderr.
Standard library and ipybox only: it imports nothing of the bench or of lemon_exec.

Requests (``op``):

- ``hello``: versions and this process's PID;
- ``generate``: ``generate_mcp_sources(server, params, root)``, ipybox's typed Python API
  for the tools of an MCP server (a package ``root/server``);
- ``start``: a ``CodeExecutor`` under ``name`` (its tool server, kernel gateway and kernel),
  tool calls without approval, waiting longer for its gateway (``CONNECT_RETRIES``);
  ``first`` also runs that code at once; returns the milliseconds of the start (and of the
  first result);
- ``execute``: ``CodeExecutor.execute(code)`` on ``name``; milliseconds and output text;
- ``stop``: stop the executor ``name`` (its kernel, gateway and MCP servers);
- ``exit``: stop every executor and exit.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
import traceback
from importlib.metadata import version
from pathlib import Path
from typing import Any

#: ipybox polls for its kernel gateway 10 times, 1 s apart (``KernelClient.connect``'s default,
#: not settable through ``CodeExecutor``); a gateway takes 5-8 s to come up on 2 loaded cores,
#: more when several start at once, so this many tries are allowed instead. Only a start that
#: would have failed changes: the 1 s polling, and so every start's timing, stay ipybox's.
CONNECT_RETRIES = 120


def _patient_connect() -> None:
    from ipybox.kernel_mgr.client import KernelClient

    connect = KernelClient.connect

    async def patient(
        self: Any, retries: int = CONNECT_RETRIES, retry_interval: float = 1.0, **kw: Any
    ) -> None:
        await connect(self, retries, retry_interval, **kw)

    KernelClient.connect = patient  # type: ignore[method-assign]


class Driver:
    def __init__(self) -> None:
        self.executors: dict[str, Any] = {}
        _patient_connect()

    async def hello(self, req: dict[str, Any]) -> dict[str, Any]:
        return {
            "pid": os.getpid(),
            "python": sys.version.split()[0],
            "ipybox": version("ipybox"),
            "mcp": version("mcp"),
            "jupyter_kernel_gateway": version("jupyter-kernel-gateway"),
        }

    async def generate(self, req: dict[str, Any]) -> dict[str, Any]:
        from ipybox import generate_mcp_sources

        tools = await generate_mcp_sources(req["server"], req["params"], Path(req["root"]))
        return {"tools": tools}

    async def start(self, req: dict[str, Any]) -> dict[str, Any]:
        from ipybox import CodeExecutor

        name = req["name"]
        if name in self.executors:
            raise ValueError(f"executor {name!r} is running")
        executor = CodeExecutor(
            working_dir=Path(req["working_dir"]),
            images_dir=Path(req["working_dir"]) / "images",
            approve_tool_calls=False,
            kernel_init_timeout=float(req.get("kernel_init_timeout", 60)),
        )
        t0 = time.perf_counter()
        await executor.start()
        started = time.perf_counter()
        self.executors[name] = executor
        out: dict[str, Any] = {"start_ms": (started - t0) * 1000}
        if req.get("first"):
            result = await executor.execute(req["first"])
            out["first_ms"] = (time.perf_counter() - t0) * 1000
            out["text"] = result.text
        return out

    async def execute(self, req: dict[str, Any]) -> dict[str, Any]:
        executor = self.executors[req["name"]]
        t0 = time.perf_counter()
        result = await executor.execute(req["code"], timeout=req.get("timeout"))
        return {"ms": (time.perf_counter() - t0) * 1000, "text": result.text}

    async def stop(self, req: dict[str, Any]) -> dict[str, Any]:
        executor = self.executors.pop(req["name"], None)
        if executor is not None:
            await executor.stop()
        return {}

    async def close(self) -> None:
        for name in list(self.executors):
            try:
                await self.stop({"name": name})
            except Exception:  # best effort on the way out: the others still get stopped
                traceback.print_exc()


async def serve(out: Any) -> None:
    """Answer each request as it completes (requests run concurrently; ``id`` pairs them)."""
    driver = Driver()
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=1 << 24)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    pending: set[asyncio.Task[None]] = set()

    async def answer(req: dict[str, Any]) -> None:
        reply: dict[str, Any] = {"id": req.get("id")}
        handler = getattr(driver, str(req.get("op")), None)
        if handler is None or req["op"] == "close":
            reply.update(ok=False, error=f"unknown op {req.get('op')!r}")
        else:
            try:
                reply.update(await handler(req), ok=True)
            except Exception as exc:
                traceback.print_exc()
                reply.update(ok=False, error=f"{type(exc).__name__}: {exc}"[:2000])
        out.write(json.dumps(reply) + "\n")
        out.flush()

    try:
        while line := await reader.readline():
            req = json.loads(line)
            if req.get("op") == "exit":
                break
            task = asyncio.create_task(answer(req))
            pending.add(task)
            task.add_done_callback(pending.discard)
    finally:
        for task in list(pending):
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        await driver.close()


def main() -> None:
    # The protocol owns the real stdout; anything ipybox or its libraries print goes to stderr.
    out = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    sys.stdout = sys.stderr
    asyncio.run(serve(out))


if __name__ == "__main__":
    main()
