"""The kernel sandbox: bubblewrap around each kernel, so helpers are a script's only way out.

With ``sandbox = "bwrap"`` every kernel is started as ``sh -c 'trap "" INT; exec bwrap ...'
python -m lemon_exec.kernel -f FILE`` (see :func:`kernel_argv_prefix`). Inside it sees:

- the whole filesystem read-only, with a private ``/tmp`` (and ``$TMPDIR``), its working
  directory writable (``sandbox_cwd = "rw"``) or read-only, a fresh ``/dev`` and ``/proc``;
- nothing of ``sandbox_hidden`` (credential stores and, by default, ``~``: an empty
  directory or file in their place; the cwd, the interpreter and ``sandbox_visible`` are
  bound back), nothing of the runtime base (:mod:`lemon_exec.host.disk.runtime_base`: every
  host's keys and sockets, those made later included) but its own kernel's directory, and
  of its staging root only the read-only directory that puts ``lemon_exec`` on its path;
- no environment variable ``sandbox_env_hidden`` matches (tokens, keys, passwords);
- its own PID namespace (host processes cannot be seen or signalled; when the kernel ends,
  the namespace and every daemon in it end), its own IPC namespace, and, unless
  ``sandbox_network``, its own network namespace with only a loopback of its own;
- ``--die-with-parent``: it dies with the host.

The helpers (read, grep, webfetch, registered tools) run on the host, under policy and
approval, over the kernel's own Jupyter channels: they keep working inside.

``bwrap`` dies of SIGINT, and the host interrupts a kernel by signalling its process group;
so the launcher ignores SIGINT before it execs bwrap (an ignored signal stays ignored across
exec) and the kernel, told by :data:`SANDBOX_ENV`, restores its own handler.
"""

from __future__ import annotations

import fnmatch
import functools
import os
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from lemon_exec._constants import PACKAGE_DIR, STAGING_ROOT_PREFIX
from lemon_exec.errors import RefusedError
from lemon_exec.host.disk import runtime_base
from lemon_exec.proc.supervise import SANDBOX_ENV
from lemon_exec.wire import protocol

if TYPE_CHECKING:
    from lemon_exec.config import ExecuteCodeConfig

#: The sandbox kinds there are (besides "none").
KINDS = ("bwrap",)
_INSTALL_HINT = (
    "install bubblewrap (Debian/Ubuntu: apt-get install bubblewrap; Fedora: dnf install "
    'bubblewrap) or set sandbox = "none" (LEMON_EXECUTE_CODE_SANDBOX=none)'
)
#: Runs bwrap with SIGINT ignored (see the module docstring); "$@" is bwrap and its args.
_LAUNCHER = ["/bin/sh", "-c", 'trap "" INT; exec "$@"', "lemon-sandbox"]
#: bwrap's own smoke test may take this long on a loaded machine.
_PROBE_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class SandboxSpec:
    """What a sandboxed kernel may see and reach (from the config's sandbox_* settings)."""

    kind: str = "none"
    cwd_writable: bool = True
    hidden: tuple[str, ...] = ()
    network: bool = False
    #: Paths inside hidden ones seen again (read-only).
    visible: tuple[str, ...] = ()
    #: Environment variable name patterns the kernel does not get, and exceptions to them.
    env_hidden: tuple[str, ...] = ()
    env_allowed: tuple[str, ...] = ()

    @property
    def enabled(self) -> bool:
        return self.kind != "none"


def spec_from_config(config: ExecuteCodeConfig) -> SandboxSpec:
    """The sandbox the config asks for (checked when a kernel starts, by :func:`require`)."""
    return SandboxSpec(
        kind=config.sandbox,
        cwd_writable=config.sandbox_cwd != "ro",
        hidden=tuple(config.sandbox_hidden),
        network=config.sandbox_network,
        visible=tuple(config.sandbox_visible),
        env_hidden=tuple(config.sandbox_env_hidden),
        env_allowed=tuple(config.sandbox_env_allowed),
    )


