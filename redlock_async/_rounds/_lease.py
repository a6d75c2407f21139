"""The life of one lock: its phases, the only moves between them, and what each move implies.

Every change of a ``Lock``'s phase goes through :meth:`Tenure.to`, which refuses a move not in
:data:`EFFECTS` and does, in that one place, everything the move implies (the table below); a
refused move is a bug in the library, never a user's error (those are checked, with their own
messages, before any move). As h11 keeps its state machine in one file, so here: a call site
names the phase it goes to, never an effect of it.

    IDLE ──acquire──▶ ACQUIRING ──majority, valid──▶ HELD ──release──▶ IDLE
      ▲                  │                            │
      └──no majority─────┘                            └──lost──▶ LOST ──acquire──▶ ACQUIRING
       (or cancelled)

HELD goes back to IDLE by ``release()``, or by the exit of ``async with`` that
confirmed an overrun lease on a majority; it goes to LOST when the lease cannot
be kept (an extension refused or expired, the watchdog's verdict, the Redlock
closed under it). LOST stays until the next acquire: ``extend()`` raises its
``LockLost`` again, ``release()`` does nothing.

==========================  =====================================================================
move                        effects
==========================  =====================================================================
IDLE, LOST -> ACQUIRING     FORGET: the last lease's token is dropped (its stale keys were
                            released just before, by the caller that still knew the token);
                            RESTART: the acquire's counts (attempts, the wake-up) start again
ACQUIRING -> HELD           HOLD: the lock joins its Redlock's held locks; no loss is recorded
                            (the move :meth:`Tenure.grant` makes, with the new lease)
ACQUIRING -> IDLE           none (nothing was held)
HELD -> IDLE                UNHOLD (out of the held locks, unbound from its task), FORGET,
                            DISOWN (no holders), UNWATCH (the watchdog drops it at its next look)
HELD -> LOST                UNHOLD, DISOWN, RECORD (the loss, ``Tenure.lost``); the token is kept:
                            the next acquire releases what may be left of it once more
==========================  =====================================================================
"""

from __future__ import annotations

import asyncio
import enum
import itertools
from collections.abc import Callable, MutableSet, Sequence
from typing import Any, NamedTuple, Protocol, TypeAlias

from redlock_async._core import PENDING, YES, Vote
from redlock_async._scripts import Script
from redlock_async.errors import LockLost


class Phase(enum.Enum):
    IDLE = "idle"
    """Never acquired, released, or an acquire that failed."""
    ACQUIRING = "acquiring"
    """An acquire is under way (one at a time per Lock)."""
    HELD = "held"
    """Granted by a majority; validity may still run out (``Lock.held`` checks the clock)."""
    LOST = "lost"
    """The lease could not be kept; sticky until the next acquire."""


FORGET = 1
"""The lease's token is dropped: nothing more of it is released."""
DISOWN = 2
"""The lease's holders are dropped: no node counts as holding it."""
HOLD = 4
"""The lock joins its Redlock's held locks (given up when the Redlock closes); no loss recorded."""
UNHOLD = 8
"""The lock leaves its Redlock's held locks, and is no longer bound to the task of its ``async with``."""
UNWATCH = 16
"""The lock is no longer watched: the watchdog drops its lease at its next look."""
RECORD = 32
"""The loss is recorded (``Tenure.lost``): what ``extend()`` raises again, and the holder is told."""
RESTART = 64
"""The acquire's counts start again: no attempt made yet, no release woke it."""
# (Plain ints, not enum.Flag: a lock makes three moves per acquire and release, and Flag's
# operators are Python code.)

EFFECTS: dict[tuple[Phase, Phase], int] = {
    (Phase.IDLE, Phase.ACQUIRING): FORGET | RESTART,
    (Phase.LOST, Phase.ACQUIRING): FORGET | RESTART,
    (Phase.ACQUIRING, Phase.HELD): HOLD,
    (Phase.ACQUIRING, Phase.IDLE): 0,
    (Phase.HELD, Phase.IDLE): UNHOLD | FORGET | DISOWN | UNWATCH,
    (Phase.HELD, Phase.LOST): UNHOLD | DISOWN | RECORD,
}
"""The legal moves and what each implies: the one table of a lock's life (see the module docstring)."""

