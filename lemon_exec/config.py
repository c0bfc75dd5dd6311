"""Settings of the execute_code tool: traits, layered loading and interpreter resolution.

Settings come from three layers, each overriding the one before it:

1. the ``[runtime.tools.execute_code]`` table of a TOML file (only when a path is given),
2. ``LEMON_EXECUTE_CODE_<KEY>`` environment variables,
3. keyword overrides passed to :meth:`ExecuteCodeConfig.load`.

A value a layer cannot parse is ignored with a warning, so the lower layer's value (or the
default) stays in force. Numeric limits are clamped to at least 1 whichever way they are set.
See ``docs/configuration.md`` for the user-facing reference.

Each setting is one trait of :class:`ExecuteCodeConfig`, and everything else derives from
it: its ``help`` documents it (``docs/conf.py`` generates the reference page from the
traits), its ``config=True`` tag makes it a TOML key and a :data:`SETTING_KEYS` entry, its
``env`` metadata names its environment variable, its ``convert`` metadata is the one
conversion every layer and every assignment goes through, and ``clamp`` (low, high or None)
bounds an integer.
"""

from __future__ import annotations

import logging
import math
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from traitlets import Bool, HasTraits, Integer, List, TraitType, Unicode, validate
from traitlets.config import Configurable

from lemon_exec.errors import ConfigError, InterpreterError
from lemon_exec.wire.protocol import HELPER_NAMES

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised only on 3.10
    import tomli as tomllib

__all__ = [
    "DEFAULT_SANDBOX_ENV_HIDDEN",
    "DEFAULT_SANDBOX_HIDDEN",
    "DEFAULT_SANDBOX_VISIBLE",
    "ENV_PREFIX",
    "HELPER_ALLOWLIST",
    "MAX_WARM_KERNELS",
    "MIN_TIMEOUT_MS",
    "SETTING_KEYS",
    "TOML_TABLE",
    "ExecuteCodeConfig",
    "canonical_python",
]

logger = logging.getLogger(__name__)

# Host tools a script may call through helpers; ``tools`` can only narrow this list.
HELPER_ALLOWLIST: tuple[str, ...] = HELPER_NAMES  # declared once, in the protocol

# Dotted path of the TOML table that holds these settings.
TOML_TABLE: tuple[str, ...] = ("runtime", "tools", "execute_code")

ENV_PREFIX = "LEMON_EXECUTE_CODE_"

#: The shortest wall-clock limit a run gets, whatever a call or the config asks for.
MIN_TIMEOUT_MS = 1000

#: What a sandboxed kernel cannot see by default: the usual credential stores.
DEFAULT_SANDBOX_HIDDEN: tuple[str, ...] = (
    "~/.ssh",
    "~/.aws",
    "~/.gnupg",
    "~/.netrc",
    "~/.docker",
    "~/.kube",
    "~/.config/gcloud",
    "~/.azure",
    "~/.git-credentials",
    "~/.pypirc",
    # Sockets that would lead out of the sandbox: agents, D-Bus (systemd-run), Docker.
    "/run/user",
    "/run/dbus",
    "/run/docker.sock",
    "/var/run/docker.sock",
    # The whole home directory (an empty, private tmpfs in its place), so that credential
    # files nobody listed, and those created after a kernel started, stay out of view too;
    # the working directory and sandbox_visible are bound back.
    "~",
)

#: What a sandboxed kernel sees again inside hidden paths (read-only): user site-packages.
DEFAULT_SANDBOX_VISIBLE: tuple[str, ...] = ("~/.local/lib",)

#: Environment variables a sandboxed kernel does not get (shell patterns, any case).
DEFAULT_SANDBOX_ENV_HIDDEN: tuple[str, ...] = (
    "*_TOKEN",
    "*_TOKEN_*",
    "TOKEN",
    "*SECRET*",
    "*PASSWORD*",
    "*PASSWD*",
    "*_KEY",
    "*_KEY_*",
    "*APIKEY*",
    "*CREDENTIAL*",
    "*_AUTH",
    "*_AUTH_*",
    "*_PAT",
    "*_DSN",
    "DATABASE_URL",
    "AWS_*",
    "AZURE_*",
    "GPG_AGENT_INFO",
)

