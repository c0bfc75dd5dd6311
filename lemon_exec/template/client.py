"""Host side of the fork server: start the template, ask it for kernels, track their exits.

A :class:`ForkServer` per interpreter runs ``python -m lemon_exec.template.server`` and
talks to it over a socketpair (see that module for the protocol). jupyter_client reaches it
through :class:`ForkServerProvisioner`, a kernel provisioner (entry point
``lemon-forkserver``) that launches by fork request instead of Popen and otherwise behaves
like the LocalProvisioner: same process-group signalling, same cleanup. When no fork server
is ready the provisioner falls back to a normal launch, so it can never make a start fail.

Under ``sandbox = "bwrap"`` the template runs inside bubblewrap (its launcher comes from
:mod:`lemon_exec.host.kernels.sandbox`) and a kernel's sandbox options travel with its fork request:
the child confines itself before anything else (:mod:`lemon_exec.template.isolate`). A kernel
whose options it cannot apply starts cold under bwrap, never in the template's view.

A template that cannot answer is retired: it forks nothing more, waiting requests fail at
once (their kernels start cold), and the backend replaces it. While a request waits, the
template's ``/proc`` state is read every ``_CHECK_S``: stopped (SIGSTOP from a script, ``T``)
or traced (``t``) on two checks in a row means retired; sleeping without using any CPU for
``_WEDGE_FACTOR`` times its slowest recent answer (at least ``_WEDGE_MIN_S``) means wedged,
retired too. A loaded machine shows as a runnable template, or one that uses CPU: it is
waited for, up to ``_REQUEST_TIMEOUT_S``, as before. A retired template is not killed while
kernels it forked run (they die with their template: a session's, or another caller's
running script): a stopped one is resumed (SIGCONT), so that it still reaps and reports
them and watches the host, and it is stopped with the backend (or sooner, if the backend
already keeps as many retired templates as it will).

Every request carries an id the template echoes in its reply, and replies are matched to
requests by it. A request given up on (timed out, or its start was cancelled) is remembered:
when its late reply names a kernel, the template is told to kill it. Without the ids a late
reply would be taken as the answer to the next request, handing out a kernel that belongs
to nobody (and leaking it).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
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
from typing import Any

from jupyter_client.provisioning.local_provisioner import LocalProvisioner
from traitlets import Unicode

from lemon_exec.proc import supervise
from lemon_exec.template import isolate as isolation

log = logging.getLogger(__name__)

_READY_TIMEOUT_S = 15.0
_REQUEST_TIMEOUT_S = 5.0
#: How often a waiting request checks on the template (stopped, wedged, gone).
_CHECK_S = 0.05
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

#: Fork servers by id, so the provisioner (built by jupyter_client) can find its server.
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
    ) -> None:
        self.server_id = server_id
        self.interpreter = interpreter
        #: Sandboxed (lemon_exec.host.kernels.sandbox): the template's launcher, the options of a
        #: probe kernel it must confine before it says ready, and how a kernel's argv splits.
        self._sandbox = sandbox
        self._env = env
        self._cwd = cwd
        self._proc: subprocess.Popen[bytes] | None = None
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._sock: socket.socket | None = None
        # True once the template said "ready"; False if it exited before that.
        self._ready: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        # Replies awaited, by request id; ids given up on, whose late kernels get killed.
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._abandoned: set[int] = set()
        self._request_ids = itertools.count(1)
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
            ready = await asyncio.wait_for(asyncio.shield(self._ready), timeout)
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
                    self._reply(msg)
        finally:
            if not self._ready.done():
                self._ready.set_result(False)
            for waiter in self._pending.values():
                if not waiter.done():
                    waiter.set_result({"error": "fork server exited"})
            self._pending.clear()
            self._abandoned.clear()  # the template kills its children when it exits

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
        for req, waiter in list(self._pending.items()):
            self._abandon(req, waiter)  # a late reply's kernel is killed
            if not waiter.done():
                waiter.set_result({"error": f"fork server {why}"})

    def _kill_template(self) -> None:
        for pid in list(self._children):
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)
        if self._proc is not None and self._proc.poll() is None:
            # Everything under the template (a subreaper): kernels' setsid descendants too.
            supervise.kill_tree(self._proc.pid)
            with contextlib.suppress(OSError):
                self._proc.kill()

    def _reply(self, msg: dict[str, Any]) -> None:
        """Hand a reply to the request it answers; kill the kernel of one given up on."""
        req = msg.get("req")
        waiter = self._pending.pop(req, None) if isinstance(req, int) else None
        if waiter is not None and not waiter.done():
            waiter.set_result(msg)
        elif req in self._abandoned:
            self._abandoned.discard(req)
            if isinstance(msg.get("pid"), int):
                self._kill_abandoned(msg["pid"])

    def _abandon(self, req: int, waiter: asyncio.Future[dict[str, Any]]) -> None:
        self._pending.pop(req, None)
        if not waiter.done():
            self._abandoned.add(req)  # its reply comes late: _reply kills its kernel
        elif isinstance(waiter.result().get("pid"), int):
            self._kill_abandoned(waiter.result()["pid"])  # answered just as we gave up

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
        req = next(self._request_ids)
        request: dict[str, Any] = {"req": req, "argv": argv, "env": env, "cwd": cwd}
        if isolate is not None:
            request["isolate"] = isolate
            # What the sandbox keeps from the kernel's environment (secrets) never reaches
            # the child: it would linger in the memory the script runs in.
            gone = set(isolation.parse(isolate).unsetenv)
            request["env"] = {k: v for k, v in env.items() if k not in gone}
        payload = json.dumps(request).encode() + b"\n"
        waiter: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[req] = waiter
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
            self._abandon(req, waiter)
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
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.shield(waiter), _CHECK_S)
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
        """Stop the template (it kills its remaining children when its socket closes).

        Idempotent: the engine retires a dead server on every start attempt until it retries.
        """
        if self._closing:
            return
        self._closing = True
        if _SERVERS.get(self.server_id) is self:
            del _SERVERS[self.server_id]
        if self._writer is not None:
            self._writer.close()
            with contextlib.suppress(Exception):
                await self._writer.wait_closed()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        if self._proc is not None:
            deadline = time.monotonic() + 1.0
            while self._proc.poll() is None and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            if self._proc.poll() is None:
                self._proc.kill()
                await asyncio.get_running_loop().run_in_executor(None, self._proc.wait)


def servers() -> list[ForkServer]:
    """The fork servers of this process."""
    return list(_SERVERS.values())


class ForkedProcess:
    """The Popen surface LocalProvisioner uses, for a kernel forked by the template."""

    def __init__(self, server: ForkServer, pid: int) -> None:
        self._server = server
        self.pid = pid
        self.returncode: int | None = None
        self.stdin = self.stdout = self.stderr = None

    def poll(self) -> int | None:
        if self.returncode is None:
            status = self._server.exit_status(self.pid)
            if status is not None:
                self.returncode = status
            elif not _exists(self.pid):
                if self._server.running:
                    # Reaped, its report still in flight: ended, but the status is not final.
                    return -signal.SIGKILL
                self.returncode = -signal.SIGKILL  # gone without a report: the template died
        return self.returncode

    async def settle(self, timeout: float = 5.0) -> int | None:
        """The exit status once the template's report is in (``poll()`` may answer first).

        The template reaps and reports at once; the bound is for a template too loaded to
        (its death ends the wait sooner: ``poll()`` then settles on -SIGKILL itself). A
        stopped template never reports: it is retired, which ends the wait too.
        """
        deadline = time.monotonic() + timeout
        checked = time.monotonic()
        while self.returncode is None and self.poll() is not None:
            if time.monotonic() > deadline:
                self.returncode = -signal.SIGKILL
                break
            if time.monotonic() - checked >= _CHECK_S:
                checked = time.monotonic()
                if self._server.stopped:
                    self._server.retire("was stopped")
            await asyncio.sleep(0.002)
        return self.poll()

    @property
    def orphaned(self) -> bool:
        """Whether its template is gone, or killed and about to be: the kernel dies with it,
        if it has not yet (its parent watch kills it), so it must not be handed out."""
        return not self._server.running or self._server.killed

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (status := self.poll()) is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(str(self.pid), timeout or 0)
            time.sleep(0.005)
        return status

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, signum)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def _exists(pid: int) -> bool:
    """Whether ``pid`` still runs: a zombie does not (a kernel whose template died is
    reparented and stays a zombie until its new parent reaps it)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            state = stat.read().rpartition(b")")[2].split()[:1]
    except OSError:
        return True  # no /proc: kill() said it exists
    return state != [b"Z"]


