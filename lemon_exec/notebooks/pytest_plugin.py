"""Pytest plugin: scenario notebooks are tests (registered as ``lemon_exec_notebooks``).

Collected: ``*.ipynb`` files inside a folder named ``notebooks`` (at any depth below the
rootdir), files matching the ``lemon_notebooks`` ini globs, and notebooks named on the
command line; of those, only notebooks that declare themselves scenarios (a ``lemon`` entry
in the notebook metadata, or the ``lemon-python`` kernelspec), so an unrelated project's
notebooks are never picked up. Each notebook is one test: it runs through the real engine
(:mod:`lemon_exec.notebooks.runner`) and passes when every call met its expectations and
its normalised result matches the outputs stored in the notebook.

``--lemon-regen`` rewrites the stored (golden) outputs in place instead of comparing.

Scenario notebooks are not for nbmake or nbval (their cells need the host). When such a
plugin also collects ``.ipynb`` files (``--nbmake``, ``--nbval``), each notebook is collected
once: a scenario only by this plugin, any other notebook only by the other plugin.

When pytest runs from its ``testpaths`` (no paths on the command line), the folders of the
``lemon_notebook_dirs`` ini option (default: ``notebooks``) that hold scenarios are added to
the run, so ``python -m pytest`` at a project's root runs its scenarios too.

This module is imported by every pytest run in an environment where lemon_exec is
installed, so it imports nothing heavy at import time and never fails collection when
nbformat is missing: such notebooks are reported as skipped, with the reason.
"""

from __future__ import annotations

import fnmatch
import json
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from pluggy import Result

__all__ = [
    "ScenarioFailure",
    "ScenarioFile",
    "ScenarioItem",
    "pytest_addoption",
    "pytest_collect_file",
    "pytest_configure",
]

#: Timeout (seconds) for one scenario notebook, when pytest-timeout is installed.
SCENARIO_TIMEOUT_S = 300

_MARKER = "lemon_notebook"


def pytest_addoption(parser: pytest.Parser) -> None:
    """``--lemon-regen`` and the ini options ``lemon_notebooks`` / ``lemon_notebook_dirs``."""
    group = parser.getgroup("lemon_exec", "lemon_exec scenario notebooks")
    group.addoption(
        "--lemon-regen",
        action="store_true",
        default=False,
        dest="lemon_regen",
        help="run scenario notebooks and rewrite their stored (golden) outputs in place "
        "instead of comparing with them",
    )
    parser.addini(
        "lemon_notebooks",
        type="linelist",
        default=[],
        help="extra glob patterns (relative to the rootdir) of scenario notebooks outside "
        "'notebooks' folders",
    )
    parser.addini(
        "lemon_notebook_dirs",
        type="linelist",
        default=["notebooks"],
        help="folders (relative to the rootdir) of scenario notebooks added to a run that "
        "uses testpaths; empty to add none",
    )


def pytest_configure(config: pytest.Config) -> None:
    """Register the marker; add scenario folders to a testpaths run."""
    config.addinivalue_line("markers", f"{_MARKER}: a lemon_exec scenario notebook")
    # Config.args_source appeared in pytest 7.2; older versions never auto-add.
    testpaths = getattr(getattr(pytest.Config, "ArgsSource", None), "TESTPATHS", None)
    if testpaths is None or getattr(config, "args_source", None) is not testpaths:
        return
    root = config.rootpath
    covered = [Path(arg.split("::")[0]).resolve() for arg in config.args]
    for name in config.getini("lemon_notebook_dirs"):
        folder = (root / name).resolve()
        if not folder.is_dir() or any(folder == c or c in folder.parents for c in covered):
            continue
        if any(
            _declares_scenario(p)
            for p in folder.rglob("*.ipynb")
            if ".ipynb_checkpoints" not in p.parts
        ):
            config.args.append(str(folder))


