"""The grant queue's waiter side without servers: a :class:`Claim` over fake nodes and an injected clock.

The fake nodes record what is sent to them; the test answers each request (as QUEUE_ENTER or
QUEUE_LEAVE or QUEUE_STAY would: ``[had, node time in us, pttl]``) and plays grant words, in the orders that
matter: a word late behind a reply, a word while our own script is on the wire, a failed request.
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

import pytest

from redlock_async._core import _clock
from redlock_async._core._algorithm import CLOCK_PRECISION, Vote, held_until, majority_until, validity
from redlock_async._core._names import slot_of, slot_tag
from redlock_async._core._settings import Settings
from redlock_async._nodes._wire import Failure
from redlock_async._queue._claim import Claim, queue_keys
from redlock_async._scripts import QUEUE_ENTER, QUEUE_LEAVE, QUEUE_STAY

from .fakes import FakeNode, as_nodes, fake_nodes

TTL = 10.0
DRIFT = 0.01


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def clock() -> Any:
    fake = Clock()
    with _clock.use(fake):
        yield fake


def make_claim(n: int = 5) -> tuple[Claim, list[FakeNode]]:
    nodes = fake_nodes(n)
    claim = Claim(as_nodes(nodes), b"redlock:r", Settings(ttl=TTL, drift_factor=DRIFT), b"tok~me")
    return claim, nodes


def reply(held: bool, node_us: int, pttl: int = 0) -> list[Any]:
    return [1 if held else 0, str(node_us).encode(), pttl if held else 0]


# -- the formulas ---------------------------------------------------------------------------------


def test_held_until_is_redlocks_validity_for_a_key_set_by_our_own_request() -> None:
    started, decided = 5.0, 5.003
    assert held_until(started, TTL, DRIFT) - decided == pytest.approx(validity(TTL, started, decided, DRIFT))


def test_held_until_charges_drift_on_the_wait_too() -> None:
    # Granted 60 s (node clock) after our entry ran: those 60 s may pass 1% faster here as well.
    assert held_until(0.0, 60 + TTL, DRIFT) == pytest.approx((60 + TTL) * 0.99 - CLOCK_PRECISION)


def test_majority_until_is_the_quorum_th_latest_end() -> None:
    assert majority_until([9.0, 7.0, 8.0], 5) == 7.0
    assert majority_until([9.0, 7.0, 8.0, 6.0, 10.0], 5) == 8.0
    assert majority_until([9.0, 7.0], 5) == -math.inf
    assert majority_until([], 1) == -math.inf


def test_queue_keys_follow_the_lock_key() -> None:
    """The line and waits start with the lock key, and a hash tag keeps them in its cluster slot (none is
    added to a key that has one of its own)."""
    tag = b"{" + slot_tag(slot_of(b"redlock:r")) + b"}"
    assert queue_keys(b"redlock:r") == (b"redlock:r", b"redlock:r\x00queue" + tag, b"redlock:r\x00waits" + tag)
    assert queue_keys(b"redlock:{r}") == (b"redlock:{r}", b"redlock:{r}\x00queue", b"redlock:{r}\x00waits")


# -- the claim ------------------------------------------------------------------------------------


async def test_a_majority_of_immediate_grants_holds_for_redlocks_validity(clock: Clock) -> None:
    claim, nodes = make_claim()
    claim.join()
    assert all(QUEUE_ENTER.sha in node.waiting[0].args for node in nodes)
    assert claim.pending == 5
    clock.t += 0.002
    for i in range(3):
        nodes[i].answer(reply(True, 1_000_000, pttl=10_000))
    assert claim.held(clock.t) == [0, 1, 2]
    # Sent at 100.0 with the whole ttl: exactly Redlock's validity from that send.
    assert claim.until(clock.t) == pytest.approx(held_until(100.0, TTL, DRIFT))
    assert claim.pending == 2


async def test_a_grant_word_counts_from_our_entrys_reply_by_the_nodes_clock(clock: Clock) -> None:
    claim, nodes = make_claim()
    claim.join()  # sent at 100.0
    clock.t = 100.001
    for node in nodes:
        node.answer(reply(False, 5_000_000))  # queued, at node time 5 s
    clock.t = 103.0
    claim.heard(0, 7_500_000)  # granted 2.5 node seconds after our entry ran
    assert claim.ends[0] == pytest.approx(held_until(100.0, 2.5 + TTL, DRIFT))
    assert claim.until(clock.t) == -math.inf  # one node is no majority
    claim.heard(1, 7_500_100)
    claim.heard(2, 7_500_200)
    assert claim.held(clock.t) == [0, 1, 2]
    assert claim.until(clock.t) == pytest.approx(held_until(100.0, 2.5 + TTL, DRIFT))


async def test_a_word_older_than_the_latest_reply_is_stale(clock: Clock) -> None:
    claim, nodes = make_claim(1)
    claim.join()
    nodes[0].answer(reply(False, 5_000_000))
    claim.heard(0, 4_999_999)  # a grant from before our entry ran there, and the reply said "not ours"
    assert claim.ends[0] == -math.inf
    claim.heard(0, 5_000_000)
    assert claim.ends[0] == -math.inf


async def test_a_word_heard_while_our_script_is_out_waits_for_its_reply(clock: Clock) -> None:
    claim, nodes = make_claim(1)
    claim.join()
    nodes[0].answer(reply(False, 5_000_000))
    clock.t += 1.0  # (a word's node time never runs ahead of our clock: a later one is not counted)
    claim.join()  # entered again (the retry delay): on the wire
    claim.heard(0, 5_500_000)  # a grant: did it come before our second entry ran, or after?
    assert claim.ends[0] == -math.inf  # not counted while we cannot tell
    nodes[0].answer(reply(False, 6_000_000))  # the entry ran later, and found the key not ours: that grant ended
    assert claim.ends[0] == -math.inf
    claim.join()
    clock.t += 1.0
    claim.heard(0, 6_500_000)
    nodes[0].answer(reply(False, 6_200_000))  # ran before the grant: the stashed word counts now
    assert claim.ends[0] > -math.inf


async def test_a_given_back_grant_is_not_brought_back_by_its_late_word(clock: Clock) -> None:
    claim, nodes = make_claim(1)
    claim.join()
    nodes[0].answer(reply(False, 5_000_000))
    clock.t += 0.2
    claim.heard(0, 5_100_000)
    assert claim.ends[0] > -math.inf
    claim.give_back([0])  # a split: handed back, staying in line
    assert QUEUE_STAY.sha in nodes[0].waiting[0].args
    assert claim.ends[0] == -math.inf
    claim.heard(0, 5_100_000)  # the same grant's word again (say, heard by a second path): still given back
    assert claim.ends[0] == -math.inf
    nodes[0].answer(reply(False, 5_200_000))
    claim.heard(0, 5_100_000)
    assert claim.ends[0] == -math.inf


async def test_after_a_failed_request_no_word_of_that_node_counts_until_a_reply(clock: Clock) -> None:
    claim, nodes = make_claim(1)
    claim.join()
    nodes[0].answer(reply(False, 5_000_000))
    claim.give_back([0])
    nodes[0].answer(Failure(Vote.ERROR, "connection lost"))  # did the give-back run? unknown
    claim.heard(0, 9_000_000)
    assert claim.ends[0] == -math.inf
    claim.join()
    nodes[0].answer(reply(True, 9_100_000, pttl=9_000))  # the node says where things stand: ours
    assert claim.ends[0] > -math.inf


async def test_a_node_sitting_out_counts_for_nothing(clock: Clock) -> None:
    claim, nodes = make_claim()
    nodes[1].quarantined_until = clock.t + 30  # restarted: sits out
    claim.join()
    for i in range(3):
        nodes[i].answer(reply(True, 1_000_000, pttl=10_000))
    assert claim.held(clock.t) == [0, 2]
    assert claim.until(clock.t) == -math.inf


async def test_a_node_sitting_out_until_its_recheck_wakes_the_waiter_once_it_counts(clock: Clock) -> None:
    """Met without marker (``Node.vouching``): its grant counts once another client marked it in service,
    and the waiter hears of it then (its bell), not at the next reply or retry."""
    claim, nodes = make_claim()
    nodes[1].quarantined_until = clock.t + 30
    nodes[1].vouching = []
    claim.join()
    for i in range(3):
        nodes[i].answer(reply(True, 1_000_000, pttl=10_000))
    assert claim.held(clock.t) == [0, 2]
    assert claim.held(clock.t) == [0, 2]  # asked again: one ring registered, not two
    assert len(nodes[1].vouching) == 1
    woken = asyncio.ensure_future(claim.bell.wait(60.0))
    await asyncio.sleep(0)
    nodes[1].quarantined_until = 0.0  # the recheck found it marked: the Quarantine settles it
    waiting, nodes[1].vouching = nodes[1].vouching, None
    for count in waiting:
        count()
    await asyncio.wait_for(woken, 1.0)
    assert claim.held(clock.t) == [0, 1, 2]
    assert claim.until(clock.t) > clock.t


async def test_a_lease_past_its_end_is_not_held(clock: Clock) -> None:
    claim, nodes = make_claim()
    claim.join()
    for i in range(3):
        nodes[i].answer(reply(True, 1_000_000, pttl=1_000))
    assert len(claim.held(clock.t)) == 3
    clock.t += 1.0  # the keys may have expired by now
    assert claim.held(clock.t) == []


async def test_leave_forgets_every_grant_and_goes_to_every_node(clock: Clock) -> None:
    claim, nodes = make_claim()
    claim.join()
    for node in nodes:
        node.answer(reply(True, 1_000_000, pttl=10_000))
    claim.quit()
    assert claim.held(clock.t) == []
    assert all(QUEUE_LEAVE.sha in node.waiting[0].args for node in nodes)


async def test_a_reply_older_than_a_give_back_on_the_wire_does_not_count(clock: Clock) -> None:
    claim, nodes = make_claim(1)
    claim.join()
    nodes[0].answer(reply(False, 5_000_000))
    claim.heard(0, 5_100_000)
    claim.join()  # a renewal, on the wire...
    claim.give_back([0])  # ...and right behind it, the give-back of the node's grant
    nodes[0].answer(reply(True, 5_200_000, pttl=9_000))  # the renewal ran first: "ours" (no longer true)
    assert claim.ends[0] == -math.inf  # not counted: the give-back behind it has the last word
    nodes[0].answer(reply(False, 5_300_000))  # given to another waiter
    assert claim.held(clock.t) == []


async def test_nothing_counts_once_the_claim_left(clock: Clock) -> None:
    claim, nodes = make_claim(1)
    claim.join()
    nodes[0].answer(reply(False, 5_000_000))
    claim.quit()
    nodes[0].answer([1, b"0", 0])  # leaving with no one in line: the node read no clock
    claim.heard(0, 5_100_000)  # a late word of a grant our leave handed on
    assert claim.ends[0] == -math.inf
    assert claim.pending == 0


# -- a fenced claim (queue=True, fencing=True) ------------------------------------------------------


def make_fenced_claim(n: int = 5, fence_ttl: float | None = None) -> tuple[Claim, list[FakeNode]]:
    nodes = fake_nodes(n)
    settings = Settings(ttl=TTL, drift_factor=DRIFT, fencing=True, fence_ttl=fence_ttl)
    claim = Claim(as_nodes(nodes), b"redlock:r", settings, b"tok~me", b"redlock-fence:r")
    return claim, nodes


def fenced_reply(held: bool, node_us: int, counter: int, pttl: int = 9_000) -> list[Any]:
    return [1, str(node_us).encode(), pttl, str(counter).encode()] if held else [0, str(node_us).encode(), 0, 0]


async def test_a_fenced_claim_chooses_one_more_than_the_largest_counter_read_while_held(clock: Clock) -> None:
    """Counters come with the holding they were read in: a reply's, a word's (``:<counter>``); a word
    without one does not count; a give-back forgets the node's counter with its holding."""
    claim, nodes = make_fenced_claim()
    assert claim.keys[3] == b"redlock-fence:r"  # every script of the claim carries the counter's key
    claim.join()
    nodes[0].answer(fenced_reply(True, 1_000_000, 41))
    for i in (1, 2, 3, 4):
        nodes[i].answer(fenced_reply(False, 1_000_000, 0))
    clock.t += 0.5
    claim.heard(1, 1_100_000, 40)
    claim.heard(2, 1_100_000)  # a word without a counter (an older client): not counted
    assert claim.held(clock.t) == [0, 1]
    assert claim.counters[:3] == [41, 40, None]
    claim.heard(3, 1_200_000, 7)
    assert claim.held(clock.t) == [0, 1, 3]
    assert claim.fence([0, 1, 3]) == 42
    claim.give_back([0])
    assert claim.counters[0] is None
    assert claim.fenced_to[0] == 0


