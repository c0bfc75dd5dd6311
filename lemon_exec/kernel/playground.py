"""The kernel's own host, for helpers in a notebook that no lemon_exec host started.

Started by Jupyter itself, a ``lemon-python`` kernel has no host to serve its helpers. So
that a person can run an agent's script cell by cell with the real ``read``, ``grep``,
``find``, ``ls``, ``webfetch`` (and the tools of ``LEMON_EXEC_MCP_CONFIG``), the first helper
call of a cell starts a host process for this kernel (wire/playground.py has the protocol),
and every cell that calls a helper gets a bridge of its own, with one run's budgets. The
host process is the same host code an agent's host runs (its registry, policy, budgets and
tool workers), outside the kernel, so the notebook's code cannot patch what a tool does.

A kernel that a lemon_exec host manages never starts one: its agent's host serves the
agent's scripts, and a person's cells there get an error that says why. In the playground,
``text()`` and ``notify()`` still print (the notebook is their reader).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import select
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

from lemon_exec.kernel import cells, helpers
from lemon_exec.kernel.bridge import CellBridge, ToolError
from lemon_exec.kernel.hostlink import HostLink
from lemon_exec.wire import jupyter_messages
from lemon_exec.wire import playground as pg

#: Longest ready line read from the host (tool specs included).
_MAX_READY_BYTES = 8 << 20
#: How long a stopping host may take to close its tools before it is killed.
_STOP_GRACE_S = 2.0


MANAGED_NO_HOST = pg.MANAGED_NO_HOST
DISABLED_NO_HOST = pg.DISABLED_NO_HOST
BETWEEN_CELLS = pg.BETWEEN_CELLS


def enabled() -> bool:
    return os.environ.get(pg.ENABLE_ENV, "1") != "0"


class _Host:
    """A running host process and the link to it."""

    def __init__(self, proc: subprocess.Popen[bytes], link: HostLink, ready: dict[str, Any]):
        self.proc = proc
        self.link = link
        self.ready = ready

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None and not self.link.ended and not self.link.closed

    def stop(self) -> None:
        self.link.close()  # the host exits when its link closes
        try:
            self.proc.wait(_STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class Playground:
    """Opens helper bridges for a kernel's ordinary cells, starting its host when needed."""

    def __init__(
        self,
        session: Any,
        iopub_socket: Any,
        namespace: dict[str, Any],
    ) -> None:
        self._session = session
        self._iopub = iopub_socket
        self._namespace = namespace
        self._host: _Host | None = None
        self._lock = threading.Lock()  # one start at a time (helpers may be called in threads)
        self._noticed = False
        #: The running cell's parent header and bridge (None before its first helper call).
        self._parent: dict[str, Any] | None = None
        self._bridge: CellBridge | None = None

    @contextlib.contextmanager
    def cell(self, parent: dict[str, Any]) -> Iterator[None]:
        """Serve helpers on demand while an ordinary cell runs; close its bridge after it."""
        self._parent = parent
        cells.STATE.opener = self._open_bridge
        if os.environ.get(pg.MCP_CONFIG_ENV) and self._host is None:
            # The MCP servers' tools (``tools.<server>``) exist only once the host has listed
            # them: started with the first cell, not the first helper call.
            with self._lock, contextlib.suppress(ToolError):
                self._ensure_host()
        try:
            yield
        finally:
            cells.STATE.opener = None
            self._parent = None
            self._end_cell()

    def _open_bridge(self) -> CellBridge:
        """The running cell's bridge, opened (and the host started) by its first helper."""
        with self._lock:
            if self._bridge is not None:
                return self._bridge
            if self._parent is None:
                raise ToolError(pg.BETWEEN_CELLS)
            host = self._ensure_host()
            comm_id, token = secrets.token_hex(16), secrets.token_urlsafe(32)
            self._send(
                host, pg.OPEN_MSG_TYPE, {"comm_id": comm_id, "token": token, "cwd": os.getcwd()}
            )
            bridge = CellBridge(
                session=self._session,
                iopub_socket=self._iopub,
                parent=self._parent,
                comm_id=comm_id,
                token=token,
                generation=cells.STATE.generation,
                max_text_bytes=int(host.ready.get(pg.MAX_TEXT_BYTES, 0)),
                link=host.link,
                prints_text=True,
            )
            self._bridge = bridge
            cells.open_cell(bridge)
            return bridge

    def _end_cell(self) -> None:
        with self._lock:
            bridge, self._bridge = self._bridge, None
            if bridge is None:
                return
            cells.close_cell()
            host = self._host
            if host is not None and host.alive:
                with contextlib.suppress(OSError, ToolError):
                    self._send(host, pg.CLOSE_MSG_TYPE, {"comm_id": bridge.comm_id})

    def _ensure_host(self) -> _Host:
        """The running host, started (or restarted) if needed; the caller holds the lock."""
        host = self._host
        if host is not None and host.alive:
            return host
        if host is not None:
            host.stop()  # it died (or its link broke): a fresh one serves from here
            self._host = None
        host = self._host = _start_host(self._session)
        ready = host.ready
        helpers.install(
            self._namespace, ready.get(pg.HELPERS), ready.get(pg.TOOLS_DIGEST), ready.get(pg.TOOLS)
        )
        if not self._noticed:
            self._noticed = True
            print(pg.NOTICE, file=sys.stderr)
        return host

    def _send(self, host: _Host, msg_type: str, content: dict[str, Any]) -> None:
        packed = json.dumps(content).encode()
        try:
            host.link.send(jupyter_messages.pack_signed(self._session, msg_type, packed))
        except OSError as exc:
            raise ToolError(pg.START_FAILED.format(reason=f"its link broke ({exc})")) from None

    def shutdown(self) -> None:
        """Stop the host (the kernel is shutting down)."""
        with self._lock:
            host, self._host = self._host, None
        if host is not None:
            host.stop()


