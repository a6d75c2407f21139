"""``redlock break NAME``: an operator deletes a lease left on the nodes, against real nodes.

The broken holder must find out at its next extension (LockLost), fencing counters must be kept
(the next holder's token still grows), and it must work for semaphores and lock_many names.
"""

from __future__ import annotations

import asyncio
import os
import pty
import sys

import pytest

from redlock_async import LockLost
from redlock_async.cli import EXIT_NOT_CONFIRMED, EXIT_UNAVAILABLE, EXIT_USAGE
from redlock_async.cli._break import break_command

from .conftest import Cluster, MakeRedlock, eventually, holders

PY = sys.executable


async def redlock_break(urls: list[str], name: str, *options: str) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        PY,
        "-m",
        "redlock_async",
        "break",
        name,
        "--nodes",
        ",".join(urls),
        *options,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    async with asyncio.timeout(30):
        out, err = await process.communicate()
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def test_break_deletes_the_lease_everywhere_and_the_holder_loses_it_at_its_next_extension(
    cluster: Cluster, make_redlock: MakeRedlock
) -> None:
    redlock = await make_redlock(fencing=True)
    lock = redlock.lock("stuck-job", ttl=60.0, owner="dead-worker")
    assert await lock.acquire(blocking=False)
    token = lock.fencing_token
    assert token is not None
    counters = [cluster[i].command("GET", "redlock-fence:stuck-job") for i in range(len(cluster))]

    code, out, err = await redlock_break(cluster.urls, "stuck-job", "--yes")

    assert code == 0, out + err
    # Who held it, before it went: the owner label, the ttl, each node.
    assert out.count("held by") >= len(cluster)
    assert "(dead-worker)" in out
    assert "ttl 5" in out or "ttl 6" in out  # about 60 s left
    for address in (url.removeprefix("redis://") for url in cluster.urls):
        assert address in out
    assert "broken: 5 of 5 nodes are clear" in out
    assert holders(cluster, "stuck-job") == []
    # The fencing counters are untouched ...
    assert [cluster[i].command("GET", "redlock-fence:stuck-job") for i in range(len(cluster))] == counters
    # ... the holder finds out at its next extension ...
    with pytest.raises(LockLost):
        await lock.extend()
    assert not lock.held
    # ... and the next holder's token is larger.
    successor = (await make_redlock(fencing=True)).lock("stuck-job")
    assert await successor.acquire(blocking=False)
    assert successor.fencing_token is not None
    assert successor.fencing_token > token
    await successor.release()


async def test_a_holder_inside_async_with_is_cancelled_with_lock_lost(
    cluster: Cluster, make_redlock: MakeRedlock
) -> None:
    """The watchdog's next round finds the key gone from the nodes it counted on: the body is cancelled."""
    redlock = await make_redlock()
    entered = asyncio.Event()
    reached_the_end = False

    async def hold() -> None:
        nonlocal reached_the_end
        async with redlock.lock("watched-job", ttl=1.5):
            entered.set()
            await asyncio.sleep(10)
            reached_the_end = True

    holder = asyncio.create_task(hold())
    await entered.wait()
    code, out, err = await redlock_break(cluster.urls, "watched-job", "--yes")
    assert code == 0, out + err
    with pytest.raises(LockLost):
        async with asyncio.timeout(5):  # the watchdog extends a 1.5 s lease well within it
            await holder
    assert not reached_the_end


async def test_without_a_terminal_it_needs_yes_and_deletes_nothing(cluster: Cluster, make_redlock: MakeRedlock) -> None:
    lock = (await make_redlock()).lock("kept-job", ttl=30.0)
    assert await lock.acquire(blocking=False)
    code, _, err = await redlock_break(cluster.urls, "kept-job")
    assert code == EXIT_USAGE
    assert "add --yes" in err
    assert holders(cluster, "kept-job") == list(range(len(cluster)))
    await lock.extend()  # still held
    await lock.release()


