"""_lease without servers: the phase table (each move and everything it implies) and the one judge of
extension verdicts."""

from __future__ import annotations

from typing import Any

import pytest

from redlock_async._core import _algorithm
from redlock_async._core._algorithm import Extension, Vote
from redlock_async._core._settings import Settings
from redlock_async._rounds._judge import GONE, RAN_OUT, after_extension
from redlock_async._rounds._lease import (
    EFFECTS,
    MOVES,
    IllegalMove,
    Lease,
    Phase,
    Tenure,
)
from redlock_async.errors import LockLost

YES, NO, PENDING, TIMEOUT = Vote.YES, Vote.NO, Vote.PENDING, Vote.TIMEOUT


class Holds:
    """A Redlock's shared state as a lock's phase changes tell it (the Cluster's ``held`` and ``unbind``)."""

    def __init__(self) -> None:
        self.held: set[Any] = set()
        self.unbound: list[tuple[tuple[bytes, ...], object]] = []

    def unbind(self, keys: tuple[bytes, ...], task: Any) -> None:
        self.unbound.append((keys, task))


KEPT = object()  # what stands for the public lock in the held set
TASK = object()  # what stands for the task of `async with`


def tenure_in(phase: Phase) -> tuple[Tenure, Holds]:
    """A tenure brought to *phase* the way a lock gets there, holding a lease with a token, two holders,
    bound to a task and watched (where the phase allows)."""
    holds = Holds()
    tenure = Tenure(holds, KEPT, (b"k",), "name", "name", None)
    route = {
        Phase.IDLE: [],
        Phase.ACQUIRING: [Phase.ACQUIRING],
        Phase.HELD: [Phase.ACQUIRING, Phase.HELD],
        Phase.LOST: [Phase.ACQUIRING, Phase.HELD, Phase.LOST],
    }[phase]
    for step in route:
        if step is Phase.HELD:
            tenure.lease = Lease((b"k",), b"token", holders=[0, 1], expires=10.0)
            tenure.lost = LockLost("an earlier loss", name="name")
        tenure.to(step, LockLost("lost", name="name") if step is Phase.LOST else None)
        if step is Phase.HELD:
            tenure.bound, tenure.watched = TASK, True
    if phase is Phase.IDLE:
        tenure.lease = Lease((b"k",), b"stale", holders=[0])
    holds.unbound.clear()
    return tenure, holds


def test_the_legal_moves_are_the_rows_of_the_effects_table() -> None:
    assert {(start, to) for start, targets in MOVES.items() for to in targets} == set(EFFECTS)
    assert set(MOVES) == set(Phase)


@pytest.mark.parametrize(("start", "to"), list(EFFECTS))
def test_each_move_does_all_that_its_row_says_and_nothing_else(start: Phase, to: Phase) -> None:
    tenure, holds = tenure_in(start)
    lease, lost_before = tenure.lease, tenure.lost
    token, holders, watched, in_held = lease.token, list(lease.holders), tenure.watched, KEPT in holds.held
    lost = LockLost("gone", name="name") if to is Phase.LOST else None
    tenure.to(to, lost)
    assert tenure.phase is to
    leaving_held = start is Phase.HELD
    # The token: dropped when an acquire starts and at release; kept at a loss (released once more later).
    assert lease.token == (None if to is Phase.ACQUIRING or (leaving_held and to is Phase.IDLE) else token)
    assert lease.holders == ([] if leaving_held else holders)
    # The held set and the task of `async with`: joined at the grant, left when the lease ends.
    assert (KEPT in holds.held) == (to is Phase.HELD or (in_held and not leaving_held))
    assert holds.unbound == ([((b"k",), TASK)] if leaving_held else [])
    assert tenure.bound is (None if leaving_held else tenure.bound)
    assert tenure.watched == (False if leaving_held and to is Phase.IDLE else watched)
    # The loss: recorded at LOST, cleared at the grant, kept otherwise (extend() of a lost lock raises it).
    assert tenure.lost is (lost if to is Phase.LOST else None if to is Phase.HELD else lost_before)


@pytest.mark.parametrize("start", list(Phase))
def test_a_move_not_in_the_table_raises_and_changes_nothing(start: Phase) -> None:
    for to in Phase:
        if (start, to) in EFFECTS:
            continue
        tenure, holds = tenure_in(start)
        token, held = tenure.lease.token, set(holds.held)
        with pytest.raises(IllegalMove, match=f"from {start.value} to {to.value}"):
            tenure.to(to)
        assert (tenure.phase, tenure.lease.token, holds.held) == (start, token, held)


SETTINGS = Settings(ttl=10.0, node_timeout=0.05, drift_factor=0.01)


def held_lease(expires: float = 105.0) -> Lease:
    return Lease((b"k",), b"token", ttl_ms=10_000, acquired_at=95.0, expires=expires, holders=[0, 1, 2])


def test_a_confirmed_extension_moves_the_validity_and_the_holders() -> None:
    lease = held_lease()
    votes = [YES, NO, YES, YES, PENDING]
    judged = after_extension(lease, SETTINGS, 10_000, votes, 100.0, 100.01, now=100.01)
    _, validity = _algorithm.judge_extension(votes, 10.0, 100.0, 100.01, 0.01, deadline=105.0, now=100.01)
    assert judged.verdict is Extension.CONFIRMED
    assert judged.validity == validity
    assert judged.margin == pytest.approx(105.0 - 100.01)
    assert lease.expires == pytest.approx(100.01 + judged.validity)
    assert lease.holders == [0, 2, 3]


@pytest.mark.parametrize(
    ("votes", "now", "verdict", "why"),
    [
        ([NO, NO, NO, YES, YES], 100.01, Extension.REFUSED, GONE),
        ([TIMEOUT, TIMEOUT, TIMEOUT, YES, YES], 105.5, Extension.EXPIRED, RAN_OUT),
        ([TIMEOUT, TIMEOUT, TIMEOUT, YES, YES], 100.06, Extension.RETRY, ""),
    ],
)
def test_an_extension_not_confirmed_leaves_the_lease_as_it_was(
    votes: list[Vote], now: float, verdict: Extension, why: str
) -> None:
    lease = held_lease()
    judged = after_extension(lease, SETTINGS, 10_000, votes, 100.0, 100.05, now=now)
    assert (judged.verdict, judged.why) == (verdict, why)
    assert (lease.expires, lease.holders) == (105.0, [0, 1, 2])
    if verdict is Extension.RETRY:
        # Short enough for a few more tries in what is left, never under one node timeout.
        assert judged.retry_in == _algorithm.extend_retry_delay(10.0, 0.05, 105.0 - now)
