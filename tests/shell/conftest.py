"""Fixtures for the shell tool tests: real bash, real subprocesses."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from lemon_exec.shell import ShellSession


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Start every test from the defaults, whatever the outer environment says."""
    for name in (
        "DPTTOOLS_SANDBOX_TIMEOUT",
        "DPTTOOLS_OUTPUT_TRUNCATION_LIMIT",
        "BASH_ENV",
        "POSIXLY_CORRECT",
    ):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def session(tmp_path: Path) -> ShellSession:
    """A session that starts in the test's temporary directory."""
    return ShellSession(tmp_path)


@pytest.fixture
def reap_pids() -> Iterator[list[int]]:
    """Pids appended to this list are SIGKILLed after the test, pass or fail."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
