"""Every reach into ipykernel's and IPython's internals, with the versions it was written for.

The kernel builds on ipykernel through its documented seams where there is one: the
application's ``kernel_class`` and ``outstream_class``, the kernel's ``shell_class``, and
overrides of public methods (``init_iopub``, ``do_execute``, ``dispatch_control``, ...);
those stay where they are. What has no seam is listed here, in :data:`PATCHES`: a
module-level name replaced for a moment, a private method called or overridden, a private
attribute written (one is traitlets': the application's logging set-up). The functions
that do it live in this module; a subclass override of a private method
(``LocalIOPubThread._really_send`` in app.py, ``BoundedOutStream._watch_pipe_fd`` in
streams.py, the app's ``_configure_logging`` and ``_ConfigPhase``, the kernel's
``_execute_sleep``) cannot leave its class, so it is only listed, and checked like the rest.

The rule on versions, applied once per process by :func:`check` (the kernel application's
``initialize``, the fork-server template's preload):

- On the versions these were written against (:data:`KNOWN`: ipykernel 7.4 and later 7.x,
  as pyproject pins it; IPython 9.x, which ipykernel 7.4 runs on here) every patch applies
  and nothing is looked up.
- On any other version each patch's private names are looked up first. Those that are all
  there apply as usual: the seam survived. A patch with a name missing is:

  - **fatal** when the kernel is unsafe or wrong without it (``essential``): its IOPub
    thread would open ipykernel's TCP pipe for forked children, which any local user can
    write into; its sockets would be created before the heartbeat's bind with the
    process's umask; child-process output would lose its order and its cell; a viewer's
    interrupt would fail. The kernel then fails its start at once with
    :class:`UnsupportedKernelVersion` (naming the versions), which the host reports,
    instead of running without it;
  - **skipped, with one warning** when it only saves time or memory: the kernel then runs
    that part as plain ipykernel/IPython would.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from ipykernel import debugger, ipkernel, kernelapp, kernelbase
from ipykernel.heartbeat import Heartbeat

#: The versions the patches were written against: (lowest, first not covered).
KNOWN: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {
    "ipykernel": ((7, 4), (8,)),
    "IPython": ((9,), (10,)),
}


@dataclass(frozen=True)
class Patch:
    """One reach into a library's internals: what it needs and whether the kernel can do
    without it (see the module's rule)."""

    name: str
    #: ``(module, dotted attribute)`` pairs that must exist for the patch to work.
    needs: tuple[tuple[str, str], ...]
    essential: bool
    why: str


PATCHES: tuple[Patch, ...] = (
    Patch(
        "iopub_thread",
        (
            ("ipykernel.kernelapp", "IOPubThread"),
            ("ipykernel.iostream", "IOPubThread._really_send"),
            ("ipykernel.iostream", "IOPubThread._is_master_process"),
        ),
        True,
        "the IOPub thread without a TCP pipe for forked children (app.LocalIOPubThread)",
    ),
    Patch(
        "heartbeat_bind",
        (("ipykernel.kernelapp", "Heartbeat"), ("ipykernel.heartbeat", "Heartbeat._bind_socket")),
        True,
        "the heartbeat's socket bound under the 0600 umask (BindingHeartbeat)",
    ),
    Patch(
        "out_stream",
        (
            ("ipykernel.iostream", "OutStream._watch_pipe_fd"),
            ("ipykernel.iostream", "OutStream._is_master_process"),
        ),
        True,
        "child-process output in order and in its own cell (streams.BoundedOutStream)",
    ),
    Patch(
        "interrupt_children",
        (("ipykernel.kernelbase", "Kernel._send_interrupt_children"),),
        True,
        "a viewer's interrupt_request in a managed kernel (interrupt_children)",
    ),
    Patch(
        "signature_memo",
        (
            ("ipykernel.kernelbase", "_accepts_parameters"),
            ("ipykernel.ipkernel", "_accepts_parameters"),
        ),
        False,
        "ipykernel's signature checks, once per function (memoize_signature_checks)",
    ),
    Patch(
        "lean_kernel_init",
        (("ipykernel.ipkernel", "sys"), ("ipykernel.debugger", "_is_debugpy_available")),
        False,
        "no module list for a debugger that is not there (kernel_init_without_module_list)",
    ),
    Patch(
        "init_code",
        tuple(
            ("IPython.core.shellapp", f"InteractiveShellApp.{step}")
            for step in (
                "_run_startup_files",
                "_run_exec_lines",
                "_run_exec_files",
                "_run_cmd_line_code",
                "_run_module",
            )
        ),
        False,
        "the template's module names shared for %reset --aggressive (run_init_code)",
    ),
    Patch(
        "config_phase",
        (
            ("IPython.core.application", "BaseIPythonApplication.initialize"),
            ("IPython.core.application", "BaseIPythonApplication.init_crash_handler"),
            ("IPython.core.application", "BaseIPythonApplication.config_file_paths"),
        ),
        False,
        "the template's configuration phase taken over (app._ConfigPhase)",
    ),
    Patch(
        "execute_sleep",
        (("ipykernel.kernelbase", "Kernel._execute_sleep"),),
        False,
        "no 0.5 ms sleep before every execute_reply (LemonKernel._execute_sleep)",
    ),
    Patch(
        "logging_once",
        (("traitlets.config.application", "Application._configure_logging"),),
        False,
        "logging configured again only when it changed (LemonKernelApp._configure_logging)",
    ),
)


class UnsupportedKernelVersion(RuntimeError):
    """An ipykernel/IPython the kernel cannot run on safely (an essential patch's seam is gone)."""


#: The patches turned off by :func:`check` (None: not checked yet in this process).
_disabled: frozenset[str] | None = None


def installed_versions() -> dict[str, str]:
    """The versions of the libraries in :data:`KNOWN` that this process runs on."""
    import ipykernel
    import IPython

    versions = {"ipykernel": getattr(ipykernel, "__version__", ""), "IPython": IPython.__version__}
    return {name: str(version) for name, version in versions.items()}


def _parse(version: str) -> tuple[int, ...]:
    parts = []
    for piece in version.split("."):
        digits = _leading_digits(piece)
        if not digits:
            break
        parts.append(int(digits))
        if digits != piece:
            break  # 8.0rc1, 9.1.dev0: the rest is a pre-release tag
    return tuple(parts)


def _leading_digits(piece: str) -> str:
    end = 0
    while end < len(piece) and piece[end].isdigit():
        end += 1
    return piece[:end]


def is_known(versions: Mapping[str, str]) -> bool:
    """Whether every library in ``versions`` is in its :data:`KNOWN` range."""
    for name, (low, high) in KNOWN.items():
        version = _parse(versions.get(name, ""))
        if not version or not low <= version < high:
            return False
    return True


def _has(module: str, dotted: str) -> bool:
    # Every module PATCHES names is loaded by this module's imports (ipykernel.kernelapp
    # imports the rest): looked up, never imported by name.
    target: Any = sys.modules.get(module)
    if target is None:
        return False
    for part in dotted.split("."):
        if not hasattr(target, part):
            return False
        target = getattr(target, part)
    return True


def check() -> frozenset[str]:
    """Apply the module's version rule to this process, once; the patches turned off.

    Raises :class:`UnsupportedKernelVersion` when an essential patch's seam is missing. A
    kernel forked from the template inherits the template's answer.
    """
    global _disabled
    if _disabled is None:
        _disabled = evaluate(installed_versions(), PATCHES)
    return _disabled


def evaluate(versions: Mapping[str, str], patches: tuple[Patch, ...]) -> frozenset[str]:
    """The version rule for ``versions`` and ``patches`` (see the module docstring)."""
    if is_known(versions):
        return frozenset()
    shown = ", ".join(f"{name} {versions.get(name, '?')}" for name in KNOWN)
    written = ", ".join(f"{name} {_range(low, high)}" for name, (low, high) in KNOWN.items())
    disabled = set()
    for patch in patches:
        missing = [f"{m}.{a}" for m, a in patch.needs if not _has(m, a)]
        if not missing:
            continue
        if patch.essential:
            raise UnsupportedKernelVersion(
                f"lemon-python cannot run safely on {shown} (written for {written}): "
                f"{patch.why} needs {', '.join(missing)}, which this version does not have"
            )
        disabled.add(patch.name)
        warnings.warn(
            f"lemon-python on {shown} (written for {written}): {patch.why} is skipped "
            f"({', '.join(missing)} not found); the kernel does it as ipykernel does",
            RuntimeWarning,
            stacklevel=2,
        )
    return frozenset(disabled)


def _range(low: tuple[int, ...], high: tuple[int, ...]) -> str:
    return f">={'.'.join(map(str, low))},<{'.'.join(map(str, high))}"


def enabled(name: str) -> bool:
    """Whether patch ``name`` applies in this process (checked on first use)."""
    return name not in check()


# -- module-level names replaced while ipykernel builds something ------------------------------


@contextlib.contextmanager
def _swapped(module: ModuleType, name: str, replacement: Any) -> Iterator[None]:
    # Through the module's namespace: the name is what ipykernel's code looks up at call time.
    namespace = vars(module)
    saved = namespace[name]
    namespace[name] = replacement
    try:
        yield
    finally:
        namespace[name] = saved


def iopub_thread_class(cls: type[Any]) -> contextlib.AbstractContextManager[None]:
    """While it holds, ``IPKernelApp.init_iopub`` builds ``cls`` as its IOPub thread
    (kernelapp does not re-export IOPubThread: no trait names it)."""
    return _swapped(kernelapp, "IOPubThread", cls)


class BindingHeartbeat(Heartbeat):
    """ipykernel's heartbeat thread, telling when its socket is bound (its file created),
    or why it could not be (``error``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[no-untyped-call]
        self.bound = threading.Event()
        self.error: BaseException | None = None

    def _bind_socket(self) -> None:
        try:
            super()._bind_socket()  # type: ignore[no-untyped-call]
        except BaseException as exc:
            self.error = exc
            raise
        finally:
            self.bound.set()


def init_binding_heartbeat(init_heartbeat: Callable[[], None], app: Any, timeout: float) -> None:
    """Run ``IPKernelApp.init_heartbeat`` (``init_heartbeat``) so that it starts a
    :class:`BindingHeartbeat`, then wait (up to ``timeout`` s) until its socket is bound:
    it binds in its own thread, and the caller's umask must hold until then.

    A bind that failed (a full disk: no room for the socket's file) fails the start here,
    rather than as a thread's traceback in the first script's output.
    """
    with _swapped(kernelapp, "Heartbeat", BindingHeartbeat):
        init_heartbeat()
    heartbeat = getattr(app, "heartbeat", None)
    if isinstance(heartbeat, BindingHeartbeat):
        heartbeat.bound.wait(timeout)
        if heartbeat.error is not None:
            raise RuntimeError(f"the heartbeat socket could not be bound: {heartbeat.error}")


# -- private methods and attributes ------------------------------------------------------------


def interrupt_children(kernel: Any) -> None:
    """SIGINT to the kernel's process group, as ipykernel's own interrupt_request sends it."""
    kernel._send_interrupt_children()


class _SysWithoutModules:
    """The sys module as IPythonKernel.__init__ sees it in a kernel without a debugger."""

    modules: dict[str, Any] = {}  # read-only: never filled

    def __getattr__(self, name: str) -> Any:
        return getattr(sys, name)


@contextlib.contextmanager
def kernel_init_without_module_list() -> Iterator[None]:
    """While it holds, ``IPythonKernel.__init__`` sees no loaded modules.

    It lists every loaded module's file for its debugger: in a forked kernel that touches all
    ~500 module objects the template shares with it (~5 ms, and their pages are copied).
    Without debugpy there is no debugger to feed: it sees a sys without modules (everything
    else is the real sys).
    """
    lean = (
        enabled("lean_kernel_init")
        and not debugger._is_debugpy_available
        and vars(ipkernel).get("sys") is sys
    )
    if not lean:
        yield
        return
    with _swapped(ipkernel, "sys", _SysWithoutModules()):
        yield


def run_init_code(app: Any, module_names: Any) -> bool:
    """IPython's ``InteractiveShellApp.init_code`` with ``module_names`` as the modules
    loaded at start (for ``%reset --aggressive``) instead of a copy of ``sys.modules``.

    False when the patch is off: the caller then runs IPython's own.
    """
    if not enabled("init_code"):
        return False
    app._run_startup_files()
    app._run_exec_lines()
    app._run_exec_files()
    shell = app.shell
    if app.hide_initial_ns:
        shell.user_ns_hidden.update(shell.user_ns)
    app._run_cmd_line_code()
    app._run_module()
    sys.stdout.flush()
    sys.stderr.flush()
    shell._sys_modules_keys = module_names
    return True


_accepts_memo: dict[tuple[Any, tuple[str, ...]], dict[str, bool]] = {}
_accepts_parameters: Any = None


def signature_check(method: Any, names: list[str]) -> dict[str, bool]:
    """ipykernel's ``_accepts_parameters``, once per function and names.

    ipykernel asks ``inspect.signature`` whether ``do_execute`` and the shell's
    ``run_cell_async`` take ``cell_id`` / ``cell_meta``: at every kernel start and every
    cell. The answer depends on the function alone (a bound method's, for any instance).
    """
    key = (getattr(method, "__func__", method), tuple(names))
    accepts = _accepts_memo.get(key)
    if accepts is None:
        accepts = _accepts_memo[key] = dict(_accepts_parameters(method, names))
    return dict(accepts)


def memoize_signature_checks() -> bool:
    """Route ipykernel's signature checks through :func:`signature_check`.

    Idempotent; False when the patch is off (nothing to memoize).
    """
    global _accepts_parameters
    # Through the modules' namespaces: ipkernel imported the function by name.
    name = "_accepts_parameters"
    original = vars(kernelbase).get(name)
    if original is signature_check:
        return True
    if not callable(original) or not enabled("signature_memo"):
        return False
    _accepts_parameters = original
    for module in (kernelbase, ipkernel):
        if vars(module).get(name) is original:
            vars(module)[name] = signature_check
    return True
