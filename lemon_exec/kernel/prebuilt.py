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
(the template's is not the kernel's). The shell also comes with IPython's default extension
(``storemagic``) loaded, and the patterns of IPython's start-up file search compiled.
"""

from __future__ import annotations

import contextlib
import copy
import fnmatch
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
class _AppSetup:
    """What the template's application found in IPython's configuration phase."""

    profile_dir: Any  # its ProfileDir
    config_file_paths: list[str]
    #: Every configuration file its search looked for; it found none of them.
    candidates: tuple[str, ...]


@dataclass
class _Prebuilt:
    shell: Any
    config: Any
    profile_dir: str
    env: dict[str, str]
    #: The template's module names (see module_names).
    modules: frozenset[str]
    #: IPython's default extensions loaded into the shell (see _load_default_extensions).
    extensions: frozenset[str]
    #: The configuration phase a kernel may take over (see app_setup), if any.
    setup: _AppSetup | None


_PREBUILT: _Prebuilt | None = None
#: Whether this kernel runs on the template's shell (for tests and diagnostics).
adopted = False
#: The template's module names, kept by a kernel that adopted its shell.
_modules: frozenset[str] | None = None
#: The default extensions the adopted shell has loaded (empty: not adopted).
_extensions: frozenset[str] = frozenset()


def build(app_class: type[Any], shell_class: type[Any]) -> bool:
    """Build the shell in this process (the template), as a kernel would configure it.

    ``app_class`` and ``shell_class`` are the kernel's application and shell classes
    (``LemonKernelApp``, ``LemonShell``), given by the caller (``app.build_prebuilt``) so
    that this module imports neither. False if that failed (an unreadable profile, say):
    each kernel then builds its own, and meets the failure itself, reported as usual.
    """
    global _PREBUILT
    from ipykernel.compiler import XCachingCompiler

    env = dict(os.environ)  # before the shell sets its pager and colour variables
    try:
        # Not the singleton: the kernel builds its own application.
        app = app_class()
        app.configure_shell_config()
        app.init_profile_dir()
        app.init_config_files()
        app.load_config_file()
        config = copy.deepcopy(app.config)
        shell = shell_class.instance(
            parent=app,
            profile_dir=app.profile_dir,
            user_module=None,
            user_ns=None,
            kernel=None,
            compiler_class=XCachingCompiler,
        )
        profile_dir = str(app.profile_dir.location) if app.profile_dir is not None else ""
        extensions = _load_default_extensions(app, shell)
        setup = _app_setup(app)
    except Exception:
        shell_class.clear_instance()
        return False
    _warm_startup_file_search()
    modules = frozenset(sys.modules)
    _PREBUILT = _Prebuilt(shell, config, profile_dir, env, modules, extensions, setup)
    return True


def app_setup(argv: list[str] | None) -> _AppSetup | None:
    """The template's configuration phase, if it is this kernel's; else None.

    IPython's configuration phase (``BaseIPythonApplication.initialize``: the profile
    directory, then the configuration files) comes out the same in a kernel as in the
    template when the command line is the host's plain ``-f FILE``, the environment is the
    template's (``IPYTHONDIR``, ``HOME``, ``JUPYTER_CONFIG_DIR``, ... decide where it
    looks), and there is still no configuration file where the template looked. A kernel
    then takes the template's profile directory instead of finding it again, and loads no
    file (``LemonKernelApp``'s ``_ConfigPhase``).
    """
    prebuilt = _PREBUILT
    if prebuilt is None or prebuilt.setup is None:
        return None
    if not is_host_command_line(sys.argv[1:] if argv is None else list(argv)):
        return None
    if not _same_env(prebuilt) or any(map(os.path.isfile, prebuilt.setup.candidates)):
        return None
    return prebuilt.setup


def is_host_command_line(args: list[str]) -> bool:
    """Whether ``args`` is the host's plain ``-f FILE``, what every kernel it starts gets."""
    return len(args) == 2 and args[0] == "-f" and not args[1].startswith("-")


def _app_setup(app: Any) -> _AppSetup | None:
    """The template application's configuration phase, when a kernel may take it over.

    Only when it loaded no configuration file: a file's effect is known only by loading
    it, and a Python one may do anything. The candidates are the files traitlets looks for
    (``<dir>/<name>.py`` and ``.json`` for ``ipython_config`` and the application's own,
    in every configuration directory).
    """
    from traitlets.utils import expand_path

    paths = list(app.config_file_paths)
    if app.loaded_config_files or app.extra_config_file or app.profile_dir is None:
        return None
    if not all(os.path.isabs(path) for path in paths):
        return None  # relative to the working directory, which is the kernel's own
    names = ["ipython_config.py", *(name for name in app.config_files if name)]
    candidates = tuple(
        expand_path(os.path.join(path, os.path.splitext(name)[0] + ext))
        for name in dict.fromkeys(names)
        for path in paths
        for ext in (".py", ".json")
    )
    return _AppSetup(app.profile_dir, paths, candidates)


def _load_default_extensions(app: Any, shell: Any) -> frozenset[str]:
    """Load IPython's default extensions (``storemagic``) into the template's shell.

    A kernel would load them at start, after a failed search for a top-level module of the
    same name (IPython's older layout); loaded here, a kernel that adopts the shell skips
    them (``LemonKernelApp.init_extensions``), and with them the search: a module named
    ``storemagic`` in a kernel's working directory is not looked for. Not done when
    ``StoreMagics`` is configured at all: ``autorestore`` reads the store as the extension
    loads, which must happen in the kernel.
    """
    if "StoreMagics" in app.config:
        return frozenset()
    loaded = set()
    for name in app.default_extensions:
        with contextlib.suppress(Exception):  # the kernel meets (and reports) it again
            shell.extension_manager.load_extension(name)
            loaded.add(name)
    return frozenset(loaded)


def _warm_startup_file_search() -> None:
    """Compile the patterns of IPython's start-up file search (``*.py``, ``*.ipy``) once.

    fnmatch caches a pattern's regular expression on first use; without this, every
    kernel ran the ``re`` compiler for them.
    """
    for pattern in ("*.py", "*.ipy"):
        fnmatch.filter((), pattern)


def adopt(shell_class: type[Any], options: dict[str, Any]) -> None:
    """Called by ``shell_class.instance(**options)`` (the kernel asking for its shell).

    If the template's shell would come out the same, it is made ready for this kernel and
    ``instance()`` returns it; otherwise it is dropped (``shell_class``'s singleton cleared)
    and ``instance()`` builds a new one. Only the first call counts: the template's shell
    is offered once.
    """
    global _PREBUILT, _modules, _extensions, adopted
    prebuilt, _PREBUILT = _PREBUILT, None
    if prebuilt is None:
        return
    kernel = options.get("kernel")
    if kernel is None or not _matches(prebuilt, options, kernel.config):
        shell_class.clear_instance()
        return
    shell = prebuilt.shell
    shell.parent = options.get("parent", kernel)
    shell.kernel = kernel
    shell.init_environment()  # TERM, PAGER, ... in this kernel's own environment
    shell.starting_dir = os.getcwd()
    shell.history_manager.dir_hist[:] = [Path.cwd()]
    _modules = prebuilt.modules
    _extensions = prebuilt.extensions
    adopted = True


def loaded_extensions() -> frozenset[str]:
    """The default extensions this kernel's shell loaded in the template (empty if none)."""
    return _extensions


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
    return bool(config == prebuilt.config) and _same_env(prebuilt)


def _same_env(prebuilt: _Prebuilt) -> bool:
    """Whether this kernel's environment is the template's, but for the per-kernel part."""
    return _env(os.environ) == _env(prebuilt.env)


def _env(environ: Any) -> dict[str, str]:
    return {k: v for k, v in environ.items() if not k.startswith(_PER_KERNEL_ENV)}
