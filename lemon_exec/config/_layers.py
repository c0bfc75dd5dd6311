"""Layered loading of the settings: TOML file, then environment, then keyword overrides.

Each layer overrides the one before it; a value a layer cannot parse is ignored with a
warning, so the lower layer's value (or the default) stays in force. The functions take the
settings' traits (name → trait, in documentation order) from the caller, which builds them
from :class:`~lemon_exec.config.ExecuteCodeConfig`.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lemon_exec.config._convert import INVALID, logger
from lemon_exec.config._defaults import TOML_TABLE
from lemon_exec.config._traits import Coerced
from lemon_exec.errors import ConfigError

Settings = Mapping[str, Coerced[Any, Any]]


def layered_values(
    settings: Settings,
    toml_path: str | os.PathLike[str] | None,
    environ: Mapping[str, str] | None,
    default_enabled: bool,
    overrides: Mapping[str, Any],
) -> dict[str, Any]:
    """Every setting's value: the defaults, then TOML, the environment and ``overrides``.

    Raises ``ConfigError`` for a missing or unparseable TOML file and ``TypeError`` for an
    unknown override name; an override of ``None`` means "not given".
    """
    unknown = sorted(set(overrides) - set(settings))
    if unknown:
        raise TypeError(f"ExecuteCodeConfig.load: unknown setting(s): {', '.join(unknown)}")
    values: dict[str, Any] = {key: trait.default() for key, trait in settings.items()}
    values["tools"] = list(values["tools"])
    values["enabled"] = bool(default_enabled)
    _merge(settings, values, _read_toml(settings, toml_path), "TOML")
    _merge(settings, values, _read_environ(settings, environ), "environment")
    _merge(settings, values, {k: v for k, v in overrides.items() if v is not None}, "override")
    return values


def explicitly_disabled(
    settings: Settings,
    toml_path: str | os.PathLike[str] | None,
    environ: Mapping[str, str] | None,
) -> bool:
    """Whether the TOML file or the environment turns ``enabled`` off (the environment wins)."""
    values: dict[str, Any] = {"enabled": None}
    _merge(settings, values, _pick(_read_toml(settings, toml_path), "enabled"), "TOML")
    _merge(settings, values, _pick(_read_environ(settings, environ), "enabled"), "environment")
    return values["enabled"] is False


def _pick(raw: dict[str, Any], key: str) -> dict[str, Any]:
    return {key: raw[key]} if key in raw else {}


def _read_toml(settings: Settings, toml_path: str | os.PathLike[str] | None) -> dict[str, Any]:
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
    for key in sorted(set(table) - set(settings)):
        logger.warning("execute_code: ignoring unknown setting %r in %s", key, path)
    return {key: table[key] for key in settings if key in table}


def _read_environ(settings: Settings, environ: Mapping[str, str] | None) -> dict[str, Any]:
    env = os.environ if environ is None else environ
    found: dict[str, Any] = {}
    for key, trait in settings.items():
        name = trait.metadata["env"]
        if name in env:
            found[key] = env[name]
    return found


def _merge(settings: Settings, values: dict[str, Any], layer: dict[str, Any], source: str) -> None:
    """Apply ``layer`` onto ``values``; a value that does not parse leaves the old one."""
    for key, raw in layer.items():
        parsed = settings[key].convert(raw)
        if parsed is INVALID:
            logger.warning("execute_code: ignoring unusable %s value %r for %s", source, raw, key)
            continue
        values[key] = parsed
