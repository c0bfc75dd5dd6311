"""The fork server: a template process that forks fresh lemon-python kernels on request.

Starting a kernel costs ~0.4 s of CPU, almost all of it importing IPython and ipykernel.
The template pays that once: it imports the kernel's modules and builds the IPython shell a
kernel adopts when it fits (:mod:`lemon_exec.kernel.prebuilt`) — before any thread or zmq
context exists, which is what makes fork() safe — and then forks one child per request. The
child sets up its own session, directory, environment and standard streams and runs the
kernel application with the request's arguments; nothing is shared after the fork.

A kernel's memory is mostly template pages it writes to (reference counts, allocations in
the template's free memory): the template freezes its objects out of the collector's reach,
fills its object allocator's and its C heap's holes (:mod:`lemon_exec.template.pools`,
:mod:`lemon_exec.template.heap`) and empties the type attribute
cache before each fork, so that a kernel copies as few of its pages as it can.

Protocol on the inherited Unix socket (fd given by ``--fd``), JSON lines:

- host → template: ``{"req": id, "argv": [...], "env": {...}, "cwd": "..."}`` with the
  child's stderr file descriptor attached (SCM_RIGHTS), and under the sandbox
  ``"isolate": [bwrap options]``, the sandbox the child builds for itself before anything
  else (:mod:`lemon_exec.template.isolate`; a sandboxed template, started with
  ``--isolate-probe``, refuses requests without one); ``{"kill": N}`` to kill the kernel
  of a request the host gave up on (only while N is an unreaped child: never a reused PID);
  ``{"bye": true}`` just before the host closes the socket on purpose (it is not dying);
- template → host: ``{"ready": pid}`` once, ``{"pid": N, "req": id}`` or
  ``{"error": "...", "req": id}`` per request (the host matches replies to requests by id,
  so a late reply can never answer a later request), and ``{"exit": N, "status": S}`` when
  a child ends (S negative: killed by -S).

The template exits when the host closes its socket or dies (a pidfd on the host, so a SIGKILLed
host is noticed at once), killing every kernel's whole process tree first. A socket closed
after ``bye`` ends it at once; one closed without it may mean the host is dying, which the
template waits up to a second to learn (a dying host's sockets close before its pidfd
fires). It is a subreaper (see :mod:`lemon_exec.proc.supervise`): what a dead kernel leaves
behind is adopted by the template and killed. When the host died (rather than closing the
socket), the template also does the host's teardown
(:func:`lemon_exec.proc.host_teardown.teardown_dead_host`) of the staging root it runs in and
of the runtime directory and links directory the host named (``--runtime-dir``,
``--links-dir``): workspaces and connection files go; spill files (readable for 24 hours) and
the owner marker stay.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib
import json
import os
import select
import selectors
import signal
import socket
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from lemon_exec.proc import supervise
from lemon_exec.proc.host_teardown import teardown_dead_host

_REAP_INTERVAL_S = 0.02
_MAX_REQUEST = 1 << 20
#: How long the template, on its way out, waits for its SIGKILLed kernels to be gone.
_CHILD_EXIT_WAIT_S = 2.0
#: After the socket closes, how long to wait to learn whether the host died or just closed it.
_HOST_EXIT_WAIT_S = 1.0


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m lemon_exec.template.server")
    parser.add_argument("--fd", type=int, required=True)
    parser.add_argument("--host-pid", type=int, default=0)
    # Sandboxed (lemon_exec.template.isolate): the bwrap options of a probe kernel, confined
    # once before "ready"; every kernel then confines itself, and nothing else is forked.
    parser.add_argument("--isolate-probe", default=None)
    # Where the host keeps its kernels' keys and links: torn down with it if it dies.
    parser.add_argument("--runtime-dir", type=Path, default=None)
    parser.add_argument("--links-dir", type=Path, default=None)
    args = parser.parse_args()
    # Import everything a kernel needs now, in the template, so children start warm.
    from lemon_exec.kernel.lean import skip_optional_modules

    skip_optional_modules()
    importlib.import_module("lemon_exec.kernel.app").preload()
    # The shell every kernel would build the same way: built once here (kernel/prebuilt.py).
    importlib.import_module("lemon_exec.kernel.app").build_prebuilt()
    heap = importlib.import_module("lemon_exec.template.heap")
    pools = importlib.import_module("lemon_exec.template.pools")

    # Move everything imported so far out of the collector's reach: a child's garbage
    # collections would otherwise touch every object header and copy most of the shared heap.
    gc.collect()
    pools.fill_partial_pools()  # after the collection's holes: a kernel's objects, fresh pools
    gc.freeze()
    heap.fill_free_chunks()  # last: a kernel's mallocs then land on fresh pages
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # only the host stops the template
    signal.signal(signal.SIGTERM, _exit_on_sigterm)  # stop through serve()'s cleanup
    supervise.become_subreaper()
    sock = socket.socket(fileno=args.fd)
    if args.isolate_probe is not None and not _probe_isolation(json.loads(args.isolate_probe)):
        sys.exit(1)  # never "ready": the host starts its sandboxed kernels cold instead
    template = _Template(sock, args.host_pid or os.getppid())
    template.isolated = args.isolate_probe is not None
    template.runtime_dir, template.links_dir = args.runtime_dir, args.links_dir
    try:
        with contextlib.suppress(OSError):  # the host closed the socket: time to go
            template.serve()
    finally:
        template.after_host()
    if template.leaving:
        # The host waits for this exit: skip the finalisation of a heap the size of
        # IPython's (its children are killed and reaped already, nothing is buffered).
        os._exit(0)


def _exit_on_sigterm(_signum: int, _frame: Any) -> None:
    raise SystemExit(0)


def _probe_isolation(options: list[str]) -> bool:
    """Whether a child can confine itself here (user namespaces, mounts, a fresh /proc)."""
    from lemon_exec.template import isolate

    template = os.getpid()
    pid = os.fork()
    if pid == 0:
        try:
            isolate.enter(isolate.parse(options), template)
        finally:
            os._exit(0 if os.getpid() == 2 else 1)  # the confined kernel is PID 2
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0


class _Template:
    def __init__(self, sock: socket.socket, host: int) -> None:
        self.sock = sock
        self.children: set[int] = set()
        self.buffer = b""
        self.fds: list[int] = []
        self.host = host
        self.pid = os.getpid()
        self.host_fd = _pidfd(self.host)
        self.root = Path.cwd().parent  # the host starts us in <staging root>/work
        self.selector = selectors.DefaultSelector()
        #: Every kernel confines itself (a request without its sandbox is refused).
        self.isolated = False
        #: The host's runtime directory and Jupyter links directory, for its teardown.
        self.runtime_dir: Path | None = None
        self.links_dir: Path | None = None
        #: The host said "bye": it closes the socket on purpose and is not dying.
        self.leaving = False

    def send(self, obj: dict[str, Any]) -> None:
        self.sock.sendall(json.dumps(obj).encode() + b"\n")

    def serve(self) -> None:
        self.send({"ready": os.getpid()})
        self.selector.register(self.sock, selectors.EVENT_READ, "sock")
        if self.host_fd is not None:
            self.selector.register(self.host_fd, selectors.EVENT_READ, "host")
        try:
            while True:
                for key, _events in self.selector.select(timeout=_REAP_INTERVAL_S):
                    if key.data == "host" or not self._read():
                        return  # the host closed the socket or died
                if self.host_fd is None and os.getppid() != self.host:
                    return  # no pidfd: being reparented tells us the host died
                self._reap()
        finally:
            self._kill_children()

    def after_host(self) -> None:
        """If the host died (not just closed the socket), do its staging-root teardown."""
        self._kill_children()
        if self.leaving or not self._host_died():
            return
        with contextlib.suppress(Exception):  # best effort: the next host start sweeps too
            teardown_dead_host(self.root, self.host, self.runtime_dir, self.links_dir)

    def _read(self) -> bool:
        data, fds, _flags, _addr = socket.recv_fds(self.sock, 65536, 4)
        if not data:
            for fd in fds:
                os.close(fd)
            return False
        self.buffer += data
        self.fds.extend(fds)
        if len(self.buffer) > _MAX_REQUEST:
            return False
        while b"\n" in self.buffer:
            line, self.buffer = self.buffer.split(b"\n", 1)
            self._handle(line)
        return True

    def _handle(self, line: bytes) -> None:
        try:
            request = json.loads(line)
        except ValueError:
            request = None
        if isinstance(request, dict) and "kill" in request:
            self._kill(request["kill"])  # no descriptor comes with a kill
            return
        if isinstance(request, dict) and request.get("bye") is True:
            self.leaving = True  # the socket closes next: no need to learn why
            return
        # Every fork request carries its child's stderr, in order.
        stderr_fd = self.fds.pop(0) if self.fds else None
        req = request.get("req") if isinstance(request, dict) else None
        try:
            if not isinstance(request, dict):
                raise ValueError("a request must be a JSON object")
            if self.isolated and not isinstance(request.get("isolate"), list):
                raise ValueError("a sandboxed template forks only kernels with a sandbox")
            _clear_type_cache()
            pid = os.fork()
        except Exception as exc:  # bad request or fork failure: report, keep serving
            if stderr_fd is not None:
                os.close(stderr_fd)
            self.send({"error": f"{type(exc).__name__}: {exc}", "req": req})
            return
        if pid == 0:
            self.selector.close()
            if self.host_fd is not None:
                os.close(self.host_fd)
            _child(request, stderr_fd, self.sock, template=self.pid)  # never returns
        if stderr_fd is not None:
            os.close(stderr_fd)
        self.children.add(pid)
        self.send({"pid": pid, "req": req})

    def _kill(self, pid: object) -> None:
        """Kill a kernel the host gave up on; its exit is reported as usual once reaped."""
        if isinstance(pid, int) and pid in self.children:
            supervise.kill_tree(pid)
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)

    def _host_died(self) -> bool:
        if self.host_fd is not None:
            ready, _, _ = select.select([self.host_fd], [], [], _HOST_EXIT_WAIT_S)
            return bool(ready)
        deadline = time.monotonic() + _HOST_EXIT_WAIT_S
        while os.getppid() == self.host:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.02)
        return True

    def _reap(self) -> None:
        """Reap every ended child: kernels (reported) and adopted orphans (not)."""
        kernel_ended = False
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                self.children.clear()
                return
            if pid == 0:
                break
            if pid not in self.children:
                continue  # an adopted orphan we killed
            kernel_ended = True
            self.children.discard(pid)
            code = os.waitstatus_to_exitcode(status)
            with contextlib.suppress(OSError):
                self.send({"exit": pid, "status": code})
        if kernel_ended:
            # A kernel that died without killing its descendants left them to us: kill them.
            self._kill_orphans()

    def _kill_orphans(self) -> None:
        for pid in supervise.children(os.getpid()):
            if pid not in self.children:
                supervise.kill_tree(pid)

    def _kill_children(self) -> None:
        for pid in list(self.children):
            supervise.kill_tree(pid)
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)
        # A kernel killed just now may still be dying: its children (a setsid daemon) come to
        # us only once all its threads have exited, which its reaping tells. Then rounds over
        # our whole tree until nothing runs under us.
        deadline = time.monotonic() + _CHILD_EXIT_WAIT_S
        for pid in self.children:
            while time.monotonic() < deadline:
                try:
                    if os.waitpid(pid, os.WNOHANG)[0]:
                        break
                except ChildProcessError:
                    break
                time.sleep(0.002)
        supervise.kill_tree(os.getpid(), include_root=False)
        with contextlib.suppress(ChildProcessError):
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        self.children.clear()


def _child(
    request: dict[str, Any], stderr_fd: int | None, sock: socket.socket, template: int
) -> None:
    code = 1
    try:
        sock.close()
        os.setsid()  # its own process group: the host signals the kernel and its children
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        devnull = os.open(os.devnull, os.O_RDWR)
        os.dup2(devnull, 0)
        os.dup2(devnull, 1)
        os.dup2(stderr_fd if stderr_fd is not None else devnull, 2)
        _set_environ({str(k): str(v) for k, v in request.get("env", {}).items()})
        os.environ.pop("JPY_PARENT_PID", None)  # supervise watches the parent instead
        if isinstance(request.get("isolate"), list):
            from lemon_exec.template import isolate

            # Confined before anything of the kernel runs; its namespace's init is the
            # parent to watch (the template is out of sight).
            template = isolate.enter(isolate.parse(request["isolate"]), template)
        else:
            os.chdir(request.get("cwd") or "/")
        argv = [str(a) for a in request["argv"]]
        # Subreaper, SIGTERM kills its tree, and the template's death (the host's is the
        # template's business) kills it and its tree.
        supervise.supervise_kernel(supervise.connection_file_arg(argv), template)
        sys.argv = ["lemon_exec.kernel", *argv]
        from lemon_exec.kernel.app import LemonKernelApp

        LemonKernelApp.launch_instance(argv=argv)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _clear_type_cache() -> None:
    """Empty CPython's type attribute cache, just before a fork.

    A kernel's first attribute lookups miss the template's cache anyway (it holds what the
    template looked up last), and a miss that evicts an entry writes the evicted name's
    reference count: a template page, copied into the kernel. With the cache empty there is
    nothing to evict (~0.2 MiB less per kernel); the template refills it in microseconds.
    """
    clear = getattr(sys, "_clear_internal_caches", None) or sys._clear_type_cache
    clear()  # 3.13 deprecates the second for the first


def _set_environ(env: dict[str, str]) -> None:
    """Make ``os.environ`` exactly ``env``, touching only the variables that differ.

    The request's environment is mostly the template's own (both come from the host):
    clearing and refilling it would rewrite every variable, in Python and in libc's
    ``environ``, copying template pages into the kernel for nothing.
    """
    for name in [name for name in os.environ if name not in env]:
        del os.environ[name]
    for name, value in env.items():
        if os.environ.get(name) != value:
            os.environ[name] = value


def _pidfd(pid: int) -> int | None:
    try:
        fd = os.pidfd_open(pid)
    except (OSError, AttributeError):
        return None
    if os.getppid() != pid:  # the host died before we opened it: being reparented says so
        os.close(fd)
        return None
    return fd


if __name__ == "__main__":
    main()