class ForkServerProvisioner(LocalProvisioner):
    """Launches kernels through a ready :class:`ForkServer`, else like LocalProvisioner."""

    server_id = Unicode("", config=True, help="Id of the ForkServer to launch kernels with.")

    async def launch_kernel(self, cmd: list[str], **kwargs: Any) -> Any:
        server = _SERVERS.get(self.server_id)
        isolate: list[str] | None = None
        argv = cmd
        if server is not None and server.sandboxed:
            # Only a kernel whose sandbox the child can build itself is forked: the rest
            # start cold under bwrap, never unconfined in the template's view.
            split = server.split_sandbox(cmd)
            isolate, argv = split if split is not None else (None, [])
        if (
            server is None
            or not server.ready
            or len(argv) < 3
            or argv[1:3] != ["-m", "lemon_exec.kernel"]
        ):
            return await super().launch_kernel(cmd, **kwargs)
        env = kwargs.get("env") or dict(os.environ)
        cwd = str(kwargs.get("cwd") or os.getcwd())
        stderr = kwargs.get("stderr")
        try:
            pid = await server.fork(
                argv[3:], env, cwd, stderr if isinstance(stderr, int) else None, isolate
            )
        except OSError as exc:  # no answer in time, or no fork: an ordinary launch instead
            log.warning("execute_code: fork server failed (%s); starting the kernel cold", exc)
            return await super().launch_kernel(cmd, **kwargs)
        # Duck-typed: LocalProvisioner only polls, waits for and signals its process.
        self.process = ForkedProcess(server, pid)  # type: ignore[assignment]
        self.pid = pid
        self.pgid = pid  # the child called setsid(): it leads its own process group
        self.cwd = cwd
        return self.connection_info
