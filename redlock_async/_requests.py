"""One request to every node: acquire (with its fence), extend, release, give back.

Each function sends on every node, counts the replies with a :class:`Ballot` and returns
what was decided. None of them touches a ``Lock``: the lock (``lock.py``) decides what a
result means for its lease. What is sent synchronously stays sent when the caller is
cancelled, so a release or a give-back queued here always reaches the nodes.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Sequence
from dataclasses import dataclass

from redlock_async import _algorithm, _clock
from redlock_async._algorithm import Verdict, Vote
from redlock_async._fanout import Ballot, vote_of_fenced, vote_of_script, vote_of_set
from redlock_async._node import Failure, Node, Reply
from redlock_async._scripts import ACQUIRE_FENCED, EXTEND, FENCE, RELEASE
from redlock_async._settings import Settings

TOKEN_BYTES = 20
"""Random bytes in each acquisition's token (the Redlock spec asks for 20)."""


@dataclass(slots=True)  # not frozen: a frozen dataclass pays object.__setattr__ per field, per attempt
class Attempt:
    """One acquire round: its votes, and the lease when a majority granted a valid one."""

    token: bytes
    started: float
    """When the first SET went out: validity counts from here."""
    decided_at: float
    validity: float | None
    """Seconds the lease can be trusted from *decided_at*; None when not granted (and given back)."""
    votes: Sequence[Vote]
    details: Sequence[str] | None
    holders: list[int]
    """Nodes that said yes (of the fence round, for a fenced lock)."""
    skip: list[int]
    """Nodes the SET never went to: nothing there to release."""
    fencing_token: int | None


async def attempt(nodes: Sequence[Node], key: bytes, fence_key: bytes, settings: Settings) -> Attempt:
    """One round of SET NX PX (or the fenced acquire) on every node; a failed round is given back."""
    token = secrets.token_urlsafe(TOKEN_BYTES).encode()
    ttl_ms = _algorithm.ttl_to_ms(settings.ttl)
    started = _clock.now()
    if settings.fencing:
        keys = (key, fence_key)
        futures = [node.send_script(ACQUIRE_FENCED, keys, (token, ttl_ms), limited=True) for node in nodes]
        ballot = Ballot(nodes, futures, vote_of_fenced, settings.node_timeout)
    else:
        futures = [node.send(b"SET", key, token, b"NX", b"PX", ttl_ms, limited=True) for node in nodes]
        ballot = Ballot(nodes, futures, vote_of_set, settings.node_timeout)
    fencing_token: int | None = None
    try:
        await ballot.wait()
        if settings.fencing and ballot.verdict is Verdict.WON:
            fencing_token, ballot = await _fence(nodes, key, fence_key, token, futures, ballot, settings.node_timeout)
    except BaseException:
        # Cancelled mid-vote: the SETs are out and may succeed; hand back
        # every one of them before the cancellation goes on (queued, no await).
        send_release(nodes, key, token, skip=never_sent(futures))
        raise
    validity = _algorithm.granted(
        len(nodes), ballot.votes, ttl_ms / 1000, started, ballot.decided_at, settings.drift_factor
    )
    if validity is None:
        # Failed: release everywhere the SET may have run (a lost reply
        # still set the key), and wait for the nodes known or likely to hold it.
        releases = send_release(nodes, key, token, skip=never_sent(futures))
        holders = ballot.voted(Vote.YES, Vote.PENDING)
        if holders:
            await Ballot(
                nodes, releases, vote_of_script, settings.node_timeout, majority=False, wait_for=holders
            ).wait()
    return Attempt(
        token=token,
        started=started,
        decided_at=ballot.decided_at,
        validity=validity,
        votes=ballot.votes,
        details=ballot.details,
        holders=ballot.voted(Vote.YES),
        skip=never_sent(futures),
        fencing_token=fencing_token if validity is not None else None,
    )


async def _fence(
    nodes: Sequence[Node],
    key: bytes,
    fence_key: bytes,
    token: bytes,
    granted: Sequence[asyncio.Future[Reply]],
    ballot: Ballot,
    node_timeout: float,
) -> tuple[int, Ballot]:
    """Choose the fencing token and make a majority hold it; the returned ballot decides the grant.

    The token is one more than the largest counter among the nodes that
    granted. It counts only once a majority raised their counter to it
    while still holding our key: every later grant needs a majority too,
    so it meets one of those nodes, after our key there is gone, and reads
    a counter at least this high. (Taking the largest counter alone is not
    enough: see docs/fencing.md for the sequence that breaks it.)
    """
    counters = [fut.result() for fut, vote in zip(granted, ballot.votes, strict=True) if vote is Vote.YES]
    fencing_token = max(counters) + 1
    futures = [node.send_script(FENCE, (key, fence_key), (token, fencing_token), limited=True) for node in nodes]
    fenced = Ballot(nodes, futures, vote_of_script, node_timeout)
    await fenced.wait()
    return fencing_token, fenced


def send_extend(nodes: Sequence[Node], key: bytes, token: bytes, ttl_ms: int, timeout: float) -> Ballot:
    """Compare-and-PEXPIRE on every node; ``await ballot.wait()`` for the votes."""
    futures = [node.send_script(EXTEND, (key,), (token, ttl_ms), limited=True) for node in nodes]
    return Ballot(nodes, futures, vote_of_script, timeout)


def send_release(nodes: Sequence[Node], key: bytes, token: bytes, skip: Sequence[int]) -> list[asyncio.Future[Reply]]:
    """Queue compare-and-delete on every node but *skip* (synchronous: survives cancellation)."""
    futures: list[asyncio.Future[Reply]] = []
    for i, node in enumerate(nodes):
        if i in skip:
            futures.append(_resolved(Failure(Vote.SKIPPED, "never sent")))
        else:
            futures.append(node.send_script(RELEASE, (key,), (token,)))
    return futures


def never_sent(futures: Sequence[asyncio.Future[Reply]]) -> list[int]:
    """Nodes whose request was refused before it was sent: nothing there to release."""
    return [
        i
        for i, fut in enumerate(futures)
        if fut.done() and isinstance(fut.result(), Failure) and fut.result().vote is Vote.SKIPPED
    ]


def _resolved(value: Reply) -> asyncio.Future[Reply]:
    fut: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
    fut.set_result(value)
    return fut
