"""The clock guard without servers: the pure judgement (``_algorithm.judge_clock``), the per-node bookkeeping
(``_clock_guard.ClockGuard``) and a ballot whose votes follow a node's TIME, on fake nodes and virtual time."""

from __future__ import annotations

import asyncio
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from redlock_async._core import _clock
from redlock_async._core._algorithm import CLOCK_PRECISION, WON, YES, ClockFault, Vote, judge_clock
from redlock_async._health._clock_guard import ClockGuard
from redlock_async._nodes._wire import Failure, Reply, pack
from redlock_async._rounds._fanout import Ballot, sitting_out, vote_of_set
from tests.fakes import NO_ANSWER, FakeNode, Request, as_nodes, fake_nodes, virtual

DRIFT = 0.01

windows = st.tuples(st.floats(min_value=-0.05, max_value=3600.0), st.floats(min_value=0.0, max_value=0.5)).map(
    lambda w: (w[0], max(w[0], 0.0) + w[1])
)  # (shortest, longest): the real time lies between


@given(windows, st.floats(min_value=0.0, max_value=1.0), st.floats(min_value=1 - DRIFT, max_value=1 + DRIFT))
def test_a_clock_within_the_drift_factor_is_never_judged(window: tuple[float, float], at: float, rate: float) -> None:
    shortest, longest = window
    real = max(shortest, 0.0) + at * (longest - max(shortest, 0.0))  # any real time the window allows
    before = 1_700_000_000.0
    assert judge_clock(before, before + real * rate, shortest, longest, DRIFT) is None


@given(windows, st.floats(min_value=0.0, max_value=1.0), st.floats(min_value=0.01, max_value=1e5))
def test_a_step_ahead_beyond_the_window_is_seen_and_never_overstated(
    window: tuple[float, float], at: float, jump: float
) -> None:
    shortest, longest = window
    real = max(shortest, 0.0) + at * (longest - max(shortest, 0.0))
    judged = judge_clock(100.0, 100.0 + real + jump, shortest, longest, DRIFT)
    if jump > longest * DRIFT + CLOCK_PRECISION + (longest - real):
        assert judged is not None
        fault, size = judged
        assert fault is ClockFault.AHEAD
        assert 0 < size <= jump + 1e-6  # at least this far ahead, never more than it went
    elif judged is not None:
        assert judged[0] is ClockFault.AHEAD


def judged(verdict: tuple[ClockFault, float] | None) -> tuple[ClockFault, float] | None:
    """The verdict with its size rounded to the microsecond (TIME's resolution)."""
    return None if verdict is None else (verdict[0], round(verdict[1], 6))


def test_a_step_back_and_a_frozen_clock_are_told_apart() -> None:
    assert judged(judge_clock(100.0, 70.5, 0.4, 0.5, DRIFT)) == (ClockFault.BEHIND, -29.9)
    assert judged(judge_clock(100.0, 100.0, 0.4, 0.5, DRIFT)) == (ClockFault.FROZEN, -0.4)
    assert judged(judge_clock(100.0, 100.2, 0.4, 0.5, DRIFT)) == (ClockFault.BEHIND, -0.2)  # runs slow
    # A window of microseconds (pipelined requests) cannot tell a frozen clock from a sound one.
    assert judge_clock(100.0, 100.0, -0.001, 0.0001, DRIFT) is None


def test_a_clock_four_times_as_fast_is_ahead() -> None:
    assert judged(judge_clock(100.0, 104.0, 0.9, 1.0, DRIFT)) == (ClockFault.AHEAD, 3.0)


class Recorded:
    def __init__(self) -> None:
        self.faults: list[tuple[int, ClockFault, float]] = []

    def __call__(self, i: int, fault: ClockFault, size: float, words: str) -> None:
        self.faults.append((i, fault, size))


def time_reply(seconds: float) -> list[bytes]:
    whole = math.floor(seconds)
    return [str(whole).encode(), str(round((seconds - whole) * 1e6)).encode()]


PERIOD = 10.0


