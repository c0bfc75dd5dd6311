"""Jobs (``ExecuteCode.start``): background calls with poll, cancel, expiry and shutdown.

Real kernels throughout. A job's progress is steered by gate files the script waits for, so
no test depends on how fast a kernel starts.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from support import await_until, enabled_config, pid_gone, wait_until

from lemon_exec import ExecuteCode, Job, JobExpiredError, SessionScope

pytestmark = [pytest.mark.timeout(120), pytest.mark.kernel]


def gated(gate: Path, before: str = "", after: str = "") -> str:
    """A script that runs ``before``, waits for ``gate`` to exist, then runs ``after``."""
    return (
        "import os, time\n"
        f"{before}\n"
        f"while not os.path.exists({str(gate)!r}):\n"
        "    time.sleep(0.02)\n"
        f"{after}\n"
    )


def run(body: Callable[[ExecuteCode], Awaitable[None]], **settings: Any) -> None:
    async def main() -> None:
        async with ExecuteCode(enabled_config(**settings)) as ec:
            await body(ec)

    asyncio.run(main())


def state(job: Job) -> str:
    """The job's state now (a call, so that type checkers do not narrow it across awaits)."""
    return job.state


async def printed(job: Job, needle: str) -> bool:
    return await await_until(lambda: needle in job.poll().output)


