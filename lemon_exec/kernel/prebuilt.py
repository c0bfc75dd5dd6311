"""The IPython shell, built once in the fork-server template and adopted by forked kernels.

Building a kernel's shell (history, magics, prefilters, display hooks: ~40 ``init_*`` steps)
was about a fifth of a forked kernel's CPU from fork to exit, and every object it touches is
a page the kernel copies from the template (~2 MiB). The template builds it once, before
its heap is frozen (:func:`build`); a forked kernel whose shell would come out the same
adopts it (:func:`adopt`), else it clears it and builds its own as before. "The same"
means:

- the same loaded configuration (the command line aside, which names the connection file):
  a kernel started with other options, or after a config file changed, builds its own;
- the same IPython profile directory;
- the same environment, apart from what the host sets per kernel (``LEMON_EXEC_*``,
  ``JPY_*``): the shell reads ``HOME`` and friends while it initialises;
- no namespace of an embedding application, and the kernel's usual compiler.

What the shell records of the process it was built in is reset on adoption: its kernel and
parent, the environment variables it sets for pagers and colours, and the working directory
(the template's is not the kernel's).
"""

from __future__ import annotations

import copy
import itertools
import os
import sys
from collections.abc import Iterable, Iterator
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

_T = TypeVar("_T")

#: Environment variables the host sets per kernel: they may differ from the template's
#: (pytest's is dropped by every kernel, see LemonKernelApp.initialize).
_PER_KERNEL_ENV = ("LEMON_EXEC_", "JPY_", "PYTEST_CURRENT_TEST")


@dataclass
class _Prebuilt:
    shell: Any
    config: Any
    profile_dir: str
    env: dict[str, str]
    #: The template's module names (see module_names).
    modules: frozenset[str]


_PREBUILT: _Prebuilt | None = None
#: Whether this kernel runs on the template's shell (for tests and diagnostics).
adopted = False
#: The template's module names, kept by a kernel that adopted its shell.
_modules: frozenset[str] | None = None


def build() -> bool:
    """Build the shell in this process (the template), as a kernel would configure it.

    False if that failed (an unreadable profile, say): each kernel then builds its own, and
    meets the failure itself, reported as usual.
    """
    global _PREBUILT
    from ipykernel.compiler import XCachingCompiler

    from lemon_exec.kernel.app import LemonKernelApp
    from lemon_exec.kernel.kernel import LemonShell

    env = dict(os.environ)  # before the shell sets its pager and colour variables
    try:
        # Not the singleton: the kernel builds its own application.
        app = LemonKernelApp()  # type: ignore[no-untyped-call]
        app.configure_shell_config()
        app.init_profile_dir()  # type: ignore[no-untyped-call]
        app.init_config_files()  # type: ignore[no-untyped-call]
        app.load_config_file()  # type: ignore[no-untyped-call]
        config = copy.deepcopy(app.config)
        shell = LemonShell.instance(
            parent=app,
            profile_dir=app.profile_dir,
            user_module=None,
            user_ns=None,
            kernel=None,
            compiler_class=XCachingCompiler,
        )
        profile_dir = str(app.profile_dir.location) if app.profile_dir is not None else ""
    except Exception:
        LemonShell.clear_instance()
        return False
    _PREBUILT = _Prebuilt(shell, config, profile_dir, env, frozenset(sys.modules))
    return True


def adopt(options: dict[str, Any]) -> None:
    """Called by ``LemonShell.instance(**options)`` (the kernel asking for its shell).

    If the template's shell would come out the same, it is made ready for this kernel and
    ``instance()`` returns it; otherwise it is dropped and ``instance()`` builds a new one.
    Only the first call counts: the template's shell is offered once.
    """
    global _PREBUILT, _modules, adopted
    prebuilt, _PREBUILT = _PREBUILT, None
    if prebuilt is None:
        return
    from lemon_exec.kernel.kernel import LemonShell

    kernel = options.get("kernel")
    if kernel is None or not _matches(prebuilt, options, kernel.config):
        LemonShell.clear_instance()
        return
    shell = prebuilt.shell
    shell.parent = options.get("parent", kernel)
    shell.kernel = kernel
    shell.init_environment()  # TERM, PAGER, ... in this kernel's own environment
    shell.starting_dir = os.getcwd()
    shell.history_manager.dir_hist[:] = [Path.cwd()]
    _modules = prebuilt.modules
    adopted = True


def module_names() -> AbstractSet[str]:
    """``set(sys.modules)``, without reading the names the template already listed.

    IPython keeps the modules loaded at start for ``%reset --aggressive``. Copying ~500
    names the template shares touches their objects, and so copies their pages into every
    kernel (~0.4 MiB); the template's own set is used as it is, with the names added since
    the fork (``sys.modules`` keeps insertion order: they are the last ones). Were a module
    removed since, one later name would be missed: it would count as imported after the
    start, which is what ``--aggressive`` unloads.
    """
    names = _modules
    if names is None or len(sys.modules) < len(names):
        return set(sys.modules)
    added = len(sys.modules) - len(names)
    return _ModuleNames(names, set(itertools.islice(reversed(sys.modules), added)))


class _ModuleNames(AbstractSet[str]):
    """The template's module names plus a kernel's own, without copying the former."""

    def __init__(self, shared: frozenset[str], own: set[str]) -> None:
        self._shared = shared
        self._own = own - shared

    def __contains__(self, name: object) -> bool:
        return name in self._own or name in self._shared

    def __iter__(self) -> Iterator[str]:
        return itertools.chain(self._shared, self._own)

    def __len__(self) -> int:
        return len(self._shared) + len(self._own)

    @classmethod
    def _from_iterable(cls, items: Iterable[_T]) -> AbstractSet[_T]:
        return set(items)  # what set operations build (``current - this`` in IPython)


def _matches(prebuilt: _Prebuilt, options: dict[str, Any], config: Any) -> bool:
    from ipykernel.compiler import XCachingCompiler

    if options.get("user_ns") is not None or options.get("user_module") is not None:
        return False  # an embedding application's namespace: the shell must be built on it
    if options.get("compiler_class") is not XCachingCompiler:
        return False
    profile_dir = options.get("profile_dir")
    if profile_dir is None or str(profile_dir.location) != prebuilt.profile_dir:
        return False
    config = copy.deepcopy(config)
    app_section = config.get("IPKernelApp")
    if app_section is not None:
        app_section.pop("connection_file", None)
        if not app_section:
            del config["IPKernelApp"]
    return bool(config == prebuilt.config) and _env(os.environ) == _env(prebuilt.env)


def _env(environ: Any) -> dict[str, str]:
    return {k: v for k, v in environ.items() if not k.startswith(_PER_KERNEL_ENV)}
