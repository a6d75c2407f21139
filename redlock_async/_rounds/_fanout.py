"""One operation on all nodes at once, decided as soon as the outcome is certain.

A :class:`Ballot` watches the reply futures of one request sent to every
node. Each reply becomes a vote the moment it arrives (a done-callback, no
task per node); the ballot resolves when :func:`_algorithm.verdict` is no
longer UNDECIDED, or when the per-node timeout runs out, whichever comes
first. It never waits for the slowest node once the answer is known: the
requests still out stay in their node's queue and are answered there,
keeping each connection in step.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from redlock_async._core import (
    LOST,
    NO,
    PENDING,
    SKIPPED,
    UNDECIDED,
    WON,
    YES,
    Verdict,
    Vote,
    patience,
    quorum,
    thresholds,
    verdict,
)
from redlock_async._core import clock as _clock
from redlock_async._nodes import ClusterVoter, Failure, Fallback, Node, Receiver, Reply, pack_script
from redlock_async._rounds._deadline import Deadline
from redlock_async._scripts import Script
from redlock_async.errors import NodeOutcome

Classify = Callable[[Reply], Vote]


def vote_of_set(reply: Reply) -> Vote:
    """``SET NX`` answers OK when it set the key, nil when the key exists."""
    if isinstance(reply, Failure):
        return reply.vote
    return YES if reply == b"OK" else NO


def vote_of_fenced(reply: Reply) -> Vote:
    """The fenced acquire script answers the node's counter (>= 0) when it set the key, -1 when not."""
    if isinstance(reply, Failure):
        return reply.vote
    return YES if isinstance(reply, int) and reply >= 0 else NO


def vote_of_counters(reply: Reply) -> Vote:
    """The fenced acquire of several keys answers their counters (a list) when it set them all, -i when not."""
    if isinstance(reply, Failure):
        return reply.vote
    return YES if isinstance(reply, list) else NO


def vote_of_script(reply: Reply) -> Vote:
    """Our scripts answer 1 for done, 0 for a key that is gone or not ours."""
    if isinstance(reply, Failure):
        return reply.vote
    return YES if reply == 1 else NO


BACK_SLACK = 0.005
"""Seconds after a node's quarantine ends that a waiter looks again (its timer has run by then)."""


def back_in(nodes: Sequence[Node]) -> float:
    """Seconds until the first node that sits out now (its restart quarantine, a clock or eviction hold; a
    Cluster voter's shard primaries each) counts again, plus :data:`BACK_SLACK`; inf when none will. A waiter
    whose try failed looks again then, not at its retry: nothing else tells it (no release word comes)."""
    now = _clock.now()
    soonest = math.inf
    for node in nodes:
        for one in (node, *node.primaries()) if isinstance(node, ClusterVoter) else (node,):
            until = one.quarantined_until
            if now < until < soonest:
                soonest = until
    return soonest - now + BACK_SLACK


def sitting_out(node: Node) -> str | None:
    """Why a yes from *node* must not count now (its restart quarantine), or None when it counts."""
    until = node.quarantined_until
    if not until:
        return None
    left = until - _clock.now()
    if left <= 0:
        return None
    if math.isinf(left):
        return "in restart quarantine: just connected, its restart check is not answered yet"
    kind = (
        "restart" if until > node.clock_held_until else "eviction" if node.quarantine_reason[:4] == "it e" else "clock"
    )
    return f"in {kind} quarantine: {node.quarantine_reason or 'restarted'}; counts again in {left:.1f} s"


def timed_out(node: Node, waited: float) -> str:
    """Why *node* has a TIMEOUT vote after *waited* seconds, and which setting to change."""
    said = f"no reply within {waited * 1000:.0f} ms"
    load = node.load
    if load.srtt >= waited:
        # Its replies come, but later than we wait: the settings, not the node, are at fault. With
        # adaptive_timeout on, the wait already followed the round trip up to its cap, ttl/10.
        fix = "raise ttl (the wait is at most ttl/10)"
        if not load.max_rto:
            fix = "turn adaptive_timeout on, or raise node_timeout"
        return f"{said}, less than its round trip (~{load.srtt * 1000:.0f} ms): {fix}"
    return f"{said}: the node is slow, paused or cut off (node_timeout sets the wait)"


def outcomes(nodes: Sequence[Node], votes: Sequence[Vote], details: Sequence[str] | None) -> tuple[NodeOutcome, ...]:
    """Per-node outcomes, for errors and ``Lock.outcomes``: built only when someone asks."""
    words = details or [""] * len(votes)
    return tuple(NodeOutcome(node.name, vote, detail) for node, vote, detail in zip(nodes, votes, words, strict=True))


UNANSWERED = Failure(PENDING, "no reply yet")
"""A ballot's reply from a node that has not answered (yet)."""


