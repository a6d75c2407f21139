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
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Any

from redis.asyncio import Redis

from redlock_async._core import MIN_TTL_TO_NODE_TIMEOUT, Settings, Vote, complete, one_slot_voters, quorum
from redlock_async._health import (
    ClockGuard,
    CounterRepair,
    EvictionWatch,
    Quarantine,
    ShardHealth,
    ShardQuarantine,
)
from redlock_async._nodes import (
    ClusterSubscriber,
    ClusterVoter,
    Failure,
    Node,
    Reply,
    SwitchWatch,
    endpoints_for,
    messages,
    replicated_outbox,
    server_error,
    wait_ms,
)
from redlock_async._rounds import sitting_out
from redlock_async._scripts import PERMISSIONS, SCRIPTS
from redlock_async._shared._cluster import Cluster, describe
from redlock_async._shared._handoff import Listener
from redlock_async._shared._inspect import Inspector
from redlock_async.errors import NodeOutcome, RedlockError
from redlock_async.events import OnEvent
from redlock_async.statistics import NodeStatistics, RedlockStatistics

log = logging.getLogger("redlock_async.client")  # the Redlock's messages, under the logger users know

SAME_SERVER = "the same server as"

PROBE_TAG = b"{\x00probe}"
"""The probes' keys, after key_prefix or fence_prefix: no lock's name (one hash tag: one cluster slot)."""

_told_even: set[int] = set()
"""The even node counts whose fault tolerance this process has told of (once each)."""


def tell_fault_tolerance(n: int) -> None:
    """Log once per process (a WARNING, per count) that an even number of nodes tolerates no more node
    failures than one node fewer: 2 none, 4 one as 3 do. A log line, not ``warnings.warn``: the node
    count is the deployment's, read by whoever runs it (as the nodes' other findings are), and a chosen
    count (a migration from 3 to 5) must not fail test suites that turn warnings into errors."""
    if n < 2 or n % 2 or n in _told_even:
        return
    _told_even.add(n)
    tolerated, majority = n - quorum(n), quorum(n)
    if tolerated == 0:
        log.warning(
            "redlock: %d nodes tolerate no node failure (a majority is %d of %d: one node down stops every "
            "acquire and extension); 3 nodes tolerate one, 5 two",
            n, majority, n,
        )  # fmt: skip
    else:
        log.warning(
            "redlock: %d nodes tolerate %d node failure%s (a majority is %d of %d), no more than %d nodes do: "
            "use %d nodes, or %d to tolerate %d",
            n, tolerated, "" if tolerated == 1 else "s", majority, n, n - 1, n - 1, n + 1, tolerated + 1,
        )  # fmt: skip