async def test_fence_ttl_floors_a_counter_at_the_nodes_clock(clock: Clock) -> None:
    claim, nodes = make_fenced_claim(3, fence_ttl=300)
    claim.join()
    nodes[0].answer(fenced_reply(True, 1_700_000_000_000_000, 5))
    nodes[1].answer(fenced_reply(False, 1_700_000_000_000_000, 0))
    nodes[2].answer(fenced_reply(False, 1_700_000_000_000_000, 0))
    claim.heard(1, 1_700_000_000_100_000, 1_800_000_000_000_000)  # a counter ahead of the clock counts as is
    assert claim.counters[:2] == [1_700_000_000_000_000, 1_800_000_000_000_000]
    assert claim.fence([0, 1]) == 1_800_000_000_000_001
    assert claim.keys[3] == b"redlock-fence:r"
    assert nodes[0].waiting[-1].args[-1] == b"300000"  # QUEUE_FENCE writes the counter with fence_ttl


async def test_the_fence_round_counts_at_a_majority_not_waiting_for_a_dead_node(clock: Clock) -> None:
    """Three of five nodes raised the counter to our token (the other two never answer): the wait for the
    fence round ends at once, as a Ballot decides at a majority; a node that said "not ours" is dropped."""
    claim, nodes = make_fenced_claim()
    claim.join()
    for node in nodes:
        node.answer(fenced_reply(True, 1_000_000, 10))
    chosen = claim.fence([0, 1, 2, 3, 4])
    assert chosen == 11
    nodes[0].answer(fenced_reply(True, 1_000_100, 11))
    nodes[1].answer(fenced_reply(False, 1_000_100, 0))  # no longer ours there
    nodes[2].answer(fenced_reply(True, 1_000_100, 11))
    assert claim.fenced_on(clock.t, chosen) == [0, 2]
    nodes[3].answer(fenced_reply(True, 1_000_100, 11))
    async with asyncio.timeout(1.0):  # the waiting of the dead node 4 would take the whole 10 s
        await claim.raised(chosen, 10.0)
    assert claim.fenced_on(clock.t, chosen) == [0, 2, 3]
    assert claim.ends[1] == -math.inf
    assert claim.pending == 1