def make_guard(n: int = 5) -> tuple[list[FakeNode], ClockGuard, Recorded]:
    nodes = fake_nodes(n)
    recorded = Recorded()
    return nodes, ClockGuard(as_nodes(nodes), DRIFT, lambda: PERIOD, recorded), recorded


def test_a_node_that_jumps_ahead_sits_out_for_the_period_and_is_told_once() -> None:
    async def scenario() -> None:
        nodes, guard, recorded = make_guard()
        wall = 1_700_000_000.0
        now = _clock.now()
        guard.observe(1, time_reply(wall), now, now)
        guard.observe(1, time_reply(wall + 1.0), now + 0.001, now + 0.001)  # 1 s on the node, 1 ms here
        assert [(i, fault, round(size, 6)) for i, fault, size in recorded.faults] == [(1, ClockFault.AHEAD, 0.999)]
        assert nodes[1].quarantined_until == pytest.approx(now + 0.001 + PERIOD)
        assert nodes[1].clock_held_until == nodes[1].quarantined_until
        assert "0.999 s ahead" in nodes[1].quarantine_reason
        # Still racing (2 s in 0.5 s): the quarantine grows, no second warning.
        guard.observe(1, time_reply(wall + 3.0), now + 0.5, now + 0.5)
        assert len(recorded.faults) == 1
        assert nodes[1].quarantined_until == pytest.approx(now + 0.5 + PERIOD)
        assert all(node.quarantined_until == 0 for i, node in enumerate(nodes) if i != 1)

    virtual(scenario)


def test_a_step_back_is_told_but_the_node_keeps_voting() -> None:
    async def scenario() -> None:
        nodes, guard, recorded = make_guard()
        now = _clock.now()
        guard.observe(0, time_reply(1000.0), now, now)
        guard.observe(0, time_reply(970.0), now + 0.5, now + 0.5)
        assert [(i, fault, round(size, 6)) for i, fault, size in recorded.faults] == [(0, ClockFault.BEHIND, -30.5)]
        assert nodes[0].quarantined_until == 0
        # A sound reading over a long enough window ends the episode: the next fault is told again.
        guard.observe(0, time_reply(970.5), now + 1.0, now + 1.0)
        guard.observe(0, time_reply(960.0), now + 1.5, now + 1.5)
        assert len(recorded.faults) == 2

    virtual(scenario)


def test_failures_and_refusals_are_no_readings() -> None:
    async def scenario() -> None:
        _, guard, recorded = make_guard()
        now = _clock.now()
        guard.observe(0, Failure(Vote.TIMEOUT, "no reply"), now, now)
        guard.observe(0, Failure(Vote.ERROR, "NOPERM", answered=True), now, now)
        guard.observe(0, [b"x", b"y"], now, now)
        guard.observe(0, time_reply(1000.0), now, now)
        guard.observe(0, time_reply(1000.001), now + 0.001, now + 0.001)
        assert recorded.faults == []

    virtual(scenario)


def node_answering(wall: list[float]) -> FakeNode:
    def respond(request: Request) -> Reply:
        if request.args[0] == b"TIME":
            return time_reply(wall[0] + _clock.now())
        if request.args[0] == b"SET":
            return b"OK"
        return NO_ANSWER

    return FakeNode("fake", respond=respond)


