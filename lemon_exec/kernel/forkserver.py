"""The fork server: a template process that forks fresh lemon-python kernels on request.

Starting a kernel costs ~0.4 s of CPU, almost all of it importing IPython and ipykernel.
The template pays that once: it imports the kernel's modules — before any thread or zmq
context exists, which is what makes fork() safe — and then forks one child per request. The
child sets up its own session, directory, environment and standard streams and runs the
kernel application with the request's arguments; nothing is shared after the fork.

Protocol on the inherited Unix socket (fd given by ``--fd``), JSON lines:

- host → template: ``{"argv": [...], "env": {...}, "cwd": "..."}`` with the child's stderr
  file descriptor attached (SCM_RIGHTS);
- template → host: ``{"ready": pid}`` once, ``{"pid": N}`` or ``{"error": "..."}`` per
  request, and ``{"exit": N, "status": S}`` when a child ends (S negative: killed by -S).

The template exits, killing its children's process groups, when the host closes the socket.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib
import json
import os
import selectors
import signal
import socket
import sys
import traceback
from typing import Any

_REAP_INTERVAL_S = 0.02
_MAX_REQUEST = 1 << 20


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m lemon_exec.kernel.forkserver")
    parser.add_argument("--fd", type=int, required=True)
    args = parser.parse_args()
    # Import everything a kernel needs now, in the template, so children start warm.
    from lemon_exec.kernel.lean import skip_optional_modules

    skip_optional_modules()
    importlib.import_module("lemon_exec.kernel.app")

    # Move everything imported so far out of the collector's reach: a child's garbage
    # collections would otherwise touch every object header and copy most of the shared heap.
    gc.collect()
    gc.freeze()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # only the host stops the template
    sock = socket.socket(fileno=args.fd)
    with contextlib.suppress(OSError):  # the host closed the socket: time to go
        _Template(sock).serve()


class _Template:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.children: set[int] = set()
        self.buffer = b""
        self.fds: list[int] = []

    def send(self, obj: dict[str, Any]) -> None:
        self.sock.sendall(json.dumps(obj).encode() + b"\n")

    def serve(self) -> None:
        self.send({"ready": os.getpid()})
        selector = selectors.DefaultSelector()
        selector.register(self.sock, selectors.EVENT_READ)
        try:
            while True:
                if selector.select(timeout=_REAP_INTERVAL_S) and not self._read():
                    return  # the host went away
                self._reap()
        finally:
            self._kill_children()

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
            fds, self.fds = self.fds[:1], self.fds[1:]
            self._handle(line, fds[0] if fds else None)
        return True

    def _handle(self, line: bytes, stderr_fd: int | None) -> None:
        try:
            request = json.loads(line)
            pid = os.fork()
        except Exception as exc:  # bad request or fork failure: report, keep serving
            if stderr_fd is not None:
                os.close(stderr_fd)
            self.send({"error": f"{type(exc).__name__}: {exc}"})
            return
        if pid == 0:
            _child(request, stderr_fd, self.sock)  # never returns
        if stderr_fd is not None:
            os.close(stderr_fd)
        self.children.add(pid)
        self.send({"pid": pid})

    def _reap(self) -> None:
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                self.children.clear()
                return
            if pid == 0:
                return
            self.children.discard(pid)
            code = os.waitstatus_to_exitcode(status)
            with contextlib.suppress(OSError):
                self.send({"exit": pid, "status": code})

    def _kill_children(self) -> None:
        for pid in list(self.children):
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)


def _child(request: dict[str, Any], stderr_fd: int | None, sock: socket.socket) -> None:
    code = 1
    try:
        sock.close()
        os.setsid()  # its own process group: the host signals the kernel and its children
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        devnull = os.open(os.devnull, os.O_RDWR)
        os.dup2(devnull, 0)
        os.dup2(devnull, 1)
        os.dup2(stderr_fd if stderr_fd is not None else devnull, 2)
        os.environ.clear()
        os.environ.update({str(k): str(v) for k, v in request.get("env", {}).items()})
        # The kernel's parent poller must watch the template, its real parent.
        os.environ["JPY_PARENT_PID"] = str(os.getppid())
        os.chdir(request.get("cwd") or "/")
        argv = [str(a) for a in request["argv"]]
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


if __name__ == "__main__":
    main()
