"""The restart quarantine's decisions without servers, on virtual time.

Fake nodes answer the probe (INFO server, GET marker), the rechecks (TIME, GET) and the watch
(the WATCH script, run as a server would) with what the test says; the clock is looptime's (as in
test_watchdog_round.py), and the nodes' clocks follow it, so "sits out 10 s, then counts again
and is marked" is checked to the millisecond, with no waiting.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass

from redlock_async._core import _clock
from redlock_async._health._markers import marker_value
from redlock_async._health._quarantine import Quarantine
from redlock_async._nodes._wire import Reply
from redlock_async._scripts import WATCH

from .fakes import FakeNode, Request, as_nodes, virtual

PERIOD = 10.0
MARKER = b"redlock:"
EPOCH = 1_800_000_000_000_000  # the nodes' clocks (µs): this, plus the loop's time


def node_time() -> int:
    return EPOCH + round(_clock.now() * 1e6)


def watch_value(run_id: bytes, since: int) -> bytes:
    """The marker the WATCH script writes: this server process, watched since then (µs, the node's time)."""
    return run_id + b"/since/" + str(since).encode()


@dataclass(eq=False)
class ProbedNode(FakeNode):
    """Answers the probe with its server's run_id and uptime, and the marker it holds."""

    run_id: bytes = b""
    uptime: float = 1000.0
    marker: bytes | None = None
    server_id: bytes | None = None  # a Node's: the run_id its handshake read (None: not connected here)
    promoted: bool = False  # a Node's: its handshake read that it was a replica since it started

    def __post_init__(self) -> None:
        if self.respond is None:
            self.respond = self.answer_probe

    def answer_probe(self, request: Request) -> Reply:
        """A real node hands the replies over as it parses them, in order: here, at once."""
        command = request.args
        now = node_time()
        if command == (b"INFO", b"server"):
            info = b"# Server\r\nrun_id:%s\r\nuptime_in_seconds:%d\r\nserver_time_usec:%d\r\n"
            return info % (self.run_id, self.uptime, now)
        if command == (b"GET", MARKER):
            return self.marker
        if command == (b"TIME",):
            return [str(now // 1_000_000).encode(), str(now % 1_000_000).encode()]
        if command == (b"EVALSHA", WATCH.sha, b"1", MARKER):
            if self.marker is None:
                self.marker = watch_value(self.run_id, now)
            return [self.marker, str(now).encode()]
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


def test_a_restarted_node_sits_out_the_whole_period_from_its_watch_then_counts() -> None:
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
        # Watched from the moment it was met without marker: every client reads the same end there.
        assert restarted.marker == watch_value(b"f" * 40, EPOCH + round(back * 1e6))
        await asyncio.sleep(PERIOD - 0.01)
        assert restarted.quarantined_until > _clock.now()  # still out, a moment before the end
        await asyncio.sleep(0.02)
        assert restarted.quarantined_until == 0
        assert restarted.marker == marker_value(b"f" * 40, PERIOD)  # in service now (its watch, above, is over)
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


def test_a_majority_without_marker_is_no_new_cluster_until_every_node_answered() -> None:
    """Nodes 2, 3 and 4 answer first, without marker; 0 and 1 later, with theirs: the cluster was in
    service (before: judged new on the first three, which then served at once and were marked)."""

    async def test() -> None:
        quarantine, nodes = cluster(marked=True)
        for i in (2, 3, 4):
            nodes[i].marker = None
            connect(quarantine, nodes[i])
        await asyncio.sleep(0)
        assert all(nodes[i].quarantined_until > _clock.now() for i in (2, 3, 4))
        assert all(nodes[i].marker is None for i in (2, 3, 4))  # nothing written before the judgement
        await asyncio.sleep(0.05)
        for i in (0, 1):
            connect(quarantine, nodes[i])
        await asyncio.sleep(0)
        assert nodes[0].quarantined_until == nodes[1].quarantined_until == 0
        met = node_time()
        for i in (2, 3, 4):  # watched from now, sitting out the whole period
            assert nodes[i].marker == watch_value(nodes[i].run_id, met)
            assert nodes[i].quarantined_until == _clock.now() + PERIOD
        quarantine.close()

    virtual(test)


def test_every_node_answering_without_marker_is_a_new_cluster() -> None:
    async def test() -> None:
        quarantine, nodes = cluster(marked=False)
        for node in nodes[:4]:
            connect(quarantine, node)
        await asyncio.sleep(0.05)
        assert all(node.quarantined_until > _clock.now() for node in nodes[:4])  # one has not answered
        connect(quarantine, nodes[4])
        await asyncio.sleep(0)
        assert all(node.quarantined_until == 0 for node in nodes)
        assert all(node.marker == marker_value(node.run_id, PERIOD) for node in nodes)
        quarantine.close()

    virtual(test)


def test_a_node_that_cannot_be_reached_makes_the_others_sit_out() -> None:
    """Node 4 is down when the cluster is first met: it may hold keys granted on a majority with nodes
    that lost theirs, so the nodes without marker are watched and sit out a period."""

    async def test() -> None:
        quarantine, nodes = cluster(marked=False)
        for node in nodes[:4]:
            connect(quarantine, node)
        await asyncio.sleep(0)
        assert all(node.marker is None for node in nodes[:4])
        quarantine.on_unreachable(as_nodes([nodes[4]])[0])
        await asyncio.sleep(0)
        met = node_time()
        for node in nodes[:4]:
            assert node.marker == watch_value(node.run_id, met)
            assert node.quarantined_until == _clock.now() + PERIOD
        await asyncio.sleep(PERIOD + 0.01)
        assert all(node.quarantined_until == 0 for node in nodes[:4])
        assert all(node.marker == marker_value(node.run_id, PERIOD) for node in nodes[:4])  # in service now
        quarantine.close()

    virtual(test)


def test_a_watched_node_ends_its_quarantine_at_the_same_moment_for_every_client() -> None:
    """Client 1 meets node 2 without marker and watches it; client 2, met 4 s later, sits it out for the
    6 s left, not a period of its own; client 3, met after the watch ran out, counts it at once."""

    async def test() -> None:
        first, nodes = cluster(marked=True)
        nodes[2].marker = None
        for node in nodes:
            connect(first, node)
        await asyncio.sleep(0)
        ends = _clock.now() + PERIOD
        assert nodes[2].quarantined_until == ends
        first.close()
        await asyncio.sleep(4.0)
        second = Quarantine(MARKER, lambda: PERIOD, as_nodes(nodes))
        for node in nodes:
            node.quarantined_until = 0.0
            connect(second, node)
        await asyncio.sleep(0)
        assert nodes[2].quarantined_until == ends
        second.close()
        await asyncio.sleep(ends - _clock.now())
        third = Quarantine(MARKER, lambda: PERIOD, as_nodes(nodes))
        for node in nodes:
            node.vouching = None
            connect(third, node)
        await asyncio.sleep(0)
        assert all(node.quarantined_until == 0 for node in nodes)
        assert nodes[2].marker == marker_value(nodes[2].run_id, PERIOD)  # the watch over: marked in service
        third.close()

    virtual(test)


def test_a_client_with_longer_leases_reads_the_same_watch_for_its_own_period() -> None:
    async def test() -> None:
        first, nodes = cluster(marked=True)
        nodes[2].marker = None
        for node in nodes:
            connect(first, node)
        await asyncio.sleep(0)
        met = _clock.now()
        first.close()
        await asyncio.sleep(PERIOD + 1)
        longer = Quarantine(MARKER, lambda: 3 * PERIOD, as_nodes(nodes))
        for node in nodes:
            node.vouching = None
            connect(longer, node)
        await asyncio.sleep(0)
        assert nodes[2].quarantined_until == met + 3 * PERIOD
        longer.close()

    virtual(test)
