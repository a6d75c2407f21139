"""A Redlock's connections: its nodes built with the hooks they need, connected and checked, closed.

Each node has two connections (``_node.Node``): one for commands (votes, scripts, the restart
quarantine's probe, the clock guard's readings) and one for the hand-off's pub/sub (the
:class:`_handoff.Listener`). Built here with them: the :class:`_cluster.Cluster` that the
Redlock's locks share, the restart quarantine, the clock guard, and the inspector's read-only
connections. ``Redlock`` (``client.py``) is the public face: settings and the makers of locks.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Iterable
from typing import Any

from redis.asyncio import Redis

from redlock_async._algorithm import Vote, quorum
from redlock_async._cleanup import complete
from redlock_async._clock_guard import ClockGuard
from redlock_async._cluster import Cluster, describe
from redlock_async._endpoint import endpoints_for
from redlock_async._fanout import sitting_out
from redlock_async._handoff import Listener
from redlock_async._inspect import Inspector
from redlock_async._node import Node
from redlock_async._quarantine import Quarantine
from redlock_async._scripts import RELEASE, SCRIPTS
from redlock_async._settings import MIN_TTL_TO_NODE_TIMEOUT, Settings
from redlock_async._wire import Failure
from redlock_async.errors import NodeOutcome, RedlockError
from redlock_async.events import OnEvent
from redlock_async.statistics import NodeStatistics, RedlockStatistics

log = logging.getLogger("redlock_async.client")  # the Redlock's messages, under the logger users know

SAME_SERVER = "the same server as"


class Connections:
    """The nodes of one Redlock and what is built on them (:attr:`cluster`, quarantine, clock guard, inspector)."""

    def __init__(self, nodes: Iterable[str | Redis], settings: Settings, hook: OnEvent | None) -> None:
        self.settings = settings
        endpoints = endpoints_for(nodes)
        built: list[Node] = []
        subscribers: list[Node] = []
        # Redlocks of this process on the same nodes share their waiters' queues.
        listener = Listener(settings.node_timeout, scope=tuple(sorted(e.name for e in endpoints)))
        cluster: Cluster  # made once the nodes are; their callbacks run only after that

        def failed(node: Node, exc: BaseException) -> None:
            cluster.failed(exc)

        quarantine: Quarantine | None = None  # made once the nodes are; its probe starts only on connect

        def probe(node: Node) -> None:
            assert quarantine is not None
            quarantine.on_ready(node)

        def unreachable(node: Node) -> None:
            assert quarantine is not None
            quarantine.on_unreachable(node)

        node_settings: dict[str, Any] = {
            "max_unanswered": settings.max_unanswered,
            "stall_after": settings.connect_timeout,
            "connect_timeout": settings.connect_timeout,
            "reconnect_delay": settings.reconnect_delay,
            "max_rto": settings.ttl / MIN_TTL_TO_NODE_TIMEOUT if settings.adaptive_timeout else 0.0,
        }
        on_ready = None if settings.restart_quarantine == 0 else probe
        on_unreachable = None if settings.restart_quarantine == 0 else unreachable
        for index, endpoint in enumerate(endpoints):
            built.append(
                Node(
                    endpoint,
                    scripts=SCRIPTS,
                    on_ready=on_ready,
                    on_unreachable=on_unreachable,
                    on_identified=self._same_server,
                    on_fault=failed,
                    **node_settings,
                )
            )
            subscribers.append(
                Node(
                    endpoint,
                    on_message=functools.partial(listener.on_message, node=index),
                    on_connect=listener.on_connect,
                    on_fault=failed,
                    warn=False,  # the node's own connection (above) says it cannot connect, once
                    **node_settings,
                )
            )
        self.nodes: tuple[Node, ...] = tuple(built)
        """The command connections, one per node, in the order the nodes were given."""
        self.subscribers = listener.nodes = tuple(subscribers)
        """The pub/sub connections, one per node (the listener's)."""
        cluster = self.cluster = Cluster(self.nodes, settings, listener, hook)
        if on_ready is not None:
            quarantine = Quarantine(settings.key_prefix.encode(), cluster.quarantine_period, self.nodes)
        self._quarantine = quarantine
        if settings.clock_guard:
            cluster.clock = ClockGuard(self.nodes, settings.drift_factor, cluster.longest_lease, cluster.clock_fault)
        # Read-only connections, opened on first inspect(), judging the restart quarantine as the locks do.
        self.inspector = Inspector(endpoints, settings, cluster.quarantine_period)

    @property
    def quorum(self) -> int:
        return quorum(len(self.nodes))

    def statistics(self) -> RedlockStatistics:
        """A snapshot of the nodes' connections, the locks held and watched, the watchdog and the waiters."""
        nodes = tuple(
            NodeStatistics(
                address=node.name,
                connected=node.connected,
                server_id=node.server_id.decode() if node.server_id else None,
                quarantined=sitting_out(node) is not None,
                round_trip=node.load.srtt or None,
                timeout=node.load.rto,
                unanswered=node.unanswered,
                sent=node.load.sent,
                fault=describe(node.fault) if node.fault is not None else None,
            )
            for node in self.nodes
        )
        cluster = self.cluster
        held = list(cluster.held)
        return RedlockStatistics(
            nodes=nodes,
            closed=cluster.closed,
            held_locks=sum(1 for lock in held if lock.held),
            watched_locks=sum(1 for lock in held if lock.statistics().watched),
            watchdog_rounds=cluster.watchdog.rounds,
            watchdog_retries=cluster.watchdog.retries,
            wakeups=cluster.listener.wakeups,
        )

    # -- connecting -------------------------------------------------------

    async def connect(self) -> None:
        """Connect to every node; a node that fails is logged and retried later (``Redlock.connect``)."""
        self.cluster.check_open()
        nodes = self.nodes
        failures = await asyncio.gather(*(node.connect() for node in nodes))
        for index, failure in enumerate(failures):
            if failure is not None and SAME_SERVER in failure.detail:
                raise ValueError(f"nodes[{index}] ({nodes[index].name}): {failure.detail}")
        up = [node for node, failure in zip(nodes, failures, strict=True) if failure is None]
        if len(up) < len(nodes):
            # Each node that failed has said why ("cannot connect: ..."); this says what it means.
            down = ", ".join(node.name for node, failure in zip(nodes, failures, strict=True) if failure)
            if len(up) >= self.quorum:
                log.info("redlock: %d of %d nodes up at start (down: %s)", len(up), len(nodes), down)
            else:
                log.warning(
                    "redlock: only %d of %d nodes up at start (down: %s): no lock can be granted "
                    "until %d of them are up; the others are retried on each use",
                    len(up),
                    len(nodes),
                    down,
                    self.quorum,
                )
        await self._check_scripts(up)
        self.cluster.check_open()  # a node's task failed while connecting: say so here

    async def _check_scripts(self, nodes: list[Node]) -> None:
        """Run the release script once on each node that is up (it deletes nothing): say at once if it is refused."""
        probe = self.settings.key_prefix.encode() + b"\x00script-probe"
        futures = [node.send_script(RELEASE, (probe,), (b"",)) for node in nodes]
        if futures:
            await asyncio.wait(futures, timeout=self.settings.connect_timeout)
        refused = [
            NodeOutcome(node.name, Vote.ERROR, reply.detail)
            for node, fut in zip(nodes, futures, strict=True)
            if fut.done() and isinstance(reply := fut.result(), Failure) and reply.answered
        ]
        for outcome in refused:
            log.warning("redlock node %s answers the lock scripts with an error: %s", outcome.node, outcome.detail)
        if len(refused) > len(self.nodes) - self.quorum:
            raise RedlockError(
                f"{len(refused)} of {len(self.nodes)} nodes answer the Lua scripts with an error, so no majority "
                "could release or extend a lock: let the user run EVAL, EVALSHA and SCRIPT (ACL +@scripting), "
                "unrenamed",
                name="",
                outcomes=refused,
            )

    def _same_server(self, node: Node) -> str | None:
        """On each connect: refuse a node whose server is another node's (two spellings of one address)."""
        if node.server_id is None:
            return None
        for index, other in enumerate(self.nodes):
            if other is not node and other.server_id == node.server_id:
                return (
                    f"{SAME_SERVER} nodes[{index}] ({other.name}), run_id {node.server_id.decode(errors='replace')}: "
                    "each node must be a distinct master, or the majority means nothing"
                )
        return None

    # -- closing ----------------------------------------------------------

    async def aclose(self) -> None:
        """Close the connections, after queued releases went out (``Redlock.aclose``). Idempotent."""
        cluster = self.cluster
        if cluster.closed:
            return
        cluster.closed = True
        # Waiters still in the nodes' lines leave them now (a key granted meanwhile goes on), while the
        # connections are open; every waiter is woken to find its Redlock closed, not at its next try.
        cluster.listener.close()
        cluster.wake_waiters()
        if self._quarantine is not None:
            self._quarantine.close()
        held = sorted(cluster.held, key=lambda lock: repr(lock.name))
        if held:
            # Released, not left to expire; a body still inside `async with` is cancelled (LockLost).
            names = ", ".join(repr(lock.name) for lock in held[:5]) + (", ..." if len(held) > 5 else "")
            log.warning(
                "redlock: closed while %d %s held (%s): releasing them",
                len(held),
                "lock was" if len(held) == 1 else "locks were",
                names,
            )
            for lock in held:
                lock.on_redlock_closed(f"lock {lock.name!r} was given up: its Redlock was closed while it was held")
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            # No asyncio loop (trio refused in __aenter__): nothing was started, close without awaiting.
            for node in (*self.nodes, *self.subscribers):
                node.close_now()
            self.inspector.close_now()
            return
        await complete(self._close())

    async def _close(self) -> None:
        try:
            await self.cluster.watchdog.aclose()
            await asyncio.gather(
                *(node.aclose(grace=self.settings.node_timeout) for node in self.nodes),
                *(node.aclose(grace=0.0) for node in self.subscribers),
            )
        finally:
            for node in (*self.nodes, *self.subscribers):
                node.close_now()
            await self.inspector.aclose()
