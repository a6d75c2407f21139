"""The clock guard against the clock nemesis, on real servers and real processes (issue 28, item 3).

Five nodes with libfaketime (``LocalNodes(5, clock=True)``). One process holds a lock in ``async
with`` (the watchdog extends it); a long-lived client in another process (it talked to every node
before the fault) contends for it. Then 1, 2, 3 or 5 of the nodes step their clocks +60 s, or run
four times as fast. Every critical section goes to one ``History``: no two may overlap. Without the
guard, the contender takes the lock while the holder still runs (shown below: the test fails then).

The holder's loss is measured in its own process: the monotonic time at which its guard parsed the
first reply that showed the jump (its ``clock`` event) and the time its lock was declared lost
(``lost`` event). They must be within one node round trip: the reply that shows the jump comes just
before the node's vote, in the same write, so the round that carries it decides the loss.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from redlock_async.testing import History, LocalNodes
from redlock_async.testing._history import Section

from .conftest import needs_faketime

pytestmark = needs_faketime

CHILD = str(Path(__file__).with_name("_clock_client.py"))
TTL = 3.0  # the watchdog extends 2 s after the grant: the holder's next look at the nodes
RUN = 3.5  # seconds the contender runs once ready
HOLD = TTL + 1.0  # seconds the holder runs once the faults are in (it is told on stdin): past one extension,
# however long the contender took to start (a process, its imports, a warm-up lock: seconds under CI's load)
NODE_TIMEOUT = 0.05  # the default: the longest a round trip is waited for


@pytest.fixture(scope="module")
def clocked() -> Iterator[LocalNodes]:
    with LocalNodes(5, clock=True) as nodes:
        yield nodes


@pytest.fixture(autouse=True)
def fresh(clocked: LocalNodes) -> None:
    for node in clocked:
        node.clock.reset()
        node.command("FLUSHALL")


class Child:
    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.lines: list[dict[str, Any]] = []

    async def ready(self) -> None:
        assert self.proc.stdout is not None
        async with asyncio.timeout(20):
            while True:
                line = await self.proc.stdout.readline()
                assert line, (await self.proc.stderr.read()).decode() if self.proc.stderr else "no output"
                event = json.loads(line)
                if event["event"] == "ready":
                    return
                self.lines.append(event)

    async def finish(self) -> None:
        async with asyncio.timeout(30):
            out, err = await self.proc.communicate()
        assert self.proc.returncode == 0, err.decode()
        self.lines += [json.loads(line) for line in out.decode().splitlines()]

    def events(self, kind: str) -> list[dict[str, Any]]:
        return [line for line in self.lines if line["event"] == kind]


async def answered(redlock: Any) -> None:
    """Until every node has answered all that *redlock* sent: an early quorum leaves the slowest pending,
    and a reply still on its way when a test steps a clock may read the jumped clock and make it the
    guard's first reading, which no client can tell from drift (seen under CI's load)."""
    while any(node.unanswered for node in redlock.statistics().nodes):
        await asyncio.sleep(0.005)


async def spawn(role: str, name: str, guard: bool, urls: list[str]) -> Child:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, CHILD, role, name, str(TTL), str(HOLD if role == "hold" else RUN), "1" if guard else "0", *urls,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    child = Child(proc)
    await child.ready()
    return child


async def fault_run(nodes: LocalNodes, fault: str, faulty: int, *, guard: bool = True) -> tuple[Child, Child, History]:
    """The holder takes the lock, the contender is ready, then *faulty* nodes get *fault*; both run out."""
    name = f"clocked-{fault}-{faulty}-{guard}"
    children: list[Child] = []
    try:
        holder = await spawn("hold", name, guard, nodes.urls)
        children.append(holder)
        contender = await spawn("contend", name, guard, nodes.urls)
        children.append(contender)
        for node in list(nodes)[:faulty]:
            if fault == "step":
                await asyncio.to_thread(node.clock.step, 60.0)
            else:
                await asyncio.to_thread(node.clock.run_at, 4.0)
        assert holder.proc.stdin is not None
        holder.proc.stdin.write(b"faulted\n")  # the holder holds HOLD seconds from now
        await holder.proc.stdin.drain()
        await asyncio.gather(holder.finish(), contender.finish())
    finally:
        for child in children:
            if child.proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    child.proc.kill()
                await child.proc.wait()
    history = History()
    for child in (holder, contender):
        history.sections += [
            Section(s["client"], s["token"], s["fencing_token"], s["start"], s["end"]) for s in child.events("section")
        ]
    return holder, contender, history


@pytest.mark.parametrize("fault", ["step", "rate"])
@pytest.mark.parametrize("faulty", [1, 2, 3, 5])
async def test_no_overlap_when_nodes_clocks_jump_or_race(clocked: LocalNodes, fault: str, faulty: int) -> None:
    holder, contender, history = await fault_run(clocked, fault, faulty)
    assert history.overlaps() == []
    assert [s.client for s in history.sections if s.client == "holder"] == ["holder"]
    faulted = {node.url.split("//")[1] for node in list(clocked)[:faulty]}
    # The contender saw each faulted node ahead, and nothing of the sound ones. (Setting a rate may
    # step a faulted node's clock back a few ms as the nemesis writes its spec: reported, harmless.)
    clock_events = contender.events("clock")
    assert {e["node"] for e in clock_events if e["fault"] == "ahead"} == faulted
    assert {e["node"] for e in clock_events} == faulted
    assert all(e["jump"] > -0.1 for e in clock_events if e["fault"] != "ahead"), clock_events
    lost = holder.events("lost")
    if faulty < 3:
        # A majority of sound nodes keeps the lease: no false loss.
        assert lost == []
        return
    # A majority jumped: the holder lost the lock, within one node round trip of the first reply that showed it.
    assert len(lost) == 1
    seen = min(e["at"] for e in holder.events("clock"))
    late = lost[0]["at"] - seen
    round_trip = holder.events("rtt")[0]["round_trip"]
    print(
        f"{fault} x{faulty}: lost {late * 1e3:.2f} ms after the first reply showing the jump "
        f"(srtt {round_trip * 1e3:.2f} ms)"
    )
    assert 0 <= late <= NODE_TIMEOUT
    holder_section = next(s for s in history.sections if s.client == "holder")
    assert holder_section.end >= lost[0]["at"] - 0.001


async def test_without_the_guard_the_same_fault_overlaps(clocked: LocalNodes) -> None:
    """The fault matrix's worst case with ``clock_guard=False``: the test above would fail without the guard."""
    holder, contender, history = await fault_run(clocked, "step", 3, guard=False)
    assert holder.events("clock") == contender.events("clock") == []
    assert [(a.client, b.client) for a, b in history.overlaps()][:1] == [("holder", "contender")]


