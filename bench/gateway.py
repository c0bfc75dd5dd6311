"""The gateway figures (issue 16): lemon_exec's kernels behind a real Enterprise Gateway on
loopback, against a plain execute over the same kind of websocket.

- ``gateway_per_call_p50_ms``: a per-call run (warm remote spare) end to end;
- ``gateway_session_rtt_p50_ms``: a trivial session cell end to end;
- ``raw_gateway_rtt_p50_ms``: the same cell as a plain ``execute_request`` over a websocket
  to a gateway kernel, waiting for the reply and ``idle``, with the socket set up as
  lemon_exec sets up its own (TCP_NODELAY, quick ACKs: Jupyter Server leaves Nagle's
  algorithm on, and a client without quick ACKs waits out the 40 ms delayed ACK on every
  cell); the untuned client's figure is reported beside it
  (``raw_gateway_untuned_rtt_p50_ms``);
- ``gateway_session_ratio``: the two, alternated in one run (target ≤ 1.3);
- ``gateway_helper_rtt_p50_ms``: one ``read()`` helper round trip, timed in the script
  (frame out on IOPub through the gateway, reply in on control through it).

The gateway is the test suite's (tests/gateway/eg.py: its own venv, a random token, the
lemon-python kernelspec), started for this group and stopped after it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import statistics
import sys
import uuid
from pathlib import Path
from typing import Any

from bench.common import (
    RESULT_MARKER,
    TRIVIAL_CELL,
    TRIVIAL_SCRIPT,
    Report,
    alternate,
    lemon_config,
    script_json,
    timed_ms,
    timed_run,
    wait_quiet,
)
from lemon_exec import ExecuteCode, SessionScope

HELPER_SCRIPT = """\
import json, time
for _ in range(10):
    read({path!r})
samples = []
for _ in range({calls}):
    t0 = time.perf_counter()
    read({path!r})
    samples.append((time.perf_counter() - t0) * 1000)
