"""The Redlock decisions, as pure functions.

No I/O, no clock: times and per-node votes go in, decisions come out. The
I/O shell (``_fanout.py``, ``lock.py``) reads a monotonic clock and feeds
these functions; acquire and extend share every formula here.

Timeline of one attempt (acquire or extend)::

    started ──send to all N──► votes arrive ──► decided ──► validity ends
              |<──── elapsed ────────────────►|
              |<──────────────── ttl_ms / 1000 ─────────────────►|
                                               drift is taken off the end

    validity = ttl - (decided - started) - (ttl * drift_factor + CLOCK_PRECISION)
"""

from __future__ import annotations

import enum
import functools
import math
from collections.abc import Iterable, Sequence

CLOCK_PRECISION = 0.002
"""Seconds added to the drift for the precision of key expiry (the Redlock spec's 2 ms)."""


class Vote(enum.Enum):
    """What one node said to one request."""

    YES = "yes"
    """The node did what was asked (key set, extended or deleted)."""
    NO = "no"
    """The node answered and refused: the key is held by another value, or gone."""
    ERROR = "error"
    """The node answered with an error, or the connection failed."""
    TIMEOUT = "timeout"
    """No answer within the per-node timeout."""
    SKIPPED = "skipped"
    """The request was not sent (the node's queue was full, or it is reconnecting)."""
    PENDING = "pending"
    """The decision was taken before this node answered."""
    QUARANTINED = "quarantined"
    """The node said yes, but it restarted or lost its data recently: it sits
    out every quorum until its restart quarantine ends (see :func:`sit_out`)."""

    @property
    def failed(self) -> bool:
        """True for every vote that counts against the quorum once it is in."""
        return self is not Vote.YES and self is not Vote.PENDING


class Verdict(enum.Enum):
    """The state of a ballot over N nodes."""

    UNDECIDED = "undecided"
    WON = "won"
    LOST = "lost"


# The members the hot path compares with, as module globals. On Python 3.11 reading a member off
# its class (``Vote.YES``) goes through the hook of EnumType.__getattr__: ~900 machine instructions
# each time (callgrind), against ~10 for a global; an acquire+release read ~50 of them in the
# ballots and here. (3.12 dropped that hook; the globals cost nothing there either.)
YES, NO, PENDING, SKIPPED, ERROR = Vote.YES, Vote.NO, Vote.PENDING, Vote.SKIPPED, Vote.ERROR
UNDECIDED, WON, LOST = Verdict.UNDECIDED, Verdict.WON, Verdict.LOST


def quorum(n_nodes: int) -> int:
    """Smallest strict majority: 3 of 5, 2 of 3, 1 of 1."""
    if n_nodes < 1:
        raise ValueError(f"a quorum needs at least one node, got {n_nodes}")
    return n_nodes // 2 + 1


@functools.cache  # (every ballot asks, always for the same few sizes)
def thresholds(n_nodes: int) -> tuple[int, int]:
    """(yes votes that win, failed votes that lose) among *n_nodes*: :func:`verdict` as two counts."""
    need = quorum(n_nodes)
    return need, n_nodes - need + 1


def verdict(n_nodes: int, yes: int, failed: int) -> Verdict:
    """Decide as soon as the outcome is certain.

    WON once a majority said yes; LOST once so many failed that a majority
    can no longer be reached (even if every node still out says yes);
    UNDECIDED otherwise.
    """
    if yes < 0 or failed < 0 or yes + failed > n_nodes:
        raise ValueError(f"impossible tally: {yes} yes + {failed} failed of {n_nodes} nodes")
    win, lose = thresholds(n_nodes)
    if yes >= win:
        return WON
    if failed >= lose:
        return LOST
    return UNDECIDED


def tally(n_nodes: int, votes: Iterable[Vote]) -> Verdict:
    """The verdict over the votes that are in (PENDING votes are not in yet)."""
    if type(votes) is list:  # (a ballot's, once per round: counted in C, by identity as below)
        yes = votes.count(YES)
        return verdict(n_nodes, yes, len(votes) - yes - votes.count(PENDING))
    yes = failed = 0
    for vote in votes:
        if vote is YES:
            yes += 1
        elif vote is not PENDING:  # Vote.failed, without the property's call
            failed += 1
    return verdict(n_nodes, yes, failed)


