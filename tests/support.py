"""Small helpers shared by test modules (imported as ``support``; tests/ is on sys.path)."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from lemon_exec import ExecuteCode


@contextlib.contextmanager
def configured(ec: ExecuteCode, **values: Any) -> Iterator[None]:
    """Change settings of a shared facade for one test; limits are read afresh per cell."""
    saved = {key: getattr(ec.config, key) for key in values}
    for key, value in values.items():
        setattr(ec.config, key, value)
    try:
        yield
    finally:
        for key, value in saved.items():
            setattr(ec.config, key, value)


def pid_gone(pid: int) -> bool:
    """Whether process ``pid`` has ended (a zombie counts as ended)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except (FileNotFoundError, ProcessLookupError):  # gone before, or while, reading
        return True
    return bool(re.search(r"^State:\s+Z", status, re.M))