async def test_on_a_terminal_it_asks_and_no_deletes_nothing(cluster: Cluster, make_redlock: MakeRedlock) -> None:
    """Run on a pseudo-terminal, as an operator would: the question is asked; "n" keeps the lease."""
    lock = (await make_redlock()).lock("asked-job", ttl=30.0, owner="night-batch")
    assert await lock.acquire(blocking=False)
    for answer, expected in ((b"n\n", EXIT_NOT_CONFIRMED), (b"y\n", 0)):
        master, slave = pty.openpty()
        try:
            process = await asyncio.create_subprocess_exec(
                PY,
                "-m",
                "redlock_async",
                "break",
                "asked-job",
                "--nodes",
                ",".join(cluster.urls),
                stdin=slave,
                stdout=slave,
                stderr=slave,
            )
            os.close(slave)
            seen = b""
            async with asyncio.timeout(30):
                while b"[y/N]" not in seen:
                    seen += await asyncio.to_thread(os.read, master, 4096)
                os.write(master, answer)
                assert await process.wait() == expected
                with_rest = seen
                while True:
                    try:
                        chunk = await asyncio.to_thread(os.read, master, 4096)
                    except OSError:  # EIO: the child closed its end
                        break
                    if not chunk:
                        break
                    with_rest += chunk
        finally:
            os.close(master)
        assert b"night-batch" in seen
        if expected == EXIT_NOT_CONFIRMED:
            assert b"not broken: nothing was deleted" in with_rest
            assert holders(cluster, "asked-job") == list(range(len(cluster)))
        else:
            assert holders(cluster, "asked-job") == []
    with pytest.raises(LockLost):
        await lock.extend()


@pytest.mark.parametrize("queue", [None, False])
async def test_it_breaks_every_permit_of_a_semaphore(
    cluster: Cluster, make_redlock: MakeRedlock, queue: bool | None
) -> None:
    """With the grant queue (the default) and without (release words only)."""
    redlock = await make_redlock(queue=queue)
    permits = [redlock.semaphore("workers", limit=3, ttl=30.0, owner=f"w{i}") for i in range(2)]
    for permit in permits:
        assert await permit.acquire(blocking=False)
    code, out, err = await redlock_break(cluster.urls, "workers", "--yes")
    assert code == 0, out + err
    assert "semaphore workers: 2 of 3 permits held" in out
    assert "(w0)" in out
    assert "(w1)" in out
    for permit in permits:
        with pytest.raises(LockLost):
            await permit.extend()
    # Every permit is free again: three holders fit.
    again = [redlock.semaphore("workers", limit=3) for _ in range(3)]
    for permit in again:
        assert await permit.acquire(blocking=False)
        await permit.release()


async def test_it_breaks_one_name_of_a_lock_many_holder(cluster: Cluster, make_redlock: MakeRedlock) -> None:
    redlock = await make_redlock()
    both = redlock.lock_many(["ledger:a", "ledger:b"], ttl=30.0)
    assert await both.acquire(blocking=False)
    code, out, err = await redlock_break(cluster.urls, "ledger:a", "--yes")
    assert code == 0, out + err
    assert holders(cluster, "ledger:a") == []
    with pytest.raises(LockLost):
        await both.extend()
    # Losing it gave back its other name too.
    assert await eventually(lambda: holders(cluster, "ledger:b") == [], 2.0)


async def test_a_waiter_in_the_grant_queue_is_granted_the_key_at_once(
    cluster: Cluster, make_redlock: MakeRedlock
) -> None:
    """Break is the holder's own release sent for it: the first waiter in line gets the key, no poll."""
    stuck = (await make_redlock(queue=True)).lock("queued-job", ttl=60.0)
    assert await stuck.acquire(blocking=False)
    waiter = (await make_redlock(queue=True, retry_delay=30.0)).lock("queued-job", acquire_timeout=20.0)
    waiting = asyncio.create_task(waiter.acquire())
    await asyncio.sleep(0.3)  # in line on the nodes
    assert not waiting.done()
    code, out, err = await redlock_break(cluster.urls, "queued-job", "--yes")
    assert code == 0, out + err
    async with asyncio.timeout(3):  # its retry_delay is 30 s: only the grant can wake it in time
        assert await waiting
    await waiter.release()


async def test_a_holder_that_came_after_the_table_is_left_alone(cluster: Cluster, make_redlock: MakeRedlock) -> None:
    """Only what was shown is deleted: if the holder leaves and another takes the key while the operator
    reads the table, the newcomer keeps it."""
    redlock = await make_redlock()
    first = redlock.lock("busy-job", ttl=30.0, owner="first")
    second = redlock.lock("busy-job", ttl=30.0, owner="second")
    assert await first.acquire(blocking=False)
    loop = asyncio.get_running_loop()

    def ask(question: str) -> str:
        assert "(first)" in question
        # While the operator reads: the first holder leaves, the second takes the key.
        asyncio.run_coroutine_threadsafe(first.release(), loop).result(5)
        assert asyncio.run_coroutine_threadsafe(second.acquire(blocking=False), loop).result(5)
        return "yes"

    # The command's work on a thread of its own (its own loop), as the CLI runs it.
    code = await asyncio.to_thread(asyncio.run, break_command("busy-job", cluster.urls, yes=False, ask=ask))
    assert code == 0
    assert holders(cluster, "busy-job") == list(range(len(cluster)))
    await second.extend()
    await second.release()


