"""Each primitive's line in the grant queue, through a :class:`Claim` over fake nodes (no servers).

tests/test_queue_claim.py covers a lock's claim; here a semaphore waiter's (a node holds a *slot*, and
a permit counts on the nodes of the slot most of them hold), a read/write lock's reader and writer
(which scripts, which fencing role), and what every line shares: a leave carries no clock reading.
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

from redlock_async._core import _algorithm, _clock
from redlock_async._core._names import rw_keys, semaphore_keys
from redlock_async._core._settings import Settings
from redlock_async._health._clock_guard import ClockGuard
from redlock_async._queue import _wait as _queue_wait
from redlock_async._queue._claim import Claim
from redlock_async._queue._lines import READER, WRITER, PermitLine, Permits, RwLine
from redlock_async._scripts import PERMIT_ENTER, PERMIT_LEAVE, PERMIT_STAY, QUEUE_LEAVE, RW_ENTER, RW_QUEUE_LEAVE

from .fakes import FakeNode, as_nodes, fake_nodes, virtual

SPEC = Permits(semaphore_keys("redlock:", "s"), 3)
TOKEN = b"3:tok~me"


def permit_claim(n: int = 5, **options: Any) -> tuple[Claim, list[FakeNode]]:
    nodes = fake_nodes(n)
    line = PermitLine(SPEC, n)
    return Claim(as_nodes(nodes), SPEC.base, Settings(ttl=10.0), TOKEN, line=line, **options), nodes


def slot_reply(slot: int | None, node_us: int = 1_000_000) -> list[Any]:
    """PERMIT_ENTER's reply: slot *slot* holds our token (None: queued)."""
    return [0, str(node_us).encode(), 0, 0] if slot is None else [1, str(node_us).encode(), 9_000, slot]


def test_a_permit_counts_on_the_nodes_of_the_slot_most_of_them_hold() -> None:
    async def scenario() -> None:
        claim, nodes = permit_claim()
        claim.join()
        assert all(PERMIT_ENTER.sha in node.waiting[0].args for node in nodes)
        for node, slot in zip(nodes, (2, 0, 2, 2, None), strict=True):
            node.answer(slot_reply(slot))
        now = _clock.now()
        assert claim.held(now) == [0, 1, 2, 3]  # four nodes hold a slot for us...
        assert _queue_wait.holding([claim], now) == [0, 2, 3]  # ...three of them the same one
        votes, details = _queue_wait.votes([claim], now, 0.05)
        assert votes == [_algorithm.YES, _algorithm.NO, _algorithm.YES, _algorithm.YES, _algorithm.NO]
        assert details[1] == "granted slot 0, most nodes slot 2"
        won = await _queue_wait.claimed([claim], now + 1.0, 0.1, 0.1, until_answered=True)
        assert won is not None
        assert (won.holders, won.slot, won.fencing_tokens) == ([0, 2, 3], 2, None)

    virtual(scenario)


def test_a_split_permit_keeps_the_likeliest_slot_and_waits_for_it_everywhere() -> None:
    """Two nodes hold slot 1, one slot 0, two are queued: no majority of one slot. After the split grace
    the claim keeps slot 1 (its grace starts again there) and stays in line everywhere else, wanting 1."""

    async def scenario() -> None:
        claim, nodes = permit_claim()
        claim.join()
        for node, slot in zip(nodes, (1, 1, 0, None, None), strict=True):
            node.answer(slot_reply(slot))
        start = _clock.now()
        assert await _queue_wait.claimed([claim], start + 0.15, 0.1, 0.1, until_answered=False) is None
        assert [node.waiting for node in nodes[:2]] == [[], []]  # slot 1 kept: nothing sent
        for node in nodes[2:]:
            (stay,) = node.waiting
            assert PERMIT_STAY.sha in stay.args
            assert stay.args[-1] == b"1"  # (token, ..., prefix, the slot wanted)
        assert claim.since[0] == claim.since[1] == start + 0.1
        assert claim.ends[2] == -math.inf  # slot 0 given back

    virtual(scenario)


def test_a_permit_word_counts_only_with_its_slot() -> None:
    async def scenario() -> None:
        claim, nodes = permit_claim(1)
        claim.join()
        nodes[0].answer(slot_reply(None))
        claim.heard(0, 1_100_000)  # no slot named (a word we cannot place): not counted
        assert claim.ends[0] == -math.inf
        claim.heard(0, 1_200_000, 2)
        assert claim.ends[0] > -math.inf
        assert _queue_wait.holding([claim], _clock.now()) == [0]

    virtual(scenario)