async def test_a_fresh_client_cannot_see_a_jump_from_before_it_started_and_fencing_refuses_the_late_writer(
    clocked: LocalNodes,
) -> None:
    """The guard's limit: a client sees a jump only across two of its own exchanges with the node. One
    made after the jump takes the lock (no overlap protection from the clocks); the fenced resource
    refuses the first holder's late write. A long-lived client, by contrast, refuses the jumped votes."""
    from redis.asyncio import Redis

    from redlock_async import Redlock, StaleFencingToken, fenced_set

    with LocalNodes(1) as store:
        resource = Redis.from_url(store.urls[0])
        async with (
            Redlock(clocked.urls, ttl=10.0, fencing=True) as first,
            Redlock(clocked.urls, ttl=10.0, fencing=True, retry_delay=0.02) as long_lived,
        ):
            warm = long_lived.lock("fresh:warm")
            await warm.acquire()  # it has a reading of every node's clock
            await warm.release()
            await answered(long_lived)
            held = first.lock("fresh", auto_extend=False)
            assert await held.acquire(blocking=False)
            assert held.fencing_token is not None
            await fenced_set(resource, "report", "first", held.fencing_token)
            for node in list(clocked)[:3]:
                await asyncio.to_thread(node.clock.step, 60.0)  # the holder's keys expire on 3 of 5

            # A client that talked to the nodes before: it sees the jump and counts none of those votes.
            assert not await long_lived.lock("fresh").acquire(timeout=0.3)
            # A fresh client cannot tell: it gets the lock while the first holder still believes it holds it.
            async with Redlock(clocked.urls, ttl=10.0, fencing=True) as fresh:
                late = fresh.lock("fresh", auto_extend=False)
                assert await late.acquire(blocking=False)
                assert held.held  # (its validity has not run out: only fencing can tell them apart)
                assert late.fencing_token is not None
                assert late.fencing_token > held.fencing_token
                await fenced_set(resource, "report", "second", late.fencing_token)
                with pytest.raises(StaleFencingToken):
                    await fenced_set(resource, "report", "first, late", held.fencing_token)
                assert await resource.get("report") == b"second"
                await late.release()
        await resource.aclose()


async def test_a_holder_drops_a_jumped_node_as_soon_as_any_request_of_its_redlock_sees_it(
    clocked: LocalNodes,
) -> None:
    """Not at its next extension (6.7 s away here): another lock's acquire in the same Redlock reads the
    jumped clocks, and both held locks are lost within that round trip (watched: body cancelled)."""
    from redlock_async import LockLost, Redlock

    lost_at: list[float] = []
    async with Redlock(clocked.urls, ttl=10.0) as redlock:
        manual = redlock.lock("held:manual", auto_extend=False)
        assert await manual.acquire(blocking=False)
        watched = redlock.lock("held:watched")

        async def body() -> None:
            try:
                async with watched:
                    started.set_result(None)
                    await asyncio.sleep(30)
            except LockLost:
                lost_at.append(time.monotonic())

        started: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        holder = asyncio.create_task(body())
        await started
        await answered(redlock)
        for node in list(clocked)[:3]:
            await asyncio.to_thread(node.clock.step, 60.0)
        sent = time.monotonic()
        other = redlock.lock("held:other")
        assert not await other.acquire(blocking=False)  # 3 jumped nodes quarantined: no majority
        async with asyncio.timeout(1):
            await holder
        assert lost_at
        print(f"watched holder lost {(lost_at[0] - sent) * 1e3:.2f} ms after the other acquire was sent")
        assert lost_at[0] - sent < 3 * NODE_TIMEOUT  # the acquire's round trip, then an extension's at most
        assert not manual.held
        with pytest.raises(LockLost, match="clock jumped"):
            await manual.extend()