async def test_too_few_nodes_answering_is_exit_69(faulty: Cluster) -> None:
    from redlock_async import Redlock

    async with Redlock(faulty.urls) as redlock:
        lock = redlock.lock("half-job", ttl=30.0)
        assert await lock.acquire(blocking=False)
        for i in range(3):
            faulty[i].kill()
        code, out, err = await redlock_break(faulty.urls, "half-job", "--yes")
        assert code == EXIT_UNAVAILABLE, out + err
        assert "partly broken: 2 of 5 nodes are clear" in out
        assert holders(faulty, "half-job", among=[3, 4]) == []


async def test_a_broken_leader_loses_its_term_and_the_next_term_is_larger(
    cluster: Cluster, make_redlock: MakeRedlock
) -> None:
    """An election's leadership is a lease on NAME's lock key: break ends it, and terms still grow."""
    leading = asyncio.Event()
    terms: list[int] = []

    async def lead(redlock_ttl: float) -> None:
        election = (await make_redlock()).election("scheduler", ttl=redlock_ttl)
        async with election.campaign() as term:
            terms.append(term)
            leading.set()
            await asyncio.sleep(30)

    leader = asyncio.create_task(lead(1.5))
    async with asyncio.timeout(5):
        await leading.wait()
    code, out, err = await redlock_break(cluster.urls, "scheduler", "--yes")
    assert code == 0, out + err
    with pytest.raises(LockLost):
        async with asyncio.timeout(5):
            await leader
    leading.clear()
    successor = asyncio.create_task(lead(10.0))
    async with asyncio.timeout(5):
        await leading.wait()
    successor.cancel()
    with pytest.raises(asyncio.CancelledError):
        await successor
    assert terms[1] > terms[0]


async def test_a_fenced_waiter_in_the_grant_queue_gets_a_larger_token(
    cluster: Cluster, make_redlock: MakeRedlock
) -> None:
    """The grant break hands to the first waiter carries the counter: the waiter's token still grows."""
    stuck = (await make_redlock(queue=True, fencing=True)).lock("fenced-queue", ttl=60.0)
    assert await stuck.acquire(blocking=False)
    old = stuck.fencing_token
    assert old is not None
    waiter = (await make_redlock(queue=True, fencing=True, retry_delay=30.0)).lock("fenced-queue", acquire_timeout=20.0)
    waiting = asyncio.create_task(waiter.acquire())
    await asyncio.sleep(0.3)
    code, out, err = await redlock_break(cluster.urls, "fenced-queue", "--yes")
    assert code == 0, out + err
    async with asyncio.timeout(3):
        assert await waiting
    assert waiter.fencing_token is not None
    assert waiter.fencing_token > old
    await waiter.release()


async def test_it_breaks_a_read_write_locks_writer(cluster: Cluster, make_redlock: MakeRedlock) -> None:
    redlock = await make_redlock(fencing=True)
    writer = redlock.rw_lock("catalog", ttl=30.0, owner="old-writer").write()
    assert await writer.acquire(blocking=False)
    old = writer.fencing_token
    assert old is not None
    code, out, err = await redlock_break(cluster.urls, "catalog", "--yes")
    assert code == 0, out + err
    assert "read/write lock catalog: a writer" in out
    assert "(old-writer)" in out
    with pytest.raises(LockLost):
        await writer.extend()
    successor = (await make_redlock(fencing=True)).rw_lock("catalog").write()
    assert await successor.acquire(blocking=False)
    assert successor.fencing_token is not None
    assert successor.fencing_token > old
    await successor.release()


