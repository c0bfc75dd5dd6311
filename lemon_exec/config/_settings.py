"""The settings of the execute_code tool: :class:`ExecuteCodeConfig`, one trait per setting.

Each setting is one trait, and everything else derives from it: its ``help`` documents it
(``docs/conf.py`` generates the reference page from the traits), its ``config=True`` tag
makes it a TOML key and a :data:`SETTING_KEYS` entry, its ``env`` metadata names its
environment variable, its ``convert`` metadata is the one conversion every layer and every
assignment goes through, and ``clamp`` (low, high or None) bounds an integer.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from traitlets import Unicode, validate
from traitlets.config import Configurable

from lemon_exec.config import _layers, _python
from lemon_exec.config._convert import (
    coerce_bool,
    coerce_cwd_mode,
    coerce_int,
    coerce_mode,
    coerce_path,
    coerce_paths,
    coerce_sandbox,
    coerce_text,
    coerce_tools,
    coerce_url,
    logger,
)
from lemon_exec.config._defaults import (
    DEFAULT_SANDBOX_ENV_HIDDEN,
    DEFAULT_SANDBOX_HIDDEN,
    DEFAULT_SANDBOX_VISIBLE,
    ENV_PREFIX,
    HELPER_ALLOWLIST,
    MAX_WARM_KERNELS,
    MIN_TIMEOUT_MS,
)
from lemon_exec.config._traits import (
    NON_NEGATIVE,
    POSITIVE,
    BoolSetting,
    Coerced,
    IntSetting,
    ListSetting,
    StrSetting,
)


class ExecuteCodeConfig(Configurable):
    """Validated settings of the execute_code tool.

    Construct directly (``ExecuteCodeConfig(timeout_ms=5000)``) or, for the layered
    TOML/environment/override lookup, with :meth:`load`. A value set either way goes through
    the same conversion and clamping rules (``"2.9"``, ``2.9`` -> 2 -> clamped to at least 1;
    ``kernel_mode=True`` -> ``"per_call"``); one they cannot use is ignored with a warning.
    """

    enabled = BoolSetting(
        False,
        help="Whether the execute_code tool is offered at all. Front ends may default it on "
        "(see ExecuteCodeConfig.load(default_enabled=...)).",
    ).tag(config=True, convert=coerce_bool)

    python_path = StrSetting(
        "",
        help="Python interpreter that runs the kernels (it needs ipykernel). Blank means "
        "python3 found on PATH when it has ipykernel, else the host's own interpreter; a "
        "relative path is resolved against the working directory.",
    ).tag(config=True, convert=coerce_path)

    timeout_ms = IntSetting(
        120_000,
        help="Wall-clock limit of one run, in milliseconds (a call's timeout_ms may lower it).",
    ).tag(config=True, convert=coerce_int, clamp=POSITIVE)

    max_rpc_calls = IntSetting(
        100,
        help="Most helper (host-tool) calls one run may make.",
    ).tag(config=True, convert=coerce_int, clamp=POSITIVE)

    max_rpc_result_bytes = IntSetting(
        5_242_880,
        help="Most bytes of helper results one run may receive.",
    ).tag(config=True, convert=coerce_int, clamp=POSITIVE)

    max_output_bytes = IntSetting(
        50_000,
        help="Most bytes of printed output returned per run; longer output loses its middle "
        "and is saved to a spill file (up to max_spill_bytes).",
    ).tag(config=True, convert=coerce_int, clamp=POSITIVE)

    max_text_bytes = IntSetting(
        65_536,
        help="Most bytes of text() blocks (the script's result) per run.",
    ).tag(config=True, convert=coerce_int, clamp=POSITIVE)

    max_images = IntSetting(
        8,
        help="Most images (image(), display() of an image) one run may show.",
    ).tag(config=True, convert=coerce_int, clamp=POSITIVE)

    max_image_bytes = IntSetting(
        5_242_880,
        help="Most bytes of images one run may show, as the script sent them (before any "
        "downscaling).",
    ).tag(config=True, convert=coerce_int, clamp=POSITIVE)

    max_image_edge = IntSetting(
        1568,
        help="Images whose longer edge is over this many pixels are downscaled to it (with "
        "Pillow, the images extra; the original is kept in the spill area). 0: never.",
    ).tag(config=True, convert=coerce_int, clamp=NON_NEGATIVE)

    max_parallel_rpc = IntSetting(
        4,
        help="Most helper calls one run may have in flight at once.",
    ).tag(config=True, convert=coerce_int, clamp=POSITIVE)

    max_parallel_mcp = IntSetting(
        16,
        help="lemon_exec extra: most calls of upstream MCP server tools (tools.<server>.<tool>) "
        "one run may have in flight at once, on a lane of their own beside max_parallel_rpc.",
    ).tag(config=True, convert=coerce_int, clamp=POSITIVE)

    tools = ListSetting(
        Unicode(),
        default_value=[],
        help="Narrows the helper allowlist (read, grep, find, ls, webfetch). Empty means the "
        "full allowlist; unknown names are dropped; a list of only unknown names allows none.",
    ).tag(config=True, convert=coerce_tools)

    kernel_mode = StrSetting(
        "per_call",
        help='"session" keeps one kernel per session; any other value means "per_call", a '
        "fresh kernel for every call.",
    ).tag(config=True, convert=coerce_mode)

    kernel_idle_timeout_ms = IntSetting(
        1_800_000,
        help="A session kernel idle for this many milliseconds is shut down.",
    ).tag(config=True, convert=coerce_int, clamp=POSITIVE)

    max_live_kernels = IntSetting(
        16,
        help="Most session kernels alive at once (a strict cap; starting kernels count). "
        "Admission evicts the least recently used idle one; if none is idle the call runs "
        "isolated (fallback_reason capacity_exhausted). Per-call kernels are not counted.",
    ).tag(config=True, convert=coerce_int, clamp=POSITIVE)

    max_queued_cells_per_kernel = IntSetting(
        8,
        help="Most calls waiting for one session kernel; further calls are refused.",
    ).tag(config=True, convert=coerce_int, clamp=POSITIVE)

    warm_kernels = IntSetting(
        1,
        help="Per-call kernels started ahead of time so a call need not wait for startup; "
        "0 disables warm spares; at most 8 (larger values are clamped).",
    ).tag(config=True, convert=coerce_int, clamp=(0, MAX_WARM_KERNELS))

    fork_server = BoolSetting(
        True,
        help="Start kernels by forking a template process that has already imported the "
        "kernel's modules (about 4x cheaper than a fresh interpreter). Off: every kernel is "
        "a new process launched by jupyter_client.",
    ).tag(config=True, convert=coerce_bool)

    gc_freeze = BoolSetting(
        True,
        help="After the host's first call, move the objects its process holds then out of "
        "the garbage collector's reach (gc.freeze()), so that full collections, tens of ms "
        "with jupyter_client and zmq loaded, no longer stall the calls in flight. A cycle "
        "among those objects that becomes garbage later is never freed. Once per process.",
    ).tag(config=True, convert=coerce_bool)

    max_concurrent_per_call = IntSetting(
        0,
        help="Most per-call runs (kernels) at once; further calls wait in a bounded queue. "
        "0 means automatic: max(2, min(4 x CPU cores, 8 x available memory in GiB)).",
    ).tag(config=True, convert=coerce_int, clamp=NON_NEGATIVE)

    max_queued_per_call = IntSetting(
        64,
        help="Most per-call runs waiting for a free slot; further calls get a busy result at "
        "once. The wait counts against the call's timeout. 0: no queue.",
    ).tag(config=True, convert=coerce_int, clamp=NON_NEGATIVE)

    max_job_ms = IntSetting(
        3_600_000,
        help="Wall-clock limit of one job (ExecuteCode.start), in milliseconds, instead of "
        "timeout_ms; a job's own timeout_ms may lower it (never below 1000 ms).",
    ).tag(config=True, convert=coerce_int, clamp=POSITIVE)

    job_result_ttl_ms = IntSetting(
        3_600_000,
        help="How long a finished job's result is kept, in milliseconds; then it expires.",
    ).tag(config=True, convert=coerce_int, clamp=POSITIVE)

    max_finished_jobs = IntSetting(
        100,
        help="Most finished jobs whose results are kept; the oldest expire first.",
    ).tag(config=True, convert=coerce_int, clamp=POSITIVE)

    max_spill_bytes = IntSetting(
        64 * 2**20,
        help="Most bytes of one run's output saved to its spill file (default 64 MiB); "
        "output past it is counted but not stored, and the result says the file is capped.",
    ).tag(config=True, convert=coerce_int, clamp=POSITIVE)

    kernel_memory_mb = IntSetting(
        0,
        help="Most memory, in MiB, a kernel and its descendants may use together (a cgroup; "
        "without one, RLIMIT_AS per process: a MemoryError). Over it the script is killed: "
        '"Script killed: memory limit (N MB) exceeded." 0: unlimited.',
    ).tag(config=True, convert=coerce_int, clamp=NON_NEGATIVE)

    kernel_max_processes = IntSetting(
        0,
        help="Most processes (and threads) a kernel and its descendants may have at once, so "
        "a fork bomb is contained (a cgroup's pids.max; without one RLIMIT_NPROC, which root "
        "ignores, so as root without a cgroup the run is refused). 0: unlimited.",
    ).tag(config=True, convert=coerce_int, clamp=NON_NEGATIVE)

    kernel_max_open_files = IntSetting(
        0,
        help="Most open file descriptors per kernel process (RLIMIT_NOFILE). 0: unlimited "
        "(the inherited limit).",
    ).tag(config=True, convert=coerce_int, clamp=NON_NEGATIVE)

    sandbox = StrSetting(
        "none",
        help='"bwrap" runs every kernel under bubblewrap (read-only filesystem, hidden '
        "credential stores and staging root, no network, own PID namespace; see "
        'docs/sandbox.md). "none" (default): kernels have the host user\'s authority. A '
        "sandbox that cannot start is refused, never replaced by an unsandboxed run.",
    ).tag(config=True, convert=coerce_sandbox)

    sandbox_cwd = StrSetting(
        "rw",
        help='Under the sandbox, whether the working directory is writable ("rw", default) '
        'or read-only ("ro").',
    ).tag(config=True, convert=coerce_cwd_mode)

    sandbox_hidden = ListSetting(
        Unicode(),
        default_value=list(DEFAULT_SANDBOX_HIDDEN),
        help="Paths a sandboxed kernel cannot see (an empty directory or file in their "
        "place); ~ is the host's HOME. Default: the common credential stores and the agent, "
        "D-Bus and Docker sockets, and ~ itself (but for the working directory and "
        "sandbox_visible). Every kernel's keys and sockets are always hidden apart from the "
        "kernel's own.",
    ).tag(config=True, convert=coerce_paths)

    sandbox_visible = ListSetting(
        Unicode(),
        default_value=list(DEFAULT_SANDBOX_VISIBLE),
        help="Paths inside hidden ones (sandbox_hidden, whose default hides ~) that a "
        "sandboxed kernel still sees, read-only; ~ is the host's HOME. Default: ~/.local/lib "
        "(user site-packages). The working directory and the interpreter's installation are "
        "always visible.",
    ).tag(config=True, convert=coerce_paths)

    sandbox_env_hidden = ListSetting(
        Unicode(),
        default_value=list(DEFAULT_SANDBOX_ENV_HIDDEN),
        help="Environment variables a sandboxed kernel does not get: shell patterns matched "
        "against each name in any case (*_TOKEN, *SECRET*, *_KEY, AWS_*, ...; see "
        "docs/sandbox.md). A list replaces the default.",
    ).tag(config=True, convert=coerce_paths)

    sandbox_env_allowed = ListSetting(
        Unicode(),
        default_value=[],
        help="Environment variables a sandboxed kernel keeps although sandbox_env_hidden "
        "matches them (names or shell patterns, any case). Default: none.",
    ).tag(config=True, convert=coerce_paths)

    sandbox_network = BoolSetting(
        False,
        help="Under the sandbox, whether kernels keep the host's network. Off (default): "
        "only their own loopback; services on the host's loopback are unreachable.",
    ).tag(config=True, convert=coerce_bool)

    gateway_url = StrSetting(
        "",
        help="Base URL of a Jupyter Enterprise Gateway (http or https, e.g. "
        '"http://eg.example:8888") to run every kernel behind; blank (default): kernels run '
        "on this machine. See docs/scale-out.md.",
    ).tag(config=True, convert=coerce_url)

    gateway_auth_token = StrSetting(
        "",
        help="The Enterprise Gateway's auth token (sent as 'Authorization: token ...'); blank: "
        "none. A secret: prefer the environment variable to a TOML file.",
    ).tag(config=True, convert=coerce_text)

    gateway_kernel_name = StrSetting(
        "lemon-python",
        help="The kernelspec the Enterprise Gateway starts (it must run the lemon-python kernel).",
    ).tag(config=True, convert=coerce_text)

    # --- checks beyond conversion and clamping; they run for every assignment ----------------

    @validate("tools")
    def _check_tools(self, proposal: Any) -> list[str]:
        # Other names can only narrow the tools the embedding program registered (code mode,
        # docs/tools.md); which are registered is known to the facade, not here.
        unknown = [name for name in proposal["value"] if name not in HELPER_ALLOWLIST]
        if unknown:
            logger.warning(
                "execute_code: tool name(s) %s are not built-in helpers: they are dropped "
                "unless a registered tool or server has that name",
                ", ".join(unknown),
            )
        return list(proposal["value"])

    @validate("kernel_mode")
    def _normalise_mode(self, proposal: Any) -> str:
        value = proposal["value"]
        if value == "session":
            return "session"
        if value != "per_call":
            logger.warning("execute_code: kernel_mode %r is not 'session'; using per_call", value)
        return "per_call"

    # --- derived views -----------------------------------------------------------------------

    @property
    def mode(self) -> str:
        """The kernel mode in force: ``"session"`` or ``"per_call"``."""
        return "session" if self.kernel_mode == "session" else "per_call"

    @property
    def run_timeout_ms(self) -> int:
        """The wall-clock limit in force: ``timeout_ms``, but never below ``MIN_TIMEOUT_MS``.

        ``timeout_ms = 0`` (clamped to 1 like every limit) would otherwise time every call out
        in a millisecond; the floor is the same one a call's own ``timeout_ms`` gets.
        """
        return max(self.timeout_ms, MIN_TIMEOUT_MS)

    @property
    def job_timeout_ms(self) -> int:
        """A job's wall-clock limit in force: ``max_job_ms``, never below ``MIN_TIMEOUT_MS``."""
        return max(self.max_job_ms, MIN_TIMEOUT_MS)

    @property
    def enabled_helpers(self) -> tuple[str, ...]:
        """The helpers scripts may call, in allowlist order.

        An empty ``tools`` list means the whole allowlist. Otherwise ``tools`` is a filter:
        unknown names are dropped, so a list naming only unknown tools allows none (a typo
        must never widen access).
        """
        if not self.tools:
            return HELPER_ALLOWLIST
        wanted = {name.strip() for name in self.tools}
        return tuple(name for name in HELPER_ALLOWLIST if name in wanted)

    def to_dict(self) -> dict[str, Any]:
        """Every setting as a plain dict (the spec's 13 keys plus lemon_exec's extras)."""
        values = {key: getattr(self, key) for key in SETTING_KEYS}
        values["tools"] = list(values["tools"])
        return values

    # --- interpreter -------------------------------------------------------------------------
    # --- interpreter -------------------------------------------------------------------------

    def resolve_python(self, cwd: str | os.PathLike[str] | None = None) -> str:
        """Return the absolute path of the interpreter to run kernels with.

        Blank ``python_path`` means ``python3`` on PATH, or the host's own interpreter
        (``sys.executable``) when that ``python3`` has no ipykernel and the host's has (see
        :mod:`lemon_exec.interpreter`). A relative path is taken relative to
        ``cwd`` (default: the current directory). Symlinks are *not* resolved: the path is
        returned as configured, made absolute; see :func:`canonical_python` for that.

        Raises :class:`~lemon_exec.errors.InterpreterError` (a ``ConfigError``) when no usable
        interpreter is found.
        """
        return _python.resolve_python(self.python_path, cwd)

    # --- layered loading (lemon_exec.config._layers) -----------------------------------------

    @classmethod
    def load(
        cls,
        toml_path: str | os.PathLike[str] | None = None,
        *,
        environ: Mapping[str, str] | None = None,
        default_enabled: bool = False,
        **overrides: Any,
    ) -> ExecuteCodeConfig:
        """Build a config from TOML, then the environment, then keyword overrides.

        ``toml_path=None`` reads no file; a path that is given must exist. ``environ``
        defaults to ``os.environ``. ``default_enabled`` is the value of ``enabled`` when no
        layer sets it: library callers keep the spec's default (off), while the CLI and MCP
        server pass ``True`` so that only an explicit ``false`` turns the tool off.
        Overrides use the setting names; an override of ``None`` means "not given".

        Raises ``ConfigError`` for a missing or unparseable TOML file and ``TypeError`` for
        an unknown override name.
        """
        return cls(
            **_layers.layered_values(_SETTINGS, toml_path, environ, default_enabled, overrides)
        )

    @classmethod
    def explicitly_disabled(
        cls,
        toml_path: str | os.PathLike[str] | None = None,
        *,
        environ: Mapping[str, str] | None = None,
    ) -> bool:
        """Whether the TOML file or the environment turns ``enabled`` off explicitly.

        The environment wins over the file, as in :meth:`load`: ``enabled = false`` in TOML
        with ``LEMON_EXECUTE_CODE_ENABLED=1`` is not disabled. Unset or unparseable values
        do not count as disabling.
        """
        return _layers.explicitly_disabled(_SETTINGS, toml_path, environ)


def _collect_settings() -> dict[str, Coerced[Any, Any]]:
    """Every setting's trait in definition order, each tagged with its ``env`` variable."""
    settings = {
        name: trait
        for name, trait in vars(ExecuteCodeConfig).items()
        if isinstance(trait, Coerced) and trait.metadata.get("config")
    }
    for name, trait in settings.items():
        trait.metadata.setdefault("env", ENV_PREFIX + name.upper())
    return settings


_SETTINGS = _collect_settings()

#: Every setting, in documentation order: the spec's 13 keys, then lemon_exec's extras. Each
#: is a key of the TOML table; its trait's ``env`` metadata names its environment variable.
SETTING_KEYS: tuple[str, ...] = tuple(_SETTINGS)
