"""Cell requests: what one cell needs from the configuration, the tool host and the staging
root (helpers, tool specs, budgets, output bounds, spill directory), for a call or a script.

Both modes make their requests here, so a per-call run, a session cell and a spare's warm-up
cell see the same helpers and the same limits.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from lemon_exec.config import ExecuteCodeConfig
from lemon_exec.host.cell.execute import CellRequest
from lemon_exec.host.cell.host_bridge import BridgeLimits
from lemon_exec.host.disk.staging import StagingRoot
from lemon_exec.host.run.calls import Call
from lemon_exec.tools import ToolHost
from lemon_exec.tools._toolset import toolset


class CellRequests:
    """Makes :class:`CellRequest` values for one host (its config, tools and staging root)."""

    def __init__(self, config: ExecuteCodeConfig, tool_host: ToolHost, staging: StagingRoot):
        self.config = config
        self.tool_host = tool_host
        self.staging = staging

    def limits(self) -> BridgeLimits:
        return BridgeLimits.of(self.config)

    def for_script(
        self,
        script: str,
        *,
        cwd: Path,
        deadline: float,
        chdir: bool,
        aborts: tuple[Any, ...],
        on_update: Callable[[str], None] | None,
        filename: str = "script.py",
        on_output: Callable[[str], None] | None = None,
        argv: tuple[str, ...] | None = None,
        on_text: Callable[[str], None] | None = None,
        on_start: Callable[[], None] | None = None,
    ) -> CellRequest:
        return CellRequest(
            code=script,
            deadline=deadline,
            helpers=self.config.enabled_helpers,
            toolset=toolset(self.tool_host.registry, self.config.tools),
            limits=self.limits(),
            max_output_bytes=self.config.max_output_bytes,
            max_spill_bytes=self.config.max_spill_bytes,
            spill_dir=self.staging.spill_dir,
            cwd=cwd,
            filename=filename,
            chdir=chdir,
            aborts=aborts,
            on_update=on_update,
            on_output=on_output,
            argv=argv,
            on_text=on_text,
            on_start=on_start,
        )

    def for_call(self, call: Call, *, chdir: bool, cwd: Path | None = None) -> CellRequest:
        """The cell request for ``call`` (in ``cwd`` when given, else the call's own)."""
        return self.for_script(
            call.script,
            cwd=cwd if cwd is not None else call.cwd,
            deadline=call.deadline,
            chdir=chdir,
            aborts=(call.abort,) if call.abort is not None else (),
            on_update=call.on_update,
            filename=call.filename,
            on_output=call.on_output,
            argv=call.argv,
            on_text=call.on_text,
            on_start=call.on_start,
        )