#: Most warm spares a host keeps (each is a running interpreter); larger values are clamped.
MAX_WARM_KERNELS = 8

_TRUE_WORDS = frozenset({"1", "true", "yes", "on"})
_FALSE_WORDS = frozenset({"0", "false", "no", "off"})

_PYTHON_HINT = f"set python_path (or {ENV_PREFIX}PYTHON_PATH) to"


# --- conversions: one per setting, named by its trait's ``convert`` metadata -------------------

#: What a conversion returns for a value it cannot use.
_INVALID: Any = object()


def _coerce_path(raw: Any) -> Any:
    return os.fspath(raw) if isinstance(raw, (str, os.PathLike)) else _INVALID


def _coerce_mode(raw: Any) -> Any:
    # Only the exact string "session" selects session mode; anything else is per_call
    # (a string other than "per_call" is warned about where the trait normalises it).
    if not isinstance(raw, str):
        logger.warning("execute_code: kernel_mode %r is not 'session'; using per_call", raw)
        return "per_call"
    return raw


def _coerce_sandbox(raw: Any) -> Any:
    # "none" and the false words mean no sandbox. Any other string is kept as given: an
    # unknown sandbox is refused when a kernel starts, never run unsandboxed.
    if isinstance(raw, bool):
        return "none" if raw is False else _INVALID
    if not isinstance(raw, str):
        return _INVALID
    word = raw.strip().lower()
    return "none" if word in ("", "none") or word in _FALSE_WORDS else word


def _coerce_url(raw: Any) -> Any:
    # Blank means "no gateway" (kernels run locally); anything else must be an http(s) URL.
    if not isinstance(raw, str):
        return _INVALID
    url = raw.strip().rstrip("/")
    return url if not url or url.startswith(("http://", "https://")) else _INVALID


def _coerce_text(raw: Any) -> Any:
    return raw.strip() if isinstance(raw, str) else _INVALID


def _coerce_cwd_mode(raw: Any) -> Any:
    word = raw.strip().lower() if isinstance(raw, str) else None
    return word if word in ("rw", "ro") else _INVALID


def _coerce_paths(raw: Any) -> Any:
    if isinstance(raw, str):
        items: list[Any] = raw.split(",")
    elif isinstance(raw, (list, tuple)):
        items = list(raw)
    else:
        return _INVALID
    return [os.fspath(i).strip() for i in items if isinstance(i, (str, os.PathLike))]


def _coerce_bool(raw: Any) -> Any:
    if isinstance(raw, bool):
        return raw
    if isinstance(raw, str):
        word = raw.strip().lower()
        if word in _TRUE_WORDS:
            return True
        if word in _FALSE_WORDS:
            return False
    return _INVALID


def _coerce_int(raw: Any) -> Any:
    # bool is an int subclass, but "timeout_ms = true" is a mistake, not 1.
    if isinstance(raw, bool):
        return _INVALID
    if isinstance(raw, int):
        return raw
    if isinstance(raw, str):
        text = raw.strip()
        try:
            return int(text)
        except ValueError:
            try:
                raw = float(text)
            except ValueError:
                return _INVALID
    if isinstance(raw, float):
        # Floats truncate toward zero; NaN and infinities have no integer meaning.
        return int(raw) if math.isfinite(raw) else _INVALID
    return _INVALID


def _coerce_tools(raw: Any) -> Any:
    if isinstance(raw, str):
        items: list[Any] = raw.split(",")
    elif isinstance(raw, (list, tuple)):
        items = list(raw)
    else:
        return _INVALID
    # Unknown names are kept here and warned about (once) when the setting is assigned.
    return [item.strip() for item in items if isinstance(item, str) and item.strip()]


# --- trait types ---------------------------------------------------------------------------------


_G = TypeVar("_G")
_S = TypeVar("_S")


class _Validating(TraitType[_G, _S]):
    """Declares, for the type checker only, the ``validate`` that the concrete trait class
    after :class:`_Coerced` in the MRO (``Bool``, ``Int``, ...) provides at run time."""

    if TYPE_CHECKING:

        def validate(self, obj: Any, value: Any) -> Any: ...


