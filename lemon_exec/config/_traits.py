"""The trait types of the settings: each converts an assigned value before checking it.

A setting's ``convert`` metadata is its conversion (:mod:`lemon_exec.config._convert`), and
``clamp`` (low, high or None) bounds an integer. So ``ExecuteCodeConfig(timeout_ms=2.9)`` or
``config.kernel_mode = True`` mean exactly what the same value means in TOML or the
environment, never a ``TraitError``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeVar

from traitlets import Bool, HasTraits, Integer, List, TraitType, Unicode

from lemon_exec.config._convert import INVALID, logger

_G = TypeVar("_G")
_S = TypeVar("_S")

# ``clamp`` metadata: the spec clamps its limits to positive integers.
POSITIVE = (1, None)
NON_NEGATIVE = (0, None)


class _Validating(TraitType[_G, _S]):
    """Declares, for the type checker only, the ``validate`` that the concrete trait class
    after :class:`Coerced` in the MRO (``Bool``, ``Int``, ...) provides at run time."""

    if TYPE_CHECKING:

        def validate(self, obj: Any, value: Any) -> Any: ...


class Coerced(_Validating[_G, _S]):
    """A setting: converts an assigned value with its ``convert`` metadata before checking.

    ``convert`` is the loader's own conversion for the setting (the one TOML, environment
    and override values go through); a value it cannot use is ignored with a warning and
    the value in force stays.
    """

    def convert(self, value: Any) -> Any:
        """``value`` in this setting's type, or ``INVALID``."""
        return self.metadata["convert"](value)

    def validate(self, obj: HasTraits, value: Any) -> Any:
        parsed = self.convert(value)
        if parsed is INVALID:
            logger.warning("execute_code: ignoring unusable value %r for %s", value, self.name)
            if self.name in obj._trait_values:
                return obj._trait_values[self.name]
            parsed = self.default()
        return super().validate(obj, parsed)


class BoolSetting(Coerced[bool, Any], Bool[bool, Any]):
    pass


class IntSetting(Coerced[int, Any], Integer[int, Any]):
    """An integer setting, clamped into its ``clamp`` metadata ``(low, high or None)``."""

    def validate(self, obj: HasTraits, value: Any) -> Any:
        number = super().validate(obj, value)
        low, high = self.metadata.get("clamp", (None, None))
        if low is not None:
            number = max(low, number)
        if high is not None:
            number = min(number, high)
        return number


class StrSetting(Coerced[str, Any], Unicode[str, Any]):
    pass


class ListSetting(Coerced[list[Any], Any], List[Any]):
    def set(self, obj: HasTraits, value: Any) -> None:
        # List.set wraps a lone string in a list; the loader splits it on commas instead.
        super().set(obj, self.convert(value) if isinstance(value, str) else value)
