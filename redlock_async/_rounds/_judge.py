"""The one judge of an extension round: what follows its votes, for an explicit ``extend()`` and the
watchdog alike (the lease's life is :mod:`._lease`'s)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from redlock_async._core import YES, Settings, Vote
from redlock_async._core import algorithm as _algorithm
from redlock_async._rounds._lease import Lease


class Judged(NamedTuple):
    """What follows one extension round (:func:`after_extension`)."""

    verdict: _algorithm.Extension
    margin: float = 0.0
    """CONFIRMED: the validity that was left at the decision."""
    validity: float = 0.0
    """CONFIRMED: the new validity, from the decision."""
    retry_in: float = 0.0
    """RETRY: seconds before the next try."""
    why: str = ""
    """REFUSED or EXPIRED: why the lock is lost, in words after ``lock NAME``."""


GONE = "is gone from a majority of nodes (expired or taken)"
RAN_OUT = "could not be extended on a majority before it ran out"


def after_extension(
    lease: Lease,
    settings: Settings,
    ttl_ms: int,
    votes: Sequence[Vote],
    started: float,
    decided_at: float,
    now: float,
) -> Judged:
    """The one decision of what follows an extension round to *ttl_ms* sent at *started*, decided at
    *decided_at* with *votes*, for an explicit ``extend()`` and the watchdog alike.

    CONFIRMED: the lease now runs to its new validity and is held by the nodes that said yes (done
    here). RETRY: neither confirmed nor refused (timeouts, errors) and validity is left: try again in
    ``retry_in`` s. REFUSED (the key is gone from a majority) and EXPIRED (no majority before the
    validity ran out): the lock is lost, ``why`` says why.
    """
    verdict, validity = _algorithm.judge_extension(
        votes, ttl_ms / 1000, started, decided_at, settings.drift_factor, deadline=lease.expires, now=now
    )
    if validity is not None:
        margin = lease.expires - decided_at
        lease.expires = decided_at + validity
        lease.holders = [i for i, vote in enumerate(votes) if vote is YES]
        return Judged(verdict, margin=margin, validity=validity)
    if verdict is _algorithm.Extension.RETRY:
        return Judged(
            verdict, retry_in=_algorithm.extend_retry_delay(settings.ttl, settings.node_timeout, lease.expires - now)
        )
    return Judged(verdict, why=GONE if verdict is _algorithm.Extension.REFUSED else RAN_OUT)