class _Coerced(_Validating[_G, _S]):
    """A setting: converts an assigned value with its ``convert`` metadata before checking.

    ``convert`` is the loader's own conversion for the setting (the one TOML, environment
    and override values go through), so ``ExecuteCodeConfig(timeout_ms=2.9)`` or
    ``config.kernel_mode = True`` mean exactly what the same value means in TOML or the
    environment, never a ``TraitError``: a value it cannot use is ignored with a warning and
    the value in force stays.
    """

    def convert(self, value: Any) -> Any:
        """``value`` in this setting's type, or ``_INVALID``."""
        return self.metadata["convert"](value)

    def validate(self, obj: HasTraits, value: Any) -> Any:
        parsed = self.convert(value)
        if parsed is _INVALID:
            logger.warning("execute_code: ignoring unusable value %r for %s", value, self.name)
            if self.name in obj._trait_values:
                return obj._trait_values[self.name]
            parsed = self.default()
        return super().validate(obj, parsed)


class _Bool(_Coerced[bool, Any], Bool[bool, Any]):
    pass


class _Int(_Coerced[int, Any], Integer[int, Any]):
    """An integer setting, clamped into its ``clamp`` metadata ``(low, high or None)``."""

    def validate(self, obj: HasTraits, value: Any) -> Any:
        number = super().validate(obj, value)
        low, high = self.metadata.get("clamp", (None, None))
        if low is not None:
            number = max(low, number)
        if high is not None:
            number = min(number, high)
        return number


class _Str(_Coerced[str, Any], Unicode[str, Any]):
    pass


class _List(_Coerced[list[Any], Any], List[Any]):
    def set(self, obj: HasTraits, value: Any) -> None:
        # List.set wraps a lone string in a list; the loader splits it on commas instead.
        super().set(obj, self.convert(value) if isinstance(value, str) else value)


# ``clamp`` metadata: the spec clamps its limits to positive integers.
_POSITIVE = (1, None)
_NON_NEGATIVE = (0, None)