def require(spec: SandboxSpec) -> str:
    """The path of a working ``bwrap`` for ``spec``; ``RefusedError`` naming the fix otherwise.

    An unknown kind is refused too: a typo must never mean an unsandboxed run.
    """
    if spec.kind not in KINDS:
        raise RefusedError(
            f"execute_code: unknown sandbox {spec.kind!r}; set sandbox (or "
            f"LEMON_EXECUTE_CODE_SANDBOX) to one of 'none', {', '.join(map(repr, KINDS))}; "
            "nothing ran"
        )
    path, problem = _probe()
    if problem:
        raise RefusedError(
            f'execute_code: sandbox = "bwrap" was requested but {problem}; {_INSTALL_HINT}; '
            "nothing ran"
        )
    return path


@functools.lru_cache(maxsize=1)
def _probe() -> tuple[str, str]:
    """(bwrap's path, "") when it can build our namespaces, else ("", what went wrong)."""
    path = shutil.which("bwrap")
    if path is None:
        return "", "bwrap (bubblewrap) is not installed (not found on PATH)"
    probe = [path, "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev"]
    probe += ["--unshare-pid", "--unshare-net", "--unshare-ipc", "--die-with-parent", "true"]
    try:
        done = subprocess.run(
            probe, capture_output=True, timeout=_PROBE_TIMEOUT_S, stdin=subprocess.DEVNULL
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return "", f"{path} could not be run ({exc})"
    if done.returncode != 0:
        detail = done.stderr.decode(errors="replace").strip().splitlines()
        return "", f"{path} cannot create a sandbox here ({detail[-1] if detail else 'no output'})"
    return path, ""


def kernel_argv_prefix(
    spec: SandboxSpec,
    *,
    bwrap: str,
    cwd: Path,
    kernel_dir: Path,
    staging_root: Path,
    pypath: Path,
    runtime: tuple[Path, ...] = (),
    environ: Mapping[str, str] | None = None,
) -> list[str]:
    """The argv that runs a kernel's ``python -m lemon_exec.kernel ...`` inside the sandbox.

    ``kernel_dir`` is the kernel's own runtime directory (bound writable: its sockets);
    ``pypath`` the staging root's ``lemon_exec`` path directory (bound read-only);
    ``runtime`` what the kernel needs to run at all (its interpreter's environment, the
    ``lemon_exec`` package): bound read-only again where the private ``/tmp`` or
    ``$TMPDIR``, or a hidden path (``~``), would hide them (a checkout and venv under
    ``/tmp``, as CI clones often are; pyenv under ``~``). ``environ`` (default:
    ``os.environ``) is the environment the kernel will be started with: the variables
    ``spec.env_hidden`` matches are removed from it inside.
    """
    cwd = Path(os.path.realpath(cwd))
    if cwd == Path("/") and spec.cwd_writable:
        raise RefusedError(
            'execute_code: sandbox = "bwrap" with a writable working directory, but the '
            "working directory is /, which would make the whole filesystem writable; run from "
            'a project directory (or a scope with its cwd), or set sandbox_cwd = "ro"; '
            "nothing ran"
        )
    base = runtime_base.base_path()
    if _under(cwd, base) and not _under(cwd, kernel_dir):
        raise RefusedError(
            f'execute_code: sandbox = "bwrap" with the working directory {cwd}, inside '
            f"{base}, where every host keeps its kernels' keys and sockets; run from a "
            "project directory (or a scope with its cwd); nothing ran"
        )
    # /tmp and $TMPDIR (where staging roots live) are private: every host's root is hidden.
    masks = [Path("/tmp")]
    for private in (Path(os.environ.get("TMPDIR") or "/tmp"), staging_root.parent):
        private = Path(os.path.realpath(private))
        if private.is_dir() and not any(_under(private, m) for m in masks):
            masks.append(private)
    hidden = _hidden_paths(spec.hidden)
    # What must stay visible: the cwd, and what the kernel needs or the config names.
    back = [Path(os.path.realpath(p)) for p in (*runtime, *_expanded(spec.visible))]
    back = [p for p in _distinct(back) if p.exists() and not _under(p, cwd)]
    # Hidden directories that contain something visible (~ holding the cwd, pyenv or
    # ~/.local/lib) are hidden before it is bound; the others after everything.
    first = [h for h in hidden if h.is_dir() and any(_under(v, h) for v in (cwd, *back))]
    later = [h for h in hidden if h not in first]
    early = masks + sorted(first, key=lambda p: len(p.parts))
    bind_cwd = [] if cwd == Path("/") else ["--bind" if spec.cwd_writable else "--ro-bind"]
    bind_cwd += [str(cwd), str(cwd)] if bind_cwd else []
    inside_mask = any(_under(cwd, m) for m in early)
    args = ["--ro-bind", "/", "/"]
    # A cwd that contains the special mounts is bound first, so that they cover it; one
    # inside a mask is bound after the mask, and what the cwd then uncovers is masked again.
    args += [] if inside_mask else bind_cwd
    args += ["--dev", "/dev", "--proc", "/proc"]
    for mask in early:
        args += ["--tmpfs", str(mask)]
    rebound = sorted(
        (p for p in back if any(_under(p, m) for m in early)), key=lambda p: len(p.parts)
    )
    for needed in rebound:
        args += ["--ro-bind", str(needed), str(needed)]
    if inside_mask:
        args += bind_cwd
        for mask in early:
            if mask != cwd and _under(mask, cwd):
                args += ["--tmpfs", str(mask)]
        if _under(staging_root.parent, cwd):  # the cwd is $TMPDIR or above: other roots
            for root in _other_roots(staging_root):
                args += ["--tmpfs", str(root)]
    # Hidden after the cwd, so that a cwd containing them (e.g. HOME) never uncovers them.
    # The runtime base holds every host's keys and sockets, those made later included: one
    # mount over its fixed path hides them all, whatever the cwd (runtime_base.py).
    args += ["--tmpfs", str(base), "--tmpfs", str(staging_root)]
    for hidden_path in later:
        if hidden_path.is_dir():
            args += ["--tmpfs", str(hidden_path)]
        else:
            args += ["--ro-bind", "/dev/null", str(hidden_path)]
    args += ["--bind", str(kernel_dir), str(kernel_dir)]
    args += ["--ro-bind", str(pypath), str(pypath)]
    args += ["--chdir", str(cwd)]
    args += ["--unshare-pid", "--unshare-ipc", "--die-with-parent"]
    if not spec.network:
        args += ["--unshare-net"]
    # jupyter_client names the host here; its PID means nothing in the new namespace.
    args += ["--unsetenv", "JPY_PARENT_PID", "--setenv", SANDBOX_ENV, "1"]
    for name in hidden_env(spec, os.environ if environ is None else environ):
        args += ["--unsetenv", name]
    # Ignore SIGINT across exec (see the module docstring); "$@" is bwrap and its args.
    return [*_LAUNCHER, bwrap, *args, "--"]


#: What the kernel itself needs from its environment: never removed.
_KERNEL_ENV = frozenset(
    {SANDBOX_ENV, protocol.HOST_LINK_ENV, protocol.MANAGED_ENV, protocol.ACK_TIMEOUT_ENV}
)


def hidden_env(spec: SandboxSpec, environ: Mapping[str, str]) -> list[str]:
    """The names in ``environ`` a kernel under ``spec`` does not get (sorted)."""

    def matches(name: str, patterns: tuple[str, ...]) -> bool:
        upper = name.upper()
        return any(fnmatch.fnmatchcase(upper, p.upper()) for p in patterns)

    return sorted(
        name
        for name in environ
        if name not in _KERNEL_ENV
        and matches(name, spec.env_hidden)
        and not matches(name, spec.env_allowed)
    )


def template_argv_prefix(spec: SandboxSpec, *, bwrap: str) -> list[str]:
    """The argv that runs a fork-server template in the sandbox its kernels are forked from.

    The template sees the host's filesystem as the host does (it never runs a script) and
    holds ``CAP_SYS_ADMIN`` in a user namespace of its own, nowhere else: each kernel it forks
    builds its own sandbox from :func:`kernel_argv_prefix`'s options before any of its code
    runs (:mod:`lemon_exec.template.isolate`). Its PIDs are the host's, so the host signals,
    limits and waits for forked kernels as it does unsandboxed ones.
    """
    args = ["--dev-bind", "/", "/", "--unshare-user", "--cap-add", "CAP_SYS_ADMIN"]
    args += ["--unshare-ipc", "--die-with-parent"]
    if not spec.network:
        args += ["--unshare-net"]
    return [*_LAUNCHER, bwrap, *args, "--"]


def split_kernel_argv(argv: list[str]) -> tuple[list[str], list[str]] | None:
    """(bwrap options, kernel argv) of a sandboxed kernel's argv (from
    :func:`kernel_argv_prefix`), when a forked kernel can build that sandbox itself; else
    None (the kernel then starts cold, under bwrap)."""
    from lemon_exec.template import isolate

    if argv[: len(_LAUNCHER)] != _LAUNCHER or "--" not in argv:
        return None
    end = argv.index("--")
    options, kernel = argv[len(_LAUNCHER) + 1 : end], argv[end + 1 :]
    try:
        isolate.parse(options)
    except isolate.IsolationError:
        return None
    return options, kernel


def forked_kernels_supported() -> bool:
    """Whether kernels can be forked into their sandboxes here (Linux, a known CPU)."""
    from lemon_exec.template import isolate

    return isolate.supported()


def runtime_paths(interpreter: str) -> tuple[Path, ...]:
    """What a kernel under ``interpreter`` must see to start: the interpreter's environment
    (a venv's root and its base installation) and the ``lemon_exec`` package itself."""
    paths = [PACKAGE_DIR]
    exe = Path(interpreter)
    if not exe.is_absolute():  # a bare name is looked up on PATH inside: nothing to add
        return tuple(paths)
    root = exe.parent.parent  # <root>/bin/python
    paths.append(root)
    cfg = root / "pyvenv.cfg"
    try:
        for line in cfg.read_text().splitlines():
            key, _, value = line.partition("=")
            if key.strip() == "home" and value.strip():
                paths.append(Path(value.strip()).parent)  # <base>/bin -> <base>
    except OSError:
        pass  # not a venv: root is the installation itself
    paths.append(Path(os.path.realpath(exe)).parent.parent)
    return tuple(paths)


def _other_roots(staging_root: Path) -> list[Path]:
    """Other hosts' staging roots next to ours (those that exist now)."""
    try:
        names = os.listdir(staging_root.parent)
    except OSError:
        return []
    return [
        staging_root.parent / name
        for name in sorted(names)
        if name.startswith(STAGING_ROOT_PREFIX) and name != staging_root.name
    ]


def _hidden_paths(paths: tuple[str, ...]) -> list[Path]:
    """The existing paths among ``paths`` (``~`` expanded), links resolved, no duplicates.

    ``/`` is never one (a ``HOME`` of ``/``, as in some containers, hides nothing).
    """
    found = [Path(os.path.realpath(p)) for p in _expanded(paths) if os.path.lexists(p)]
    return _distinct([p for p in found if p != Path("/")])


def _expanded(paths: tuple[str, ...]) -> list[Path]:
    """``paths`` with ``~`` expanded; relative ones (meaningless here) left out."""
    expanded = [Path(os.path.expanduser(raw)) for raw in paths]
    return [p for p in expanded if p.is_absolute()]


def _distinct(paths: list[Path]) -> list[Path]:
    return list(dict.fromkeys(paths))


def _under(path: Path, parent: Path) -> bool:
    return path == parent or parent in path.parents


def command_argv_prefix(
    spec: SandboxSpec,
    *,
    bwrap: str,
    cwd: Path,
    scratch: Path,
    runtime: tuple[Path, ...] = (),
) -> list[str]:
    """The argv that runs a plain command (the shell tool's) in the view a kernel whose
    working directory is ``cwd`` gets from :func:`kernel_argv_prefix`, options and all.

    ``scratch`` is an empty private directory of the caller's (outside any staging root):
    it stands in for the staging root, the kernel directory and the path directory, which a
    plain command has none of; it is bound writable, so keep it empty.
    """
    return kernel_argv_prefix(
        spec,
        bwrap=bwrap,
        cwd=cwd,
        kernel_dir=scratch,
        staging_root=scratch,
        pypath=scratch,
        runtime=runtime,
    )
