"""A sandboxed script never reaches another host's kernel (issue 25 item 1).

Each test starts a sandboxed attacker (a real kernel under bwrap) and an *unsandboxed*
victim host in this process, then has the attacker's script search every directory it can
see for the victim kernel's connection file and sockets, connect to each socket, and run
code in the victim through each connection file (jupyter_client, as anyone would). The
victim's code would create a marker file outside every sandbox view: it must never appear.

The victim is started *after* the attacker's kernel, in places the attacker's view
contains: its ``$TMPDIR``, a sibling folder under its working directory, ``$HOME``, ``/tmp``
and ``/`` (read-only). Only the victim kernel's own files are attacked (the search matches
its id), so kernels of other programs on the machine are left alone.

On e55567e each of these reached the victim (the keys and sockets lay in the victim's
staging root, bound live into the view); now they lie under the fixed runtime base
``/tmp/lemon-exec.<uid>/``, which every view masks.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import enabled_config, wait_until

from lemon_exec import ExecuteCode, RefusedError, SessionScope
from lemon_exec.host.disk import runtime_base

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow, pytest.mark.kernel]

#: Trees no host can create files in (or that are too large to walk in a test).
_PRUNE = [
    "/proc", "/sys", "/dev", "/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin", "/etc",
    "/boot", "/snap", "/var/lib", "/var/cache", "/nix",
]  # fmt: skip
_SKIP = [".git", "site-packages", "node_modules", "__pycache__", ".mypy_cache", ".ruff_cache"]

HUNT = """
import os, socket, stat
VICTIM, MARK = {victim!r}, {mark!r}
PRUNE, SKIP = set({prune!r}), set({skip!r})
found, reached, walked = [], [], 0
for d, ds, fs in os.walk('/'):
    ds[:] = [x for x in ds if os.path.join(d, x) not in PRUNE and x not in SKIP]
    walked += len(fs)
    for name in fs + ds:
        if VICTIM not in name:
            continue
        p = os.path.join(d, name)
        found.append(p)
        try:
            st = os.lstat(p)
        except OSError:
            continue
        if stat.S_ISSOCK(st.st_mode):
            s = socket.socket(socket.AF_UNIX)
            try:
                s.connect(p)
                reached.append(p)
            except OSError as exc:
                print('REFUSED', p, exc)
            finally:
                s.close()
        elif name.endswith('.json'):
            try:
                from jupyter_client import BlockingKernelClient
                kc = BlockingKernelClient(connection_file=p)
                kc.load_connection_file()
                kc.start_channels()
                try:
                    kc.execute_interactive(
                        f"open({{MARK!r}}, 'w').write('pwned')", timeout=15
                    )
                    reached.append(p)
                finally:
                    kc.stop_channels()
            except Exception as exc:
                print('FAILED', p, type(exc).__name__, exc)
print('WALKED', walked)
print('FOUND', found)
print('REACHED', reached)
"""


def hunt(victim_id: str, mark: Path) -> str:
    """The attacker's script: find the victim's files anywhere, use what it finds."""
    return HUNT.format(victim=victim_id, mark=str(mark), prune=_PRUNE, skip=_SKIP)


class Victim:
    """An unsandboxed host with a live session kernel, its staging root under ``base``."""

    def __init__(self, base: Path) -> None:
        base.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.tool = ExecuteCode(
            enabled_config(kernel_mode="session", sandbox="none"), staging_base=base
        )
        result = self.tool.run_sync("x = 1", scope=SessionScope("victim"))
        assert result.details.get("exit_code") == 0, result.content
        live = self.tool.diagnostics.kernels
        assert len(live) == 1
        self.connection_file = live[0].connection_file
        assert self.connection_file.exists()
        self.kernel_id = self.connection_file.stem.removeprefix("kernel-")

    def close(self) -> None:
        self.tool.close()


@pytest.fixture
def place() -> Iterator[Path]:
    """A scratch directory outside /tmp, where no sandbox writes."""
    path = Path(tempfile.mkdtemp(prefix="lsn-", dir="/var/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _attack(
    place: Path,
    *,
    cwd: Path,
    victim_base: Path,
    monkeypatch: pytest.MonkeyPatch,
    kind: str = "session",
    forked: bool = True,
    writable: bool = True,
    tmpdir: Path | None = None,
) -> None:
    """Start the attacker's kernel, then the victim; the attacker must not reach it."""
    if tmpdir is not None:
        tmpdir.mkdir(parents=True, exist_ok=True, mode=0o700)
        monkeypatch.setenv("TMPDIR", str(tmpdir))
    mark = place / "pwned"
    config = enabled_config(
        sandbox="bwrap",
        kernel_mode="session" if kind == "session" else "per_call",
        warm_kernels=1 if kind == "spare" else 0,
        fork_server=forked,
        sandbox_cwd="rw" if writable else "ro",
    )
    attacker = ExecuteCode(config)
    victim: Victim | None = None
    try:
        probe = "print('KERNEL', open('/proc/%d/cmdline' % os.getppid(), 'rb').read())"
        probe = "import os\n" + probe
        scope: SessionScope | None = None
        deadline = time.monotonic() + 60
        for n in range(1000):  # until the kernel comes the expected way (see test_sandbox)
            if kind == "session":
                scope = SessionScope(f"attacker-{n}", cwd=str(cwd))
            out = attacker.run_sync(probe, scope=scope).content
            assert "KERNEL" in out, out
            if ("lemon_exec.template.server" in out) == forked:
                break
            assert forked and time.monotonic() < deadline, out
            time.sleep(0.2)
        if kind == "spare":  # the spare the attack runs on starts before the victim
            _wait_spare(attacker)
        victim = Victim(victim_base)
        script = hunt(victim.kernel_id, mark)
        result = attacker.run_sync(script, scope=scope)
        out = result.content
        assert result.details.get("exit_code") == 0, out
        assert "WALKED" in out and "REACHED []" in out, out
        assert not mark.exists(), out
        # The victim still works (nothing of its was taken over).
        again = victim.tool.run_sync("print(x + 1)", scope=SessionScope("victim"))
        assert "2" in again.content, again.content
    finally:
        if victim is not None:
            victim.close()
        attacker.close()