def _start_host(session: Any) -> _Host:
    """Start a host process, read its ready line and connect to its link."""
    env = dict(os.environ)
    env.pop("JPY_PARENT_PID", None)
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", pg.HOST_MODULE],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            # Its own session: a Ctrl-C sent to the kernel's process group is not for it.
            start_new_session=True,
            env=env,
        )
    except OSError as exc:
        raise ToolError(pg.START_FAILED.format(reason=f"{sys.executable}: {exc}")) from None
    try:
        ready = _handshake(proc, session)
        link = HostLink.connect(str(ready[pg.LINK]))
    except BaseException as exc:
        proc.kill()
        proc.wait()
        if isinstance(exc, ToolError):
            raise
        if isinstance(exc, OSError | KeyError | ValueError):
            raise ToolError(pg.START_FAILED.format(reason=str(exc))) from None
        raise
    link.serve_replies(session)
    return _Host(proc, link, ready)


def _handshake(proc: subprocess.Popen[bytes], session: Any) -> dict[str, Any]:
    assert proc.stdin is not None and proc.stdout is not None
    greeting = {pg.KEY: bytes(session.key).hex(), pg.SCHEME: session.signature_scheme}
    try:
        proc.stdin.write(json.dumps(greeting).encode())
        proc.stdin.close()
    except OSError:
        pass  # it died already: its exit is reported below
    line = _read_line(proc.stdout, pg.READY_TIMEOUT_S)
    proc.stdout.close()
    if not line:
        code = proc.poll()
        why = "it exited" if code is not None else "no answer"
        raise ToolError(pg.START_FAILED.format(reason=f"{why} (exit status {code})"))
    ready = json.loads(line)
    if not isinstance(ready, dict):
        raise ValueError(f"unexpected ready line {line[:200]!r}")
    if pg.ERROR in ready:
        raise ToolError(pg.START_FAILED.format(reason=ready[pg.ERROR]))
    return ready


def _read_line(stream: Any, timeout: float) -> bytes:
    """One line from ``stream`` (a pipe), or what came before EOF or the timeout."""
    fd = stream.fileno()
    deadline = time.monotonic() + timeout
    data = bytearray()
    while b"\n" not in data and len(data) < _MAX_READY_BYTES:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        ready, _, _ = select.select([fd], [], [], remaining)
        if not ready:
            break
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            break
        data += chunk
    return bytes(data.split(b"\n", 1)[0])
