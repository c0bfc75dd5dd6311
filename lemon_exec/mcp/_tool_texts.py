"""What the server's tools say about themselves: descriptions, schemas, instructions, errors.

``execute_code``'s own description and input schema are ``ExecuteCode.schema()``'s (the
facade's, not copied here); its output schema is here. ``execute_command``'s description says
whether commands run in the sandbox (:func:`command_description`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from lemon_exec.mcp._images import IMAGES_OUTPUT_SCHEMA

if TYPE_CHECKING:
    from lemon_exec.host.kernels.sandbox import SandboxSpec

EXECUTE_COMMAND_DESCRIPTION = (
    "Run a shell command with /bin/bash -c in this server's shell session and return JSON: "
    "stdout, stderr, exit_code (int) and timed_out (bool).\n"
    "\n"
    "- Pipes, redirects and chaining (&&, ||, ;) work.\n"
    "- Each call runs in a fresh subprocess started in the session's working directory; the "
    "directory the command finished in carries over to the next call (so `cd` persists). "
    "Nothing else carries over: variables set with `export` or `source` are gone on the next "
    "call, so set them in the same command. Files on disk persist.\n"
    "- There is no stdin and no terminal: interactive commands are not supported; pass flags "
    "such as -y or --yes.\n"
    "- timeout is in seconds. Its default and maximum is DPTTOOLS_SANDBOX_TIMEOUT (default "
    "30); a larger value is lowered to it. On timeout the whole process tree is killed, and "
    "the result has timed_out true and exit_code -1 with the output captured so far.\n"
    "- A background job that keeps the output open (`job &`) makes the call wait until the "
    "timeout; redirect it (`job > job.log 2>&1 &`) to let it outlive the call.\n"
    "- stdout and stderr are each cut at DPTTOOLS_OUTPUT_TRUNCATION_LIMIT characters "
    "(default 50000).\n"
    "- Commands are not filtered: they run with the server's permissions. This is not a "
    "sandbox."
)
#: Replaces the last point of the description when the server runs under --sandbox.
_UNCONFINED_POINT = (
    "- Commands are not filtered: they run with the server's permissions. This is not a sandbox."
)
_SANDBOXED_POINT = (
    "- Commands run in the same bubblewrap sandbox as execute_code: the filesystem is "
    "read-only except the server's working directory, /tmp is private to each command, "
    "credential stores are hidden{network}, and background jobs end with the server."
)
RESTART_SESSION_DESCRIPTION = (
    "Reset the shell session's working directory to the directory the server started in. "
    "Returns a confirmation naming that directory."
)
EXECUTE_COMMAND_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "command": {
            "type": "string",
            "description": "The bash command line to run.",
        },
        "timeout": {
            "type": "number",
            "description": "Timeout in seconds (default and maximum: DPTTOOLS_SANDBOX_TIMEOUT, "
            "default 30).",
        },
    },
    "required": ["command"],
    "additionalProperties": False,
}
#: execute_code's structuredContent. Clients such as pydantic-ai, the OpenAI Agents SDK (with
#: use_structured_content) and fastmcp (result.data) hand the model this object instead of
#: ``content``, so it repeats the result text. ``images`` is there only when the script showed
#: images; their bytes are in ``content``'s image blocks, never here.
EXECUTE_CODE_OUTPUT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "content": {
            "type": "string",
            "description": "The result text, as in the content block: the text() blocks, "
            "then any diagnostics; an untrusted result keeps its external-content envelope.",
        },
        "details": {
            "type": "object",
            "description": "Execution metadata: exit_code, duration_ms, mode, python, ...",
        },
        "trust": {
            "type": "string",
            "enum": ["trusted", "untrusted"],
            "description": "untrusted when third-party content (webfetch) reached the result.",
        },
        "images": IMAGES_OUTPUT_SCHEMA,
    },
    "required": ["content", "details", "trust"],
}
RESTART_SESSION_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {},
    "additionalProperties": False,
}

BAD_COMMAND = "execute_command: `command` is required and must be a string."
BAD_TIMEOUT = "execute_command: `timeout` must be a number of seconds."
INSTRUCTIONS = (
    "execute_code runs a Python 3 script whose helpers (read, grep, find, ls, webfetch) call "
    "host tools; only text() blocks and the pictures image() shows are its result. "
    "execute_command runs a bash command in a shell session that remembers its working "
    "directory. Both run with the server user's permissions: this is not a sandbox."
)
SHELL_INSTRUCTIONS = (
    "execute_command runs a bash command in a shell session that remembers its working "
    "directory between calls; restart_session returns to the start directory. Commands run "
    "with the server user's permissions: this is not a sandbox."
)


def command_description(sandbox: SandboxSpec | None) -> str:
    """execute_command's description: it says whether commands run in the sandbox."""
    spec = sandbox
    if spec is None:
        return EXECUTE_COMMAND_DESCRIPTION
    network = "" if spec.network else ", and there is no network (not even the host's loopback)"
    return EXECUTE_COMMAND_DESCRIPTION.replace(
        _UNCONFINED_POINT, _SANDBOXED_POINT.format(network=network)
    )