class Ballot(Deadline):
    """The votes of N nodes on one request; ``await ballot.wait()`` for the verdict.

    Made before the request is sent: :meth:`send` (or ``node.send_packed(ballot,
    i, ...)`` per node) queues each node's command with the ballot as its
    receiver, then :meth:`start` arms the timer. A reply is counted the moment
    the node's reader parses it (no future, no callback scheduled per reply);
    every reply is kept in ``replies``, late ones too. :meth:`of` counts the
    futures of ``send()``.

    *wait_for* names the nodes whose answers matter: for acquire and extend,
    all of them, decided by majority (``majority=True``); for a release, the
    nodes known to hold the key, all of which are awaited (``majority=False``).

    It is its own :class:`Deadline` (armed by :meth:`start`): one object per request.
    """

    __slots__ = (
        "_counted",
        "_done",
        "_failed",
        "_held",
        "_lose_at",
        "_majority",
        "_need",
        "_open",
        "_said_yes",
        "_skipped",
        "_started",
        "_timeout",
        "_window",
        "_yes",
        "classify",
        "decided_at",
        "details",
        "nodes",
        "replies",
        "verdict",
        "votes",
    )

    def __init__(
        self,
        nodes: Sequence[Node],
        classify: Classify,
        timeout: float,
        *,
        majority: bool = True,
        wait_for: Sequence[int] | None = None,
        rearm: float | None = None,
    ) -> None:
        n = len(nodes)
        # On a slow network, wait as long as the nodes are measured to take (never less than *timeout*).
        indices = range(n) if wait_for is None else wait_for
        for i in indices:
            if nodes[i].load.rto > timeout:
                needed = quorum(n) if majority else len(indices)
                timeout = patience(timeout, _rtos(nodes, indices), needed, math.inf)
                break
        self.nodes = nodes
        self.classify = classify
        self.votes: list[Vote] = [PENDING] * n
        self.replies: list[Reply] = [UNANSWERED] * n
        self.details: list[str] | None = None  # made on the first failure with words
        self.verdict = UNDECIDED
        self.decided_at = 0.0
        self._counted: Sequence[int] | None = wait_for
        self._majority = majority
        # The verdict rule (_algorithm.verdict) as two counts: won at _need yes, lost at _lose_at failed.
        self._need, self._lose_at = thresholds(n) if majority else (0, 0)
        self._yes = 0
        self._failed = 0
        self._said_yes: list[int] = []
        self._held: list[int] | None = None  # yes votes waiting for their node's recheck (Node.vouching)
        self._skipped = False  # a reply said the request was never sent (counted or not)
        self._done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.live = self._started = False
        self._timeout = timeout
        self._window = rearm
        self._open = len(indices)
        if not self._open and not majority:
            self._decide(WON)  # nothing to wait for

    @classmethod
    def of(
        cls,
        nodes: Sequence[Node],
        futures: Sequence[asyncio.Future[Reply]],
        classify: Classify,
        timeout: float,
        **options: Any,
    ) -> Ballot:
        """A started ballot counting the futures of ``node.send()`` (one per node)."""
        ballot = cls(nodes, classify, timeout, **options)
        for i, fut in enumerate(futures):
            if fut.done():
                ballot.deliver(i, fut.result())
            else:
                fut.add_done_callback(partial(_deliver_to, ballot, i))
        return ballot.start()

    def send(
        self, packed: bytes, *, limited: bool = False, fallback: Fallback = None, clock: Receiver | None = None
    ) -> Ballot:
        """Queue one command (packed once) on every node, the replies to this ballot; with *clock* (the
        clock guard's reading), each node's ``TIME`` goes right before it (``Node.send_timed``)."""
        if clock is None:
            for i, node in enumerate(self.nodes):
                node.send_packed(self, i, packed, limited=limited, fallback=fallback)
        else:
            for i, node in enumerate(self.nodes):
                node.send_timed(clock, self, i, packed, limited=limited, fallback=fallback)
        return self

    def script(
        self,
        script: Script,
        keys: tuple[bytes, ...],
        args: tuple[bytes | int, ...],
        *,
        limited: bool = False,
        clock: Receiver | None = None,
    ) -> Ballot:
        """Queue EVALSHA of *script* on every node (see ``Node.send_script``), the replies to this ballot."""
        return self.send(pack_script(script, keys, args), limited=limited, fallback=(script, keys, args), clock=clock)

    def start(self) -> Ballot:
        """Every request is queued: arm the timer, unless the verdict is in already."""
        if self.verdict is UNDECIDED and not self._started:
            self._started = True
            self.arm(self._done.get_loop(), self._timeout, self._window)
        return self

    def deliver(self, i: int, reply: Reply, /) -> None:
        """Node *i* answered (or its request failed): keep the reply, count it if it still matters."""
        self.replies[i] = reply
        if type(reply) is Failure and reply.vote is SKIPPED:
            self._skipped = True
        if self.verdict is not UNDECIDED:
            return  # a late reply: the request was answered, the decision stands
        counted = self._counted
        if counted is not None and i not in counted:
            return
        vote = self.classify(reply)
        if vote is YES:
            node = self.nodes[i]
            if node.quarantined_until and (detail := sitting_out(node)):
                if node.vouching is not None and self._majority:
                    # Met without marker while others have theirs: its recheck may find it marked by
                    # another client at this moment. Count this yes once that recheck has decided.
                    node.vouching.append(partial(self._vouched, i))
                    if self._held is None:
                        self._held = []
                    self._held.append(i)
                    return
                vote = Vote.QUARANTINED
                self._say(i, detail)
            else:
                # _count's yes, inlined (most replies of an uncontended lock).
                self.votes[i] = YES
                self._open -= 1
                self._said_yes.append(i)
                self._yes += 1
                if self._yes >= self._need if self._majority else not self._open:
                    self._decide(WON)
                return
        elif type(reply) is Failure:
            self._say(i, reply.detail)
        self._count(i, vote)

    def _vouched(self, i: int) -> None:
        """The recheck a yes of node *i* waited for has decided (``Node.vouching``): count it now."""
        held = self._held
        if held is None or i not in held:
            return
        held.remove(i)
        if self.verdict is not UNDECIDED:
            return  # decided meanwhile: a late yes
        detail = sitting_out(self.nodes[i])
        if detail:
            self._say(i, detail)
        self._count(i, Vote.QUARANTINED if detail else YES)

    def _count(self, i: int, vote: Vote) -> None:
        self.votes[i] = vote
        self._open -= 1
        if vote is YES:
            self._said_yes.append(i)
        if self._majority:
            if vote is YES:
                self._yes += 1
                if self._yes >= self._need:
                    self._decide(WON)
            else:
                self._failed += 1
                if self._failed >= self._lose_at:
                    self._decide(LOST)
        else:
            if vote is YES:
                self._yes += 1
            else:
                self._failed += 1
            if not self._open:
                self._decide(WON)

    def _say(self, i: int, detail: str) -> None:
        if self.details is None:
            self.details = [""] * len(self.nodes)
        self.details[i] = detail

    def never_sent(self) -> Sequence[int]:
        """Nodes whose request was refused before it was sent: nothing there to release."""
        if not self._skipped:
            return ()  # (not a new list: it lives in the lease, held across the hold's awaits)
        return [i for i, reply in enumerate(self.replies) if type(reply) is Failure and reply.vote is SKIPPED]

    def on_deadline(self) -> None:
        if self.verdict is not UNDECIDED:
            return
        held = self._held
        if held:
            # Yes votes held for their nodes' rechecks: wait for those, up to the latest they may take.
            until = max(self.nodes[i].vouch_until for i in held)
            if until > _clock.now():
                self.arm(self._done.get_loop(), until - _clock.now(), 0.0)
                return
            self._failed += len(held)  # refused: _decide below says so in their votes
        for i, vote in enumerate(self.votes):
            if vote is PENDING and self.replies[i] is UNANSWERED:
                self.votes[i] = Vote.TIMEOUT
                self._say(i, timed_out(self.nodes[i], self._timeout))
                self._failed += 1
        # Every vote is in now (or timed out): the verdict is final.
        if self._majority:
            self._decide(verdict(len(self.nodes), self._yes, self._failed))
        else:
            self._decide(LOST)

    def _decide(self, result: Verdict) -> None:
        if self._held:
            # Decided without them: those yes votes did not count (their nodes still sat out).
            for i in self._held:
                self.votes[i] = Vote.QUARANTINED
                self._say(i, sitting_out(self.nodes[i]) or "in restart quarantine: its recheck did not answer")
            self._held.clear()
        self.verdict = result
        self.decided_at = _clock.now()
        if self.live:
            self.cancel()
        if not self._done.done():
            self._done.set_result(None)

    def decided(self) -> asyncio.Future[None]:
        """What :meth:`wait` awaits, for a caller on the hot path to await itself (no coroutine of its own):
        done once the verdict is in. A caller that awaits it calls :meth:`cancel` when cancelled, as
        :meth:`wait` does."""
        return self._done

    async def wait(self) -> Verdict:
        """The verdict, as soon as it is certain."""
        if not self._done.done():
            try:
                await self._done
            except asyncio.CancelledError:
                self.cancel()
                raise
        return self.verdict

    def outcomes(self) -> tuple[NodeOutcome, ...]:
        """Per-node outcomes for errors and logs."""
        details = self.details or [""] * len(self.nodes)
        return tuple(
            NodeOutcome(node.name, vote, detail)
            for node, vote, detail in zip(self.nodes, self.votes, details, strict=True)
        )

    def voted(self, *votes: Vote) -> list[int]:
        """Indices of the nodes whose vote is one of *votes*."""
        if votes == (YES,):
            return sorted(self._said_yes)  # (kept as they were counted)
        found = []  # (no comprehension: naming *votes* in one made it a cell, on every call)
        for i, v in enumerate(self.votes):
            if v in votes:
                found.append(i)
        return found


def _rtos(nodes: Sequence[Node], indices: Sequence[int]) -> list[float]:
    """The retransmission timeouts of *nodes* named by *indices* (a loop, not a comprehension: one naming
    ``nodes`` made it a cell, on every ballot of a slow network)."""
    rtos = []
    for i in indices:
        rtos.append(nodes[i].load.rto)
    return rtos


def _deliver_to(ballot: Ballot, i: int, fut: asyncio.Future[Reply]) -> None:
    ballot.deliver(i, fut.result())