class Connections:
    """The nodes of one Redlock and what is built on them (:attr:`cluster`, quarantine, clock guard, inspector)."""

    def __init__(self, nodes: Iterable[str | Redis], settings: Settings, hook: OnEvent | None) -> None:
        self.settings = settings
        if isinstance(nodes, Iterable) and not isinstance(nodes, str | bytes):
            nodes = list(nodes)  # read twice: the endpoints, and the key layout
        endpoints = endpoints_for(nodes)
        tell_fault_tolerance(len(endpoints))
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
        # wait_replicas: each vote's connection WAITs for replicas behind it (_nodes/_replicas.py); else as ever.
        voting = dict(node_settings)
        if settings.wait_replicas is not None:
            voting["outbox_type"] = replicated_outbox(settings.wait_replicas, wait_ms(settings.node_timeout))
        shards: ShardQuarantine | None = None  # a Cluster voter's shards' quarantine, made once the nodes are

        def probe_shard(index: int, node: Node) -> None:
            assert shards is not None
            shards.on_ready(index, node)

        on_ready = None if settings.restart_quarantine == 0 else probe
        on_unreachable = None if settings.restart_quarantine == 0 else unreachable
        probe_key = settings.key_prefix.encode() + PROBE_TAG
        for index, endpoint in enumerate(endpoints):
            built.append(
                ClusterVoter(
                    endpoint,
                    shard_settings=voting,
                    scripts=SCRIPTS,
                    shard_ready=None if on_ready is None else functools.partial(probe_shard, index),
                    on_fault=failed,
                    probe_prefix=settings.key_prefix.encode(),  # each primary's handshake asks of DELIFEQ
                )
                if endpoint.seeds
                else Node(
                    replace(endpoint, probe_key=probe_key),  # its handshake asks of DELIFEQ on that key
                    scripts=SCRIPTS,
                    on_ready=on_ready,
                    on_unreachable=on_unreachable,
                    on_identified=self._same_server,
                    on_fault=failed,
                    **voting,
                )
            )
            hear = functools.partial(listener.on_message, node=index)
            voter = built[-1]
            subscribers.append(
                ClusterSubscriber(  # sharded pub/sub: each channel on the primary of its slot
                    voter, on_message=hear, on_connect=listener.on_connect, on_fault=failed, settings=node_settings
                )
                if isinstance(voter, ClusterVoter)
                else Node(
                    endpoint,
                    on_message=messages(hear),
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
        listener.marks.nodes = self.nodes  # where its listening marks go
        # A Sentinel voter's connections follow +switch-master (from connect() on).
        self._watches = [
            SwitchWatch(endpoint, (self.nodes[i], self.subscribers[i]))
            for i, endpoint in enumerate(endpoints)
            if endpoint.service is not None
        ]
        cluster = self.cluster = Cluster(self.nodes, settings, listener, hook)
        cluster.one_slot = one_slot_voters(nodes)
        # The standalone (and Sentinel) voters' restart quarantine; a Cluster voter's shards have their own.
        plain = tuple(node for node in self.nodes if not isinstance(node, ClusterVoter))
        voters = [(i, node) for i, node in enumerate(self.nodes) if isinstance(node, ClusterVoter)]
        if on_ready is not None:
            # A node back from a restart, or a shard whose primary changed, raises its fencing counters from the
            # other voters (standalone nodes and Cluster voters' shards alike) before it counts again.
            repair = CounterRepair(
                self.nodes, prefix=settings.fence_prefix.encode(), timeout=settings.connect_timeout * 2
            )
            at = [self.nodes.index(node) for node in plain]  # a standalone node's index among the voters
            # A deployment is new only if every voter is: each quarantine asks the other one's word.
            quarantine = Quarantine(
                settings.key_prefix.encode(),
                cluster.quarantine_period,
                plain,
                repair=lambda i: repair.node(at[i]),
                elsewhere=(lambda: shards.state() if shards is not None else None) if voters else None,
            )
            judged = quarantine.judged
            repair.node_judged = lambda j: judged(at.index(j))
            if voters:
                shards = ShardQuarantine(
                    settings.key_prefix.encode(),
                    cluster.quarantine_period,
                    voters,
                    on_replaced=cluster.shard_replaced,
                    elsewhere=quarantine.state if plain else None,
                    repair=repair.shard,
                )
                repair.shard_judged = shards.judged
        self._quarantine = quarantine
        self._shards = shards
        # A node whose maxmemory-policy can evict: INFO stats before its votes; an eviction holds it out.
        self._evictions = EvictionWatch(self.nodes, cluster.quarantine_period, cluster.evicted)
        self._probing: asyncio.Future[None] | None = None
        cluster.first_use = self._first_use  # until connect()'s checks passed
        if settings.clock_guard:
            cluster.clock = ClockGuard(self.nodes, settings.drift_factor, cluster.longest_lease, cluster.clock_fault)
        # A Cluster voter's shard primaries: a clock guard and an eviction watch each (that shard alone sits out).
        self._shard_health = ShardHealth(
            voters,
            drift_factor=settings.drift_factor,
            period=cluster.quarantine_period,
            longest_lease=cluster.longest_lease,
            clock_guard=settings.clock_guard,
            on_clock=cluster.shard_clock_fault,
            on_evicted=cluster.shard_evicted,
        )
        # Read-only connections, opened on first inspect(), judging the restart quarantine as the locks do.
        # A node the clock guard holds out (its clock jumped ahead) rules out no holder there either.
        self.inspector = Inspector(endpoints, settings, cluster.quarantine_period, self._clock_held)

    @property
    def quorum(self) -> int:
        return quorum(len(self.nodes))

    def _clock_held(self, i: int, key: bytes) -> tuple[float, str]:
        """Until when (monotonic) the clock guard or the eviction watch holds node *i* out, 0 when they never
        did, and why; on a Cluster voter, the hold of the shard primary serving *key* (the inspected name's)."""
        node = self.nodes[i]
        if isinstance(node, ClusterVoter):
            return node.hold_for(key)
        return node.clock_held_until, node.quarantine_reason

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
            watched_locks=sum(1 for lock in held if lock.tenure.watched),
            watchdog_rounds=cluster.watchdog.rounds,
            watchdog_retries=cluster.watchdog.retries,
            wakeups=cluster.listener.wakeups,
        )

    # -- connecting -------------------------------------------------------

    async def connect(self) -> None:
        """Connect to every node; a node that fails is logged and retried later (``Redlock.connect``)."""
        self.cluster.check_open()
        for watch in self._watches:
            watch.start()
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
        await self._check_permissions(up, denied_at_connect(nodes, failures))
        self.cluster.check_open()  # a node's task failed while connecting: say so here
        self.cluster.first_use = None

    async def _first_use(self) -> None:
        """The first acquire of a Redlock never connected: the permissions probe first, shared by every
        acquire that comes meanwhile, so a user who may not run what the scripts call gets the clear error
        before any body runs (not a lock lost, or never released, a ttl later). Probed again at the next
        acquire when it raised (the ACL may have been fixed)."""
        probing = self._probing
        if probing is None:
            probing = self._probing = asyncio.ensure_future(self._probe_first())
        try:
            await asyncio.shield(probing)
        finally:
            if probing.done() and self._probing is probing and (probing.cancelled() or probing.exception()):
                self._probing = None

    async def _probe_first(self) -> None:
        nodes = self.nodes
        failures = await asyncio.gather(*(node.connect() for node in nodes))
        up = [node for node, failure in zip(nodes, failures, strict=True) if not failure]
        await self._check_permissions(up, denied_at_connect(nodes, failures))
        self.cluster.first_use = None

    async def _check_permissions(self, nodes: list[Node], denied: list[NodeOutcome]) -> None:
        """Run the permissions probe once on each node that is up (it leaves nothing behind): every command
        the lock scripts call, so a user who may not run one is told now, not by a lease lost a ttl later.
        *denied*: the nodes whose connect the user's ACL refused, counted with those refusing the scripts."""
        settings = self.settings
        # One hash tag: on a Cluster voter every key of the probe is in one slot, as a script's keys must be.
        key, fence = settings.key_prefix.encode() + PROBE_TAG, settings.fence_prefix.encode() + PROBE_TAG
        keys = (key, key + b":h", key + b":s", key + b":z", fence)
        futures = [node.send_script(PERMISSIONS, keys, ()) for node in nodes]
        if futures:
            await asyncio.wait(futures, timeout=settings.connect_timeout)
        answered = [(node, fut.result()) for node, fut in zip(nodes, futures, strict=True) if fut.done()]
        for node, reply in answered:
            if busy := not_now(reply):
                log.warning("redlock node %s could not run the permissions probe: %s", node.name, busy)
        refused = [
            NodeOutcome(node.name, Vote.ERROR, detail)
            for node, reply in answered
            if not not_now(reply) and (detail := permissions_refused(reply))
        ]
        for outcome in refused:
            log.warning("redlock node %s refuses what the lock scripts run: %s", outcome.node, outcome.detail)
        if len(refused) + len(denied) > len(self.nodes) - self.quorum:
            at_connect = "; ".join(f"{outcome.node}: {outcome.detail}" for outcome in denied)
            if not refused:
                raise RedlockError(
                    f"{len(denied)} of {len(self.nodes)} nodes refuse the user what connecting to them needs "
                    f"({at_connect}), so no majority could grant, release or extend a lock: allow it (the ACL "
                    "lines in docs/deployment.md)",
                    name="",
                    outcomes=denied,
                )
            raise RedlockError(
                f"{len(refused) + len(denied)} of {len(self.nodes)} nodes refuse commands the lock scripts run"
                f"{f' or connecting needs ({at_connect})' if denied else ''}, so no majority "
                "could release or extend a lock: let the user run EVAL, EVALSHA and SCRIPT (ACL +@scripting), "
                "unrenamed, and every command the scripts call, on the keys and channels under key_prefix and "
                "fence_prefix (the ACL line in docs/deployment.md)",
                name="",
                outcomes=denied + refused,
            )

    def _same_server(self, node: Node) -> str | None:
        """On each connect: refuse a node whose server is another node's (two spellings of one address); watch
        its evictions."""
        self._evictions.identified(self.nodes.index(node))
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
        if self._shards is not None:
            self._shards.close()
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
                lock.redlock_closed(f"lock {lock.name!r} was given up: its Redlock was closed while it was held")
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
            await asyncio.gather(*(watch.aclose() for watch in self._watches))
            await self.cluster.watchdog.aclose()
            await asyncio.gather(
                *(node.aclose(grace=self.settings.node_timeout) for node in self.nodes),
                *(node.aclose(grace=0.0) for node in self.subscribers),
            )
        finally:
            for node in (*self.nodes, *self.subscribers):
                node.close_now()
            await self.inspector.aclose()


# The server's state, not the user's rights: a node full under noeviction refuses every write (OOM), one
# loading its data every script (LOADING), one running a long script everything (BUSY). It votes no until
# that passes, as any node in trouble; blaming the ACL would send the operator to the wrong place.
_NOT_NOW = ("OOM", "LOADING", "BUSY")


def not_now(reply: Reply) -> str:
    """Why the permissions probe's *reply* says nothing of the user's rights ("" when it does): the node
    refused it for its state (out of memory, loading, busy), which a later use meets as errors."""
    if isinstance(reply, Failure):
        text = reply.detail if reply.answered else ""
    elif isinstance(reply, list) and reply:
        first = reply[0]
        text = (first.decode(errors="replace") if isinstance(first, bytes) else str(first)).partition(": ")[2]
    else:
        return ""
    if text.startswith(_NOT_NOW):
        what = "out of memory" if text.startswith("OOM") else "loading" if text.startswith("LOADING") else "busy"
        return server_error(f"the node is {what}, not a matter of permissions ({text})")
    return ""


def denied_at_connect(nodes: Sequence[Node], failures: Sequence[Failure | None]) -> list[NodeOutcome]:
    """The nodes whose connect the user's ACL refused (a Cluster voter's slot map): not down, but told as the
    nodes refusing the scripts are (an error saying what to allow), not as a lock another client holds."""
    return [
        NodeOutcome(node.name, Vote.ERROR, failure.detail)
        for node, failure in zip(nodes, failures, strict=True)
        if failure and ("NOPERM" in failure.detail or "the user may not" in failure.detail)
    ]


def permissions_refused(reply: Reply) -> str:
    """What the permissions probe's *reply* says was refused, in words ("" when nothing was)."""
    if isinstance(reply, Failure):
        return reply.detail if reply.answered else ""  # not answered: a node down, said elsewhere
    if not isinstance(reply, list) or not reply:
        return ""
    refusals = [(error.decode(errors="replace") if isinstance(error, bytes) else str(error)) for error in reply]
    commands = [refusal.partition(": ")[0] for refusal in refusals]
    missing = f"not allowed: {', '.join(commands)}"
    first = refusals[0].partition(": ")[2]
    if "READONLY" in first:  # not the user's rights: a replica (whose INFO the user may not read) refuses writes
        return server_error(f"a replica, not a master: it refuses every write ({first})")
    return server_error(f"{missing} ({first})")