MOVES: dict[Phase, frozenset[Phase]] = {
    phase: frozenset(to for (start, to) in EFFECTS if start is phase) for phase in Phase
}
"""The legal moves, from each phase."""


class IllegalMove(RuntimeError):
    """A phase change not in MOVES: a bug in redlock_async."""


# Each phase carries, per target (by its place in Phase), the effects of the move there, -1 when the move
# is illegal: a move is then checked and its effects found without hashing an Enum (Enum.__hash__ is
# Python code, and a lock makes three moves per acquire and release).
for _i, _phase in enumerate(Phase):
    _phase.index = _i  # type: ignore[attr-defined]
for _phase in Phase:
    _phase.effects = tuple(EFFECTS.get((_phase, _to), -1) for _to in Phase)  # type: ignore[attr-defined]
    _phase.targets = tuple(_to for _to in Phase if (_phase, _to) in EFFECTS)  # type: ignore[attr-defined]
del _i, _phase
# What Tenure.to can do, checked once: HOLD alone, RESTART with FORGET alone, and DISOWN, UNWATCH and
# RECORD only with UNHOLD; and every move to HELD holds, as Tenure.grant does.
for (_start, _to), _effects in EFFECTS.items():
    if (
        (_effects & HOLD and _effects != HOLD)
        or (_effects & RESTART and _effects != RESTART | FORGET)
        or (_effects & (DISOWN | UNWATCH | RECORD) and not _effects & UNHOLD)
        or ((_to is Phase.HELD) != (_effects == HOLD))
    ):
        raise AssertionError(f"Tenure.to cannot apply effects {_effects}: change it with EFFECTS")
del _start, _to, _effects


def move(current: Phase, to: Phase) -> Phase:
    """*to*, when the move from *current* is legal; else IllegalMove."""
    if to not in current.targets:  # type: ignore[attr-defined]
        raise IllegalMove(f"a lock cannot go from {current.value} to {to.value} (a bug in redlock_async)")
    return to


_serials = itertools.count(1)

Late: TypeAlias = "tuple[Sequence[Vote], Sequence[Any], Callable[[Any], Vote]]"
"""A decided request's votes at the decision, its replies as they come (a ``Ballot``'s ``replies``,
which late ones still fill) and how a reply votes."""


class Keep(NamedTuple):
    """A key a lease's extensions keep alive beside its own, and the script that does it, sent right
    behind each extension (``_requests.send_keep``): a permit's semaphore's widest-limit key
    (KEEP_LIMIT). *instead*: the script is the lease's extension itself, sent in place of EXTEND (KEYS
    *key*, ARGV its token and the new ttl; answering ``{1}`` or ``{0}`` as EXTEND_MANY for one lease): a
    reader's, whose lease is its entry in its read/write lock's readers' hash (RW_READ_EXTEND)."""

    script: Script
    key: bytes
    instead: bool = False