def to_regain(votes: Sequence[Vote]) -> list[int]:
    """The nodes a lease's next extension takes where its key is free, after a grant or extension
    with these *votes*: those that answered without a yes (refused: another holder's key, or gone;
    failed; in quarantine).

    Not the nodes that said yes, nor those still pending (their yes likely came after the
    decision): a key found missing there before it could expire was lost (a restart, a
    deletion), not freed, and an extension says no there instead of hiding it. Nor, whatever
    these votes, a node the lease's validity counts on (``Lease.holders``): the caller skips those.
    """
    return [i for i, vote in enumerate(votes) if vote is not YES and vote is not PENDING]


def refused(votes: Iterable[Vote]) -> bool:
    """True when so many nodes answered no that no majority can ever accept the request.

    For an extension this means the lease is gone for certain (the key expired
    or another client holds it), not merely unconfirmed.
    """
    votes = list(votes)
    return sum(v is NO for v in votes) > len(votes) - quorum(len(votes))


CANNOT_VOTE = frozenset({Vote.ERROR, Vote.TIMEOUT, Vote.SKIPPED, Vote.QUARANTINED})
"""Votes of nodes that could not take part: unreachable, failing, or in restart quarantine."""


def unavailable(votes: Iterable[Vote]) -> bool:
    """True when so many nodes could not vote (:data:`CANNOT_VOTE`) that no majority could have said
    yes even had the key been free everywhere: the nodes are unavailable, whatever the others said.

    False when a majority could have voted (PENDING counts as could: the decision came first), so a
    failure is contention (or a slow round), never an outage. Mixed outcomes, where some nodes said
    no and too many others could not answer, are unavailable: the holder leaving would not help.
    """
    votes = list(votes)
    return sum(v in CANNOT_VOTE for v in votes) > len(votes) - quorum(len(votes))


def ttl_to_ms(ttl: float) -> int:
    """The integer milliseconds sent to Redis for a ttl in seconds, rounded down.

    Rounding down keeps the key's life no longer than the ttl the caller gave
    (to within a nanosecond); validity is computed from this integer, the one
    the servers enforce. Float noise is rounded away first, so that a decimal
    ttl means what it says: 0.3 s is 300 ms, although 0.3 * 1000 is
    299.99999999999994 in binary.
    """
    return math.floor(round(ttl * 1000, 6))


def drift(ttl: float, drift_factor: float) -> float:
    """Seconds taken off the end of a lease for clock drift between nodes."""
    return ttl * drift_factor + CLOCK_PRECISION


def validity(ttl: float, started: float, decided: float, drift_factor: float) -> float:
    """Seconds the lock can be trusted after *decided*; <= 0 means give it back.

    *started* is when the first request of the attempt was sent, *decided*
    when the majority was known: both from the same monotonic clock.
    """
    return ttl - (decided - started) - (ttl * drift_factor + CLOCK_PRECISION)  # (drift(), inlined: once per round)


def best_validity(ttl: float, drift_factor: float) -> float:
    """The validity of an attempt that took no time at all: the most any lease can give."""
    return validity(ttl, 0.0, 0.0, drift_factor)


def granted(
    n_nodes: int, votes: Iterable[Vote], ttl: float, started: float, decided: float, drift_factor: float
) -> float | None:
    """The validity of a successful acquire or extend, or None when it failed.

    Succeeds only when a majority voted yes and the validity left is positive.
    For an extend, the caller also checks that *decided* came before the old
    lease ran out (``decided < deadline``): see :func:`extended`.
    """
    if tally(n_nodes, votes) is not WON:
        return None
    left = validity(ttl, started, decided, drift_factor)
    return left if left > 0 else None


