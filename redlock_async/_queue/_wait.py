"""One acquire's wait in the grant queue: a claim per name (lock_many: several), all held or none.

A lock of one name waits with one :class:`_queue.Claim`; a lock of several names (``lock_many``) waits
in every name's line at once, with one token and one score for all of them, so that it has the same
place in each line on every node. It holds once a majority of the nodes hold *every* name for its
token (the nodes that count for the lease, as ACQUIRE_ALL's all-or-none per node: its extension and
release ask each node about every key at once).

**Splits.** A claim that holds some nodes but no majority for a grace of a few round trips gives them
back and stays in line (``QUEUE_STAY``): each node hands the key to its first waiter, which may be
itself. For several names, a name held (on any nodes) while the others are not is given back the same
way, after *hold_back* (at least the grace): holding it would keep it from a waiter ahead in that line.

**No deadlock, no starvation.** Every line orders its waiters by the score each chose once (its
wall-clock start, :func:`_queue.new_score`). The waiter W with the lowest score among those waiting
is first in every line it waits in. Another waiter that holds one of W's names either holds it as a
lease (it acquired all of its names: it releases, or its lease runs out) or was granted it while
waiting (a partial hold: given back within *hold_back*, and the node hands it to W, first in line).
So W gets every name on the nodes that answer, and then the next waiter in score order. Keys are
never held for a waiter that left: a leave (``QUEUE_LEAVE``; the acquire's ``finally``) hands on
whatever a node granted it meanwhile, and an entry not entered again expires.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from redlock_async._core import algorithm as _algorithm
from redlock_async._core import clock as _clock
from redlock_async._queue._claim import Claim
from redlock_async._rounds import sitting_out, timed_out


@dataclass(frozen=True, slots=True)
class Won:
    """A majority holds every name for the claims' token."""

    holders: list[int]
    """The nodes that hold every name (and count)."""
    at: float
    """When it was known (our clock)."""
    end: float
    """Until when a majority of *holders* hold every name for sure."""
    fencing_tokens: tuple[int, ...] | None
    """Each name's fencing token (fenced claims), in the claims' order."""
    slot: int | None = None
    """A permit claim: the slot a majority holds for us."""


def holding(claims: Sequence[Claim], now: float) -> list[int]:
    """The nodes that hold every claim's key for us at *now*, and count (a permit claim: one slot)."""
    held = claims[0].holding(now)
    for claim in claims[1:]:
        theirs = set(claim.holding(now))
        held = [i for i in held if i in theirs]
    return held


def until(claims: Sequence[Claim], holders: Sequence[int]) -> float:
    """Until when a majority of *holders* hold every key for us (-inf: no majority)."""
    ends = (min(claim.ends[i] for claim in claims) for i in holders)
    return _algorithm.majority_until(ends, len(claims[0].nodes))


def join(claims: Sequence[Claim]) -> None:
    """Join (or stay in) every name's line on every node (a try)."""
    for claim in claims:
        claim.poked = False
        claim.join()


def quit(claims: Sequence[Claim]) -> None:
    """Leave every line (synchronous: survives cancellation); whatever a node granted us goes on."""
    for claim in claims:
        claim.quit()


def votes(claims: Sequence[Claim], now: float, waited: float) -> tuple[list[_algorithm.Vote], list[str]]:
    """Each node's standing at *now* for every name: yes where every claim's is, else the first other
    (for ``Lock.outcomes`` and errors; *waited*: the try's patience, for a timeout's detail)."""
    votes, details = standing(claims[0], now, waited)
    for claim in claims[1:]:
        theirs, why = standing(claim, now, waited)
        for i, vote in enumerate(theirs):
            if votes[i] is _algorithm.YES and vote is not _algorithm.YES:
                votes[i], details[i] = vote, why[i]
    return votes, details