class Lease:
    """One acquisition's lease: its token on the nodes, how long it can be trusted, who holds it.

    A Lock gets a new Lease at each grant (and an empty one, without a token, when made).
    The watchdog keeps Leases, not Locks: it reads ``keys``, ``token``, ``ttl_ms``, ``expires``,
    what the next extension takes (``holders``, ``regain``, ``late``) and the fence fields, and calls
    the two hooks the lock set when it began to watch (``due`` at a round's start, ``result`` with
    the round's votes). A round that answers for a lease the lock has since replaced finds it
    superseded, and changes nothing.
    """

    __slots__ = (
        "acquired_at",
        "due",
        "expires",
        "extensions",
        "fence_keys",
        "fence_ttl_ms",
        "fencing_token",
        "fencing_tokens",
        "holders",
        "keeps",
        "keys",
        "late",
        "regain",
        "result",
        "serial",
        "skip",
        "takes",
        "token",
        "ttl_ms",
    )

    def __init__(
        self,
        keys: tuple[bytes, ...],
        token: bytes | None = None,
        *,
        ttl_ms: int = 0,
        acquired_at: float = 0.0,
        expires: float = 0.0,
        holders: list[int] | None = None,
        skip: Sequence[int] = (),
        fencing_token: int | None = None,
        fencing_tokens: tuple[int, ...] | None = None,
        keeps: Keep | None = None,
        fence_keys: tuple[bytes, ...] = (),
        fence_ttl_ms: int | None = None,
        regain: list[int] | None = None,
        late: Late | None = None,
        takes: bool = True,
    ) -> None:
        self.serial = next(_serials)
        """This acquisition's number, unique in the process: events name their grant by it."""
        self.keys = keys
        """The keys this acquisition holds on the nodes, all with its token: one for a lock, several for
        ``lock_many`` (all or none), the permit's slot for a semaphore."""
        self.token = token
        """The acquisition's random value on the nodes; None once released (or before any grant)."""
        self.ttl_ms = ttl_ms
        self.acquired_at = acquired_at
        """When the first SET went out (monotonic): validity counts from here."""
        self.expires = expires
        """Monotonic time at which validity runs out."""
        self.holders: list[int] = holders if holders is not None else []
        """Nodes that said yes to the grant or the last extension."""
        self.skip = skip
        """Nodes the SET never went to: nothing there to release."""
        self.extensions = 0
        self.fencing_token = fencing_token
        self.fencing_tokens = fencing_tokens
        """Per key, in the order of ``keys`` (fenced locks); ``fencing_token`` is the first."""
        self.keeps = keeps
        """A key every extension keeps alive a lease longer than this lease's (a permit's: its
        semaphore's widest-limit key, which must exist while any permit may be held; a reader's: its
        readers' hash, whose entry is its lease: ``Keep.instead``, its extension itself); None for most."""
        self.fence_keys = fence_keys
        """Per key, its fencing counter (fenced locks; else empty): an extension that takes a node
        raises them there to ``fencing_tokens`` (with ``fence_ttl_ms``, the counters' ttl)."""
        self.fence_ttl_ms = fence_ttl_ms
        self.regain: list[int] = regain if regain is not None else []
        """Nodes that answered the last watchdog round without a yes (``_algorithm.to_regain``, and late
        noes as they come): the next extension takes them where the key is free, but for the holders
        (:meth:`to_take`)."""
        self.late = late
        """The grant's (or the last explicit extension's) votes and replies, read only by the next
        extension (:meth:`to_take`): nothing is worked out for them on the acquire's path."""
        self.takes = takes
        """False: extensions never take a free node (a read/write lease: its take would skip the check
        for the other side; docs/algorithm.md, "Read/write locks")."""
        self.due: Callable[[Lease, float], bool] = _never_due
        """The watchdog asks at a round's start: True to extend now (the lock handles every other case)."""
        self.result: Callable[[Lease, float, float, Sequence[Vote], Sequence[str] | None], None] = _ignore
        """The watchdog's round for this lease was decided: (lease, started, decided_at, votes, details)."""

    def to_take(self) -> list[int]:
        """The nodes the next extension takes where the keys are free: :attr:`regain`, and the nodes of
        :attr:`late` that answered without a yes (``_algorithm.to_regain``) or, pending at its
        decision, whose reply came since without one; never a holder (a key missing there was lost,
        not freed: taking it would hide that)."""
        if not self.takes:
            return []
        regain = self.regain
        if self.late is not None:
            votes, replies, vote_of = self.late
            regain = regain + [
                i
                for i, vote in enumerate(votes)
                if vote is not YES and (vote is not PENDING or vote_of(replies[i]) not in (YES, PENDING))
            ]
        holders = self.holders
        return [i for i in regain if i not in holders]