text({marker!r} + json.dumps(samples))
"""


_QUICKACK: int | None = getattr(socket, "TCP_QUICKACK", None)


class RawGatewayKernel:
    """A gateway kernel driven over its websocket with nothing but the Jupyter protocol."""

    def __init__(self, base: str, token: str, kernel_id: str, ws: Any, tuned: bool) -> None:
        self._base, self._token, self.kernel_id, self._ws = base, token, kernel_id, ws
        sock = getattr(getattr(ws.protocol, "stream", None), "socket", None)
        self._sock: socket.socket | None = sock if tuned else None
        if self._sock is not None:
            self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    @classmethod
    async def start(cls, base: str, token: str, *, tuned: bool) -> RawGatewayKernel:
        from tornado.httpclient import AsyncHTTPClient, HTTPRequest
        from tornado.websocket import websocket_connect

        headers = {"Authorization": f"token {token}"}
        response = await AsyncHTTPClient().fetch(
            f"{base}/api/kernels",
            method="POST",
            headers=headers,
            body=json.dumps({"name": "lemon-python"}),
            request_timeout=60,
        )
        kernel_id = json.loads(response.body)["id"]
        ws_url = base.replace("http", "ws", 1) + f"/api/kernels/{kernel_id}/channels"
        ws = await websocket_connect(HTTPRequest(ws_url, headers=headers))
        kernel = cls(base, token, kernel_id, ws, tuned)
        await kernel._request("kernel_info_request", {}, wait_idle=False)
        return kernel

    async def execute(self, code: str) -> None:
        await self._request(
            "execute_request",
            {"code": code, "silent": False, "store_history": False, "allow_stdin": False},
            wait_idle=True,
        )

    async def _request(self, msg_type: str, content: dict[str, Any], *, wait_idle: bool) -> None:
        msg_id = uuid.uuid4().hex
        header = {
            "msg_id": msg_id,
            "msg_type": msg_type,
            "session": "bench",
            "username": "bench",
            "version": "5.3",
            "date": "",
        }
        message = {
            "header": header,
            "parent_header": {},
            "metadata": {},
            "content": content,
            "channel": "shell",
            "buffers": [],
        }
        await self._ws.write_message(json.dumps(message))
        replied, idle = False, not wait_idle
        while not (replied and idle):
            raw = await asyncio.wait_for(self._ws.read_message(), 60)
            if self._sock is not None and _QUICKACK is not None:  # Linux: not sticky
                self._sock.setsockopt(socket.IPPROTO_TCP, _QUICKACK, 1)
            if raw is None:
                raise RuntimeError("the gateway closed the websocket")
            msg = json.loads(raw)
            if msg.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            if msg["channel"] == "shell":
                replied = True
            elif msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                idle = True

    async def aclose(self) -> None:
        from tornado.httpclient import AsyncHTTPClient

        self._ws.close()
        with contextlib.suppress(Exception):
            await AsyncHTTPClient().fetch(
                f"{self._base}/api/kernels/{self.kernel_id}",
                method="DELETE",
                headers={"Authorization": f"token {self._token}"},
                request_timeout=30,
            )


def suite_gateway() -> Any:
    """The test suite's ``running_gateway``: one way to start a gateway.

    Its helpers import their siblings top-level (``support_venv``), as pytest puts tests/
    on sys.path: so does this, for a benchmark run outside pytest.
    """
    tests_dir = str(Path(__file__).resolve().parents[1] / "tests")
    if tests_dir not in sys.path:
        sys.path.append(tests_dir)
    from tests.gateway.eg import running_gateway

    return running_gateway


async def bench_gateway(
    report: Report, workdir: Path, *, pairs: int, per_call_runs: int, helper_calls: int
) -> None:
    running_gateway = suite_gateway()

    eg_dir = workdir / "gateway"
    eg_dir.mkdir()
    try:
        gateway_cm = running_gateway(eg_dir)
        gateway = gateway_cm.__enter__()
    except BaseException as exc:  # pytest.fail raises an OutcomeException (BaseException)
        raise RuntimeError(f"Enterprise Gateway did not start: {exc}") from None
    try:
        await _measure(gateway.url, gateway.token, report, workdir, pairs, per_call_runs,
                       helper_calls)  # fmt: skip
    finally:
        gateway_cm.__exit__(None, None, None)


async def _measure(
    url: str,
    token: str,
    report: Report,
    workdir: Path,
    pairs: int,
    per_call_runs: int,
    helper_calls: int,
) -> None:
    remote = {"gateway_url": url, "gateway_auth_token": token}
    scope = SessionScope("bench-gateway", "bench", str(workdir))
    tiny = workdir / "gateway-tiny.txt"
    tiny.write_text("hello from the benchmark\n")

    # Session cells against plain executes over the gateway's websocket, alternated.
    untuned_ms: list[float] = []
    session = lemon_config(kernel_mode="session", warm_kernels=0, max_rpc_calls=1_000_000, **remote)
    async with ExecuteCode(session) as ec:
        raw = await RawGatewayKernel.start(url, token, tuned=True)
        untuned = await RawGatewayKernel.start(url, token, tuned=False)
        try:
            for _ in range(10):  # warm-up
                await timed_run(ec, TRIVIAL_CELL, scope)
                await raw.execute(TRIVIAL_CELL)
                await untuned.execute(TRIVIAL_CELL)

            async def lemon() -> float:
                return (await timed_run(ec, TRIVIAL_CELL, scope))[0]

            async def sample_untuned(i: int) -> None:
                if i % 5 == 0:  # context only: a fifth of the samples
                    untuned_ms.append(await timed_ms(untuned.execute(TRIVIAL_CELL)))

            lemon_ms, raw_ms = await alternate(
                pairs, lemon, lambda: timed_ms(raw.execute(TRIVIAL_CELL)), after=sample_untuned
            )
        finally:
            await raw.aclose()
            await untuned.aclose()
        _, result = await timed_run(
            ec, HELPER_SCRIPT.format(path=str(tiny), calls=helper_calls, marker=RESULT_MARKER),
            scope,
        )  # fmt: skip
        helper_ms: list[float] = script_json(result)
    report.figure("gateway_session_rtt_p50_ms", statistics.median(lemon_ms), lemon_ms)
    report.figure("raw_gateway_rtt_p50_ms", statistics.median(raw_ms), raw_ms)
    report.figure("gateway_session_ratio", statistics.median(lemon_ms) / statistics.median(raw_ms))
    report.context("raw_gateway_untuned_rtt_p50_ms", statistics.median(untuned_ms))
    report.figure("gateway_helper_rtt_p50_ms", statistics.median(helper_ms), helper_ms)

    # Per-call runs on warm remote spares, one a second apart (an agent's cadence).
    per_call_ms: list[float] = []
    sources: dict[str, int] = {}
    async with ExecuteCode(lemon_config(kernel_mode="per_call", warm_kernels=1, **remote)) as ec:
        await timed_run(ec, TRIVIAL_SCRIPT, scope)
        for _ in range(per_call_runs):
            await wait_quiet(ec, 1, 15)
            elapsed, result = await timed_run(ec, TRIVIAL_SCRIPT, scope)
            per_call_ms.append(elapsed)
            source = str(result.details.get("kernel_source"))
            sources[source] = sources.get(source, 0) + 1
    report.figure("gateway_per_call_p50_ms", statistics.median(per_call_ms), per_call_ms)
    report.context("gateway_per_call_kernel_sources", sources)