def extended(
    n_nodes: int,
    votes: Iterable[Vote],
    ttl: float,
    started: float,
    decided: float,
    drift_factor: float,
    deadline: float,
) -> float | None:
    """The new validity of an extension, or None when it does not count.

    An extension counts only when a majority accepted it before *deadline*,
    the moment the current validity runs out: after that, another client may
    already hold the lock, so a late majority proves nothing.
    """
    if decided >= deadline:
        return None
    return granted(n_nodes, votes, ttl, started, decided, drift_factor)


def held_until(sent: float, span: float, drift_factor: float) -> float:
    """When a key a node holds for us may first expire, on our clock (a lower bound).

    The node saw the key with *span* seconds of its own clock left, at a moment
    after *sent* (when our request went out, or an earlier one we measure from).
    Those seconds may pass up to *drift_factor* faster here, and the key's expiry
    is precise to CLOCK_PRECISION: the same terms as :func:`validity`, which is
    ``held_until(started, ttl, drift_factor) - decided``.
    """
    return sent + span * (1 - drift_factor) - CLOCK_PRECISION


def majority_until(ends: Iterable[float], n_nodes: int) -> float:
    """Until when a majority of *n_nodes* holds the key, given when each holder's key may first expire:
    the quorum-th latest end (-inf when fewer nodes hold it)."""
    latest = sorted(ends, reverse=True)
    need = quorum(n_nodes)
    return latest[need - 1] if len(latest) >= need else -math.inf


def retry_delay(base: float, unit_random: float, remaining: float) -> float:
    """Seconds to wait before the next attempt.

    Uniform in [base/2, 3*base/2] given *unit_random* in [0, 1), so that
    competing clients spread out instead of colliding again; never longer than
    the *remaining* time of the caller's acquire timeout.
    """
    if not 0.0 <= unit_random < 1.0:
        raise ValueError(f"unit_random must be in [0, 1), got {unit_random}")
    return max(0.0, min(base * (0.5 + unit_random), remaining))


class Extension(enum.Enum):
    """What one round of extension votes means for the lease."""

    CONFIRMED = "confirmed"
    """A majority accepted it before the old validity ran out: the lease has a new validity."""
    REFUSED = "refused"
    """So many nodes said no that no majority can accept: the key expired or another client holds it."""
    RETRY = "retry"
    """Neither (timeouts, errors): validity is left, so try again."""
    EXPIRED = "expired"
    """Neither, and the old validity has run out: the lease cannot be kept."""


def judge_extension(
    votes: Sequence[Vote],
    ttl: float,
    started: float,
    decided: float,
    drift_factor: float,
    deadline: float,
    now: float,
) -> tuple[Extension, float | None]:
    """The verdict on one extension round, and the new validity when it is CONFIRMED.

    The one judge of extensions: an explicit ``extend()`` and the watchdog both
    ask it. *deadline* is when the current validity runs out; *now* decides
    between RETRY and EXPIRED for a round that neither counted nor was refused.
    """
    new_validity = extended(len(votes), votes, ttl, started, decided, drift_factor, deadline=deadline)
    if new_validity is not None:
        return Extension.CONFIRMED, new_validity
    if refused(votes):
        return Extension.REFUSED, None
    return (Extension.RETRY if now < deadline else Extension.EXPIRED), None


def extend_retry_delay(ttl: float, node_timeout: float, remaining: float) -> float:
    """Seconds before retrying an extension that was neither confirmed nor refused.

    Short enough for a few more tries within the *remaining* validity, never
    shorter than one node timeout (no hot loop), never longer than a tenth of the ttl.
    """
    return max(node_timeout, min(ttl / 10, remaining / 3))


class Held(enum.StrEnum):
    """What reading the nodes (writing nothing) can say of a lock."""

    HELD = "held"
    """One holder's key is on a majority."""
    FREE = "free"
    """A majority answered, and no holder could have a majority even with every unanswered node."""
    UNKNOWN = "unknown"
    """The nodes that did not answer could make either true."""


