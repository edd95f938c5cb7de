"""The store's writer commits a few records on the CPU the event loop queued them from, a
lone one where it is, and a large batch on every CPU (labd/store/affinity.py), on this
machine's own scheduler."""

import asyncio
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from labd.store import Store
from labd.store.affinity import FOLLOW_AT_LEAST, FOLLOW_AT_MOST, Follower
from labd.store.writer import ReconfigurationRecord

CPUS = frozenset(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else frozenset()
pytestmark = pytest.mark.skipif(len(CPUS) < 2, reason="following needs Linux and two CPUs")


def in_a_thread(work: Callable[[], list[object]]) -> list[object]:
    """``work()`` in a thread of its own (as the writer is), its result or its error."""
    out: dict[str, list[object]] = {}
    failed: list[BaseException] = []

    def run() -> None:
        try:
            out["value"] = work()
        except BaseException as exc:
            failed.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    if failed:
        raise failed[0]
    return out["value"]


def test_a_few_records_go_to_the_loops_cpu_and_many_to_every_cpu() -> None:
    first, second = sorted(CPUS)[:2]

    def follow() -> list[object]:
        follower = Follower()
        seen: list[object] = [os.sched_getscheduler(0)]
        for records, cpu in ((FOLLOW_AT_LEAST, first), (FOLLOW_AT_MOST, second),
                             (FOLLOW_AT_LEAST - 1, first), (FOLLOW_AT_MOST + 1, first),
                             (3, -1), (3, max(CPUS) + 1)):
            follower.before(records, cpu)
            seen.append(frozenset(os.sched_getaffinity(0)))
        return seen

    policy, *places = in_a_thread(follow)
    assert policy == os.SCHED_BATCH
    assert places == [{first}, {second}, {second}, CPUS, CPUS, CPUS]


@pytest.fixture
def loop_on() -> Iterator[Callable[[int], None]]:
    """Holds the test's own thread (the event loop's) on a CPU; given back after."""
    before = os.sched_getaffinity(0)
    yield lambda cpu: os.sched_setaffinity(0, {cpu})
    os.sched_setaffinity(0, before)


async def test_the_writer_commits_where_the_loop_queued_the_record(
        tmp_path: Path, loop_on: Callable[[int], None]) -> None:
    store = Store(str(tmp_path / "store.sqlite"))
    await store.open()
    try:
        writer = store.writer_id
        assert writer is not None
        for cpu in sorted(CPUS)[:2]:
            loop_on(cpu)
            # The writer held in a piece of work while three records queue behind it, so
            # that they go in as one batch of three.
            held, going = threading.Event(), threading.Event()

            def hold(session: object, held: threading.Event = held,
                     going: threading.Event = going) -> None:
                going.set()
                assert held.wait(10), "the test never let the writer go on"

            blocking = asyncio.ensure_future(store.run_write(hold))
            assert await asyncio.to_thread(going.wait, 10)
            now = time.monotonic_ns()
            records = asyncio.gather(*(store.record(ReconfigurationRecord(
                switch="s1", cause="api", outcome="ok", error=None, connected=[(i, 16 + i)],
                disconnected=[], requested_ns=now, dispatched_ns=now, activated_ns=now,
                acked_ns=now, light_ns=None, done_ns=now)) for i in (1, 2, 3)))
            # The writer is let go once the three tasks have queued their records: the loop
            # runs its callbacks in the order they were scheduled, theirs first.
            asyncio.get_running_loop().call_soon(held.set)
            await blocking
            await records
            assert store.loop_cpu == cpu
            assert os.sched_getaffinity(writer) == {cpu}
    finally:
        await store.close()
