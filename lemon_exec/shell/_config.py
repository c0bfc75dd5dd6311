"""Environment settings of the shell tool, read afresh on every call.

Reading per call (not once at construction) means a long-lived server picks up a changed
environment, and tests can set the variables with ``monkeypatch.setenv``.
"""

from __future__ import annotations

import math
import os

TIMEOUT_ENV = "DPTTOOLS_SANDBOX_TIMEOUT"
LIMIT_ENV = "DPTTOOLS_OUTPUT_TRUNCATION_LIMIT"

DEFAULT_TIMEOUT = 30.0
DEFAULT_LIMIT = 50_000


def sandbox_timeout() -> float:
    """Return the default timeout and ceiling, in seconds.

    Any value that is not a finite number greater than zero falls back to the default.
    """
    raw = os.environ.get(TIMEOUT_ENV)
    if raw is None:
        return DEFAULT_TIMEOUT
    try:
        value = float(raw.strip())
    except ValueError:
        return DEFAULT_TIMEOUT
    return value if math.isfinite(value) and value > 0 else DEFAULT_TIMEOUT


def output_limit() -> int:
    """Return how many characters of stdout and of stderr are kept.

    Any value that is not a whole number greater than zero falls back to the default.
    """
    raw = os.environ.get(LIMIT_ENV)
    if raw is None:
        return DEFAULT_LIMIT
    try:
        value = int(raw.strip())
    except ValueError:
        return DEFAULT_LIMIT
    return value if value > 0 else DEFAULT_LIMIT


def effective_timeout(requested: float | None) -> float:
    """Turn the caller's ``timeout`` argument into the number of seconds to allow.

    ``None`` means the configured default; anything above the configured ceiling is lowered to
    it. Raises ``TypeError`` for a non-number and ``ValueError`` (whose message is meant for the
    caller) for zero, a negative number or NaN.
    """
    ceiling = sandbox_timeout()
    if requested is None:
        return ceiling
    # bool is an int subclass, but timeout=True is surely a mistake.
    if isinstance(requested, bool) or not isinstance(requested, (int, float)):
        raise TypeError(
            f"timeout must be a number of seconds or None, not {type(requested).__name__}"
        )
    if math.isnan(requested) or requested <= 0:
        raise ValueError(
            f"timeout must be a positive number of seconds, got {requested!r}; "
            "the command was not run."
        )
    return min(float(requested), ceiling)