@pytest.hookimpl(hookwrapper=True)
def pytest_collect_file(
    file_path: Path, parent: pytest.Collector
) -> Generator[None, Result[list[pytest.Collector]], None]:
    """Collect scenario notebooks (see the module docstring for which), each exactly once.

    A wrapper, so it sees what other plugins (nbmake, nbval) collected for the same file.
    """
    outcome = yield
    if file_path.suffix != ".ipynb" or ".ipynb_checkpoints" in file_path.parts:
        return
    config = parent.config
    explicit = parent.session.isinitpath(file_path) or _configured(file_path, config)
    if not explicit and not _in_notebooks_dir(file_path, config.rootpath):
        return
    scenario = _declares_scenario(file_path)
    if not scenario and not explicit:
        return
    others = [c for c in outcome.get_result() or [] if c is not None]
    if scenario:
        # Another notebook plugin would run it without a host, where every helper fails.
        outcome.force_result([ScenarioFile.from_parent(parent, path=file_path)])
    elif not others:  # named explicitly, and nobody else wants it
        outcome.force_result([ScenarioFile.from_parent(parent, path=file_path)])


def _in_notebooks_dir(path: Path, root: Path) -> bool:
    try:
        parts = path.resolve().relative_to(root.resolve()).parts[:-1]
    except ValueError:
        parts = path.parts[:-1]
    return "notebooks" in parts


def _configured(path: Path, config: pytest.Config) -> bool:
    patterns = config.getini("lemon_notebooks")
    if not patterns:
        return False
    try:
        rel = path.resolve().relative_to(config.rootpath.resolve()).as_posix()
    except ValueError:
        return False
    return any(fnmatch.fnmatch(rel, pattern) for pattern in patterns)


def _declares_scenario(path: Path) -> bool:
    """Whether the notebook's metadata marks it a scenario (read as plain JSON, cheaply)."""
    try:
        with open(path, encoding="utf-8") as fh:
            metadata = json.load(fh).get("metadata") or {}
    except (OSError, ValueError, AttributeError):
        return False
    spec = metadata.get("kernelspec") or {}
    return "lemon" in metadata or (isinstance(spec, dict) and spec.get("name") == "lemon-python")


class ScenarioFailure(Exception):
    """A scenario whose calls missed their expectations or whose results changed."""

    def __init__(self, failures: list[str], mismatches: list[str]) -> None:
        super().__init__(failures, mismatches)
        self.failures = failures
        self.mismatches = mismatches

    def __str__(self) -> str:
        lines: list[str] = []
        if self.failures:
            lines.append("Expectations not met:")
            lines += [f"  {msg}" for msg in self.failures]
        if self.mismatches:
            lines.append(
                "Results differ from the stored outputs "
                "(if the change is intended, rerun with --lemon-regen):"
            )
            for msg in self.mismatches:
                lines += [f"  {line}" for line in msg.splitlines()]
        return "\n".join(lines)


class ScenarioFile(pytest.File):
    """A scenario notebook: one test item."""

    def collect(self) -> Iterator[ScenarioItem]:
        try:
            import nbformat  # noqa: F401
        except ImportError:
            pytest.skip(
                "nbformat is not installed: install lemon_exec[notebook] to run scenario notebooks"
            )
        item = ScenarioItem.from_parent(self, name=self.path.stem)
        item.add_marker(_MARKER)
        if self.config.pluginmanager.hasplugin("timeout"):
            item.add_marker(pytest.mark.timeout(SCENARIO_TIMEOUT_S))
        yield item


class ScenarioItem(pytest.Item):
    """Run one scenario notebook; compare with (or, with --lemon-regen, rewrite) its outputs."""

    def runtest(self) -> None:
        from lemon_exec.notebooks import runner

        nb = runner.load_notebook(self.path)
        try:
            result = runner.run_scenario_sync(nb, path=self.path)
        except runner.ScenarioError as exc:
            raise ScenarioFailure([f"invalid scenario metadata: {exc}"], []) from None
        if self.config.getoption("lemon_regen"):
            runner.write_outputs(nb, result, normalized=True)
            runner.save_notebook(nb, self.path)
            if not result.ok:
                raise ScenarioFailure(result.failures(), [])
            return
        mismatches = runner.compare_outputs(nb, result)
        if not result.ok or mismatches:
            raise ScenarioFailure(result.failures(), mismatches)

    def repr_failure(
        self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None
    ) -> str | Any:
        if isinstance(excinfo.value, ScenarioFailure):
            return f"scenario {self.path.name} failed\n{excinfo.value}"
        return super().repr_failure(excinfo, style=style)

    def reportinfo(self) -> tuple[Path, int | None, str]:
        return self.path, None, f"scenario notebook {self.path.name}"