def held_by_majority(n_nodes: int, holders: Iterable[int], unreachable: int) -> Held:
    """The verdict of an inspection: *holders* counts the nodes holding each holder's key.

    Held only when one holder has a majority; free only when a majority answered and no
    holder (seen or not) could reach a majority with the *unreachable* nodes; else unknown.
    """
    need = quorum(n_nodes)
    counts = list(holders)
    if counts and max(counts) >= need:
        return Held.HELD
    if n_nodes - unreachable >= need and all(count + unreachable < need for count in counts):
        return Held.FREE
    return Held.UNKNOWN


def smoothed_rtt(srtt: float, rttvar: float, sample: float) -> tuple[float, float]:
    """A node's round-trip estimate after one more *sample*, as TCP keeps it (RFC 6298).

    ``(0, 0)`` means no sample yet. Returns the new (smoothed RTT, RTT variation).
    """
    if sample < 0:
        raise ValueError(f"an RTT sample cannot be negative, got {sample}")
    if srtt == 0.0 and rttvar == 0.0:
        return sample, sample / 2
    rttvar = 0.75 * rttvar + 0.25 * abs(srtt - sample)
    return 0.875 * srtt + 0.125 * sample, rttvar


def patience(floor: float, timeouts: Iterable[float], needed: int, cap: float) -> float:
    """How long a fan-out waits for its nodes: *floor* (node_timeout), or longer on a slow network.

    *timeouts* are the nodes' retransmission timeouts (smoothed RTT + 4 x variation, 0 when
    unknown); the decision needs *needed* of them, so the needed-th shortest counts, and a
    single slow or dead node never stretches the wait. Never above *cap* (a tenth of the ttl),
    never below *floor*: on a fast network (loopback) this is the floor, unchanged.
    """
    ordered = sorted(timeouts)
    if not 0 < needed <= len(ordered):
        return floor
    return max(floor, min(ordered[needed - 1], cap))


class Marker(enum.Enum):
    """The marker key clients write on a node in service: the server's run_id then, and the
    quarantine period it was judged under (``run_id/period_ms``); or, on a node found without
    one while the cluster is in service, since when it is watched (``run_id/since/time_us``)."""

    CURRENT = "current"
    """Written while this server process ran, under a period at least as long as ours:
    a client judged it in service."""
    STALE = "stale"
    """Written under an earlier process (restarted with maybe stale data), or judged under a
    shorter period than ours (a client with shorter leases, or an old marker with none), which
    vouches for nothing our longer leases need: the rest of our period, from its uptime."""
    WATCHED = "watched"
    """Written while this server process ran, by a client that found it without marker while the
    cluster was in service: it lost its data before then, and nothing since (a loss takes the
    marker with it). It sits out until a period has passed since then, on its own clock, for
    every client alike."""
    ABSENT = "absent"
    """No marker: a new node, or one whose data was lost."""
    UNKNOWN = "unknown"
    """The marker could not be read."""


UPTIME_SLACK = 1.0
"""How much a server's reported uptime may exceed its true uptime, in seconds.

Valkey and Redis report ``uptime_in_seconds`` as their cached whole-second
clock minus their whole-second start time: a server started at 100.9 s says
"1" at 101.1 s. Taken at its word, that would end a quarantine up to 1 s
early, while a lease granted before the restart may still run."""


