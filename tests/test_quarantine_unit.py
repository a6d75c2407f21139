"""The restart quarantine's decisions without servers, on virtual time.

Fake nodes answer the probe (INFO server, GET marker) with what the test says; the clock is
looptime's (as in test_watchdog_round.py), so "sits out 10 s, then counts again and is
marked" is checked to the millisecond, with no waiting.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass

from redlock_async import _clock
from redlock_async._quarantine import Quarantine, marker_value
from redlock_async._wire import Reply

from .fakes import FakeNode, Request, as_nodes, virtual

PERIOD = 10.0
MARKER = b"redlock:"


@dataclass(eq=False)
class ProbedNode(FakeNode):
    """Answers the probe with its server's run_id and uptime, and the marker it holds."""

    run_id: bytes = b""
    uptime: float = 1000.0
    marker: bytes | None = None

    def __post_init__(self) -> None:
        if self.respond is None:
            self.respond = self.answer_probe

    def answer_probe(self, request: Request) -> Reply:
        """A real node hands the replies over as it parses them, in order: here, at once."""
        command = request.args
        if command == (b"INFO", b"server"):
            return b"# Server\r\nrun_id:%s\r\nuptime_in_seconds:%d\r\n" % (self.run_id, self.uptime)
        if command == (b"GET", MARKER):
            return self.marker
        assert command[:2] == (b"SET", MARKER), command  # nothing else is sent by the quarantine
        self.marker = command[2]
        return b"OK"


def cluster(n: int = 5, *, marked: bool) -> tuple[Quarantine, list[ProbedNode]]:
    nodes = [ProbedNode(f"fake:{i}", run_id=b"%040d" % i) for i in range(n)]
    if marked:
        for node in nodes:
            node.marker = marker_value(node.run_id, PERIOD)
    quarantine = Quarantine(MARKER, lambda: PERIOD, as_nodes(nodes))
    return quarantine, nodes


def connect(quarantine: Quarantine, node: ProbedNode) -> None:
    node.connect_started = _clock.now()
    quarantine.on_ready(as_nodes([node])[0])


def test_a_new_cluster_serves_at_once_and_is_marked() -> None:
    async def test() -> None:
        quarantine, nodes = cluster(marked=False)
        for node in nodes:
            connect(quarantine, node)
        await asyncio.sleep(0)
        assert all(node.quarantined_until == 0 for node in nodes)
        assert all(node.marker == marker_value(node.run_id, PERIOD) for node in nodes)
        quarantine.close()

    virtual(test)


def test_a_restarted_node_sits_out_the_whole_period_then_counts_and_is_marked() -> None:
    async def test() -> None:
        quarantine, nodes = cluster(marked=True)
        for node in nodes:
            connect(quarantine, node)
        await asyncio.sleep(0)
        assert all(node.quarantined_until == 0 for node in nodes)
        # Node 2 restarts empty (a new run_id, no marker) and is met again.
        restarted = nodes[2]
        restarted.run_id, restarted.uptime, restarted.marker = b"f" * 40, 3.0, None
        connect(quarantine, restarted)
        await asyncio.sleep(0)
        back = _clock.now()
        assert restarted.quarantined_until == back + PERIOD
        await asyncio.sleep(PERIOD - 0.01)
        assert restarted.quarantined_until > _clock.now()  # still out, a moment before the end
        await asyncio.sleep(0.02)
        assert restarted.quarantined_until == 0
        assert restarted.marker == marker_value(b"f" * 40, PERIOD)
        quarantine.close()

    virtual(test)


def test_a_marker_written_under_a_shorter_period_vouches_for_nothing() -> None:
    async def test() -> None:
        quarantine, nodes = cluster(marked=True)
        nodes[1].marker = marker_value(nodes[1].run_id, PERIOD / 10)  # an admin script with short leases
        nodes[1].uptime = 5.0
        for node in nodes:
            connect(quarantine, node)
        await asyncio.sleep(0)
        assert nodes[1].quarantined_until > _clock.now()
        assert all(node.quarantined_until == 0 for i, node in enumerate(nodes) if i != 1)
        quarantine.close()

    virtual(test)


def test_a_spare_without_our_marker_sits_out_the_period_whatever_its_uptime() -> None:
    async def test() -> None:
        quarantine, nodes = cluster(marked=True)
        nodes[3].marker, nodes[3].uptime = None, 10 * PERIOD  # up for ages, but empty
        for node in nodes:
            connect(quarantine, node)
        await asyncio.sleep(0)
        assert nodes[3].quarantined_until > _clock.now() + PERIOD - 1
        quarantine.close()

    virtual(test)


def test_a_probe_in_flight_counts_nothing_from_the_node() -> None:
    quarantine, nodes = cluster(marked=True)
    node = nodes[0]
    node.respond = None  # sent, not answered yet

    async def test() -> None:
        connect(quarantine, node)
        assert math.isinf(node.quarantined_until)  # until the probe is answered
        assert [request.args for request in node.waiting] == [(b"INFO", b"server"), (b"GET", MARKER)]
        quarantine.close()

    virtual(test)
