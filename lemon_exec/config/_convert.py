"""The conversions of setting values: one per setting, named by its trait's ``convert`` tag.

Every layer (TOML, environment, keyword overrides) and every assignment to a setting goes
through its conversion, so a value means the same wherever it is given. A conversion
returns :data:`INVALID` for a value it cannot use; the caller then keeps the value in force
and logs a warning.
"""

from __future__ import annotations

import logging
import math
import os
from typing import Any

#: One logger for the settings, whichever of the package's modules warns.
logger = logging.getLogger("lemon_exec.config")

#: What a conversion returns for a value it cannot use.
INVALID: Any = object()

_TRUE_WORDS = frozenset({"1", "true", "yes", "on"})
_FALSE_WORDS = frozenset({"0", "false", "no", "off"})


def coerce_path(raw: Any) -> Any:
    return os.fspath(raw) if isinstance(raw, (str, os.PathLike)) else INVALID


def coerce_mode(raw: Any) -> Any:
    # Only the exact string "session" selects session mode; anything else is per_call
    # (a string other than "per_call" is warned about where the trait normalises it).
    if not isinstance(raw, str):
        logger.warning("execute_code: kernel_mode %r is not 'session'; using per_call", raw)
        return "per_call"
    return raw


def coerce_sandbox(raw: Any) -> Any:
    # "none" and the false words mean no sandbox. Any other string is kept as given: an
    # unknown sandbox is refused when a kernel starts, never run unsandboxed.
    if isinstance(raw, bool):
        return "none" if raw is False else INVALID
    if not isinstance(raw, str):
        return INVALID
    word = raw.strip().lower()
    return "none" if word in ("", "none") or word in _FALSE_WORDS else word


def coerce_url(raw: Any) -> Any:
    # Blank means "no gateway" (kernels run locally); anything else must be an http(s) URL.
    if not isinstance(raw, str):
        return INVALID
    url = raw.strip().rstrip("/")
    return url if not url or url.startswith(("http://", "https://")) else INVALID


def coerce_text(raw: Any) -> Any:
    return raw.strip() if isinstance(raw, str) else INVALID


def coerce_cwd_mode(raw: Any) -> Any:
    word = raw.strip().lower() if isinstance(raw, str) else None
    return word if word in ("rw", "ro") else INVALID


def coerce_paths(raw: Any) -> Any:
    if isinstance(raw, str):
        items: list[Any] = raw.split(",")
    elif isinstance(raw, (list, tuple)):
        items = list(raw)
    else:
        return INVALID
    return [os.fspath(i).strip() for i in items if isinstance(i, (str, os.PathLike))]


def coerce_bool(raw: Any) -> Any:
    if isinstance(raw, bool):
        return raw
    if isinstance(raw, str):
        word = raw.strip().lower()
        if word in _TRUE_WORDS:
            return True
        if word in _FALSE_WORDS:
            return False
    return INVALID


def coerce_int(raw: Any) -> Any:
    # bool is an int subclass, but "timeout_ms = true" is a mistake, not 1.
    if isinstance(raw, bool):
        return INVALID
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
                return INVALID
    if isinstance(raw, float):
        # Floats truncate toward zero; NaN and infinities have no integer meaning.
        return int(raw) if math.isfinite(raw) else INVALID
    return INVALID


def coerce_tools(raw: Any) -> Any:
    if isinstance(raw, str):
        items: list[Any] = raw.split(",")
    elif isinstance(raw, (list, tuple)):
        items = list(raw)
    else:
        return INVALID
    # Unknown names are kept here and warned about (once) when the setting is assigned.
    return [item.strip() for item in items if isinstance(item, str) and item.strip()]
