"""Check a call's params against its tool's spec, with Python-like error messages.

The messages deliberately copy CPython's ``TypeError`` wording (``read() got an unexpected
keyword argument 'x'``), because the script's author -- a model -- already knows what they mean.
"""

from __future__ import annotations

from typing import Any

from lemon_exec.errors import ToolFailure

from ._types import ToolSpec

__all__ = ["validate_params"]


def validate_params(spec: ToolSpec, params: Any) -> dict[str, Any]:
    """Return ``params`` if it is acceptable for ``spec``, else raise :class:`ToolFailure`.

    Checks, in order: ``params`` is a dict with str keys; no unknown keyword; every required
    parameter is present (and not ``None``); every value has one of the declared types.
    """
    name = spec.name
    if not isinstance(params, dict):
        raise ToolFailure(f"{name}() params must be a dict, not {type(params).__name__}")
    for key in params:
        if not isinstance(key, str):
            raise ToolFailure(f"{name}() keywords must be strings")
    accepted = set(spec.parameters)
    for key in params:
        if key not in accepted:
            raise ToolFailure(f"{name}() got an unexpected keyword argument '{key}'")
    missing = [p for p in spec.required if params.get(p) is None]
    if missing:
        raise ToolFailure(_missing_message(name, missing))
    for key, value in params.items():
        expected = spec.param_types.get(key)
        if expected is None or value is None:
            continue  # None on an optional parameter means "use the default"
        if not _is_instance(value, expected):
            raise ToolFailure(
                f"{name}() argument '{key}' must be {_type_names(expected)}, "
                f"not {type(value).__name__}"
            )
    return params


def _missing_message(name: str, missing: list[str]) -> str:
    """Mirror CPython: ``f() missing 2 required positional arguments: 'a' and 'b'``."""
    quoted = [f"'{m}'" for m in missing]
    if len(quoted) == 1:
        listed = quoted[0]
    elif len(quoted) == 2:
        listed = f"{quoted[0]} and {quoted[1]}"
    else:
        listed = ", ".join(quoted[:-1]) + f", and {quoted[-1]}"
    plural = "argument" if len(missing) == 1 else "arguments"
    return f"{name}() missing {len(missing)} required positional {plural}: {listed}"


def _is_instance(value: Any, expected: type | tuple[type, ...]) -> bool:
    types = expected if isinstance(expected, tuple) else (expected,)
    # bool is a subclass of int, but read(path, limit=True) is a bug, not a limit of 1.
    if isinstance(value, bool) and bool not in types:
        return False
    return isinstance(value, types)


def _type_names(expected: type | tuple[type, ...]) -> str:
    types = expected if isinstance(expected, tuple) else (expected,)
    names = [t.__name__ for t in types]
    return names[0] if len(names) == 1 else " or ".join(names)