def _never_due(lease: Lease, now: float) -> bool:
    return False


def _ignore(
    lease: Lease, started: float, decided_at: float, votes: Sequence[Vote], details: Sequence[str] | None
) -> None:
    return None


_IDLE, _ACQUIRING, _HELD, _LOST = Phase.IDLE, Phase.ACQUIRING, Phase.HELD, Phase.LOST  # (see lock.py's note)


class Decided(Protocol):
    """A decided request as :meth:`Tenure.heard` reads it (a ``Ballot``, an attempt's result)."""

    @property
    def votes(self) -> Sequence[Vote]: ...

    @property
    def details(self) -> Sequence[str] | None: ...


class Heard(NamedTuple):
    """Votes and details heard outside a ballot (the watchdog's round, a grant queue's standing)."""

    votes: Sequence[Vote]
    details: Sequence[str] | None


class Holds(Protocol):
    """What a lock's phase changes tell its Redlock (``Cluster`` meets it): which locks are held, and
    which tasks hold which keys inside ``async with``."""

    @property
    def held(self) -> MutableSet[Any]:
        """The locks held now."""

    def unbind(self, keys: tuple[bytes, ...], task: Any) -> None:
        """One hold of *keys* by *task* ended."""


class Tenure:
    """A lock's life across its acquisitions: its phase, its current lease, what its last request
    heard, whether it is watched; and :meth:`to`, the one way its phase changes.

    Every part of a lock (its acquire strategy, its keeper, its guard, its events) reads these
    fields and changes them only through the methods below (``tests/test_house.py`` holds them to
    it); only :meth:`to` and :meth:`grant` change ``phase``, with the effects :data:`EFFECTS` lists.
    """

    __slots__ = (
        "attempts",
        "bound",
        "cancelled_host",
        "details",
        "holds",
        "host",
        "host_cancelling",
        "kept",
        "keys",
        "label",
        "lease",
        "lost",
        "name",
        "on_lost",
        "phase",
        "votes",
        "watched",
        "woken_at",
    )

    def __init__(
        self,
        holds: Holds,
        kept: object,
        keys: tuple[bytes, ...],
        name: object,
        label: str,
        on_lost: Callable[[LockLost], object] | None,
    ) -> None:
        self.holds = holds
        self.kept = kept
        """What joins ``holds.held`` while held: the public lock, which its Redlock tells things to."""
        self.keys = keys
        """The keys the lock is bound to inside ``async with`` (a semaphore's: its name's, not the slot's)."""
        self.name = name
        """The lock's name (or names), as messages show it with ``%r``."""
        self.label = label
        """The name as errors and events carry it."""
        self.on_lost = on_lost
        self.phase = _IDLE
        self.lease = Lease(keys)
        """The current (or last) acquisition's; a new one at each grant."""
        self.lost: LockLost | None = None
        """Why the last acquisition was lost."""
        self.votes: Sequence[Vote] = ()
        """Per-node votes of the last attempt, extension or release (NodeOutcomes are built only when asked)."""
        self.details: Sequence[str] | None = None
        self.attempts = 0
        """Rounds sent by the acquire in progress (or the last one)."""
        self.woken_at: float | None = None
        """When a release last woke the acquire in progress, if it did."""
        # The watchdog (inside `async with`): whether it keeps the lease, the task running the body,
        # its cancel count on entry, and whether we cancelled it because of a loss.
        self.watched = False
        self.host: Any = None
        self.host_cancelling = 0
        self.cancelled_host = False
        self.bound: Any = None
        """The holder of this lock inside ``async with`` (its task; a thread for the blocking API: ``_holder``):
        a nested acquire by it fails at once."""

    def to(self, phase: Phase, lost: LockLost | None = None) -> None:
        """Move to *phase* (IllegalMove unless :data:`EFFECTS` allows it) and do what the move implies;
        a move to LOST records *lost*, the loss its holder is told."""
        effects = self.phase.effects[phase.index]  # type: ignore[attr-defined]
        if effects < 0:
            move(self.phase, phase)  # raises IllegalMove
        self.phase = phase
        # (In order of how often: a lock goes to HELD and out of it once per acquisition.)
        if effects & HOLD:
            self.lost = None
            self.holds.held.add(self.kept)
            return
        if effects & RESTART:  # (with FORGET alone: the moves to ACQUIRING)
            self.lease.token = None
            self.attempts = 0
            self.woken_at = None
            return
        if effects & FORGET:
            self.lease.token = None
        if effects & UNHOLD:
            self.holds.held.discard(self.kept)
            if self.bound is not None:
                self.holds.unbind(self.keys, self.bound)
                self.bound = None
            if effects & DISOWN:
                self.lease.holders = []
            if effects & UNWATCH:
                self.watched = False
            if effects & RECORD:
                self.lost = lost

    def grant(self, lease: Lease, decided: Decided, tries: int) -> None:
        """ACQUIRING -> HELD: *lease* granted by the request *decided* (:meth:`heard`), after *tries* more
        attempts.
        The move's effect, HOLD, is done here as :meth:`to` does it (the table's check at import: every
        move to HELD is ACQUIRING's, with HOLD alone); one call on the acquire's path, not two."""
        if self.phase is not _ACQUIRING:
            move(self.phase, _HELD)  # raises IllegalMove
        self.phase = _HELD
        self.lease = lease  # (one statement each: cheaper than a tuple's)
        self.votes = decided.votes
        self.details = decided.details
        self.attempts += tries
        self.lost = None
        self.holds.held.add(self.kept)

    def heard(self, decided: Decided) -> None:
        """The last request (an attempt, extension or release) was *decided* (a ``Ballot``, an attempt's
        result, a :class:`Heard`): its votes and details are the lock's."""
        self.votes = decided.votes
        self.details = decided.details

    def tried(self) -> None:
        """One more attempt of the acquire in progress."""
        self.attempts += 1

    def woke(self, at: float | None) -> None:
        """A release woke the acquire in progress at *at* (None: its wait ran out unwoken)."""
        self.woken_at = at

    def forget(self) -> None:
        """Drop the lease's token (a LOST lease: nothing more of it is released), as FORGET does."""
        self.lease.token = None

    def tell_loss_to(self, on_lost: Callable[[LockLost], object] | None) -> None:
        """Call *on_lost* with the LockLost when the watchdog loses the lock (None: cancel the body)."""
        self.on_lost = on_lost

    def watch(self, holder: Any, host: asyncio.Task[Any] | None) -> None:
        """Inside ``async with``: bound to *holder*, and watched for *host* (the task running the body;
        None: not watched, ``auto_extend=False``), which a loss cancels."""
        self.bound = holder
        if host is not None:
            self.host = host
            self.host_cancelling = host.cancelling()
            self.cancelled_host = False
            self.watched = True

    def unwatch(self) -> None:
        """Out of ``async with``: no longer watched, no host (read ``host`` and ``cancelled_host`` first)."""
        self.watched = False
        self.host = None
        self.cancelled_host = False

    def let_go(self) -> None:
        """The watchdog lets the lease go (its rounds out change nothing); the host stays, as inside
        ``async with``."""
        self.watched = False

    def cancel_host(self, msg: str) -> None:
        """A loss cancels the body's task, if it still runs (``async with`` turns it into LockLost)."""
        host = self.host
        if host is not None and not host.done():
            self.cancelled_host = True
            host.cancel(msg=msg)

    def unbind(self) -> None:
        """No longer bound to its holder (a failed ``async with`` exit: a lease that ended unbinds it)."""
        if self.bound is not None:
            self.holds.unbind(self.keys, self.bound)
            self.bound = None
