"""Settings of the execute_code tool: traits, layered loading and interpreter resolution.

Settings come from three layers, each overriding the one before it:

1. the ``[runtime.tools.execute_code]`` table of a TOML file (only when a path is given),
2. ``LEMON_EXECUTE_CODE_<KEY>`` environment variables,
3. keyword overrides passed to :meth:`ExecuteCodeConfig.load`.

A value a layer cannot parse is ignored with a warning, so the lower layer's value (or the
default) stays in force. Numeric limits are clamped to at least 1 whichever way they are set.
See ``docs/configuration.md`` for the user-facing reference.

The package's private modules, by job: ``_settings`` (:class:`ExecuteCodeConfig`, one trait
per setting), ``_traits`` (the trait types that convert and clamp), ``_convert`` (one
conversion per setting), ``_layers`` (TOML, environment, overrides), ``_python`` (the
interpreter a config names), ``_defaults`` (fixed values and default lists). Import the
names below from ``lemon_exec.config``, not from those modules.
"""

from __future__ import annotations

from lemon_exec.config._defaults import (
    DEFAULT_SANDBOX_ENV_HIDDEN,
    DEFAULT_SANDBOX_HIDDEN,
    DEFAULT_SANDBOX_VISIBLE,
    ENV_PREFIX,
    HELPER_ALLOWLIST,
    MAX_WARM_KERNELS,
    MIN_TIMEOUT_MS,
    TOML_TABLE,
)
from lemon_exec.config._python import canonical_python
from lemon_exec.config._settings import SETTING_KEYS, ExecuteCodeConfig

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