class ExecuteCodeConfig(Configurable):
    """Validated settings of the execute_code tool.

    Construct directly (``ExecuteCodeConfig(timeout_ms=5000)``) or, for the layered
    TOML/environment/override lookup, with :meth:`load`. A value set either way goes through
    the same conversion and clamping rules (``"2.9"``, ``2.9`` -> 2 -> clamped to at least 1;
    ``kernel_mode=True`` -> ``"per_call"``); one they cannot use is ignored with a warning.
    """

    enabled = _Bool(
        False,
        help="Whether the execute_code tool is offered at all. Front ends may default it on "
        "(see ExecuteCodeConfig.load(default_enabled=...)).",
    ).tag(config=True, convert=_coerce_bool)

    python_path = _Str(
        "",
        help="Python interpreter that runs the kernels (it needs ipykernel). Blank means "
        "python3 found on PATH when it has ipykernel, else the host's own interpreter; a "
        "relative path is resolved against the working directory.",
    ).tag(config=True, convert=_coerce_path)

    timeout_ms = _Int(
        120_000,
        help="Wall-clock limit of one run, in milliseconds (a call's timeout_ms may lower it).",
    ).tag(config=True, convert=_coerce_int, clamp=_POSITIVE)

    max_rpc_calls = _Int(
        100,
        help="Most helper (host-tool) calls one run may make.",
    ).tag(config=True, convert=_coerce_int, clamp=_POSITIVE)

    max_rpc_result_bytes = _Int(
        5_242_880,
        help="Most bytes of helper results one run may receive.",
    ).tag(config=True, convert=_coerce_int, clamp=_POSITIVE)

    max_output_bytes = _Int(
        50_000,
        help="Most bytes of printed output returned per run; longer output loses its middle "
        "and is saved to a spill file (up to max_spill_bytes).",
    ).tag(config=True, convert=_coerce_int, clamp=_POSITIVE)

    max_text_bytes = _Int(
        65_536,
        help="Most bytes of text() blocks (the script's result) per run.",
    ).tag(config=True, convert=_coerce_int, clamp=_POSITIVE)

    max_parallel_rpc = _Int(
        4,
        help="Most helper calls one run may have in flight at once.",
    ).tag(config=True, convert=_coerce_int, clamp=_POSITIVE)

    max_parallel_mcp = _Int(
        16,
        help="lemon_exec extra: most calls of upstream MCP server tools (tools.<server>.<tool>) "
        "one run may have in flight at once, on a lane of their own beside max_parallel_rpc.",
    ).tag(config=True, convert=_coerce_int, clamp=_POSITIVE)

    tools = _List(
        Unicode(),
        default_value=[],
        help="Narrows the helper allowlist (read, grep, find, ls, webfetch). Empty means the "
        "full allowlist; unknown names are dropped; a list of only unknown names allows none.",
    ).tag(config=True, convert=_coerce_tools)

    kernel_mode = _Str(
        "per_call",
        help='"session" keeps one kernel per session; any other value means "per_call", a '
        "fresh kernel for every call.",
    ).tag(config=True, convert=_coerce_mode)

    kernel_idle_timeout_ms = _Int(
        1_800_000,
        help="A session kernel idle for this many milliseconds is shut down.",
    ).tag(config=True, convert=_coerce_int, clamp=_POSITIVE)

    max_live_kernels = _Int(
        16,
        help="Most session kernels alive at once (a strict cap; starting kernels count). "
        "Admission evicts the least recently used idle one; if none is idle the call runs "
        "isolated (fallback_reason capacity_exhausted). Per-call kernels are not counted.",
    ).tag(config=True, convert=_coerce_int, clamp=_POSITIVE)

    max_queued_cells_per_kernel = _Int(
        8,
        help="Most calls waiting for one session kernel; further calls are refused.",
    ).tag(config=True, convert=_coerce_int, clamp=_POSITIVE)

    warm_kernels = _Int(
        1,
        help="Per-call kernels started ahead of time so a call need not wait for startup; "
        "0 disables warm spares; at most 8 (larger values are clamped).",
    ).tag(config=True, convert=_coerce_int, clamp=(0, MAX_WARM_KERNELS))

    fork_server = _Bool(
        True,
        help="Start kernels by forking a template process that has already imported the "
        "kernel's modules (about 4x cheaper than a fresh interpreter). Off: every kernel is "
        "a new process launched by jupyter_client.",
    ).tag(config=True, convert=_coerce_bool)

    max_concurrent_per_call = _Int(
        0,
        help="Most per-call runs (kernels) at once; further calls wait in a bounded queue. "
        "0 means automatic: max(2, min(4 x CPU cores, 8 x available memory in GiB)).",
    ).tag(config=True, convert=_coerce_int, clamp=_NON_NEGATIVE)

    max_queued_per_call = _Int(
        64,
        help="Most per-call runs waiting for a free slot; further calls get a busy result at "
        "once. The wait counts against the call's timeout. 0: no queue.",
    ).tag(config=True, convert=_coerce_int, clamp=_NON_NEGATIVE)

    max_spill_bytes = _Int(
        64 * 2**20,
        help="Most bytes of one run's output saved to its spill file (default 64 MiB); "
        "output past it is counted but not stored, and the result says the file is capped.",
    ).tag(config=True, convert=_coerce_int, clamp=_POSITIVE)

    kernel_memory_mb = _Int(
        0,
        help="Most memory, in MiB, a kernel and its descendants may use together (a cgroup; "
        "without one, RLIMIT_AS per process: a MemoryError). Over it the script is killed: "
        '"Script killed: memory limit (N MB) exceeded." 0: unlimited.',
    ).tag(config=True, convert=_coerce_int, clamp=_NON_NEGATIVE)

    kernel_max_processes = _Int(
        0,
        help="Most processes (and threads) a kernel and its descendants may have at once, so "
        "a fork bomb is contained (a cgroup's pids.max; without one RLIMIT_NPROC, which root "
        "ignores, so as root without a cgroup the run is refused). 0: unlimited.",
    ).tag(config=True, convert=_coerce_int, clamp=_NON_NEGATIVE)

    kernel_max_open_files = _Int(
        0,
        help="Most open file descriptors per kernel process (RLIMIT_NOFILE). 0: unlimited "
        "(the inherited limit).",
    ).tag(config=True, convert=_coerce_int, clamp=_NON_NEGATIVE)

    sandbox = _Str(
        "none",
        help='"bwrap" runs every kernel under bubblewrap (read-only filesystem, hidden '
        "credential stores and staging root, no network, own PID namespace; see "
        'docs/sandbox.md). "none" (default): kernels have the host user\'s authority. A '
        "sandbox that cannot start is refused, never replaced by an unsandboxed run.",
    ).tag(config=True, convert=_coerce_sandbox)

    sandbox_cwd = _Str(
        "rw",
        help='Under the sandbox, whether the working directory is writable ("rw", default) '
        'or read-only ("ro").',
    ).tag(config=True, convert=_coerce_cwd_mode)

    sandbox_hidden = _List(
        Unicode(),
        default_value=list(DEFAULT_SANDBOX_HIDDEN),
        help="Paths a sandboxed kernel cannot see (an empty directory or file in their "
        "place); ~ is the host's HOME. Default: the common credential stores and the agent, "
        "D-Bus and Docker sockets, and ~ itself (but for the working directory and "
        "sandbox_visible). Every kernel's keys and sockets are always hidden apart from the "
        "kernel's own.",
    ).tag(config=True, convert=_coerce_paths)

    sandbox_visible = _List(
        Unicode(),
        default_value=list(DEFAULT_SANDBOX_VISIBLE),
        help="Paths inside hidden ones (sandbox_hidden, whose default hides ~) that a "
        "sandboxed kernel still sees, read-only; ~ is the host's HOME. Default: ~/.local/lib "
        "(user site-packages). The working directory and the interpreter's installation are "
        "always visible.",
    ).tag(config=True, convert=_coerce_paths)

    sandbox_env_hidden = _List(
        Unicode(),
        default_value=list(DEFAULT_SANDBOX_ENV_HIDDEN),
        help="Environment variables a sandboxed kernel does not get: shell patterns matched "
        "against each name in any case (*_TOKEN, *SECRET*, *_KEY, AWS_*, ...; see "
        "docs/sandbox.md). A list replaces the default.",
    ).tag(config=True, convert=_coerce_paths)

    sandbox_env_allowed = _List(
        Unicode(),
        default_value=[],
        help="Environment variables a sandboxed kernel keeps although sandbox_env_hidden "
        "matches them (names or shell patterns, any case). Default: none.",
    ).tag(config=True, convert=_coerce_paths)

    sandbox_network = _Bool(
        False,
        help="Under the sandbox, whether kernels keep the host's network. Off (default): "
        "only their own loopback; services on the host's loopback are unreachable.",
    ).tag(config=True, convert=_coerce_bool)

    gateway_url = _Str(
        "",
        help="Base URL of a Jupyter Enterprise Gateway (http or https, e.g. "
        '"http://eg.example:8888") to run every kernel behind; blank (default): kernels run '
        "on this machine. See docs/scale-out.md.",
    ).tag(config=True, convert=_coerce_url)

    gateway_auth_token = _Str(
        "",
        help="The Enterprise Gateway's auth token (sent as 'Authorization: token ...'); blank: "
        "none. A secret: prefer the environment variable to a TOML file.",
    ).tag(config=True, convert=_coerce_text)

    gateway_kernel_name = _Str(
        "lemon-python",
        help="The kernelspec the Enterprise Gateway starts (it must run the lemon-python kernel).",
    ).tag(config=True, convert=_coerce_text)

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
        configured = self.python_path
        if not configured.strip():
            # python3 on PATH, or the host's interpreter when that one lacks ipykernel.
            from lemon_exec.interpreter import default_python

            return default_python()

        path = os.path.expanduser(configured)
        if not os.path.isabs(path):
            base = os.fspath(cwd) if cwd is not None else os.getcwd()
            path = os.path.join(base, path)
        path = os.path.abspath(path)
        if not os.path.exists(path):
            raise InterpreterError(
                f"execute_code: python_path not found: {path}; "
                f"{_PYTHON_HINT} an existing Python interpreter"
            )
        if not os.path.isfile(path) or not os.access(path, os.X_OK):
            raise InterpreterError(
                f"execute_code: python_path is not executable: {path}; "
                f"{_PYTHON_HINT} an executable Python interpreter"
            )
        return path

    # --- layered loading ---------------------------------------------------------------------

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
        unknown = sorted(set(overrides) - set(SETTING_KEYS))
        if unknown:
            raise TypeError(f"ExecuteCodeConfig.load: unknown setting(s): {', '.join(unknown)}")

        values = _defaults()
        values["enabled"] = bool(default_enabled)
        _merge(values, _read_toml(toml_path), "TOML")
        _merge(values, _read_environ(environ), "environment")
        _merge(values, {k: v for k, v in overrides.items() if v is not None}, "override")
        return cls(**values)

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
        values: dict[str, Any] = {"enabled": None}
        _merge(values, _pick(_read_toml(toml_path), "enabled"), "TOML")
        _merge(values, _pick(_read_environ(environ), "enabled"), "environment")
        return values["enabled"] is False