def test_a_slot_held_under_another_limit_is_a_refusal() -> None:
    async def scenario() -> None:
        claim, nodes = permit_claim(3)
        claim.join()
        nodes[0].answer([-5, b"1000000", 0, 0])  # PERMIT_ENTER: a slot is held under limit 5
        nodes[1].answer(slot_reply(None))
        assert isinstance(claim.line, PermitLine)
        assert claim.line.refusals == [5, 0, 0]
        claim.quit()
        assert PERMIT_LEAVE.sha in nodes[0].waiting[-1].args

    virtual(scenario)


def rw_claim(kind: bytes, fencing: bool) -> tuple[Claim, list[FakeNode]]:
    nodes = fake_nodes(3)
    fence_key = b"redlock-fence:rw" if fencing else None
    line = RwLine(b"redlock:rw", rw_keys(b"redlock:rw"), fence_key, kind)
    settings = Settings(ttl=10.0, fencing=fencing)
    return Claim(as_nodes(nodes), b"redlock:rw", settings, b"tok~me", fence_key, line=line), nodes


def test_a_read_write_claim_enters_the_names_line_with_its_side() -> None:
    async def scenario() -> None:
        for kind in (READER, WRITER):
            claim, nodes = rw_claim(kind, fencing=False)
            assert claim.keys == RwLine(b"redlock:rw", rw_keys(b"redlock:rw"), None, kind).keys
            claim.join()
            assert all(RW_ENTER.sha in node.waiting[0].args and node.waiting[0].args[-1] == kind for node in nodes)
            assert (claim.fenced, claim.reads) == (False, False)

    virtual(scenario)


def test_fencing_roles_a_writer_raises_the_counter_a_reader_reads_it() -> None:
    async def scenario() -> None:
        writer, _ = rw_claim(WRITER, fencing=True)
        assert (writer.fenced, writer.reads) == (True, False)
        reader, nodes = rw_claim(READER, fencing=True)
        assert (reader.fenced, reader.reads) == (False, True)
        reader.join()
        for node, counter in zip(nodes, (7, 9, 4), strict=True):
            node.answer([1, b"1000000", 9_000, str(counter).encode()])
        won = await _queue_wait.claimed([reader], _clock.now() + 1.0, 0.1, 0.1, until_answered=True)
        assert won is not None
        assert won.fencing_tokens == (9,)  # the last writer's token: the largest read

    virtual(scenario)


def test_every_line_script_is_a_clock_reading_and_none_carries_a_time() -> None:
    """Every line script replies with the node's time as it ran: the clock guard reads it before the vote
    counts, so no TIME goes before any of them (one command less per entry on the node); a node whose time
    ran 60 s ahead between two replies 1 s apart sits out, as after a TIME."""

    async def scenario() -> None:
        for leave, make in (
            (QUEUE_LEAVE, lock_claim_on),
            (PERMIT_LEAVE, permit_claim_on),
            (RW_QUEUE_LEAVE, rw_claim_on),
        ):
            nodes = fake_nodes(3)
            guard = ClockGuard(as_nodes(nodes), 0.01, lambda: 1.0, lambda *_: None)
            claim = make(nodes, guard)
            claim.join()
            assert [request.args[0] for request in nodes[0].waiting] == [b"EVALSHA"]
            nodes[0].answer([0, b"100000000", 0, 0])  # in line, at the node's 100 s
            await asyncio.sleep(1.0)
            claim.give_back([0])
            assert [request.args[0] for request in nodes[0].waiting] == [b"EVALSHA"]
            assert nodes[0].clock_held_until == 0.0
            nodes[0].answer([0, b"160000000", 0, 0])
            assert nodes[0].clock_held_until > _clock.now()  # ahead: it counts toward no quorum
            assert nodes[1].clock_held_until == 0.0
            claim.quit()
            assert [request.args[0] for request in nodes[0].waiting] == [b"EVALSHA"]
            assert leave.sha in nodes[0].waiting[-1].args

    virtual(scenario)


def lock_claim_on(nodes: list[FakeNode], guard: ClockGuard) -> Claim:
    return Claim(as_nodes(nodes), b"redlock:r", Settings(), b"t", guard=guard)


def permit_claim_on(nodes: list[FakeNode], guard: ClockGuard) -> Claim:
    line = PermitLine(SPEC, len(nodes))
    return Claim(as_nodes(nodes), SPEC.base, Settings(), TOKEN, guard=guard, line=line)


def rw_claim_on(nodes: list[FakeNode], guard: ClockGuard) -> Claim:
    line = RwLine(b"redlock:rw", rw_keys(b"redlock:rw"), None, READER)
    return Claim(as_nodes(nodes), b"redlock:rw", Settings(), b"t", guard=guard, line=line)
