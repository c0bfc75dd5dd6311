"""The shell tool's per-command wrapper: run bash as a traced child, kill its whole tree.

Run as a script (``python -I -S _reaper.py REPORT_FD PARENT_PID CWD -- bash -c ...``), one
per command, by :mod:`lemon_exec.shell._process`. It

* becomes a child subreaper, so every descendant that is orphaned (a ``setsid`` daemon, a
  double fork) is re-parented to it instead of init and stays in reach;
* enters ``CWD`` and forks the command, traced with ``PTRACE_SEIZE`` for two events only:
  the shell's exit and its ``exec``. At either, it reads the shell's working directory from
  ``/proc/<pid>/cwd`` (a zombie has none, hence the trace). That is the only way the
  directory is learnt, so nothing the command prints, defines, traps or writes can forge
  it; the command never holds the report descriptor either;
* writes a report on ``REPORT_FD`` once the shell has ended and no descendant holds its
  stdout or stderr (see :func:`_report`), then stays as the reaper of the background jobs
  the command left, until they end;
* on SIGTERM (the host's timeout) SIGTERMs every descendant, SIGKILLs them all 0.2 s later
  (and again every 20 ms until none is left), and exits; when the host (``PARENT_PID``, 0
  for its own parent) dies, it SIGKILLs every descendant at once and exits.

It runs once per command, so it imports only what it needs of the standard library, not
lemon_exec (``-I -S``: a fast start, unaffected by the caller's ``PYTHON*`` variables); the
process-tree reading is a small copy of :mod:`lemon_exec.proc.supervise`'s.
"""

from __future__ import annotations

import ctypes
import os
import select
import signal
import stat
import sys
import threading
import time

_PR_SET_CHILD_SUBREAPER = 36
_PTRACE_CONT = 7
_PTRACE_DETACH = 17
_PTRACE_SEIZE = 0x4206
_PTRACE_LISTEN = 0x4208
_OPTIONS = 0x10 | 0x40 | 0x100000  # TRACEEXEC | TRACEEXIT | EXITKILL
_EVENT_EXEC = 4
_EVENT_EXIT = 6
_EVENT_STOP = 128
_WALL = 0x40000000
_TERM_GRACE_S = 0.2
_KILL_ROUND_S = 0.02
_HOLD_POLL_S = 0.02
_STOP_SIGNALS = (signal.SIGSTOP, signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU)

#: Report states (second line of the report).
OK, UNKNOWN, UNTRACED, NO_CWD = "ok", "unknown", "untraced", "nocwd"

_libc = ctypes.CDLL(None, use_errno=True)
_libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
_libc.ptrace.restype = ctypes.c_long


def _ptrace(request: int, pid: int, data: int = 0) -> bool:
    return int(_libc.ptrace(request, pid, None, ctypes.c_void_p(data))) == 0


def _children(pid: int) -> list[int]:
    """Children of ``pid`` (zombies included: signalling one is harmless)."""
    found: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as fh:
                found.extend(int(c) for c in fh.read().split())
        except FileNotFoundError:
            if os.path.exists(f"/proc/{pid}/task/{tid}"):
                return _children_by_scan(pid)  # a kernel without the children file
        except OSError:
            continue
    return found