def _wait_spare(tool: ExecuteCode) -> None:
    def spare_up() -> bool:
        return any(k.phase == "spare" for k in tool.diagnostics.kernels)

    assert wait_until(spare_up, 30), "no warm spare was started"


@pytest.mark.parametrize("forked", [True, False], ids=["forked", "cold"])
def test_a_victim_in_the_attackers_tmpdir_is_unreachable(
    place: Path, short_tmp: Path, monkeypatch: pytest.MonkeyPatch, forked: bool
) -> None:
    """The working directory is $TMPDIR itself; the victim's root lands there later."""
    _attack(
        place,
        cwd=short_tmp,
        victim_base=short_tmp,
        tmpdir=short_tmp,
        monkeypatch=monkeypatch,
        forked=forked,
    )


def test_a_victim_in_a_sibling_folder_of_the_cwd_is_unreachable_from_a_spare(
    place: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Attacker's TMPDIR and the victim's staging base are sibling folders under the cwd."""
    project = place / "project"
    project.mkdir()
    monkeypatch.chdir(project)  # per-call spares' view: the host's working directory
    _attack(
        place,
        cwd=project,
        victim_base=project / "victim-tmp",
        tmpdir=project / "my-tmp",
        monkeypatch=monkeypatch,
        kind="spare",
    )


def test_a_victim_in_home_is_unreachable_from_a_cold_spare(
    place: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = place / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(home)
    _attack(
        place,
        cwd=home,
        victim_base=home / "tmp",
        monkeypatch=monkeypatch,
        kind="spare",
        forked=False,
    )


@pytest.mark.parametrize("forked", [True, False], ids=["forked", "cold"])
def test_a_cwd_of_tmp_reaches_no_victim_in_tmp(
    place: Path, short_tmp: Path, monkeypatch: pytest.MonkeyPatch, forked: bool
) -> None:
    _attack(
        place,
        cwd=Path("/tmp"),
        victim_base=short_tmp,
        monkeypatch=monkeypatch,
        forked=forked,
    )


def test_a_read_only_cwd_of_root_reaches_no_victim_anywhere(
    place: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The whole filesystem in view (read-only): the victim's root is where nothing masks it."""
    _attack(
        place,
        cwd=Path("/"),
        victim_base=place / "anywhere",
        monkeypatch=monkeypatch,
        writable=False,
    )


def test_the_runtime_base_holds_every_key_and_socket(place: Path) -> None:
    """Keys and sockets of any host, whatever its staging base, are under the fixed base,
    which is ours and 0700; the staging root holds none."""
    victim = Victim(place / "elsewhere")
    try:
        base = runtime_base.base_path()
        assert base.parent == Path(os.path.realpath("/tmp"))
        st = os.lstat(base)
        assert st.st_uid == os.getuid() and (st.st_mode & 0o777) == 0o700
        assert base in victim.connection_file.parents
        sockets = [p for p in victim.connection_file.parent.iterdir() if p.is_socket()]
        assert len(sockets) >= 5, sockets
        staged = [str(p) for p in (place / "elsewhere").rglob("*") if "kernel-" in p.name]
        assert staged == [], staged
    finally:
        victim.close()


def test_a_squatted_runtime_base_is_refused(monkeypatch: pytest.MonkeyPatch, place: Path) -> None:
    """A base that is not a 0700 directory of ours (here: a symlink) fails closed."""
    fake = place / "tmp"
    fake.mkdir()
    (fake / f"lemon-exec.{os.getuid()}").symlink_to(place)
    monkeypatch.setattr(runtime_base, "base_path", lambda: fake / f"lemon-exec.{os.getuid()}")
    with pytest.raises(RefusedError, match=r"is a symlink; .*remove .* if it is not yours"):
        runtime_base.runtime_base()
    (fake / f"lemon-exec.{os.getuid()}").unlink()
    (fake / f"lemon-exec.{os.getuid()}").mkdir(mode=0o755)
    os.chmod(fake / f"lemon-exec.{os.getuid()}", 0o755)
    with pytest.raises(RefusedError, match=r"mode 0755, not 0700; .*if it is not yours"):
        runtime_base.runtime_base()


def test_a_cwd_inside_the_runtime_base_is_refused() -> None:
    from lemon_exec.host.kernels import sandbox as sandboxes

    base = runtime_base.base_path()
    spec = sandboxes.SandboxSpec(kind="bwrap")
    with pytest.raises(Exception, match="where every host keeps its kernels' keys"):
        sandboxes.kernel_argv_prefix(
            spec,
            bwrap="bwrap",
            cwd=base / "lemon-exec-other",
            kernel_dir=base / "lemon-exec-mine" / "k",
            staging_root=Path("/tmp/lemon-exec-mine"),
            pypath=Path("/tmp/lemon-exec-mine/pypath"),
        )
