"""Kernel resource limits (kernel_memory_mb, kernel_max_processes, kernel_max_open_files).

Real kernels under real cgroups (this machine and CI run as root with writable cgroup v1
hierarchies) and, with cgroups turned off, under rlimits. Every test checks that no
``lemon-<host pid>`` cgroup directory is left once its facade is closed.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support import enabled_config

from lemon_exec import ExecuteCode, ExecuteCodeConfig
from lemon_exec.host.kernels import resource_limits as limits

pytestmark = [pytest.mark.timeout(90), pytest.mark.kernel]


def make_config(**overrides: Any) -> ExecuteCodeConfig:
    """An enabled config (see support.enabled_config)."""
    return enabled_config(**overrides)


def lemon_cgroups() -> list[Path]:
    """This host's lemon cgroup directories, in every hierarchy."""
    found: list[Path] = []
    for root in Path("/sys/fs/cgroup").iterdir():
        found += [p for p in root.rglob(f"lemon-{os.getpid()}") if p.is_dir()]
    return found


def rss_kb() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


@pytest.fixture
def facade(request: pytest.FixtureRequest) -> Iterator[ExecuteCode]:
    tool = ExecuteCode(make_config(**request.param))
    try:
        yield tool
    finally:
        tool.close()
        assert lemon_cgroups() == [], "a kernel cgroup was left behind"


@pytest.mark.slow
@pytest.mark.parametrize("facade", [{"kernel_memory_mb": 512}], indirect=True)
def test_memory_limit_kills_the_script_not_the_host(facade: ExecuteCode) -> None:
    placed = facade.run_sync("print(open('/proc/self/cgroup').read())")
    assert placed.details["exit_code"] == 0, placed.content
    assert f"lemon-{os.getpid()}/k-" in placed.content  # the kernel runs in its own cgroup
    before = rss_kb()
    result = facade.run_sync("data = b'x' * (4 * 2**30)\nprint('allocated', len(data))")
    assert result.content.startswith("Script killed: memory limit (512 MB) exceeded."), (
        result.content
    )
    assert "allocated" not in result.content
    assert result.details.get("crashed") is True
    assert result.details.get("memory_limit_exceeded") is True
    assert rss_kb() - before < 64 * 1024  # the host never held the 4 GB
    after = facade.run_sync("print('still works')")  # the next call gets a fresh kernel
    assert "still works" in after.content
    assert "memory_limit_exceeded" not in after.details


@pytest.mark.slow
@pytest.mark.parametrize("facade", [{"kernel_max_processes": 40}], indirect=True)
def test_fork_bomb_is_contained(facade: ExecuteCode) -> None:
    bomb = (
        "import os, time\n"
        "forked, failed = 0, None\n"
        "for _ in range(1000):\n"
        "    try:\n"
        "        pid = os.fork()\n"
        "    except OSError as exc:\n"
        "        failed = exc.errno\n"
        "        break\n"
        "    if pid == 0:\n"  # every child forks forever: a fork bomb
        "        while True:\n"
        "            try:\n"
        "                os.fork()\n"
        "            except OSError:\n"
        "                time.sleep(0.01)\n"
        "    forked += 1\n"
        "import errno\n"
        "print('forked', forked, 'failed', errno.errorcode.get(failed))\n"
    )
    for _ in range(2):  # the first kernel starts cold, the second is usually forked
        result = facade.run_sync(bomb)
        assert result.details["exit_code"] == 0, result.content
        assert "failed EAGAIN" in result.content, result.content
        forked = int(result.content.split("forked ")[1].split()[0])
        assert forked < 40
    # The kernels' trees (and cgroups) are gone: conftest's leak watch and the fixture check.


@pytest.mark.parametrize("facade", [{"kernel_max_open_files": 80}], indirect=True)
def test_open_files_are_limited(facade: ExecuteCode) -> None:
    # 80: room above the ~64 descriptors an idle kernel holds (zmq sockets and their
    # mailboxes, the host link, captured output pipes).
    # Run out of descriptors in a child: inside the kernel itself zmq aborts on EMFILE.
    child = (
        "import errno\n"
        "files = []\n"
        "try:\n"
        "    while len(files) < 1000:\n"
        "        files.append(open('/dev/null'))\n"
        "except OSError as exc:\n"
        "    print('opened', len(files), errno.errorcode[exc.errno])\n"
    )
    script = (
        "import resource, subprocess, sys\n"
        "print('limit', resource.getrlimit(resource.RLIMIT_NOFILE))\n"
        f"subprocess.run([sys.executable, '-c', {child!r}])\n"
    )
    result = facade.run_sync(script)
    assert "limit (80, 80)" in result.content, result.content
    assert "EMFILE" in result.content, result.content
    assert int(result.content.split("opened ")[1].split()[0]) < 80


@pytest.fixture
def no_cgroups(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(limits.CGROUPS_ENV, "0")


@pytest.mark.parametrize("facade", [{"kernel_memory_mb": 1536}], indirect=True)
def test_without_cgroups_memory_is_an_rlimit(no_cgroups: None, facade: ExecuteCode) -> None:
    result = facade.run_sync(
        "try:\n"
        "    data = b'x' * (4 * 2**30)\n"
        "except MemoryError:\n"
        "    print('caught MemoryError')\n"
        "print(open('/proc/self/cgroup').read())\n"
    )
    assert "caught MemoryError" in result.content, result.content
    assert "lemon-" not in result.content


@pytest.mark.parametrize("facade", [{"kernel_max_processes": 10}], indirect=True)
def test_unenforceable_process_limit_is_refused(no_cgroups: None, facade: ExecuteCode) -> None:
    result = facade.run_sync("print('ran')")
    if os.geteuid() == 0:  # RLIMIT_NPROC does not bind root: refused, never run unlimited
        assert result.details.get("error") is True
        assert "ran" not in result.content
        assert "kernel_max_processes = 10 cannot be enforced" in result.content
        assert "RLIMIT_NPROC" in result.content and "LEMON_EXEC_CGROUP_PARENT" in result.content
    else:
        assert "ran" in result.content


def test_settings_default_to_unlimited_and_read_the_environment() -> None:
    config = ExecuteCodeConfig.load(
        environ={
            "LEMON_EXECUTE_CODE_KERNEL_MEMORY_MB": "512",
            "LEMON_EXECUTE_CODE_KERNEL_MAX_PROCESSES": "-3",
        }
    )
    assert config.kernel_memory_mb == 512
    assert config.kernel_max_processes == 0  # clamped: 0 is unlimited
    assert config.kernel_max_open_files == 0


@pytest.mark.slow
@pytest.mark.bwrap
@pytest.mark.parametrize(
    "facade",
    [{"sandbox": "bwrap", "kernel_memory_mb": 256, "kernel_max_processes": 30}],
    indirect=True,
)
def test_limits_apply_inside_the_sandbox(facade: ExecuteCode) -> None:
    # bwrap's pid is the kernel's ancestor: its whole tree goes into the cgroup from the host.
    placed = facade.run_sync("print(open('/proc/self/cgroup').read())")
    assert f"lemon-{os.getpid()}/k-" in placed.content, placed.content
    result = facade.run_sync("data = b'x' * 2**31")
    assert result.content.startswith("Script killed: memory limit (256 MB) exceeded."), (
        result.content
    )
    assert result.details.get("memory_limit_exceeded") is True
