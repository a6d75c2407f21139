"""One request to every node: acquire (with its fence), extend, release, give back.

Each function sends on every node, counts the replies with a :class:`Ballot` and returns
what was decided. None of them touches a ``Lock``: the lock (``lock.py``) decides what a
result means for its lease. What is sent synchronously stays sent when the caller is
cancelled, so a release or a give-back queued here always reaches the nodes.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

from redlock_async._core import PENDING, SKIPPED, WON, YES, Settings, Vote
from redlock_async._core import algorithm as _algorithm
from redlock_async._core import clock as _clock
from redlock_async._health import floored
from redlock_async._nodes import IGNORED, Failure, Node, Receiver, Reply, pack, pack_script
from redlock_async._rounds._fanout import Ballot, vote_of_counters, vote_of_fenced, vote_of_script, vote_of_set
from redlock_async._rounds._lease import Keep, Late, Lease
from redlock_async._rounds._tokens import new_token as new_token  # (requests.new_token, as before)
from redlock_async._rounds._tokens import owner_of as owner_of
from redlock_async._scripts import (
    ACQUIRE_ALL,
    ACQUIRE_ALL_FENCED,
    ACQUIRE_FENCED,
    ACQUIRE_PERMIT,
    EXTEND,
    EXTEND_MANY,
    FENCE,
    FENCE_ALL,
    FENCED_BY,
    HANDED_RELEASE,
    KEEP_LIMIT,
    RELEASE,
    RELEASE_ALL,
    Script,
)


@dataclass(slots=True)  # not frozen: a frozen dataclass pays object.__setattr__ per field, per attempt
class Attempt:
    """One acquire round: its votes, and the lease when a majority granted a valid one."""

    token: bytes
    keys: tuple[bytes, ...]
    """The keys this round asked for (a permit's: the slot it tried)."""
    started: float
    """When the first SET went out: validity counts from here."""
    decided_at: float
    validity: float | None
    """Seconds the lease can be trusted from *decided_at*; None when not granted (and given back)."""
    votes: Sequence[Vote]
    details: Sequence[str] | None
    holders: list[int]
    """Nodes that said yes (of the fence round, for a fenced lock)."""
    skip: Sequence[int]
    """Nodes the SET never went to: nothing there to release."""
    fencing_tokens: tuple[int, ...] | None
    """Per key, for a fenced grant."""
    codes: list[int]
    """The negative answers of nodes that said no: lock_many's -i (key i, from 1, is held), a
    permit's -L (a slot is held under limit L)."""
    free: dict[int, int] | None = None
    """A permit's round that was not granted: slot -> how many nodes said it is free there."""
    keeps: Keep | None = None
    """A permit's (its semaphore's widest-limit key): what every extension keeps alive beside its key
    (:func:`send_keep`); a reader's: its extension itself (``Keep.instead``)."""
    late: Late | None = None
    """The votes and replies of the request that decided it (the fence round, for a fenced grant):
    its lease's first extension reads them (``Lease.late``)."""
    takes: bool = True
    """False: its lease's extensions never take a free node (``Lease.takes``)."""


GiveBack: TypeAlias = "Callable[[Sequence[int], Ballot | None], None]"
"""How a failed or cancelled round is given back (queued, synchronous): called with the nodes to skip and the
ballot its replies go to (None: nowhere). The default: compare-and-delete of the round's keys."""


@dataclass(slots=True)
class Sent:
    """An acquire round whose requests are out, not yet decided (see :func:`send_attempt`)."""

    token: bytes
    started: float
    ballot: Ballot
    announce: tuple[bytes, bytes] | None = None
    """(channel, word) of the release that handed this round over, which told no one: said on every
    node if the round is lost or given back, so that the waiters elsewhere hear the key is free."""


def send_attempt(
    nodes: Sequence[Node],
    keys: tuple[bytes, ...],
    fence_keys: tuple[bytes, ...],
    settings: Settings,
    owner: bytes,
    clock: Receiver | None = None,
) -> Sent:
    """Queue one round of SET NX PX (or a script taking every key, fenced or not) on every node, now
    (synchronous); :func:`decide` counts it. *clock*: the clock guard's reading, whose ``TIME`` goes
    right before each node's vote."""
    token = new_token(owner)
    ttl_ms = settings.ttl_ms
    # With fence_ttl, a counter read is at least the node's clock in microseconds (counters expire); so too
    # where a node can evict one (_evictions.floored: a token never repeats after a counter was evicted).
    floor = settings.fence_ttl_ms is not None or (settings.fencing and floored(nodes))
    args: tuple[bytes | int, ...] = (token, ttl_ms, b"floor") if floor else (token, ttl_ms)
    if len(keys) == 1:
        if settings.fencing:
            ballot = Ballot(nodes, vote_of_fenced, settings.node_timeout)
            started = _clock.now()
            ballot.script(ACQUIRE_FENCED, (keys[0], fence_keys[0]), args, limited=True, clock=clock)
        else:
            ballot = Ballot(nodes, vote_of_set, settings.node_timeout)
            started = _clock.now()
            ballot.send(pack((b"SET", keys[0], token, b"NX", b"PX", ttl_ms)), limited=True, clock=clock)
    elif settings.fencing:
        ballot = Ballot(nodes, vote_of_counters, settings.node_timeout)
        started = _clock.now()
        ballot.script(ACQUIRE_ALL_FENCED, keys + fence_keys, args, limited=True, clock=clock)
    else:
        ballot = Ballot(nodes, vote_of_script, settings.node_timeout)
        started = _clock.now()
        ballot.script(ACQUIRE_ALL, keys, (token, ttl_ms), limited=True, clock=clock)
    return Sent(token, started, ballot.start())


def decide(
    nodes: Sequence[Node], keys: tuple[bytes, ...], fence_keys: tuple[bytes, ...], settings: Settings, sent: Sent
) -> Coroutine[Any, Any, Attempt]:
    """Count a round of :func:`send_attempt` (and fence a won one); a failed or cancelled round is given back.

    Not a coroutine itself: it returns the one that counts (nearly always :func:`_decide`'s, awaited
    directly: one coroutine less in the chain each of the round's wake-ups runs through)."""
    fenced = fence_keys if settings.fencing else None
    if sent.announce is None:
        return _decide(nodes, keys, fenced, sent.token, sent.started, sent.ballot, settings, None)
    return _decide_announced(nodes, keys, fenced, sent, settings)


async def _decide_announced(
    nodes: Sequence[Node], keys: tuple[bytes, ...], fenced: tuple[bytes, ...] | None, sent: Sent, settings: Settings
) -> Attempt:
    """:func:`decide` of a round that a release handed over, which told no one: said if the round fails."""
    assert sent.announce is not None
    try:
        result = await _decide(nodes, keys, fenced, sent.token, sent.started, sent.ballot, settings, None)
    except BaseException:
        _announce(nodes, sent.announce)  # given back (cancelled): the release it followed is said now
        raise
    if result.validity is None:
        _announce(nodes, sent.announce)
    return result


def give_back(nodes: Sequence[Node], keys: tuple[bytes, ...], sent: Sent) -> None:
    """Release a round of :func:`send_attempt` that will never be counted (queued: no await)."""
    sent.ballot.cancel()
    send_release(nodes, keys, sent.token, skip=sent.ballot.never_sent())
    if sent.announce is not None:
        _announce(nodes, sent.announce)


def _announce(nodes: Sequence[Node], announce: tuple[bytes, bytes]) -> None:
    """Publish a release's word on every node (queued after the give-back: the key is free by then)."""
    packed = pack((b"PUBLISH", *announce))
    for i, node in enumerate(nodes):
        node.send_packed(IGNORED, i, packed)


async def attempt(
    nodes: Sequence[Node], keys: tuple[bytes, ...], fence_keys: tuple[bytes, ...], settings: Settings, owner: bytes
) -> Attempt:
    """One round of SET NX PX (or a script taking every key, fenced or not) on every node; a failed
    round is given back."""
    return await decide(nodes, keys, fence_keys, settings, send_attempt(nodes, keys, fence_keys, settings, owner))


async def attempt_permit(
    nodes: Sequence[Node],
    slots: tuple[bytes, ...],
    slot: int,
    widest: bytes,
    limit: int,
    channel: bytes,
    settings: Settings,
    owner: bytes,
    clock: Receiver | None = None,
) -> Attempt:
    """One round for permit slot *slot* of a semaphore (ACQUIRE_PERMIT, every slot of *slots* named: at least
    the limit of them), given back when not granted."""
    token = b"%d:" % limit + new_token(owner)
    ttl_ms = settings.ttl_ms
    ballot = Ballot(nodes, vote_of_script, settings.node_timeout)
    started = _clock.now()
    ballot.script(ACQUIRE_PERMIT, (widest, *slots), (token, ttl_ms, limit, slot), limited=True, clock=clock)
    result = await _decide(nodes, (slots[slot],), None, token, started, ballot, settings, channel)
    result.keeps = Keep(KEEP_LIMIT, widest)
    if result.validity is None:
        free: dict[int, int] = {}
        for reply in ballot.replies:
            if isinstance(reply, list):
                for other in reply:
                    free[other] = free.get(other, 0) + 1
        result.free = free
    return result


async def count(
    nodes: Sequence[Node],
    keys: tuple[bytes, ...],
    fence_keys: tuple[bytes, ...] | None,
    token: bytes,
    started: float,
    sent: Ballot,
    settings: Settings,
    channel: bytes | None = None,
    give_back: GiveBack | None = None,
) -> Attempt:
    """Count an acquire round that another module's script sent (*sent*, not started: its replies answer
    as ``ACQUIRE_FENCED``'s do), fence a won one on *fence_keys* (None: no fence round), and give a
    failed or cancelled one back (compare-and-delete of *keys*, told on *channel*; or *give_back*, called
    with the nodes to skip and the ballot its replies go to), as every acquire's."""
    return await _decide(nodes, keys, fence_keys, token, started, sent, settings, channel, give_back)


async def _decide(
    nodes: Sequence[Node],
    keys: tuple[bytes, ...],
    fence_keys: tuple[bytes, ...] | None,
    token: bytes,
    started: float,
    sent: Ballot,
    settings: Settings,
    channel: bytes | None,
    give_back: GiveBack | None = None,
) -> Attempt:
    """Count the round's votes (and fence a won one); give a failed or cancelled round back.

    No closure for the default give-back (``send_release``): its cells and function were made on every
    round and lived across the await, which under 64 tasks ran the garbage collector ~3 times as often.
    """
    ballot = sent.start()
    fencing_tokens: tuple[int, ...] | None = None
    try:
        await ballot.decided()  # (ballot.wait(), without its coroutine: its cancel is below)
        if fence_keys is not None and ballot.verdict is WON:
            fencing_tokens, ballot = await _fence(nodes, keys, fence_keys, token, sent, settings)
    except BaseException:
        sent.cancel()  # the round's timer, as ballot.wait() stops it when cancelled
        # Cancelled mid-vote: the SETs are out and may succeed; hand back
        # every one of them before the cancellation goes on (queued, no await).
        if give_back is None:
            send_release(nodes, keys, token, skip=sent.never_sent(), channel=channel)
        else:
            give_back(sent.never_sent(), None)
        raise
    validity = _algorithm.granted(
        len(nodes), ballot.votes, settings.ttl_ms / 1000, started, ballot.decided_at,
        settings.drift_factor,
    )  # fmt: skip
    skip = sent.never_sent()
    if validity is None:
        # Failed: release everywhere the SET may have run (a lost reply
        # still set the key), and wait for the nodes known or likely to hold it.
        holders = ballot.voted(YES, PENDING, Vote.QUARANTINED)  # a quarantined yes set the key there too
        releases = (
            Ballot(nodes, vote_of_script, settings.node_timeout, majority=False, wait_for=holders) if holders else None
        )
        if give_back is None:
            send_release(nodes, keys, token, skip=skip, channel=channel, into=releases)
        else:
            give_back(skip, releases)
        if releases is not None:
            await releases.start().wait()
        codes = [
            reply for reply in sent.replies if isinstance(reply, int) and not isinstance(reply, bool) and reply < 0
        ]
    else:
        codes = []
    return Attempt(  # (by position, in the fields' order: once per round)
        token,
        keys,
        started,
        ballot.decided_at,
        validity,
        ballot.votes,
        ballot.details,
        ballot.voted(YES),
        skip,
        fencing_tokens if validity is not None else None,
        codes,
        None,  # free
        None,  # keeps
        (ballot.votes, ballot.replies, ballot.classify),  # late: answers(ballot), inlined
    )


async def _fence(
    nodes: Sequence[Node],
    keys: tuple[bytes, ...],
    fence_keys: tuple[bytes, ...],
    token: bytes,
    granted: Ballot,
    settings: Settings,
) -> tuple[tuple[int, ...], Ballot]:
    """Choose each key's fencing token and make a majority hold them; the returned ballot decides the grant.

    A key's token is one more than the largest counter among the nodes that
    granted. It counts only once a majority raised their counter to it
    while still holding our key: every later grant needs a majority too,
    so it meets one of those nodes, after our key there is gone, and reads
    a counter at least this high. (Taking the largest counter alone is not
    enough: see docs/fencing.md for the sequence that breaks it.)
    """
    answers = [reply for reply, vote in zip(granted.replies, granted.votes, strict=True) if vote is YES]
    fenced = Ballot(nodes, vote_of_script, settings.node_timeout)
    expiry: tuple[int, ...] = () if settings.fence_ttl_ms is None else (settings.fence_ttl_ms,)  # fence_ttl
    if len(keys) == 1:
        chosen: tuple[int, ...] = (max(answers) + 1,)
        fencer = fence_keys[0] + FENCED_BY
        fenced.script(FENCE, (keys[0], fence_keys[0], fencer), (token, chosen[0], *expiry), limited=True)
    else:
        chosen = tuple(max(counters[i] for counters in answers) + 1 for i in range(len(keys)))
        fencers = tuple(fence_key + FENCED_BY for fence_key in fence_keys)
        fenced.script(FENCE_ALL, keys + fence_keys + fencers, (token, *chosen, *expiry), limited=True)
    await fenced.start().wait()
    return chosen, fenced


def pack_extend(
    leases: Sequence[Lease], n: int, ttl_ms: int | None = None
) -> tuple[list[bytes], tuple[Script, tuple[bytes, ...], tuple[bytes | int, ...]]]:
    """One EXTEND_MANY of *leases* (each with its own ``ttl_ms``, or *ttl_ms* for all), packed for each
    of the *n* nodes, and its fallback (the EVAL sent again if a node lost the script).

    A lease takes the nodes of ``Lease.to_take`` where its keys are free, never its ``holders`` (the
    nodes whose yes its validity counts on: a missing key there was lost, not freed; see
    docs/algorithm.md, "Regaining the free nodes"). So the command differs per node only while
    some lease has nodes to regain; the same bytes go to every node otherwise. The fallback takes
    nothing (``EXTEND_MANY``).
    """
    keys: list[bytes] = []
    args: list[bytes | int] = []
    takes: list[tuple[int, bytes | int, list[int]]] | None = None  # (where its spec is, the spec taking, nodes)
    for lease in leases:
        token = lease.token
        assert token is not None
        ttl = lease.ttl_ms if ttl_ms is None else ttl_ms
        at = len(args) + 2
        lease_keys = lease.keys
        fence_keys = lease.fence_keys
        taking: bytes | int
        if len(lease_keys) == 1 and not fence_keys:  # most leases: "0" extends, "1" also takes
            keys.append(lease_keys[0])
            args += (token, ttl, 0)
            taking = 1
        elif fence_keys and lease.fencing_tokens is not None:
            count = -len(lease_keys)
            keys += lease_keys
            keys += fence_keys
            keys += (fence_key + FENCED_BY for fence_key in fence_keys)
            args += (token, ttl, b"0:%d" % count)
            args += lease.fencing_tokens
            args.append(b"" if lease.fence_ttl_ms is None else lease.fence_ttl_ms)
            taking = b"1:%d" % count
        else:
            keys += lease_keys
            args += (token, ttl, b"0:%d" % len(lease_keys))
            taking = b"1:%d" % len(lease_keys)
        if lease.regain or lease.late is not None:
            regain = lease.to_take()
            if regain:
                if takes is None:
                    takes = []
                takes.append((at, taking, regain))
    names, plain = tuple(keys), tuple(args)
    fallback = (EXTEND_MANY, names, plain)
    if takes is None:
        return [pack_script(EXTEND_MANY, names, plain)] * n, fallback
    packed = []
    for i in range(n):
        mine = args.copy()
        for at, taking, regain in takes:
            if i in regain:
                mine[at] = taking
        packed.append(pack_script(EXTEND_MANY, names, tuple(mine)))
    return packed, fallback


def pack_own(
    lease: Lease, n: int, ttl_ms: int | None = None
) -> tuple[list[bytes], tuple[Script, tuple[bytes, ...], tuple[bytes | int, ...]]]:
    """The extension of a lease extended by a script of its own (``Keep.instead``: a reader's), packed for
    each of the *n* nodes, and its fallback; it answers as EXTEND_MANY for one lease, and takes no node."""
    keep, token = lease.keeps, lease.token
    assert keep is not None
    assert token is not None
    names, args = (keep.key,), (token, lease.ttl_ms if ttl_ms is None else ttl_ms)
    return [pack_script(keep.script, names, args)] * n, (keep.script, names, args)


def answers(ballot: Ballot) -> Late:
    """A decided *ballot*'s votes and replies, for the lease's next extension (``Lease.late``)."""
    return ballot.votes, ballot.replies, ballot.classify


def vote_of_extend(reply: Reply) -> Vote:
    """EXTEND_MANY of one lease answers [1] when the node holds every key for it now, [0] when not."""
    if isinstance(reply, Failure):
        return reply.vote
    return YES if reply == [1] else Vote.NO


def send_extend(
    nodes: Sequence[Node], lease: Lease, ttl_ms: int, timeout: float, clock: Receiver | None = None
) -> Ballot:
    """Extend *lease* to *ttl_ms* on every node, taking those of ``Lease.to_take`` where its keys are
    free (all keys or none); ``await ballot.wait()`` for the votes. One unfenced key: EXTEND (the
    cheapest script); otherwise EXTEND_MANY of this one lease. *clock*: the clock guard's reading,
    whose ``TIME`` goes right before each node's vote."""
    keys = lease.keys
    if lease.keeps is not None and lease.keeps.instead:  # a lease extended by a script of its own
        packed, fallback = pack_own(lease, len(nodes), ttl_ms)
        ballot = Ballot(nodes, vote_of_extend, timeout)
    elif len(keys) > 1 or lease.fence_keys:
        packed, fallback = pack_extend((lease,), len(nodes), ttl_ms)
        ballot = Ballot(nodes, vote_of_extend, timeout)
    else:
        token = lease.token
        assert token is not None
        args: tuple[bytes | int, ...] = (token, ttl_ms, 0)
        extend = pack_script(EXTEND, keys, args)
        take = lease.to_take() if lease.regain or lease.late is not None else None
        taking = pack_script(EXTEND, keys, (token, ttl_ms, 1)) if take else extend
        packed = [taking if take and i in take else extend for i in range(len(nodes))]
        fallback = (EXTEND, keys, args)
        ballot = Ballot(nodes, vote_of_script, timeout)
    for i, node in enumerate(nodes):
        if clock is None:
            node.send_packed(ballot, i, packed[i], limited=True, fallback=fallback)
        else:
            node.send_timed(clock, ballot, i, packed[i], limited=True, fallback=fallback)
    return ballot.start()


def send_keep(nodes: Sequence[Node], key: bytes, keep: Keep, token: bytes, margin_ms: int) -> None:
    """Queue *keep*'s script on every node, right behind an extension of the lease of *key* (synchronous; no
    one awaits the replies): its kept key (a semaphore's widest-limit key) lives
    *margin_ms* longer than *key* where *key* holds *token*. Nothing for a lease extended by *keep* itself."""
    if keep.instead:
        return
    args: tuple[bytes | int, ...] = (token, margin_ms)
    keys = (key, keep.key)
    packed = pack_script(keep.script, keys, args)
    for i, node in enumerate(nodes):
        node.send_packed(IGNORED, i, packed, limited=True, fallback=(keep.script, keys, args))


def send_release(
    nodes: Sequence[Node],
    keys: tuple[bytes, ...],
    token: bytes,
    skip: Sequence[int],
    *,
    channel: bytes | None = None,
    into: Ballot | None = None,
    handed: bool = False,
) -> None:
    """Queue compare-and-delete on every node but *skip* (synchronous: survives cancellation).

    The replies go to *into* (a ballot not started yet), or nowhere. The waiters are
    told on each key's channel, or on *channel* (a semaphore's permits share one);
    *handed*: no one is told (a hand-over: the next holder's round follows).
    """
    names: tuple[bytes, ...]
    if handed:
        assert len(keys) == 1, "a hand-over releases one lock key"
        script, names = HANDED_RELEASE, keys
    elif len(keys) == 1:
        script, names = RELEASE, (keys if channel is None else (keys[0], channel))
    else:
        script, names = RELEASE_ALL, keys
    args = (token,)
    packed, fallback = pack_script(script, names, args), (script, names, args)
    receiver: Receiver = IGNORED if into is None else into
    # A hand-over's release is a bare compare-and-delete: on a server that has it natively (Valkey 9's
    # DELIFEQ, the same 1 or 0), that, at well under half the node's CPU of the script (benchmarks/
    # bench_server_cpu.py --scripts). The other releases publish their word only when they deleted: scripts.
    native = pack((b"DELIFEQ", keys[0], token)) if handed else None
    for i, node in enumerate(nodes):
        if i in skip:
            receiver.deliver(i, Failure(SKIPPED, "never sent"))
        elif native is not None and node.delifeq:
            node.send_packed(receiver, i, native)
        else:
            node.send_packed(receiver, i, packed, fallback=fallback)
