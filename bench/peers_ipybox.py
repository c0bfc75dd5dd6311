"""ipybox 0.9 as a peer (issue 31): its venv and the child process that drives it.

ipybox (gradion-ai/ipybox) runs code in a stateful IPython kernel behind an embedded Jupyter
Kernel Gateway (a subprocess, no container) and calls MCP tools from code through Python
functions it generates (mcpygen) and an embedded tool server (in the calling process). Its
dependencies conflict with ours (mcpygen 0.1 needs ``mcp<2``), so it lives in a venv of its
own, ``LEMON_BENCH_IPYBOX_VENV`` (default ``<repo>/.bench-ipybox-venv``), driven through
bench/peers_ipybox_child.py over JSON lines: nothing of it enters the bench's process.

The default venv is created on first use (under a file lock; a few minutes). A venv named
by the environment variable is used as it is: one without ipybox is an error (so the
smoke test can point at a missing one), never a silent skip.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from bench.memory import descendants

REPO = Path(__file__).resolve().parents[1]
VENV_ENV = "LEMON_BENCH_IPYBOX_VENV"
#: mcpygen 0.1.4 imports ``streamablehttp_client``, which mcp 2 removed; pip alone would pick
#: mcp 2 (mcpygen declares no upper bound).
REQUIREMENTS = ("ipybox>=0.9,<0.10", "mcp>=1.20,<2")
CHILD = Path(__file__).resolve().with_name("peers_ipybox_child.py")
#: How long one request may take (starting an executor on 2 loaded cores takes ~5-15 s).
REQUEST_TIMEOUT_S = 180.0


class PeerUnavailable(RuntimeError):
    """The peer could not be installed or started; the message says why and how to fix it."""


def venv_path() -> Path:
    return Path(os.environ.get(VENV_ENV) or REPO / ".bench-ipybox-venv")


def install_hint(venv: Path) -> str:
    quoted = " ".join(f"'{r}'" for r in REQUIREMENTS)
    return (
        f"create it with `python3 -m venv {venv} && {venv}/bin/pip install {quoted}` "
        f"(or point {VENV_ENV} at a venv that has it)"
    )


def _has_ipybox(python: Path) -> bool:
    if not python.exists():
        return False
    probe = "import importlib.metadata as m; m.version('ipybox'); m.version('mcpygen')"
    done = subprocess.run([str(python), "-c", probe], capture_output=True, timeout=60)
    return done.returncode == 0


def ensure_venv() -> Path:
    """The ipybox venv's Python, creating the default venv first if it has no ipybox."""
    venv = venv_path()
    python = venv / "bin" / "python"
    if _has_ipybox(python):
        return python
    if os.environ.get(VENV_ENV):
        raise PeerUnavailable(f"ipybox is not installed in {venv}; {install_hint(venv)}")
    try:
        with open(venv.with_name(venv.name + ".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # another run may be installing it right now
            if not _has_ipybox(python):
                if not python.exists():
                    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
                pip = [str(python), "-m", "pip", "install", "--quiet", *REQUIREMENTS]
                subprocess.run(pip, check=True, timeout=1800, capture_output=True)
    except (OSError, subprocess.SubprocessError) as exc:
        detail = getattr(exc, "stderr", b"") or b""
        raise PeerUnavailable(
            f"installing ipybox into {venv} failed ({exc}; {detail[-300:]!r}); {install_hint(venv)}"
        ) from exc
    if not _has_ipybox(python):
        raise PeerUnavailable(f"ipybox is not importable in {venv}; {install_hint(venv)}")
    return python


class IpyboxDriver:
    """The child process holding ipybox's executors; every request is one JSON line, and
    several may be under way at once (their answers come back by id)."""

    def __init__(self, proc: asyncio.subprocess.Process, log: Path) -> None:
        self.proc = proc
        self.log = log
        self.info: dict[str, Any] = {}
        self._seq = 0
        self._waiting: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._reader = asyncio.create_task(self._read_replies())

    async def _read_replies(self) -> None:
        """Hand each answer to the request waiting for its id; fail them all at EOF."""
        assert self.proc.stdout is not None
        try:
            while raw := await self.proc.stdout.readline():
                reply: dict[str, Any] = json.loads(raw)
                future = self._waiting.pop(reply.get("id", -1), None)
                if future is not None and not future.done():
                    future.set_result(reply)
        finally:
            for future in self._waiting.values():
                if not future.done():
                    future.set_exception(
                        PeerUnavailable(f"the ipybox driver exited: {self.log_tail()!r}")
                    )
            self._waiting.clear()

    @classmethod
    async def start(cls, python: Path, workdir: Path) -> IpyboxDriver:
        log = workdir / "ipybox-driver.log"
        with open(log, "wb") as err:
            proc = await asyncio.create_subprocess_exec(
                str(python),
                str(CHILD),
                cwd=str(workdir),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                start_new_session=True,  # Ctrl-C of the bench reaches it through aclose only
                limit=1 << 24,
            )
        driver = cls(proc, log)
        try:
            driver.info = await driver.request("hello", timeout=60)
        except BaseException:
            await driver.aclose()
            raise
        return driver

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log_tail(self, chars: int = 600) -> str:
        with contextlib.suppress(OSError):
            return self.log.read_text(errors="replace")[-chars:]
        return ""

    async def request(self, op: str, timeout: float = REQUEST_TIMEOUT_S, **fields: Any) -> Any:
        """Send one request and return its answer; raise with ipybox's error."""
        assert self.proc.stdin is not None
        if self._reader.done():
            raise PeerUnavailable(f"the ipybox driver exited: {self.log_tail()!r}")
        self._seq += 1
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._waiting[self._seq] = future
        line = json.dumps({"id": self._seq, "op": op, **fields}) + "\n"
        self.proc.stdin.write(line.encode())
        await self.proc.stdin.drain()
        reply = await asyncio.wait_for(future, timeout)
        if not reply.get("ok"):
            raise RuntimeError(f"ipybox {op} failed: {reply.get('error')}")
        return reply

    async def aclose(self) -> None:
        """Ask the child to stop its executors; after 30 s kill it and whatever it started."""
        proc = self.proc
        if proc.returncode is None and proc.stdin is not None:
            with contextlib.suppress(OSError, RuntimeError):
                proc.stdin.write(b'{"op": "exit"}\n')
                await proc.stdin.drain()
                proc.stdin.close()
        try:
            await asyncio.wait_for(proc.wait(), 30)
        except TimeoutError:
            for pid in [*descendants(proc.pid), proc.pid]:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            await proc.wait()
        await asyncio.gather(self._reader, return_exceptions=True)
