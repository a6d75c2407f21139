"""What ``async with lock`` raises when no majority granted the lock: contention, or nodes unavailable.

The line between the two is :func:`_algorithm.unavailable`: would the last attempt have been won
had the lock been free everywhere? If not, the nodes that could not vote (unreachable, failing,
in restart quarantine) are the cause, and the error is :class:`NodesUnavailable`, whatever the
others said; otherwise it is contention, a plain :class:`LockNotAcquired`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from redlock_async._core import Vote
from redlock_async._core import algorithm as _algorithm
from redlock_async._core import clock as _clock
from redlock_async._nodes import Node
from redlock_async._rounds._fanout import outcomes
from redlock_async.errors import LockNotAcquired, NodesUnavailable


def not_acquired(
    name: str,
    shown: str,
    timeout: float,
    nodes: Sequence[Node],
    votes: Sequence[Vote],
    details: Sequence[str] | None,
) -> LockNotAcquired:
    """The error for lock *shown* (its repr), not acquired within *timeout* s; *votes* of the last attempt."""
    head = f"could not acquire lock {shown} within {timeout:g} s"
    found = outcomes(nodes, votes, details) if votes else ()
    if not votes or not _algorithm.unavailable(votes):
        return LockNotAcquired(head, name=name, outcomes=found)
    n, need = len(votes), _algorithm.quorum(len(votes))
    answered = sum(vote in (Vote.YES, Vote.NO, Vote.QUARANTINED) for vote in votes)
    failed = sum(vote in (Vote.ERROR, Vote.TIMEOUT, Vote.SKIPPED) for vote in votes)
    could_not = f", {failed} could not" if failed else ""  # (the rest were not needed for the decision)
    text = f"{head}: nodes unavailable: {answered} of {n} nodes answered{could_not} (a majority is {need})"
    quarantined = [i for i, vote in enumerate(votes) if vote is Vote.QUARANTINED]
    retry_after = _back_in(nodes, votes, quarantined)
    if quarantined:
        text += f", {len(quarantined)} of them in restart quarantine"
        if retry_after is not None:
            text += f": a majority can vote again in {retry_after:.1f} s"
    held = sum(vote is Vote.NO for vote in votes)
    if held:
        text += f"; {held} found it held"
    return NodesUnavailable(text, name=name, outcomes=found, retry_after=retry_after)


def reason(votes: Sequence[Vote], blocking: bool) -> str:
    """The ``not_acquired`` event's reason: the same line between busy and unavailable as the error."""
    if votes and _algorithm.unavailable(votes):
        return "nodes unavailable: too few nodes could vote"
    return "no majority within the timeout" if blocking else "no majority (blocking=False)"


def _back_in(nodes: Sequence[Node], votes: Sequence[Vote], quarantined: list[int]) -> float | None:
    """Seconds until enough *quarantined* nodes count again for a majority to vote, when the others
    that could not vote leave room for one; None when they do not (or a node's check is unanswered)."""
    if not quarantined:
        return None
    free = [Vote.YES if vote is Vote.QUARANTINED else vote for vote in votes]
    if _algorithm.unavailable(free):
        return None  # unreachable nodes alone stand in the way: no one can say when they come back
    # The fewest quarantined nodes that must come back: every vote that could not be cast, beyond the
    # n - quorum a majority can do without.
    short = sum(vote in _algorithm.CANNOT_VOTE for vote in votes) - (len(votes) - _algorithm.quorum(len(votes)))
    now = _clock.now()
    left = sorted(nodes[i].quarantined_until - now for i in quarantined)[short - 1]
    return None if math.isinf(left) else max(0.0, left)