def _children_by_scan(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as fh:
                    fields = fh.read().rsplit(b")", 1)[-1].split()
            except OSError:
                continue
            if len(fields) > 1 and int(fields[1]) == pid:
                found.append(int(entry))
    return found


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[-1].split()[0] not in (b"Z", b"X")
    except (OSError, IndexError):
        return False


def _descendants() -> list[int]:
    """Every running descendant of this process, parents first."""
    order: list[int] = []
    queue = [os.getpid()]
    while queue:
        for child in _children(queue.pop(0)):
            if child not in order and _running(child):
                order.append(child)
                queue.append(child)
    return order


class _State:
    terminating = False


def _on_term(_signum: int, _frame: object) -> None:
    if _State.terminating:
        return
    _State.terminating = True
    for pid in _descendants():
        _kill(pid, signal.SIGTERM)
    signal.setitimer(signal.ITIMER_REAL, _TERM_GRACE_S)


def _on_alarm(_signum: int, _frame: object) -> None:
    # One round per tick, not kill_tree's loop: the main loop must keep serving the trace
    # (a shell killed in its exit stop ends only when continued), and what the killed
    # leave behind is re-parented to us and found by the next round.
    for pid in _descendants():
        _kill(pid, signal.SIGKILL)
    signal.setitimer(signal.ITIMER_REAL, _KILL_ROUND_S)


def _kill(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except OSError:
        return  # gone already


def _report(fd: int, returncode: int, state: str, cwd: bytes = b"") -> None:
    """``<returncode>\\n<state>\\n<len(cwd)>\\n<cwd bytes>``, the returncode as Popen
    gives it. Length-prefixed: under a sandbox bwrap holds the pipe, so no EOF follows."""
    data = b"%d\n%s\n%d\n%s" % (returncode, state.encode(), len(cwd), cwd)
    while data:
        data = data[os.write(fd, data) :]
    os.close(fd)


def _cwd_of(pid: int) -> bytes | None:
    try:
        return os.readlink(f"/proc/{pid}/cwd".encode())
    except OSError:
        return None


def _child(go: int, argv: list[str]) -> None:
    """In the forked child: wait until traced, restore default signals, exec the command."""
    try:
        if os.read(go, 1) != b"g":
            os._exit(1)  # the wrapper died before it let us run
        os.close(go)
        for name in ("SIGPIPE", "SIGXFSZ", "SIGTERM", "SIGINT", "SIGHUP", "SIGALRM"):
            signal.signal(getattr(signal, name), signal.SIG_DFL)
        os.execv(argv[0], argv)
    except OSError as exc:
        os.write(2, f"lemon-exec shell: cannot run {argv[0]}: {exc.strerror}\n".encode())
    os._exit(127)


def main(args: list[str]) -> int:
    report_fd, parent, cwd = int(args[0]), int(args[1]), args[2]
    argv = args[4:]
    _libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    signal.signal(signal.SIGTERM, _on_term)
    signal.signal(signal.SIGHUP, _on_term)
    signal.signal(signal.SIGALRM, _on_alarm)
    try:
        os.chdir(cwd)
    except OSError as exc:
        os.write(2, f"lemon-exec shell: cannot enter {cwd}: {exc.strerror}\n".encode())
        _report(report_fd, 1, NO_CWD)
        return 1
    # Only pipes: a terminal or /dev/null held by a background job must not hold the call.
    outputs = {_identity(fd) for fd in (1, 2) if stat.S_ISFIFO(os.fstat(fd).st_mode)}
    go_read, go_write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(go_write)
        os.close(report_fd)
        _child(go_read, argv)
    os.close(go_read)
    traced = _ptrace(_PTRACE_SEIZE, pid, _OPTIONS)
    os.write(go_write, b"g")
    os.close(go_write)
    # The wrapper must not hold the command's output open: only the command's tree does.
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)
    if _State.terminating:  # SIGTERM came before the fork
        _kill(pid, signal.SIGKILL)
    _watch(parent or os.getppid())
    returncode, final = _follow(pid)
    state = UNTRACED if not traced else (UNKNOWN if final is None else OK)
    # A background job that keeps the output open holds the call (until the timeout).
    while _holders(outputs):
        _reap(os.WNOHANG)
        time.sleep(_HOLD_POLL_S)
    _report(report_fd, returncode, state, final or b"")
    _reap(0)
    return 0


def _identity(fd: int) -> tuple[int, int]:
    st = os.fstat(fd)
    return st.st_dev, st.st_ino


def _holders(outputs: set[tuple[int, int]]) -> bool:
    """Whether a descendant still has the command's stdout or stderr open.

    Under a sandbox, bwrap (our parent) holds them too, so their EOF cannot tell the host.
    """
    if not outputs:
        return False
    for pid in _descendants():
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                st = os.stat(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if (st.st_dev, st.st_ino) in outputs:
                return True
    return False


def _reap(flags: int) -> None:
    """Reap adopted orphans: all that end (``flags`` 0: until none is left), or those that
    have ended (``WNOHANG``)."""
    while True:
        try:
            child, _ = os.waitpid(-1, flags)
        except ChildProcessError:
            return
        if child == 0:
            return


def _watch(parent: int) -> None:
    """Kill the whole tree and exit once ``parent`` (the host) has exited."""
    try:
        fd: int | None = os.pidfd_open(parent)
    except (OSError, AttributeError):
        fd = None  # gone already, or Linux < 5.3: being re-parented tells

    def watch() -> None:
        if os.getppid() == parent or fd is not None:
            if fd is not None:
                select.select([fd], [], [])
            else:
                while os.getppid() == parent:
                    time.sleep(0.2)
        deadline = time.monotonic() + 2.0
        while (found := _descendants()) and time.monotonic() < deadline:
            for pid in found:
                _kill(pid, signal.SIGKILL)
            time.sleep(0.002)  # let the orphans re-parent to us
        os._exit(1)

    threading.Thread(target=watch, daemon=True).start()


def _follow(pid: int) -> tuple[int, bytes | None]:
    """Serve the trace of the shell ``pid`` until it has ended, reaping orphans meanwhile;
    return its returncode and the directory it finished in (None if unknown)."""
    execs = 0
    final: bytes | None = None
    while True:
        child, status = os.waitpid(-1, _WALL)
        if child != pid:
            continue  # an adopted orphan, reaped
        if not os.WIFSTOPPED(status):
            return os.waitstatus_to_exitcode(status), final
        event, sig = status >> 16, os.WSTOPSIG(status)
        if event == _EVENT_EXEC:
            execs += 1
            if execs > 1:  # the shell replaced itself: it ends here
                final = _cwd_of(pid)
                _ptrace(_PTRACE_DETACH, pid)
                continue
            _ptrace(_PTRACE_CONT, pid)
        elif event == _EVENT_EXIT:
            if final is None:
                final = _cwd_of(pid)
            _ptrace(_PTRACE_CONT, pid)
        elif event == _EVENT_STOP and sig in _STOP_SIGNALS:
            _ptrace(_PTRACE_LISTEN, pid)  # a group-stop: stay stopped until SIGCONT
        elif event == _EVENT_STOP:
            _ptrace(_PTRACE_CONT, pid)  # SIGCONT ended the group-stop
        else:  # a signal on its way to the shell: deliver it
            _ptrace(_PTRACE_CONT, pid, sig)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