def _collect_settings() -> dict[str, _Coerced[Any, Any]]:
    """Every setting's trait in definition order, each tagged with its ``env`` variable."""
    settings = {
        name: trait
        for name, trait in vars(ExecuteCodeConfig).items()
        if isinstance(trait, _Coerced) and trait.metadata.get("config")
    }
    for name, trait in settings.items():
        trait.metadata.setdefault("env", ENV_PREFIX + name.upper())
    return settings


_SETTINGS = _collect_settings()

#: Every setting, in documentation order: the spec's 13 keys, then lemon_exec's extras. Each
#: is a key of the TOML table; its trait's ``env`` metadata names its environment variable.
SETTING_KEYS: tuple[str, ...] = tuple(_SETTINGS)


def canonical_python(path: str | os.PathLike[str]) -> str:
    """Return ``path`` absolute with every symlink resolved: one interpreter, one key.

    Used to key session kernels, so ``/usr/bin/python3`` and the ``python3.11`` it points
    to share a session.
    """
    return os.path.realpath(os.path.abspath(os.fspath(path)))


# --- loading helpers ----------------------------------------------------------------------------


def _defaults() -> dict[str, Any]:
    values: dict[str, Any] = {key: trait.default() for key, trait in _SETTINGS.items()}
    values["tools"] = list(values["tools"])
    return values


