"""The exceptions lemon_exec raises on the host side.

The tree, in one place (modelled on httpx's)::

    LemonExecError                  base of everything below
    ├── ConfigError                 a setting is unusable (bad python_path, no python3, ...)
    ├── RefusedError                a call was refused before any code ran (disabled, bad params,
    │                               already aborted, workspace creation failed); its message is the
    │                               spec's refusal text, returned to the model as the tool result
    ├── KernelError                 something went wrong with a kernel process
    │   ├── KernelStartError        the kernel could not be started or did not become ready in 10 s
    │       └── InterpreterError    the interpreter is missing, not executable, or has no ipykernel
    ├── SessionBusyError            the session kernel's queue is full
    ├── JobExpiredError             a finished job's result is no longer kept
    └── ToolFailure                 a host-side tool failed; the message goes back to the script,
        │                           where the helper raises it as ``ToolError``
        └── ToolDenied              the policy or approval hook said no (counted as rpc_denied)

Script failures (exceptions, ``SystemExit``, timeouts) are *not* host exceptions: they are
outcomes, reported in the result's headline and ``details``; so are a kernel that dies while
a cell runs (``crashed``) and a kernel that breaks the comm protocol (``protocol_fault``).
"""

from __future__ import annotations


class LemonExecError(Exception):
    """Base class of every lemon_exec host-side error."""


class ConfigError(LemonExecError):
    """A configuration value cannot be used."""


class RefusedError(LemonExecError):
    """A call was refused before any code ran; ``str(err)`` is the text shown to the model."""


class KernelError(LemonExecError):
    """A kernel process failed."""


class KernelStartError(KernelError):
    """A kernel could not be started, or did not become ready within the startup timeout."""


class InterpreterError(KernelStartError, ConfigError):
    """The configured interpreter is missing, not executable, or lacks ipykernel."""


class SessionBusyError(LemonExecError):
    """A session kernel's FIFO queue is full."""


class JobExpiredError(LemonExecError):
    """A finished job's result is no longer kept (job_result_ttl_ms, max_finished_jobs)."""


class ToolFailure(LemonExecError):
    """A host-side tool failed; the message is passed to the script as a ``ToolError``."""


class ToolDenied(ToolFailure):
    """A tool call was denied by the policy hook or by the approval hook."""
