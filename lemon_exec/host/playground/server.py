"""A host for one kernel's ordinary cells: the default tools, policy and per-cell budgets.

It reads the kernel's greeting on stdin, loads the configuration (``ExecuteCodeConfig.load``:
the TOML file and ``LEMON_EXECUTE_CODE_*``), builds the default tool registry (with the MCP
servers of ``LEMON_EXEC_MCP_CONFIG``), lists their tools, listens on a link socket in a 0700
directory and says so on stdout. Then, for each cell the kernel opens, a
:class:`~lemon_exec.host.cell.host_bridge.HostBridge` with one run's budgets serves the
cell's frames, exactly as for an agent's script; the bridge is closed (its calls cancelled)
when the kernel says the cell ended. It exits when the link closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from jupyter_client.session import Session

from lemon_exec._constants import STAGING_ROOT_PREFIX
from lemon_exec.config import ExecuteCodeConfig
from lemon_exec.errors import LemonExecError
from lemon_exec.host.cell.host_bridge import BridgeLimits, HostBridge
from lemon_exec.host.disk.runtime_base import runtime_base, sweep_stale_runtime_dirs
from lemon_exec.host.kernels.local.link_end import LinkEnd
from lemon_exec.proc.private_fs import write_owner_marker
from lemon_exec.proc.tree_removal import remove_tree
from lemon_exec.tools import ToolHost, ToolRegistry, default_registry
from lemon_exec.tools._mcp_config import registry_with_mcp_servers
from lemon_exec.tools._toolset import toolset
from lemon_exec.wire import jupyter_messages, protocol
from lemon_exec.wire import playground as pg

log = logging.getLogger(__name__)

#: The longest greeting read from stdin.
_MAX_GREETING_BYTES = 64 << 10


class PlaygroundHost:
    """Serves the cells of the one kernel on the other end of ``link``."""

    def __init__(
        self,
        config: ExecuteCodeConfig,
        tool_host: ToolHost,
        session: Session,
        link: LinkEnd,
        on_connected: Callable[[], object],
    ) -> None:
        self._config = config
        self._on_connected: Callable[[], object] | None = on_connected
        self._tool_host = tool_host
        self._session = session
        self._link = link
        self._bridges: dict[str, HostBridge] = {}
        self._closing: set[asyncio.Task[None]] = set()

    async def serve(self) -> None:
        """Serve until the kernel closes the link; then close every cell."""
        try:
            await self._link.serve(self._on_message, self._on_oversize, self._on_end)
        finally:
            for comm_id in list(self._bridges):
                self._close_cell(comm_id)
            if self._closing:
                await asyncio.gather(*self._closing, return_exceptions=True)
            self._link.close()

    def _on_message(self, frames: list[bytes]) -> None:
        connected = self._on_connected
        if connected is not None:
            self._on_connected = None
            connected()
        try:
            msg = jupyter_messages.unpack_signed(self._session, frames)
        except ValueError:  # unsigned, badly signed or malformed: dropped, as a kernel does
            log.error("playground host: invalid message from the kernel", exc_info=True)
            return
        content = msg.get("content")
        if not isinstance(content, dict):
            return
        comm_id = content.get("comm_id")
        if not isinstance(comm_id, str):
            return
        kind = msg.get("msg_type")
        if kind == "comm_msg":
            bridge = self._bridges.get(comm_id)
            if bridge is not None:
                bridge.handle(content.get("data"))
        elif kind == pg.OPEN_MSG_TYPE:
            self._open_cell(comm_id, content)
        elif kind == pg.CLOSE_MSG_TYPE:
            self._close_cell(comm_id)

    def _open_cell(self, comm_id: str, content: dict[str, Any]) -> None:
        token, cwd = content.get("token"), content.get("cwd")
        if comm_id in self._bridges or not isinstance(token, str):
            return
        if not isinstance(cwd, str) or not os.path.isabs(cwd):
            cwd = os.getcwd()
        self._bridges[comm_id] = HostBridge(
            tool_host=self._tool_host,
            enabled_tools=self._enabled_tools(),
            cwd=Path(cwd),
            limits=BridgeLimits.of(self._config),
            send_reply=self._send_reply,
            identity=(comm_id, token),
        )

    def _enabled_tools(self) -> tuple[str, ...]:
        extras = toolset(self._tool_host.registry, self._config.tools)
        return self._config.enabled_helpers + extras.names

    def _close_cell(self, comm_id: str) -> None:
        bridge = self._bridges.pop(comm_id, None)
        if bridge is not None:
            task = asyncio.ensure_future(bridge.aclose())
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    def _send_reply(self, content: dict[str, Any]) -> None:
        packed = json.dumps(content).encode("ascii")
        self._link.send(
            jupyter_messages.pack_signed(self._session, protocol.REPLY_MSG_TYPE, packed)
        )

    def _on_oversize(self, size: int) -> None:
        log.error("playground host: a %d-byte message from the kernel was dropped", size)

    def _on_end(self, problem: str | None) -> None:
        if problem is not None:
            log.error("playground host: %s", problem)


def _registry() -> ToolRegistry:
    path = os.environ.get(pg.MCP_CONFIG_ENV)
    return registry_with_mcp_servers(path) if path else default_registry()


def _read_greeting() -> Session:
    raw = sys.stdin.buffer.read(_MAX_GREETING_BYTES)
    greeting = json.loads(raw)
    return Session(key=bytes.fromhex(greeting[pg.KEY]), signature_scheme=greeting[pg.SCHEME])


async def _run(ready_out: Any) -> int:
    session = _read_greeting()
    config = ExecuteCodeConfig.load()
    tool_host = ToolHost(_registry())
    base = runtime_base()
    sweep_stale_runtime_dirs(base)  # those of hosts killed outright (this one's too, later)
    link_dir = Path(tempfile.mkdtemp(prefix=f"{STAGING_ROOT_PREFIX}playground-", dir=base))
    try:
        write_owner_marker(link_dir)
        await tool_host.prepare_tools()
        extras = toolset(tool_host.registry, config.tools)
        link = LinkEnd(link_dir / "link")
        ready = {
            pg.READY: True,
            pg.LINK: str(link.path),
            pg.HELPERS: list(config.enabled_helpers),
            pg.TOOLS_DIGEST: extras.digest,
            pg.TOOLS: extras.specs,
            pg.MAX_TEXT_BYTES: config.max_text_bytes,
        }
        _answer(ready_out, ready)
        # Gone before the first reply: the socket's path went at the kernel's connection.
        host = PlaygroundHost(config, tool_host, session, link, lambda: remove_tree(link_dir))
        serving = asyncio.ensure_future(host.serve())
        if not await _connected(link, serving):
            serving.cancel()  # the kernel went away before it connected
            link.close()
            return 1
        await serving
    finally:
        remove_tree(link_dir)
        await tool_host.aclose()
    return 0


async def _connected(link: LinkEnd, serving: asyncio.Future[None]) -> bool:
    """Whether the kernel connects within the ready timeout (it does so at once)."""
    deadline = asyncio.get_running_loop().time() + pg.READY_TIMEOUT_S
    while not link.connected:
        if serving.done() or asyncio.get_running_loop().time() > deadline:
            return False
        await asyncio.sleep(0.005)
    return True


def _answer(out: Any, value: dict[str, Any]) -> None:
    out.write(json.dumps(value) + "\n")
    out.flush()
    out.close()  # nothing more is written there: the kernel reads one line


def main() -> int:
    # Interrupts are the kernel's business (it runs in a session of its own anyway).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(level=logging.WARNING, format="lemon_exec playground host: %(message)s")
    ready_out = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    # Anything else printed (a tool's stray print) must not reach the kernel's ready pipe.
    with contextlib.suppress(OSError):
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    try:
        return asyncio.run(_run(ready_out))
    except (LemonExecError, OSError, ValueError, KeyError) as exc:
        with contextlib.suppress(ValueError, OSError):  # closed already: the kernel has its line
            _answer(ready_out, {pg.ERROR: f"{type(exc).__name__}: {exc}"})
        return 1