def test_poll_is_incremental_and_the_result_is_a_runs(tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    script = gated(
        gate,
        before="print('one', flush=True)\nnotify('halfway')\ntext('first')",
        after="print('two', flush=True)\ntext('second')",
    )

    async def body(ec: ExecuteCode) -> None:
        job = await ec.start(script)
        assert state(job) in ("queued", "running")
        assert ec.jobs() == [job] and ec.job(job.id) == job
        assert await await_until(lambda: job.poll().text_blocks == ["first"])
        first = job.poll()
        assert first.state == "running" and first.result is None
        assert first.output == "one\n" and first.notifications == ["notify: halfway"]
        assert not first.missed
        gate.touch()
        result = await job.wait(timeout=60)
        assert job.state == "completed" and result.ok
        rest = job.poll(first.cursor)
        assert rest.output == "two\n" and rest.text_blocks == ["second"]
        assert rest.notifications == [] and rest.result is result
        assert job.poll(rest.cursor).output == ""  # nothing after the last cursor
        assert result.content.startswith("Script result (text()):\nfirst\nsecond")
        assert "one\ntwo" in result.content  # the whole output, as run() gives it

    run(body)


def test_cancel_while_running_interrupts_and_keeps_partial_output() -> None:
    script = "import os, time\nprint('pid', os.getpid(), flush=True)\ntime.sleep(300)"

    async def body(ec: ExecuteCode) -> None:
        job = await ec.start(script)
        assert await printed(job, "pid ")
        pid = int(job.poll().output.split()[1])
        assert state(job) == "running"
        result = await job.cancel()
        assert result is not None and job.state == "cancelled"
        assert result.details.get("cancelled") is True
        assert result.content.startswith("Script cancelled.")
        assert f"pid {pid}" in result.content  # the partial output is kept
        assert await await_until(lambda: pid_gone(pid))
        assert await job.cancel() is result  # cancelling again changes nothing

    run(body)


def test_cancel_while_queued_leaves_the_queue(tmp_path: Path) -> None:
    gate = tmp_path / "gate"

    async def body(ec: ExecuteCode) -> None:
        holder = await ec.start(gated(gate, after="text('held')"))
        assert await await_until(lambda: holder.state == "running")
        queued = await ec.start("text('must not run')")
        assert await await_until(lambda: ec.diagnostics.per_call_waiting == 1)
        assert state(queued) == "queued"
        result = await queued.cancel()
        assert result is not None and queued.state == "cancelled"
        assert "must not run" not in result.content and "nothing ran" in result.content
        assert holder.state == "running"  # the running job is undisturbed
        gate.touch()
        assert (await holder.wait(60)).content.endswith("held")

    run(body, max_concurrent_per_call=1)


def test_a_job_has_max_job_ms_not_timeout_ms() -> None:
    async def body(ec: ExecuteCode) -> None:
        long = await ec.start("import time\ntime.sleep(2)\ntext('done')")
        short = await ec.start("import time\ntime.sleep(300)", timeout_ms=1500)
        assert (await long.wait(60)).ok  # past timeout_ms (1 s), within max_job_ms
        result = await short.wait(60)
        assert short.state == "timed_out" and result.details.get("timed_out") is True
        assert result.content.startswith("Script timed out after 1500ms.")

    run(body, timeout_ms=1000, max_job_ms=60_000)


def test_finished_jobs_expire_by_count_and_by_age() -> None:
    async def body(ec: ExecuteCode) -> None:
        jobs = []
        for n in range(3):  # one after the other: they finish in order
            jobs.append(job := await ec.start(f"text('{n}')"))
            assert (await job.wait(60)).ok
        kept = ec.jobs()
        assert len(kept) == 2 and jobs[0] not in kept  # max_finished_jobs: oldest first
        assert jobs[0].state == "expired" and jobs[0].result is None
        with pytest.raises(JobExpiredError, match="has expired"):
            ec.job(jobs[0].id)
        with pytest.raises(JobExpiredError):
            await jobs[0].wait()
        with pytest.raises(JobExpiredError):
            jobs[0].poll()
        with pytest.raises(KeyError, match="no job nope"):
            ec.job("nope")
        ec.config.job_result_ttl_ms = 1  # now everything finished is past its age
        assert await await_until(lambda: not ec.jobs())
        with pytest.raises(JobExpiredError, match="job_result_ttl_ms"):
            ec.job(jobs[2].id)

    run(body, max_finished_jobs=2)


def test_a_finished_job_expires_on_time_without_being_asked() -> None:
    async def body(ec: ExecuteCode) -> None:
        first = await ec.start("text('1')")
        await first.wait(60)
        second = await ec.start("text('2')")
        await second.wait(60)
        # Nobody calls jobs()/job()/start(): the table's timer expires them, in order.
        assert await await_until(lambda: state(first) == "expired", 30)
        assert await await_until(lambda: state(second) == "expired", 30)
        assert first.result is None and second.result is None

    run(body, job_result_ttl_ms=300)


def test_session_job_is_the_active_cell_and_calls_queue_behind(tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    scope = SessionScope("s1", "a1", str(tmp_path))

    async def body(ec: ExecuteCode) -> None:
        job = await ec.start(gated(gate, before="x = 41"), scope=scope)
        assert await await_until(lambda: job.state == "running")
        behind = asyncio.ensure_future(ec.run("text(str(x + 1))", scope=scope))
        assert await await_until(lambda: ec.snapshot()["queued"] == 1)
        busy = await ec.run("text('no room')", scope=scope)  # the queue holds one
        assert busy.details.get("busy") is True and "no room" not in busy.content
        assert not behind.done()
        gate.touch()
        assert (await job.wait(60)).details["state_retained"] is True
        after = await behind
        assert after.content.endswith("42"), after.content  # the job's state is kept

    run(body, kernel_mode="session", max_queued_cells_per_kernel=1)


def test_cancelled_session_job_discards_its_kernel(tmp_path: Path) -> None:
    scope = SessionScope("s2", "a1", str(tmp_path))

    async def body(ec: ExecuteCode) -> None:
        assert (await ec.run("y = 1", scope=scope)).ok
        job = await ec.start("import time\nprint('go', flush=True)\ntime.sleep(300)", scope=scope)
        assert await printed(job, "go")
        result = await job.cancel()
        assert result is not None and result.details["state_retained"] is False
        later = await ec.run("print('y' in globals())", scope=scope)
        assert "False" in later.content  # the spec's row: aborted while active: discarded

    run(body, kernel_mode="session")


def test_an_owner_starts_jobs_in_its_kernel_and_closing_it_aborts_them(tmp_path: Path) -> None:
    gate = tmp_path / "gate"

    async def body(ec: ExecuteCode) -> None:
        owner = await ec.attach(SessionScope("s3", "a1", str(tmp_path)))
        job = await owner.start(gated(gate, before="z = 6", after="text('gated')"))
        assert await await_until(lambda: job.state == "running")
        assert job in ec.jobs() and ec.job(job.id) == job
        gate.touch()
        assert (await job.wait(60)).details["state_retained"] is True
        assert (await owner.run("text(str(z * 7))")).content.endswith("42")  # its kernel

        long = await owner.start("import time\nprint('go', flush=True)\ntime.sleep(300)")
        assert await printed(long, "go")
        await owner.aclose()  # the active call of a closing owner is aborted
        result = await long.wait(60)
        assert long.state == "cancelled" and result.details["state_retained"] is False

    run(body, kernel_mode="session")


def test_crashed_kernel_ends_the_job() -> None:
    async def body(ec: ExecuteCode) -> None:
        job = await ec.start("import os\nprint('bye', flush=True)\nos._exit(7)")
        result = await job.wait(60)
        assert job.state == "failed" and result.details.get("crashed") is True
        assert result.details["exit_code"] == 7 and "bye" in result.content

    run(body)


def test_aclose_cancels_jobs_keeps_results_and_leaks_no_kernel(tmp_path: Path) -> None:
    gate = tmp_path / "never"
    script = gated(gate, before="print('pid', os.getpid(), flush=True)")

    async def main() -> None:
        ec = ExecuteCode(enabled_config(max_concurrent_per_call=2))
        running = [await ec.start(script) for _ in range(2)]
        queued = await ec.start(script)
        for job in running:
            assert await printed(job, "pid ")
        pids = [int(job.poll().output.split()[1]) for job in running]
        await ec.aclose()
        for job in running:
            assert job.state == "cancelled"
            assert job.result is not None and "pid " in job.result.content
        assert queued.state == "cancelled" and queued.result is not None
        assert all(pid_gone(pid) for pid in pids)
        assert ec.diagnostics.kernels == () and ec.jobs() == [*running, queued]
        with pytest.raises(RuntimeError, match="closed"):
            await ec.start("1")

    asyncio.run(main())


def test_sync_twins(tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    with ExecuteCode(enabled_config()) as ec:
        job = ec.start_sync(gated(gate, after="text('synced')"))
        assert wait_until(lambda: job.state == "running")
        gate.touch()
        assert job.wait_sync(60).content.endswith("synced")
        other = ec.start_sync("import time\ntime.sleep(300)")
        cancelled = other.cancel_sync()
        assert cancelled is not None and other.state == "cancelled"


def test_a_job_holds_an_admission_slot_and_calls_wait_for_it(tmp_path: Path) -> None:
    """Per call with max_concurrent_per_call=1: a running job holds the one slot, so a call
    (or a second job) waits in the admission queue until the job ends, and one whose
    deadline passes first leaves the queue with nothing run."""
    gate = tmp_path / "gate"

    async def body(ec: ExecuteCode) -> None:
        job = await ec.start(gated(gate, before="print('job', flush=True)", after="text('j')"))
        assert await printed(job, "job")
        refused = await ec.run("text('never')", timeout_ms=1_000)
        assert not refused.ok and refused.details["exit_code"] is None, refused.content
        assert "never" not in refused.content
        waiting = asyncio.create_task(ec.run("text('after')", timeout_ms=60_000))
        second = await ec.start("text('second')")
        await asyncio.sleep(0.5)
        assert not waiting.done() and state(second) == "queued"
        gate.write_text("")
        assert (await job.wait()).ok
        after = await waiting
        assert after.ok and after.details["queue_wait_ms"] >= 500, after.details
        assert (await second.wait()).ok

    run(body, kernel_mode="per_call", max_concurrent_per_call=1, warm_kernels=0)


def test_a_session_job_counts_against_max_live_kernels(tmp_path: Path) -> None:
    """Sessions with max_live_kernels=1: a job's kernel is live and busy, so another
    session's call cannot evict it and runs isolated (capacity_exhausted), as a call would."""
    gate = tmp_path / "gate"

    async def body(ec: ExecuteCode) -> None:
        job = await ec.start(
            gated(gate, before="print('job', flush=True)", after="text('j')"),
            scope=SessionScope("a", "owner-a"),
        )
        assert await printed(job, "job")
        other = await ec.run("text('other')", scope=SessionScope("b", "owner-b"))
        assert other.ok, other.content
        assert other.details.get("fallback_reason") == "capacity_exhausted", other.details
        gate.write_text("")
        assert (await job.wait()).details["persistent"] is True

    run(body, kernel_mode="session", max_live_kernels=1)