def test_the_yes_that_follows_a_jump_is_not_counted() -> None:
    async def scenario() -> None:
        offsets = [[1_700_000_000.0] for _ in range(5)]
        nodes = [node_answering(offset) for offset in offsets]
        recorded = Recorded()
        guard = ClockGuard(as_nodes(nodes), DRIFT, lambda: PERIOD, recorded)
        packed = pack((b"SET", b"k", b"v", b"NX", b"PX", 1000))

        async def vote() -> Ballot:
            ballot = Ballot(as_nodes(nodes), vote_of_set, 0.05).send(packed, clock=guard.reading())
            await ballot.start().wait()
            return ballot

        assert (await vote()).verdict is WON
        for i in range(3):
            offsets[i][0] += 60.0  # three of five step ahead
        ballot = await vote()
        assert ballot.verdict is not WON
        assert ballot.votes[:3] == [Vote.QUARANTINED] * 3
        assert [fault for _, fault, _ in recorded.faults] == [ClockFault.AHEAD] * 3
        # A new guard (a new client): two of five jump, and the other three still make a majority.
        guard = ClockGuard(as_nodes(nodes), DRIFT, lambda: PERIOD, recorded)
        for node in nodes:
            node.quarantined_until = node.clock_held_until = 0.0
        assert (await vote()).verdict is WON
        offsets[0][0] += 60.0
        offsets[1][0] += 60.0
        ballot = await vote()
        assert ballot.verdict is WON
        assert ballot.votes == [Vote.QUARANTINED, Vote.QUARANTINED, YES, YES, YES]

    virtual(scenario)


def test_a_clock_quarantine_outlives_a_shorter_restart_quarantine_and_a_reconnect() -> None:
    """Both sit a node out through ``quarantined_until``: the restart quarantine's end (or a reconnect
    judged in service) must not end a clock quarantine that runs longer."""
    from tests.test_quarantine_unit import cluster, connect

    async def scenario() -> None:
        quarantine, nodes = cluster(marked=True)
        for node in nodes:
            connect(quarantine, node)
        await asyncio.sleep(0)
        guard = ClockGuard(as_nodes(nodes), DRIFT, lambda: 3 * PERIOD, Recorded())
        now = _clock.now()
        guard.observe(2, time_reply(1000.0), now, now)
        guard.observe(2, time_reply(1060.0), now + 0.001, now + 0.001)  # 60 s ahead: out for 30 s
        held = nodes[2].clock_held_until
        assert held == pytest.approx(now + 0.001 + 3 * PERIOD)
        # It restarts (a new run_id, no marker): the restart quarantine is 10 s, the clock's 30 s.
        nodes[2].run_id, nodes[2].uptime, nodes[2].marker = b"f" * 40, 3.0, None
        connect(quarantine, nodes[2])
        await asyncio.sleep(0)
        assert nodes[2].quarantined_until == held
        await asyncio.sleep(PERIOD + 0.1)  # the restart quarantine is over, the clock's is not
        assert nodes[2].quarantined_until == held
        # A reconnect judged in service at once leaves it out too.
        connect(quarantine, nodes[2])
        await asyncio.sleep(0)
        assert nodes[2].quarantined_until == held
        await asyncio.sleep(held - _clock.now() + 0.1)
        assert sitting_out(as_nodes(nodes)[2]) is None
        quarantine.close()

    virtual(scenario)


def test_a_time_carried_by_a_message_is_judged_for_a_jump_ahead_only_and_never_kept() -> None:
    """A grant word of the queue carries the node's time at the grant (read at some moment before we heard
    it): a jump ahead since our last reading makes the node sit out; a time older than that reading (the
    word and a reply crossed) is no fault, and the word never becomes the baseline."""

    async def scenario() -> None:
        nodes, guard, recorded = make_guard()
        wall = 1_700_000_000.0
        now = _clock.now()
        assert not guard.heard(2, wall + 60.0, now)  # no reading yet: nothing to judge against
        guard.observe(2, time_reply(wall), now, now + 0.001)
        assert not guard.heard(2, wall - 0.5, now + 0.01)  # older than the reading: crossed, not a fault
        assert not guard.heard(2, wall + 0.009, now + 0.01)  # within the window since our send
        assert recorded.faults == []
        assert guard.heard(2, wall + 60.0, now + 0.01)  # a minute on the node in 10 ms here
        assert [(i, fault) for i, fault, _ in recorded.faults] == [(2, ClockFault.AHEAD)]
        assert nodes[2].quarantined_until == pytest.approx(now + 0.01 + PERIOD)
        # The word was not kept: the next reply is judged against the reply before, and shows the jump too.
        guard.observe(2, time_reply(wall + 60.02), now + 0.02, now + 0.021)
        assert len(recorded.faults) == 1  # the same episode: one warning

    virtual(scenario)