def _pick(raw: dict[str, Any], key: str) -> dict[str, Any]:
    return {key: raw[key]} if key in raw else {}


def _read_toml(toml_path: str | os.PathLike[str] | None) -> dict[str, Any]:
    """Return the execute_code table of ``toml_path`` ({} when the table is absent)."""
    if toml_path is None:
        return {}
    path = Path(toml_path)
    try:
        with path.open("rb") as handle:
            document = tomllib.load(handle)
    except FileNotFoundError:
        raise ConfigError(f"execute_code: config file not found: {path}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"execute_code: could not parse config file {path}: {exc}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"execute_code: could not read config file {path}: {exc}") from None

    table: Any = document
    for part in TOML_TABLE:
        if not isinstance(table, dict):
            break
        table = table.get(part, {})
    if not isinstance(table, dict):
        raise ConfigError(
            f"execute_code: in config file {path}, [{'.'.join(TOML_TABLE)}] is not a table"
        )
    for key in sorted(set(table) - set(SETTING_KEYS)):
        logger.warning("execute_code: ignoring unknown setting %r in %s", key, path)
    return {key: table[key] for key in SETTING_KEYS if key in table}


def _read_environ(environ: Mapping[str, str] | None) -> dict[str, Any]:
    env = os.environ if environ is None else environ
    found: dict[str, Any] = {}
    for key, trait in _SETTINGS.items():
        name = trait.metadata["env"]
        if name in env:
            found[key] = env[name]
    return found


def _merge(values: dict[str, Any], layer: dict[str, Any], source: str) -> None:
    """Apply ``layer`` onto ``values``; a value that does not parse leaves the old one."""
    for key, raw in layer.items():
        parsed = _SETTINGS[key].convert(raw)
        if parsed is _INVALID:
            logger.warning("execute_code: ignoring unusable %s value %r for %s", source, raw, key)
            continue
        values[key] = parsed
