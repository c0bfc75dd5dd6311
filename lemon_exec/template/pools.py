"""Fill pymalloc's partly used pools in the fork-server template, so kernels allocate densely.

CPython serves objects of up to 512 bytes from 16 KiB pools, one size class per pool, and
takes a new object's block from a partly used pool of its class first. After its imports
the template has ~4,000 free blocks (~0.4 MiB) scattered over its ~1,100 pools: a forked
kernel's first small objects land in them, and each block it writes copies a 4 KiB page of
the template. Allocating every free block in the template (and never freeing them) leaves
only fresh pools for a kernel's objects: ~0.19 MiB less copied per kernel (128 idle
session kernels: 1,252 -> 1,227 MiB of PSS), for ~5 ms once at the template's start.

The counts come from CPython's allocator statistics (``sys._debugmallocstats``); with
another allocator (``PYTHONMALLOC=malloc``) or another interpreter there are none, and
:func:`fill_partial_pools` does nothing. It is bounded: it never holds more than
:data:`MAX_BYTES`. The C heap's holes are :mod:`lemon_exec.template.heap`'s.
"""

from __future__ import annotations

import os
import re
import sys

#: The most the template holds for the filling (a few hundred KiB is usual).
MAX_BYTES = 4 << 20
#: Filling allocates too (the lists that hold the blocks): a second pass fills what the
#: first one left; a third finds nothing left but those passes' own last pools.
_PASSES = 2
#: A row of the statistics' size-class table: class, size, pools, blocks in use, free blocks.
_ROW = re.compile(rb"^[ \t]*\d+[ \t]+(\d+)[ \t]+\d+[ \t]+\d+[ \t]+(\d+)[ \t]*$", re.MULTILINE)
#: The smallest block a ``bytes`` object fills (its header, on this build).
_BYTES_HEADER = sys.getsizeof(b"")
#: An int of one digit (below 2**30) takes the 32-byte class; ints are made fresh by range().
_ONE_DIGIT_INT = 1 << 20

#: The filling objects, never freed (the template's life; kernels inherit them unused).
_held: list[object] = []


def fill_partial_pools() -> int:
    """Allocate the free blocks of pymalloc's partly used pools; return how many are held."""
    budget = MAX_BYTES
    for _ in range(_PASSES):
        vacancies = free_blocks()
        for size, count in vacancies.items():
            count = min(count, budget // size)
            if count > 0:
                _held.extend(_objects(size, count))
                budget -= size * count
    return len(_held)


def free_blocks() -> dict[int, int]:
    """Free blocks in partly used pools, by block size (empty when not pymalloc)."""
    # The size-class table is the only part of the statistics with five numbers a line.
    return {int(row[1]): int(row[2]) for row in _ROW.finditer(_allocator_stats())}


def _objects(size: int, count: int) -> list[object]:
    """``count`` new objects that each take a block of ``size`` bytes."""
    if size <= 16:
        return [object() for _ in range(count)]
    if size <= 32:
        return list(range(_ONE_DIGIT_INT, _ONE_DIGIT_INT + count))
    length = size - _BYTES_HEADER  # >= 15: never one of the shared empty/1-byte objects
    return [bytes(length) for _ in range(count)]


def _allocator_stats() -> bytes:
    """What ``sys._debugmallocstats`` writes to the C stderr (empty when unavailable)."""
    dump = getattr(sys, "_debugmallocstats", None)
    memfd_create = getattr(os, "memfd_create", None)
    if dump is None or memfd_create is None:
        return b""
    try:
        capture = memfd_create("lemon-mallocstats")
    except OSError:
        return b""
    try:
        saved = os.dup(2)
        try:
            sys.stderr.flush()
            os.dup2(capture, 2)
            dump()
        finally:
            os.dup2(saved, 2)  # stderr back, whatever happened
            os.close(saved)
        os.lseek(capture, 0, os.SEEK_SET)
        chunks = []
        while chunk := os.read(capture, 65536):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(capture)
