"""What the fork-server template does so that its kernels copy fewer of its pages, and what
its kernels share with it (the string-hash secret).

The effect is measured by the benchmark (``sessions64_idle_pss_mb``); these tests check
that each piece does what it says, in a process of its own.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import pytest

from lemon_exec import ExecuteCode, ExecuteCodeConfig

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc and fork: Linux"),
    pytest.mark.kernel,
]

HEAP_PROBE = """
import ctypes, json
from lemon_exec.template import heap
libc = heap._libc()
libc.free.argtypes = [ctypes.c_void_p]
kept, freed = [], []
for i in range(3000):  # holes of many sizes between blocks that stay
    size = 24 + (i % 60) * 16
    kept.append(libc.malloc(size))
    freed.append(libc.malloc(size))
for block in freed:
    libc.free(block)
before = libc.mallinfo2()
top = libc.sbrk(0) - before.keepcost  # where the heap's free top began: fresh memory
held = heap.fill_free_chunks()
after = libc.mallinfo2()
fresh = [libc.malloc(size) for size in (24, 100, 500, 1000, 3000)]
print(json.dumps({
    "held": held,
    "free_chunks_before": before.ordblks + before.smblks,
    "free_chunks_after": after.ordblks + after.smblks,
    "fresh_from_top": all(block >= top for block in fresh),
}))
"""


def test_filling_the_heap_leaves_new_allocations_to_its_top() -> None:
    out = subprocess.run(
        [sys.executable, "-c", HEAP_PROBE], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    info = json.loads(out.stdout)
    assert info["free_chunks_before"] > 100  # the holes the probe made
    assert info["free_chunks_after"] <= 2  # the top chunk (and at most one remainder)
    assert info["held"] > 0
    assert info["fresh_from_top"]  # not in a hole


POOLS_PROBE = """
import json
from lemon_exec.template import pools
kept, freed = [], []
for i in range(6000):  # holes in many pools of several size classes
    size = 40 + (i % 12) * 32
    kept.append(bytes(size))
    freed.append(bytes(size))
del freed
before = pools.free_blocks()
held = pools.fill_partial_pools()
after = pools.free_blocks()
print(json.dumps({"held": held, "before": before, "after": after}))
"""

#: pymalloc's pool size on 64-bit CPython 3.10+ (the statistics give blocks, not pools).
POOL_BYTES = 16 << 10


def test_filling_the_object_pools_leaves_only_fresh_pools_with_free_blocks() -> None:
    out = subprocess.run(
        [sys.executable, "-c", POOLS_PROBE], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    info = json.loads(out.stdout)
    before = {int(k): v for k, v in info["before"].items()}
    after = {int(k): v for k, v in info["after"].items()}
    assert set(before) == set(after) and len(before) == 32  # pymalloc's 32 size classes
    # The probe's holes: for its sizes, far more free blocks than one pool holds.
    holed = [size for size in before if before[size] > 2 * POOL_BYTES // size]
    assert len(holed) >= 8
    # Every hole is filled (a class's newest pool may have been left as it was).
    assert info["held"] >= sum(before[size] - POOL_BYTES // size for size in holed)
    for size in holed:
        # At most the newest pool's untouched blocks (the fill's own last pool) remain.
        assert after[size] <= POOL_BYTES // size, (size, before[size], after[size])


ENV_PROBE = """
import json, os, subprocess
from lemon_exec.template.server import _set_environ
os.environ.update({"LEMON_T_KEEP": "same", "LEMON_T_CHANGE": "old", "LEMON_T_DROP": "x"})
target = {k: v for k, v in os.environ.items() if k != "LEMON_T_DROP"}
target.update({"LEMON_T_CHANGE": "new", "LEMON_T_ADD": "added"})
_set_environ(target)
seen = subprocess.run(["env", "-0"], capture_output=True, check=True).stdout
child = dict(item.split("=", 1) for item in seen.decode().split("\\0") if item)
print(json.dumps({"python": dict(os.environ) == target, "libc": child == target}))
"""


def test_a_forked_kernel_gets_exactly_the_requested_environment() -> None:
    """Only the differences are applied, in Python and in libc's environment alike."""
    out = subprocess.run(
        [sys.executable, "-c", ENV_PROBE], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {"python": True, "libc": True}


HASH_PROBE = """
import os
parent = open(f"/proc/{os.getppid()}/cmdline", "rb").read()
print("FORKED" if b"lemon_exec.template.server" in parent else "COLD", hash("lemon-x"))
"""


@pytest.mark.slow
def test_forked_kernels_share_their_templates_hash_secret_and_only_theirs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """docs/security.md, "Forked kernels and their template": hash("x") is the same in the
    kernels of one template, and differs across templates (facades) and cold kernels."""
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)  # a fixed seed: the same everywhere

    def facade(fork_server: bool) -> ExecuteCode:
        return ExecuteCode(
            ExecuteCodeConfig(
                enabled=True,
                warm_kernels=0,
                python_path=sys.executable,
                fork_server=fork_server,
                timeout_ms=30_000,
            )
        )

    async def hashes(ec: ExecuteCode, start: str, count: int) -> list[str]:
        found: list[str] = []
        for _ in range(100):
            result = await ec.run(HASH_PROBE)
            kind, value = result.content.split()
            if kind == start:
                found.append(value)
                if len(found) == count:
                    return found
            else:
                await asyncio.sleep(0.2)  # the template is still starting
        raise AssertionError(f"no {start} kernels: {found}")

    async def main() -> tuple[list[str], list[str], list[str]]:
        one, two, cold = facade(True), facade(True), facade(False)
        try:
            return (
                await hashes(one, "FORKED", 2),
                await hashes(two, "FORKED", 1),
                await hashes(cold, "COLD", 2),
            )
        finally:
            for ec in (one, two, cold):
                await ec.aclose()

    same_template, other_template, cold = asyncio.run(main())
    assert same_template[0] == same_template[1]
    assert other_template[0] != same_template[0]
    assert cold[0] != cold[1]