async def test_it_breaks_every_reader_and_a_waiting_writer_gets_the_lock(
    cluster: Cluster, make_redlock: MakeRedlock
) -> None:
    redlock = await make_redlock()
    readers = [redlock.rw_lock("shelf", ttl=30.0, owner=f"reader-{i}").read() for i in range(2)]
    for reader in readers:
        assert await reader.acquire(blocking=False)
    writer = (await make_redlock(retry_delay=30.0)).rw_lock("shelf", acquire_timeout=20.0).write()
    waiting = asyncio.create_task(writer.acquire())
    await asyncio.sleep(0.3)
    assert not waiting.done()
    code, out, err = await redlock_break(cluster.urls, "shelf", "--yes")
    assert code == 0, out + err
    assert "(reader-0)" in out
    assert "(reader-1)" in out
    # Woken by the last reader's release word on each node, not by its 30 s retry delay.
    async with asyncio.timeout(3):
        assert await waiting
    for reader in readers:
        with pytest.raises(LockLost):
            await reader.extend()
    await writer.release()


async def test_a_semaphore_waiter_in_the_grant_queue_is_handed_the_broken_permit(
    cluster: Cluster, make_redlock: MakeRedlock
) -> None:
    """A broken permit goes to the first waiter in the semaphore's line, as at its holder's own release."""
    stuck = (await make_redlock()).semaphore("printers", limit=1, ttl=60.0)
    assert await stuck.acquire(blocking=False)
    waiter = (await make_redlock(retry_delay=30.0)).semaphore("printers", limit=1, acquire_timeout=20.0)
    waiting = asyncio.create_task(waiter.acquire())
    await asyncio.sleep(0.3)  # in the semaphore's line on every node
    assert not waiting.done()
    code, out, err = await redlock_break(cluster.urls, "printers", "--yes")
    assert code == 0, out + err
    async with asyncio.timeout(3):  # its retry_delay is 30 s: only the hand-off can wake it in time
        assert await waiting
    with pytest.raises(LockLost):
        await stuck.extend()
    await waiter.release()


async def test_a_node_in_restart_quarantine_is_cleared_too(faulty: Cluster) -> None:
    """A node that restarted (its data kept) is read as it is, restart quarantine or not: its copy goes too."""
    from redlock_async import Redlock

    async with Redlock(faulty.urls) as redlock:
        lock = redlock.lock("restarted-job", ttl=30.0)
        assert await lock.acquire(blocking=False)
        assert await eventually(lambda: holders(faulty, "restarted-job") == list(range(len(faulty))), 2.0)
        faulty[4].restart(keep_data=True)
        assert holders(faulty, "restarted-job", among=[4]) == [4]
        code, out, err = await redlock_break(faulty.urls, "restarted-job", "--yes")
        assert code == 0, out + err
        assert holders(faulty, "restarted-job") == []
        with pytest.raises(LockLost):
            await lock.extend()


async def test_a_redlock_run_holder_in_another_process_stops_its_command(cluster: Cluster) -> None:
    """The operator's case: `redlock run` in another process holds the lock; break it, and the command is
    stopped (SIGTERM) at the next extension, and run exits 76 (the lock was lost)."""
    from redlock_async.cli import EXIT_LOST

    run = await asyncio.create_subprocess_exec(
        PY, "-m", "redlock_async", "run", "nightly", "--nodes", ",".join(cluster.urls), "--ttl", "1.5",
        "--owner", "cron-7", "--", PY, "-c", "import time; print('started', flush=True); time.sleep(60)",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert run.stdout is not None
    async with asyncio.timeout(30):
        assert (await run.stdout.readline()).strip() == b"started"
    code, out, err = await redlock_break(cluster.urls, "nightly", "--yes")
    assert code == 0, out + err
    assert "(cron-7)" in out
    async with asyncio.timeout(10):  # the watchdog extends a 1.5 s lease every ~0.5 s
        assert await run.wait() == EXIT_LOST


async def test_nodes_that_started_moments_ago_are_read_as_they_are(faulty: Cluster) -> None:
    """Fresh nodes (up for less than the default 10 s quarantine of a read-only inspection, their markers
    written under a 1 s period) hide their keys from `redlock status`; break must still see and delete the
    lease there, not say "nothing to break" beside it."""
    from redlock_async import Redlock

    async with Redlock(faulty.urls, ttl=1.0) as redlock:
        lock = redlock.lock("fresh-job", ttl=30.0, owner="fresh")
        assert await lock.acquire(blocking=False)
        assert await eventually(lambda: holders(faulty, "fresh-job") == list(range(len(faulty))), 2.0)
        code, out, err = await redlock_break(faulty.urls, "fresh-job", "--yes")
        assert code == 0, out + err
        assert "(fresh)" in out
        assert "nothing to break" not in out
        assert holders(faulty, "fresh-job") == []
        with pytest.raises(LockLost):
            await lock.extend()
