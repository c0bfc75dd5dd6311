"""Host side of the fork server: start the template, ask it for kernels, track their exits.

A :class:`ForkServer` per interpreter runs ``python -m lemon_exec.template.server`` and
talks to it over a socketpair (see that module for the protocol). jupyter_client reaches it
through the kernel provisioner of :mod:`lemon_exec.template.provisioner`, which finds its
server by id (:func:`find_server`). The host names its runtime directory and Jupyter links
directory when it starts a template, which tears them down should the host die.

Under ``sandbox = "bwrap"`` the template runs inside bubblewrap (its launcher comes from
:mod:`lemon_exec.host.kernels.sandbox`) and a kernel's sandbox options travel with its fork
request: the child confines itself before anything else (:mod:`lemon_exec.template.isolate`).

A template that cannot answer is retired: it forks nothing more, waiting requests fail at
once (their kernels start cold), and the backend replaces it. While a request waits, the
template's ``/proc`` state is read every ``CHECK_S``: stopped (SIGSTOP from a script, ``T``)
or traced (``t``) on two checks in a row means retired; sleeping without using any CPU for
``_WEDGE_FACTOR`` times its slowest recent answer (at least ``_WEDGE_MIN_S``) means wedged,
retired too. A loaded machine shows as a runnable template, or one that uses CPU: it is
waited for, up to ``_REQUEST_TIMEOUT_S``. A retired template is not killed while
kernels it forked run (they die with their template: a session's, or another caller's
running script): a stopped one is resumed (SIGCONT), so that it still reaps and reports
them and watches the host, and it is stopped with the backend (or sooner, if the backend
already keeps as many retired templates as it will).

Replies are matched to requests by id (:mod:`lemon_exec.template.replies`): the kernel of a
request given up on is killed, never handed to a later request.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import select
import signal
import socket
import subprocess
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lemon_exec.proc import supervise
from lemon_exec.proc.exit_wait import wait_exit
from lemon_exec.template import isolate as isolation
from lemon_exec.template.replies import Replies

log = logging.getLogger(__name__)

_READY_TIMEOUT_S = 15.0
_REQUEST_TIMEOUT_S = 5.0
#: How often a waiting request checks on the template (stopped, wedged, gone).
CHECK_S = 0.05
#: A sleeping template that used no CPU this many times its slowest recent answer is wedged.
_WEDGE_FACTOR = 10.0
#: ... but never sooner than this (one answer is ~10 ms; a busy host adds its delays).
_WEDGE_MIN_S = 0.5
#: How many recent answer times the wedge bound is taken from.
_RECENT_ANSWERS = 20
#: ``(state letter, CPU ticks)`` of a process, None when it is gone (tests replace it).
_process_state = supervise.state
#: How long a kernel start waits for a starting template before it launches cold instead.
START_WAIT_S = 3.0
#: How long a closing template gets to kill its kernels and exit before it is killed.
_CLOSE_WAIT_S = 1.0
#: The line that tells the template its socket is about to close on purpose.
_BYE = b'{"bye": true}\n'

#: Open fork servers by id, so the provisioner (built by jupyter_client) can find its server.
_SERVERS: dict[str, ForkServer] = {}

#: (sandbox options, kernel argv) of a sandboxed kernel's argv, None for one it cannot fork.
SplitSandbox = Callable[[list[str]], "tuple[list[str], list[str]] | None"]


class ForkServer:
    """One template process for one interpreter and environment."""

    def __init__(
        self,
        server_id: str,
        interpreter: str,
        env: dict[str, str],
        cwd: str,
        *,
        sandbox: tuple[list[str], list[str], SplitSandbox] | None = None,
        runtime_dir: Path | None = None,
        links_dir: Path | None = None,
    ) -> None:
        self.server_id = server_id
        self.interpreter = interpreter
        #: Sandboxed (lemon_exec.host.kernels.sandbox): the template's launcher, the options of a
        #: probe kernel it must confine before it says ready, and how a kernel's argv splits.
        self._sandbox = sandbox
        self._env = env
        self._cwd = cwd
        #: What the template tears down, beside its staging root, if the host dies.
        self._teardown = [("--runtime-dir", runtime_dir), ("--links-dir", links_dir)]
        self._proc: subprocess.Popen[bytes] | None = None
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._sock: socket.socket | None = None
        # True once the template said "ready"; False if it exited before that.
        self._ready: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._replies = Replies(kill=self._kill_abandoned)
        self._lock = asyncio.Lock()  # one sender at a time on the socket
        self._exits: dict[int, int] = {}
        self._children: set[int] = set()
        self._task: asyncio.Task[None] | None = None
        self.started = False
        self._closing = False
        #: Could not answer (stopped, wedged): never used again (see the module doc).
        self.retired = False
        #: The template's PID as it said in "ready" (under the sandbox: below bwrap's).
        self._template_pid: int | None = None
        self._answer_times: deque[float] = deque(maxlen=_RECENT_ANSWERS)
        self.created = time.monotonic()
        _SERVERS[server_id] = self

    async def start(self) -> None:
        """Launch the template and read its messages in the background."""
        self.started = True
        try:
            await self._launch()
        except BaseException:
            if not self._ready.done():
                self._ready.set_result(False)  # nobody waits for a template that never ran
            raise

    async def _launch(self) -> None:
        host_sock, child_sock = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        argv = [self.interpreter, "-m", "lemon_exec.template.server"]
        argv += ["--fd", str(child_sock.fileno())]
        argv += [arg for option, path in self._teardown if path for arg in (option, str(path))]
        if self._sandbox is None:
            argv += ["--host-pid", str(os.getpid())]
        else:  # its parent is bwrap, which dies with us; its kernels confine themselves
            launcher, probe, _ = self._sandbox
            argv = [*launcher, *argv, "--isolate-probe", json.dumps(probe)]
        try:
            self._proc = subprocess.Popen(
                argv,
                pass_fds=(child_sock.fileno(),),
                env=self._env,
                cwd=self._cwd,
                # Its failures surface as a fallback to an ordinary launch, whose error is
                # reported; the template's own traceback would only be noise on our stderr.
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
        finally:
            child_sock.close()
        self._sock = host_sock
        host_sock.setblocking(False)
        self._reader, self._writer = await asyncio.open_unix_connection(sock=host_sock)
        self._task = asyncio.get_running_loop().create_task(self._read_loop())

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def cwd(self) -> str:
        return self._cwd

    @property
    def sandboxed(self) -> bool:
        """Whether the template runs in the sandbox and forks only self-confining kernels."""
        return self._sandbox is not None

    def split_sandbox(self, argv: list[str]) -> tuple[list[str], list[str]] | None:
        """(sandbox options, kernel argv) of a sandboxed kernel's argv, None if unforkable."""
        return None if self._sandbox is None else self._sandbox[2](argv)

    @property
    def ready(self) -> bool:
        return self.was_ready and self.alive

    @property
    def was_ready(self) -> bool:
        """Whether the template said "ready" (it may have died or been retired since)."""
        return self._ready.done() and self._ready.result()

    @property
    def template_pid(self) -> int | None:
        return self._template_pid or self.pid

    @property
    def stopped(self) -> bool:
        """Whether the template is stopped or traced: it answers nothing until resumed."""
        pid = self.template_pid
        found = None if pid is None else _process_state(pid)
        return found is not None and found[0] in ("T", "t")

    @property
    def starting(self) -> bool:
        """On its way: not ready yet, and neither failed nor exited (nor launched yet)."""
        return not self._ready.done() and (self._proc is None or self._proc.poll() is None)

    @property
    def alive(self) -> bool:
        """Running, not retired and not killed (a SIGKILL pending): it may fork."""
        return not self.retired and self.running and not self.killed

    @property
    def killed(self) -> bool:
        """Whether the template has a SIGKILL pending: it dies, with its kernels, as soon as
        it next runs (on a busy host a while later, and until then it looks alive)."""
        pid = self.template_pid
        return pid is not None and supervise.kill_pending(pid)

    @property
    def running(self) -> bool:
        """Whether the template process has not exited (retired or not)."""
        return self._proc is not None and self._proc.poll() is None

    async def wait_ready(self, timeout: float = _READY_TIMEOUT_S) -> bool:
        try:
            # asyncio.timeout, not wait_for: on 3.11 that drops a cancellation landing as
            # the wait ends (a closing host would then wait for a whole kernel start).
            async with asyncio.timeout(timeout):
                ready = await asyncio.shield(self._ready)
        except TimeoutError:
            return False
        return ready and self.alive

    async def _read_loop(self) -> None:
        assert self._reader is not None
        try:
            while True:
                line = await self._reader.readline()
                if not line:
                    break
                try:
                    msg = json.loads(line)
                except ValueError:
                    continue
                if "exit" in msg:
                    pid = int(msg["exit"])
                    self._exits[pid] = int(msg["status"])
                    self._children.discard(pid)
                elif "ready" in msg:
                    self._note_template_pid(msg["ready"])
                    if not self._ready.done():
                        self._ready.set_result(True)
                elif "req" in msg:
                    self._replies.deliver(msg)
        finally:
            if not self._ready.done():
                self._ready.set_result(False)
            self._replies.close("fork server exited")

    def _note_template_pid(self, pid: object) -> None:
        """Keep the PID the template reported if it is ours: the launcher's or below it."""
        launcher = self.pid
        if not isinstance(pid, int) or launcher is None:
            return
        if pid == launcher or pid in supervise.descendants(launcher):
            self._template_pid = pid

    def retire(self, why: str) -> None:
        """Fork nothing more: waiting requests fail at once (their kernels start cold), and
        the backend replaces it. A stopped template is resumed (every time: a script may
        stop it again), so that its kernels are still reaped and reported."""
        pid = self.template_pid
        if pid is not None and self.running:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGCONT)
        if self.retired:
            return
        self.retired = True
        log.warning("fork server %s (pid %s) %s: retired and replaced", self.server_id, pid, why)
        self._replies.abandon_all(f"fork server {why}")  # a late reply's kernel is killed

    def _kill_template(self) -> None:
        for pid in list(self._children):
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)
        if self._proc is not None and self._proc.poll() is None:
            # Everything under the template (a subreaper): kernels' setsid descendants too.
            supervise.kill_tree(self._proc.pid)
            with contextlib.suppress(OSError):
                self._proc.kill()

    def _kill_abandoned(self, pid: int) -> None:
        # The template kills it only while it is its unreaped child, so never a reused PID.
        log.debug("fork server: killing kernel %d of an abandoned request", pid)
        if self._sock is not None:
            try:  # a few bytes: the socketpair's buffer takes them without blocking
                self._sock.send(json.dumps({"kill": pid}).encode() + b"\n")
            except OSError:  # gone or jammed: the template kills its children on exit
                log.warning("fork server: could not have kernel %d killed", pid)

    async def fork(
        self,
        argv: list[str],
        env: dict[str, str],
        cwd: str,
        stderr_fd: int | None,
        isolate: list[str] | None = None,
    ) -> int:
        """Ask the template for a kernel; returns the child's pid.

        ``isolate``: the bwrap options of the sandbox the child builds for itself first.

        Raises ``TimeoutError`` when the template does not answer within
        ``_REQUEST_TIMEOUT_S`` and ``OSError`` when it could not fork, or is retired (stopped
        or wedged: see the module doc) before or while it should answer. A request that
        times out or is cancelled is abandoned: the kernel its late reply names is killed.
        """
        assert self._sock is not None
        if not self.retired and self.stopped:
            self.retire("was stopped")
        if self.retired:
            raise OSError("fork server retired: it stopped answering")
        req, waiter = self._replies.open()
        request: dict[str, Any] = {"req": req, "argv": argv, "env": env, "cwd": cwd}
        if isolate is not None:
            request["isolate"] = isolate
            # What the sandbox keeps from the kernel's environment (secrets) never reaches
            # the child: it would linger in the memory the script runs in.
            gone = set(isolation.parse(isolate).unsetenv)
            request["env"] = {k: v for k, v in env.items() if k not in gone}
        payload = json.dumps(request).encode() + b"\n"
        try:
            async with self._lock:
                fd = stderr_fd if stderr_fd is not None else os.open(os.devnull, os.O_WRONLY)
                try:
                    # A request is a few KiB; a socketpair's buffer takes it without blocking.
                    socket.send_fds(self._sock, [payload], [fd])
                finally:
                    if stderr_fd is None:
                        os.close(fd)
            reply = await self._answer(waiter)
        except BaseException:  # timed out, cancelled, or the send failed: give it up
            self._replies.abandon(req, waiter)
            raise
        if "pid" not in reply:
            raise OSError(f"fork server could not start a kernel: {reply.get('error')}")
        pid = int(reply["pid"])
        self._children.add(pid)
        return pid

    async def _answer(self, waiter: asyncio.Future[dict[str, Any]]) -> dict[str, Any]:
        """The reply, checking on the template while it is awaited (see the module doc)."""
        sent = time.monotonic()
        before = self._usage()
        # Ten times the slowest recent answer: a loaded host slows every answer alike.
        wedged_after = max(_WEDGE_MIN_S, _WEDGE_FACTOR * max(self._answer_times, default=0.0))
        suspect: str | None = None  # what the last check found wrong
        while not waiter.done():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(CHECK_S):  # not wait_for: see wait_ready
                    await asyncio.shield(waiter)
                break
            waited = time.monotonic() - sent
            now = self._usage()
            found: str | None = None
            if now is not None and now[0] in ("T", "t"):
                found = "was stopped"
            elif (
                waited >= wedged_after
                and now is not None
                and before is not None
                and now[0] not in ("R", "D")  # runnable or in I/O: a busy host, not a wedge
                and now[1] == before[1]
            ):
                found = f"sent no answer in {waited:.1f} s, idle"
            if found is not None and self._unread():
                found = None  # it answered; a busy loop has not read it yet
            # Twice in a row: a reply that came just before the check has been read by then.
            if found is not None and suspect is not None:
                self.retire(found)
            elif waited >= _REQUEST_TIMEOUT_S:
                raise TimeoutError(f"fork server did not answer within {_REQUEST_TIMEOUT_S:g} s")
            suspect = found
        reply = waiter.result()
        if "pid" in reply:
            self._answer_times.append(time.monotonic() - sent)
        return reply

    def _unread(self) -> bool:
        """Whether the template sent something the host has not read yet."""
        if self._sock is None:
            return False
        try:
            return bool(select.select([self._sock], [], [], 0)[0])
        except (OSError, ValueError):  # closed meanwhile
            return False

    def _usage(self) -> tuple[str, int] | None:
        pid = self.template_pid
        return None if pid is None else _process_state(pid)

    def exit_status(self, pid: int) -> int | None:
        return self._exits.get(pid)

    def kill_sync(self) -> None:
        """Kill the template and every process under it (exit-time cleanup)."""
        self._kill_template()
        _SERVERS.pop(self.server_id, None)

    async def aclose(self) -> None:
        """Stop the template: it kills its remaining children and exits as its socket closes.

        The host says ``bye`` first, so the template need not wait to learn whether the host
        is dying, and its exit is awaited on a pidfd (:mod:`lemon_exec.proc.exit_wait`).
        A template that does not go within ``_CLOSE_WAIT_S`` (stopped by a script, wedged)
        is killed with everything under it. Idempotent: the engine retires a dead server
        on every start attempt until it retries.
        """
        if self._closing:
            return
        self._closing = True
        if _SERVERS.get(self.server_id) is self:
            del _SERVERS[self.server_id]
        if self._writer is not None:
            with contextlib.suppress(Exception):  # gone already: it is exiting anyway
                self._writer.write(_BYE)
            self._writer.close()
            with contextlib.suppress(Exception):
                await self._writer.wait_closed()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        proc = self._proc
        if proc is None:
            return
        if self.stopped:  # a stopped template would never read its socket
            self._kill_template()
        if not await wait_exit(proc.pid, lambda: proc.poll() is None, _CLOSE_WAIT_S):
            self._kill_template()
            await wait_exit(proc.pid, lambda: proc.poll() is None, _CLOSE_WAIT_S)


def servers() -> list[ForkServer]:
    """The fork servers of this process."""
    return list(_SERVERS.values())


def find_server(server_id: str) -> ForkServer | None:
    """The fork server ``server_id`` of this process, if it is still open."""
    return _SERVERS.get(server_id)
