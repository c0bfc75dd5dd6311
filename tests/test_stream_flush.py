"""A cell's end costs no needless thread round trips (issue 17).

ipykernel flushes stdout and stderr after every cell and then sleeps 0.5 ms before its
reply. A kernel stream with nothing written since its last flush answers at once, without
a round trip to the IOPub thread; one with something written still sends it before flush
returns. The kernel does not sleep: the host (and every client) waits for the idle status,
which comes after the cell's output on IOPub; what a cell writes last, by any route, is
in its result, and the cell ends.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import zmq
from ipykernel.iostream import IOPubThread
from jupyter_client.session import Session

from lemon_exec import ExecuteCode, ExecuteCodeConfig, SessionScope
from lemon_exec.kernel.lemon_kernel import LemonKernel
from lemon_exec.kernel.streams import BoundedOutStream

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def iopub() -> Iterator[tuple[IOPubThread, zmq.Socket[Any], list[Callable[[], Any]]]]:
    """A real IOPub thread on an inproc PUB socket, a subscriber, and what gets scheduled."""
    context = zmq.Context()
    pub = context.socket(zmq.PUB)
    pub.bind("inproc://iopub")
    sub = context.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect("inproc://iopub")
    thread = IOPubThread(pub)
    thread.start()
    scheduled: list[Callable[[], Any]] = []
    schedule = thread.schedule

    def counting(job: Callable[[], Any]) -> None:
        scheduled.append(job)
        schedule(job)

    thread.schedule = counting  # type: ignore[method-assign]
    try:
        yield thread, sub, scheduled
    finally:
        thread.stop()
        thread.close()
        sub.close(linger=0)
        context.term()


def test_a_flush_with_nothing_written_is_not_a_round_trip(iopub: Any) -> None:
    thread, sub, scheduled = iopub
    stream = BoundedOutStream(Session(key=b"k"), thread, "stdout", watchfd=False)
    try:
        stream.flush()
        stream.flush()
        assert scheduled == []
        stream.write("hello")
        scheduled.clear()
        stream.flush()  # the text is sent before flush returns
        assert scheduled, "a flush after a write must go through the IO thread"
        assert sub.poll(5000)
        frames = sub.recv_multipart()
        assert b'"text": "hello"' in frames[-1]
        scheduled.clear()
        stream.flush()  # sent already: nothing left to wait for
        assert scheduled == []
    finally:
        stream.close()


def test_the_kernel_does_not_sleep_before_its_reply() -> None:
    assert LemonKernel.class_traits()["_execute_sleep"].default_value == 0


#: A cell whose last acts write, each by another route, what the result must hold.
LAST_WRITES = """
import os, subprocess, sys, threading
print("a{i}")
sys.stdout.write("b{i}")  # no newline, no flush
sys.stderr.write("c{i}")
os.write(1, b"d{i}")  # the file descriptor: through the kernel's pipe
subprocess.run(["sh", "-c", "printf e{i}"])
writer = threading.Thread(target=lambda: print("f{i}", end=""))  # another thread's write
writer.start()
writer.join()
"""


@pytest.mark.timeout(120)
@pytest.mark.kernel
def test_what_a_cell_writes_last_is_in_its_result() -> None:
    # 100 rounds: the pipe watcher once blocked in a read while holding the pipe lock (a
    # writer had drained the pipe after select() said readable), and the cell's end waited
    # on that lock until more output came: about one cell in three hung until its timeout.
    async def main() -> None:
        config = ExecuteCodeConfig(
            enabled=True, kernel_mode="session", warm_kernels=0, timeout_ms=10_000
        )
        async with ExecuteCode(config) as ec:
            scope = SessionScope("last-writes")
            for i in range(100):
                result = await ec.run(LAST_WRITES.format(i=i), scope=scope)
                assert not result.details.get("timed_out"), (i, result.content)
                for marker in "abcdef":
                    assert f"{marker}{i}" in result.content, (marker, i, result.content)

    asyncio.run(main())
