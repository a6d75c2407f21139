"""``Redlock.election``: one leader at a time, terms that grow, pushed hand-off, observers.

In process, candidates are Redlocks of their own on ``cluster`` (or ``faulty`` to lose a lease);
across processes, the leader is tests/_election_candidate.py, killed (SIGKILL) or frozen (SIGSTOP).
The candidates' ``retry_delay`` of 2 s is far longer than any hand-off allowed here: a successor
that leads sooner was woken by the resignation (pushed), not by its next try.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
import time
from collections.abc import AsyncGenerator, AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from redlock_async import LockLost, LockNotAcquired, Redlock
from redlock_async.election import Election
from redlock_async.inspection import LockInfo

from .conftest import Cluster, MakeRedlock, next_event

CHILD = str(Path(__file__).with_name("_election_candidate.py"))
NAME = "scheduler"  # the child's election
SLOW = 2.0
"""retry_delay of the in-process candidates and observers: a hand-off faster than this was pushed."""
HANDOFF = 0.5
"""Longest wait allowed between a resignation and the successor leading (or an observer seeing it)."""


class Candidate:
    """A campaign in a task of its own: leads until told to resign, and records what happened."""

    def __init__(self, election: Election, timeout: float | None = None) -> None:
        self.election = election
        self.leading = asyncio.Event()
        self.resign = asyncio.Event()
        self.term: int | None = None
        self.led_at: float | None = None
        self.left_at: float | None = None
        self.body_cancelled = False
        self.task = asyncio.create_task(self._run(timeout))

    async def _run(self, timeout: float | None) -> None:
        async with self.election.campaign(timeout=timeout) as term:
            self.term, self.led_at = term, time.monotonic()
            self.leading.set()
            try:
                await self.resign.wait()
            except asyncio.CancelledError:
                self.body_cancelled = True
                raise
            self.left_at = time.monotonic()

    async def leads(self, within: float = 5.0) -> int:
        async with asyncio.timeout(within):
            await self.leading.wait()
        assert self.term is not None
        return self.term

    async def step_down(self) -> float:
        """Resign; returns when the block was left (the release is sent)."""
        self.resign.set()
        async with asyncio.timeout(5):
            await self.task
        assert self.left_at is not None
        return self.left_at


def observing_of(election: Election) -> AsyncGenerator[LockInfo, None]:
    """``election.observe()``: an async generator, to be closed (aclose)."""
    return election.observe()


class Observer:
    """Collects what ``observe()`` yields, with the time each came."""

    def __init__(self, election: Election) -> None:
        self.seen: list[tuple[float, LockInfo]] = []
        self.changed = asyncio.Event()
        self.task = asyncio.create_task(self._run(election))

    async def _run(self, election: Election) -> None:
        async for info in election.observe():
            self.seen.append((time.monotonic(), info))
            self.changed.set()

    async def count(self, n: int, within: float) -> None:
        async with asyncio.timeout(within):
            while len(self.seen) < n:
                self.changed.clear()
                await self.changed.wait()

    @property
    def leaders(self) -> list[tuple[str | None, int | None]]:
        return [(info.owner, info.fencing_counter) for _, info in self.seen]

    async def stop(self) -> None:
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task


# -- in process ---------------------------------------------------------------------------------------------


@pytest.mark.serial
async def test_successor_is_pushed_leadership_with_a_larger_term(make_redlock: MakeRedlock) -> None:
    first = (await make_redlock(retry_delay=SLOW)).election("jobs", owner="A")
    second = (await make_redlock(retry_delay=SLOW)).election("jobs", owner="B")
    a = Candidate(first)
    term_a = await a.leads()
    b = Candidate(second)
    await asyncio.sleep(0.3)
    assert not b.leading.is_set()  # waits while A leads
    info = await second.leader()
    assert (info.state, info.owner, info.fencing_counter) == ("held", "A", term_a)

    left = await a.step_down()
    term_b = await b.leads(within=HANDOFF + 0.5)
    assert b.led_at is not None
    assert b.led_at - left < HANDOFF  # pushed: its next try would have come up to 2 s later
    assert term_b > term_a
    for election in (first, second):
        info = await election.leader()
        assert (info.state, info.owner, info.fencing_counter) == ("held", "B", term_b)
    await b.step_down()
    assert (await first.leader()).state == "free"


async def test_terms_grow_across_leaders_and_repeated_campaigns(make_redlock: MakeRedlock) -> None:
    redlocks = [await make_redlock(retry_delay=0.05) for _ in range(3)]
    elections = [r.election("rounds", owner=f"c{i}") for i, r in enumerate(redlocks)]
    terms = []
    for round_ in range(6):
        election = elections[round_ % 3]
        async with election.campaign(timeout=2.0) as term:
            terms.append(term)
            info = await election.leader()
            assert (info.state, info.owner, info.fencing_counter) == ("held", f"c{round_ % 3}", term)
    assert terms == sorted(set(terms)), terms
    assert len(terms) == 6


@pytest.mark.serial
async def test_campaign_with_a_timeout_while_someone_leads_raises_lock_not_acquired(make_redlock: MakeRedlock) -> None:
    leader = (await make_redlock()).election("busy", owner="leader")
    other = (await make_redlock(retry_delay=0.05)).election("busy", owner="other")
    async with leader.campaign(timeout=0) as term:  # free: one try is enough
        started = time.monotonic()
        with pytest.raises(LockNotAcquired):
            async with other.campaign(timeout=0.3):
                pytest.fail("led while another candidate led")
        assert 0.25 <= time.monotonic() - started < 1.5
        started = time.monotonic()
        with pytest.raises(LockNotAcquired):
            async with other.campaign(timeout=0):
                pytest.fail("led while another candidate led")
        assert time.monotonic() - started < 0.5
        info = await other.leader()
        assert (info.owner, info.fencing_counter) == ("leader", term)  # the failed campaigns took nothing
    async with other.campaign(timeout=0.3) as later:
        assert later > term


async def test_campaign_checks_its_arguments(redlock: Redlock) -> None:
    election = redlock.election("args")
    with pytest.raises(ValueError, match="timeout"):
        async with election.campaign(timeout=-1):
            pass
    with pytest.raises(TypeError):
        async with election.campaign(timeout="1"):  # type: ignore[arg-type]
            pass
    with pytest.raises(TypeError, match="election name"):
        redlock.election(42)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="owner"):
        redlock.election("args", owner="two\nlines")


async def test_default_owner_and_leader_info(make_redlock: MakeRedlock) -> None:
    redlock = await make_redlock()
    election = redlock.election("who")
    assert (await election.leader()).state == "free"
    async with election.campaign() as term:
        info = await election.leader()
        assert info.state == "held"
        assert info.owner == f"{socket.gethostname()}:{os.getpid()}"
        assert info.fencing_counter == term
        inspected = await redlock.inspect("who")  # leader() is inspect() of the election's name
        assert (inspected.state, inspected.owner, inspected.holder) == ("held", info.owner, info.holder)


@pytest.mark.serial
async def test_a_body_that_raises_resigns_and_hands_over(make_redlock: MakeRedlock) -> None:
    first = (await make_redlock(retry_delay=SLOW)).election("crashy", owner="A")
    second = (await make_redlock(retry_delay=SLOW)).election("crashy", owner="B")
    b: Candidate | None = None
    failed_at = 0.0
    with pytest.raises(RuntimeError, match="scheduler crashed"):
        async with first.campaign() as term_a:
            b = Candidate(second)
            await asyncio.sleep(0.2)
            failed_at = time.monotonic()
            raise RuntimeError("scheduler crashed")
    assert b is not None
    term_b = await b.leads(within=HANDOFF + 0.5)
    assert b.led_at is not None
    assert b.led_at - failed_at < HANDOFF
    assert term_b > term_a
    await b.step_down()


@pytest.mark.slow
@pytest.mark.serial
async def test_observer_sees_each_new_leader_once_in_order(make_redlock: MakeRedlock) -> None:
    first = (await make_redlock(retry_delay=SLOW)).election("observed", owner="A", ttl=1.0)
    second = (await make_redlock(retry_delay=SLOW)).election("observed", owner="B", ttl=1.0)
    # One observer that looks only when told (its pace is 2 s), one that also looks every 50 ms.
    pushed = Observer((await make_redlock(retry_delay=SLOW)).election("observed"))
    polling = Observer((await make_redlock(retry_delay=0.05, ttl=0.5)).election("observed"))
    await asyncio.sleep(0.1)  # both have looked once: nothing to yield yet
    assert pushed.seen == polling.seen == []

    a = Candidate(first)
    term_a = await a.leads()
    await pushed.count(1, within=HANDOFF)
    await polling.count(1, within=HANDOFF)
    b = Candidate(second)
    await asyncio.sleep(1.3)  # A's watchdog extends its lease meanwhile: still one leader, seen once

    left = await a.step_down()
    term_b = await b.leads(within=HANDOFF + 0.5)
    await pushed.count(2, within=HANDOFF + 0.5)
    await polling.count(2, within=HANDOFF + 0.5)
    for observer in (pushed, polling):
        assert observer.seen[1][0] - left < HANDOFF, observer.leaders

    a = Candidate(first)
    await asyncio.sleep(0.1)
    left = await b.step_down()
    term_a2 = await a.leads(within=HANDOFF + 0.5)
    await pushed.count(3, within=HANDOFF + 0.5)
    await polling.count(3, within=HANDOFF + 0.5)
    await asyncio.sleep(0.3)  # nothing more comes while A leads
    await a.step_down()
    await asyncio.sleep(0.3)  # nor once no one leads
    await pushed.stop()
    await polling.stop()

    assert term_a < term_b < term_a2
    expected = [("A", term_a), ("B", term_b), ("A", term_a2)]
    assert pushed.leaders == expected
    assert polling.leaders == expected
    for observer in (pushed, polling):
        assert all(info.state == "held" for _, info in observer.seen)
        assert len({info.holder for _, info in observer.seen}) == 3


async def test_observe_starts_with_the_current_leader(make_redlock: MakeRedlock) -> None:
    leader = (await make_redlock()).election("current", owner="boss")
    watcher = (await make_redlock(retry_delay=SLOW)).election("current")
    async with leader.campaign() as term:
        observing = observing_of(watcher)
        try:
            async with asyncio.timeout(0.5):
                info = await anext(observing)
            assert (info.state, info.owner, info.fencing_counter) == ("held", "boss", term)
            with pytest.raises(TimeoutError):  # the same leader is not yielded again
                async with asyncio.timeout(0.4):
                    await anext(observing)
        finally:
            await observing.aclose()


@pytest.mark.slow
@pytest.mark.serial
async def test_observe_yields_nothing_while_no_one_leads(make_redlock: MakeRedlock) -> None:
    watcher = (await make_redlock(retry_delay=SLOW)).election("vacant")
    candidate = (await make_redlock()).election("vacant", owner="late")
    observing = observing_of(watcher)
    try:
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.5):
                await anext(observing)
    finally:
        await observing.aclose()

    observing = observing_of(watcher)
    try:
        next_leader = asyncio.ensure_future(anext(observing))
        await asyncio.sleep(0.3)
        assert not next_leader.done()
        async with candidate.campaign() as term:
            led_at = time.monotonic()
            async with asyncio.timeout(HANDOFF):
                info = await next_leader
            assert time.monotonic() - led_at < HANDOFF  # announced: the watcher's own pace is 2 s
            assert (info.owner, info.fencing_counter) == ("late", term)
        with pytest.raises(TimeoutError):  # resigned, no successor: nothing
            async with asyncio.timeout(0.5):
                await anext(observing)
    finally:
        await observing.aclose()


async def test_leader_whose_lease_is_lost_gets_lock_lost(faulty: Cluster) -> None:
    """A majority of the nodes freezes: the watchdog cannot extend the 0.5 s lease, the block is
    cancelled and the campaign raises LockLost; once the nodes are back, a new term is larger."""
    async with (
        Redlock(faulty.urls, retry_delay=0.05, connect_timeout=0.5) as redlock,
        Redlock(faulty.urls, retry_delay=0.05) as other,
    ):
        election = redlock.election("fragile", owner="frail", ttl=0.5)
        candidate = Candidate(election)
        term = await candidate.leads()
        paused_at = time.monotonic()
        for i in (0, 1, 2):
            faulty[i].pause()
        try:
            with pytest.raises(LockLost):
                async with asyncio.timeout(3):
                    await candidate.task
            lost_after = time.monotonic() - paused_at
            assert candidate.body_cancelled
            assert candidate.left_at is None
            assert lost_after < 1.5, lost_after
            info = await election.leader()
            assert info.state == "unknown", info  # two nodes answer, three are silent
        finally:
            for i in (0, 1, 2):
                faulty[i].resume()
        async with other.election("fragile", owner="next").campaign(timeout=5) as next_term:
            assert next_term > term
        async with election.campaign(timeout=5) as again:  # the loser may campaign again
            assert again > next_term


async def test_observer_sees_a_leader_after_one_whose_term_showed_inflated(faulty: Cluster) -> None:
    """Node 4's fencing counter is ahead (100) of the counted terms, as fences that reached it alone
    leave it (simulated by setting it). A leads with term 1; node 4, answering late, holds A's key
    too, so the observer is shown term 100. B then leads with term 2 (node 4 silent): a new leader,
    which the observer must yield; it never does (2 > 100 is false)."""
    faulty[4].command("SET", "redlock-fence:inflated", "100")
    async with (
        Redlock(faulty.urls) as first,
        Redlock(faulty.urls) as second,
        Redlock(faulty.urls, retry_delay=0.05, ttl=0.5, connect_timeout=0.3) as watching,
    ):
        observer = Observer(watching.election("inflated"))
        try:
            faulty[4].pause()
            async with first.election("inflated", owner="A").campaign(timeout=2) as term_a:
                faulty[4].resume()
                await observer.count(1, within=2.0)  # its looks may have waited for node 4, paused
                async with asyncio.timeout(3):  # node 4 runs the queued acquire late: it holds A's key too
                    while faulty[4].command("EXISTS", "redlock:inflated") != 1:
                        await asyncio.sleep(0.01)
                await asyncio.sleep(0.2)  # the observer looks again meanwhile (every 50 ms): no new leader
            faulty[4].pause()
            try:
                async with second.election("inflated", owner="B").campaign(timeout=2) as term_b:
                    assert term_a < term_b
                    info = await second.inspect("inflated")
                    assert (info.state, info.owner) == ("held", "B")
                    # Node 4 is paused: each of the observer's looks waits 2 connect timeouts (0.6 s) for it.
                    await observer.count(2, within=4.0)  # B is yielded (it was not when terms showed inflated)
            finally:
                faulty[4].resume()
        finally:
            await observer.stop()
        assert [owner for owner, _ in observer.leaders] == ["A", "B"]


# -- across processes ---------------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def candidate_process(owner: str, urls: list[str], ttl: float = 1.0) -> AsyncIterator[asyncio.subprocess.Process]:
    child = await asyncio.create_subprocess_exec(
        sys.executable, CHILD, owner, str(ttl), *urls,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        yield child
    finally:
        if child.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                child.kill()  # SIGKILL ends a stopped process too
            await child.wait()


def process_state(pid: int) -> bytes:
    with open(f"/proc/{pid}/stat", "rb") as stat:
        return stat.read().rpartition(b")")[2].split()[0]


async def wait_state(pid: int, stopped: bool) -> None:
    async with asyncio.timeout(2):
        while (process_state(pid) in (b"T", b"t")) != stopped:
            await asyncio.sleep(0.001)


@pytest.mark.slow
@pytest.mark.serial
async def test_killed_leader_process_is_succeeded_after_its_lease(cluster: Cluster, make_redlock: MakeRedlock) -> None:
    observer = Observer((await make_redlock(retry_delay=SLOW)).election(NAME))
    try:
        async with candidate_process("child-leader", cluster.urls) as leader:
            assert (await next_event(leader, 20))["event"] == "ready"
            led = await next_event(leader, 20)
            assert led["event"] == "leading", led
            await observer.count(1, within=HANDOFF)
            async with candidate_process("child-standby", cluster.urls) as standby:
                assert (await next_event(standby, 20))["event"] == "ready"
                took = await succeed(leader, standby, led, observer, make_redlock)
    finally:
        await observer.stop()
    assert observer.leaders == [("child-leader", led["term"]), ("child-standby", took["term"])]


async def succeed(
    leader: asyncio.subprocess.Process,
    standby: asyncio.subprocess.Process,
    led: dict[str, Any],
    observer: Observer,
    make_redlock: MakeRedlock,
) -> dict[str, Any]:
    """Kill the leading process; the standby process leads once the lease is out, with a larger term."""
    info = await (await make_redlock()).inspect(NAME)
    assert (info.state, info.owner, info.fencing_counter) == ("held", "child-leader", led["term"])
    assert info.ttl is not None
    lease_end = time.monotonic() + info.ttl  # no sooner: the leader's keys live that long at least

    leader.kill()
    await leader.wait()
    took = await next_event(standby, 5)
    took_at = time.monotonic()
    assert took["event"] == "leading", took
    assert took["term"] > led["term"]
    assert took_at > lease_end - 0.05, "led before the dead leader's lease ran out"
    assert took_at < lease_end + 1.0 + 0.5  # a lease (1 s) at most, and the standby's retry
    await observer.count(2, within=HANDOFF)
    return took


@pytest.mark.slow
@pytest.mark.serial
async def test_frozen_leader_process_loses_to_a_standby_and_is_told_on_resume(
    cluster: Cluster, make_redlock: MakeRedlock
) -> None:
    redlock = await make_redlock(retry_delay=0.05)
    async with candidate_process("frozen", cluster.urls) as child:
        assert (await next_event(child, 20))["event"] == "ready"
        led = await next_event(child, 20)
        assert led["event"] == "leading", led
        child.send_signal(signal.SIGSTOP)
        await wait_state(child.pid, stopped=True)
        info = await redlock.inspect(NAME)
        assert (info.state, info.owner) == ("held", "frozen")
        assert info.ttl is not None
        lease_end = time.monotonic() + info.ttl

        standby = redlock.election(NAME, owner="standby")
        async with standby.campaign(timeout=10) as term:
            took_at = time.monotonic()
            assert took_at > lease_end - 0.05, "led before the frozen leader's lease ran out"
            assert took_at < lease_end + 1.0
            assert term > led["term"]
            assert process_state(child.pid) in (b"T", b"t")  # frozen the whole time, believing it leads
            resumed_at = time.monotonic()
            child.send_signal(signal.SIGCONT)
            lost = await next_event(child, 5)
            assert lost["event"] == "lost", lost
            assert time.monotonic() - resumed_at < 1.0  # told at once, not at its next extension
            assert lost["term"] == led["term"] < term
            # The frozen leader's clean-up left the successor's keys alone.
            info = await standby.leader()
            assert (info.state, info.owner, info.fencing_counter) == ("held", "standby", term)
            async with asyncio.timeout(10):
                _, errors = await child.communicate()
            assert child.returncode == 0, errors.decode()
            info = await standby.leader()
            assert (info.state, info.owner, info.fencing_counter) == ("held", "standby", term)
