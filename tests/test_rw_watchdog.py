"""A reader's lease in the watchdog's rounds, without servers: its entry in the readers' hash is extended by a
script of its own (RW_READ_EXTEND, ``Keep.instead``), sent beside the round's EXTEND_MANY of the other leases,
and each is decided on its own votes (the fakes and virtual time of tests/test_watchdog_round.py)."""

from __future__ import annotations

import asyncio

from redlock_async._core import _clock
from redlock_async._core._algorithm import Vote
from redlock_async._rounds._lease import Keep
from redlock_async._scripts import EXTEND_MANY, RW_READ_EXTEND
from redlock_async._shared._watchdog import Watchdog

from .fakes import as_nodes, fake_nodes, virtual
from .test_watchdog_round import NODE_TIMEOUT, Decision, watched

READERS = b"redlock:\x00rw\x00doc\x00readers"


def test_a_readers_lease_is_extended_by_its_own_script_beside_the_batch() -> None:
    async def test() -> None:
        nodes = fake_nodes(3)
        watchdog = Watchdog(tuple(as_nodes(nodes)), NODE_TIMEOUT)
        reader: list[Decision] = []
        plain: list[Decision] = []
        start = _clock.now()
        lease = watched(READERS, start + 1.0, reader)
        lease.keeps = Keep(RW_READ_EXTEND, READERS, instead=True)
        watchdog.schedule(lease, start + 0.3)
        watchdog.schedule(watched(b"a", start + 1.0, plain), start + 0.31)  # within the batch window
        await asyncio.sleep(0.35)
        assert watchdog.rounds == 1
        for node in nodes:
            (batch, own) = node.sent  # the batch first, the reader's own after it
            assert batch[:4] == (b"EVALSHA", EXTEND_MANY.sha, b"1", b"a")
            assert own == (b"EVALSHA", RW_READ_EXTEND.sha, b"1", READERS, b"token-" + READERS, b"1000")
        for node in nodes[:2]:
            node.answer([1])  # the batch: a holds
            node.answer([0])  # the reader's entry is gone there
        await asyncio.sleep(0)
        assert plain[0].votes == [Vote.YES, Vote.YES, Vote.PENDING]
        assert reader[0].votes == [Vote.NO, Vote.NO, Vote.PENDING]
        await watchdog.aclose()

    virtual(test)