def sit_out(
    period: float,
    *,
    uptime: float | None,
    known_run_id: bool,
    restarted: bool,
    marker: Marker,
    watched: float | None = None,
    promoted: bool = False,
) -> tuple[float, bool]:
    """How long a node that just (re)connected must sit out of every quorum.

    The hazard: a node that comes back without the keys it held (restarted
    without persistence, or with a stale snapshot) can say yes to a second
    client while the first still counts on it. Every lease granted before it
    went down ends within one ttl, so a node that has been back for *period*
    (at least the largest ttl in use, plus drift) can no longer help anyone
    overlap. What is known when it connects:

    * *uptime*: the server's ``uptime_in_seconds`` (None when INFO is refused).
      It is a difference of two whole-second clocks, so it may be up to 1 s more
      than the truth: :data:`UPTIME_SLACK` is taken off it, never the other way;
    * *known_run_id*: this client saw the same server process before;
    * *restarted*: this client saw another server process at this address;
    * *marker*: what the marker key says (see :class:`Marker`);
    * *watched*: for a :attr:`Marker.WATCHED` node, the seconds since its watch began, on the
      node's clock (None when the node does not say its time);
    * *promoted*: the server was a replica since it started (a failover promoted it): its data is
      what it had received, which may lack keys its old master granted, and neither its uptime
      nor a marker replicated from the old master says when it began to serve.

    Returns (seconds to sit out from now, suspect). A *suspect* node has no
    marker, or one that says it is watched: only the other nodes, or another
    client, can tell more (it is rechecked). The caller lifts the quarantine of
    a suspect without marker when every node answered and none has a marker (a
    new cluster; a cluster wiped all at once looks the same, and only a client
    that knew the old servers can tell: *restarted*).
    """
    if period <= 0:
        return 0.0, False
    if marker is Marker.WATCHED:
        # Found without marker (it had lost its data) *watched* seconds ago, and it lost nothing since:
        # every lease it could have held has run out a period after then. The same end for every client.
        left = period if watched is None else max(0.0, period - max(0.0, watched))
        return left, left > 0
    if promoted and marker is not Marker.CURRENT:
        # A failover is a restart: the whole period, unless a client judged it in service since (its marker).
        return period, False
    if uptime is not None:
        uptime = max(0.0, uptime - UPTIME_SLACK)
    if restarted:
        if marker is Marker.ABSENT:
            # Another server here, without our marker: restarted empty, or a spare put behind the
            # address (whose uptime says nothing of when it took the address): the whole period.
            return period, False
        # We knew another server here: it came back *uptime* seconds ago, with its data.
        return (period if uptime is None else max(0.0, period - uptime)), False
    if marker is Marker.ABSENT:
        # New, or its data is gone: lost in place (a FLUSHALL), restarted empty, or another,
        # empty server put behind the same address (a VIP or DNS name re-pointed at a spare,
        # up for ages). Its uptime proves nothing then: the whole period from now, unless the
        # other nodes show a new cluster (none has a marker either), or another client marks it.
        return period, True
    if marker is Marker.CURRENT or known_run_id or uptime is None:
        # Judged in service under this very process (by us or another client), or no way to see restarts.
        return 0.0, False
    # Restarted with data that may be stale, or a marker we cannot read: the rest of the period.
    return max(0.0, period - uptime), False


class ClockFault(enum.Enum):
    """What a node's clock did between two of our exchanges with it (:func:`judge_clock`)."""

    AHEAD = "ahead"
    """It advanced more than the real time could have: stepped forward, or runs fast. Its keys
    expired early: a lease it granted may already be gone there."""
    BEHIND = "behind"
    """It advanced less than the real time did, or went back: stepped back, or runs slow. Its keys
    live too long there (safe for their holder; others wait longer)."""
    FROZEN = "frozen"
    """It did not advance at all while time passed: its keys never expire."""


def judge_clock(
    before: float, after: float, shortest: float, longest: float, drift_factor: float
) -> tuple[ClockFault, float] | None:
    """How a node's clock moved between two readings of it, against ours; None when within the drift.

    *before* and *after* are the node's times (seconds, its ``TIME``) of two exchanges;
    the real time between the two readings lies in [*shortest*, *longest*]: from the first's
    reply to the second's send, and from the first's send to the second's reply, on our
    monotonic clock (network delays, queues and pauses only widen the window, never cause a
    false alarm). A clock within the drift factor advances at least ``shortest * (1 - drift)``
    and at most ``longest * (1 + drift)``, give or take :data:`CLOCK_PRECISION`. Outside that:
    the fault and its size in seconds (positive ahead, negative behind: how far, at least, the
    node's clock left the real time).
    """
    advanced = after - before
    if advanced > longest * (1 + drift_factor) + CLOCK_PRECISION:
        return ClockFault.AHEAD, advanced - longest
    if advanced < shortest * (1 - drift_factor) - CLOCK_PRECISION:
        return (ClockFault.FROZEN if advanced == 0 else ClockFault.BEHIND), advanced - shortest
    return None