def standing(claim: Claim, now: float, waited: float) -> tuple[list[_algorithm.Vote], list[str]]:
    """Each node's standing at *now* for *claim*, as votes (with details): yes (holds the key for us, as
    :meth:`Claim.holding` counts), quarantined (holds it, but sits out), no (answered: not ours, or held
    but not counted), its failure's vote, or timeout (a script of ours still unanswered after *waited*
    seconds, the try's patience: its detail says which setting to change, as a fan-out's does)."""
    out = [sitting_out(node) for node in claim.nodes]  # read once: the holders and the votes agree
    holders = claim.line.holding([i for i, end in enumerate(claim.ends) if end > now and out[i] is None])
    votes, details = [], []
    for i, node in enumerate(claim.nodes):
        failed, detail = claim.failed[i], ""
        if failed is not None:
            vote, detail = failed.vote, failed.detail
        elif claim.busy[i]:
            vote, detail = _algorithm.Vote.TIMEOUT, timed_out(node, waited)
        elif claim.ends[i] > now:
            if (quarantined := out[i]) is not None:
                vote, detail = _algorithm.Vote.QUARANTINED, quarantined
            elif i in holders:
                vote = _algorithm.YES
            else:
                vote, detail = _algorithm.NO, claim.line.why_not(i, holders)
        else:
            vote = _algorithm.NO
        votes.append(vote)
        details.append(detail)
    return votes, details


async def settled(claims: Sequence[Claim], timeout: float) -> None:
    """Wait until every script of every claim was answered, at most *timeout* seconds."""
    ends = _clock.now() + timeout
    while any(claim.pending for claim in claims) and (left := ends - _clock.now()) > 0:
        await claims[0].bell.wait(left)


async def claimed(
    claims: Sequence[Claim], until_at: float, grace: float, hold_back: float, *, until_answered: bool
) -> Won | None:
    """Wait until a majority holds every name for us (fenced: and raised each name's counter to its token),
    or until *until_at* (or, with *until_answered*, every node answered, or a release word pokes a claim).
    Holds short of that are given back after the split *grace* (*hold_back* for a name held while another
    is not); the claims stay in line. The claims share one bell."""
    first = claims[0]
    need = _algorithm.quorum(len(first.nodes))
    several = len(claims) > 1
    for claim in claims:
        claim.eager = not until_answered  # in line, each grant may start the split grace
    while True:
        now = _clock.now()
        held = holding(claims, now)
        if len(held) >= need and (end := until(claims, held)) > now:
            if first.reads:  # a reader: the last writer's token, the largest counter its majority read
                return Won(held, now, end, (first.fencing.last(held),))
            if not first.fenced:
                return Won(held, now, end, None, first.line.slot(held))
            # Fenced: a majority must raise each name's counter to its token while the keys are ours first.
            chosen = [claim.fence(held) for claim in claims]
            deadline = now + grace
            for claim, token in zip(claims, chosen, strict=True):
                await claim.raised(token, max(deadline - _clock.now(), 0.0))
            now = _clock.now()
            held = holding(claims, now)
            for claim, token in zip(claims, chosen, strict=True):
                raised = set(claim.fenced_on(now, token))
                held = [i for i in held if i in raised]
            if len(held) >= need and (end := until(claims, held)) > now:
                return Won(held, now, end, tuple(chosen))
            if now >= until_at:
                return None
            continue  # not on a majority: the replies said where things stand; on in line
        pending = any(claim.pending for claim in claims)
        poked = any(claim.poked for claim in claims)
        if now >= until_at or (until_answered and not pending) or (not until_answered and poked):
            return None
        wake = until_at
        if not until_answered:
            split = _give_back_due(claims, held, now, grace, hold_back if several else grace)
            if split is not None and now >= split:
                for claim in claims:
                    claim.split(now)  # the nodes serve the first in line (a permit: keeps its likeliest slot)
                continue
            if split is not None:
                wake = min(wake, split)
        await first.bell.wait(wake - now)


def _give_back_due(
    claims: Sequence[Claim], held: Sequence[int], now: float, grace: float, hold_back: float
) -> float | None:
    """When what the claims hold short of a win is to be given back (None: they hold nothing)."""
    since = [claim.since[i] for claim in claims for i in claim.held(now)]
    if not since:
        return None
    # Nodes that hold every name (but no majority of them yet): a split of nodes, given back after the
    # grace. A name held while another is not: given back after hold_back.
    partial = len(held) == 0 or any(len(claim.held(now)) > len(held) for claim in claims)
    return min(since) + (hold_back if partial and len(claims) > 1 else grace)
