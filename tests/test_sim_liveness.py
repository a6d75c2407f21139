"""The simulator's liveness oracles (``testing.sim._liveness``) on histories written by hand: each finds
what it is for, and judges nothing over a stretch the fault schedule shows unhealthy."""

from __future__ import annotations

import math
import random

from redlock_async.testing._history import History, Section
from redlock_async.testing.sim import Config
from redlock_async.testing.sim._liveness import RUN, check_liveness
from redlock_async.testing.sim._loop import SimLoop
from redlock_async.testing.sim._timeline import Timeline
from redlock_async.testing.sim._workloads import Attempt, Board


def _board(workload: str = "lock", **settings: object) -> Board:
    loop = SimLoop(random.Random(0))
    board = Board(loop, Config(workload=workload, settings=tuple(settings.items())), [])
    board.settings.pop("queue", None)
    board.settings.update(settings)
    board.histories["res"] = History()
    loop.close()
    return board


def _try(
    board: Board, client: str, start: float, finished: float, *, blocking: bool, granted: float | None = None
) -> Attempt:
    attempt = Attempt(client, 0, ("res",), start, blocking)
    attempt.finished = finished
    attempt.granted = granted
    attempt.outcome = "done" if granted is not None else "refused"
    board.attempts.append(attempt)
    if granted is not None:
        board.histories["res"].sections.append(Section(client, client, None, granted, finished))
        board.grants.setdefault("res", []).append((granted, client, start))
    return attempt


def _kinds(board: Board) -> list[str]:
    board.violations.clear()
    check_liveness(board)
    return [kind for kind, _ in board.violations]


def test_a_refused_try_on_a_free_lock() -> None:
    """Two blocking=False tries racing on a free lock: one must win (a split needs three); a third try
    beside them, or any fault from a ttl before, and nothing is judged."""
    board = _board()
    _try(board, "c0", 0.03, 0.032, blocking=False)
    assert _kinds(board) == ["free_try"]
    _try(board, "c1", 0.03, 0.033, blocking=False)
    assert _kinds(board) == ["free_try"]  # both refused
    board.attempts[1].outcome, board.attempts[1].granted = "done", 0.031
    assert _kinds(board) == []
    board.attempts[1].outcome, board.attempts[1].granted = "refused", None
    _try(board, "c2", 0.031, 0.034, blocking=False)
    assert _kinds(board) == []  # three racers may split the votes
    board.attempts.pop()
    board.timeline.add("pause", -0.5, -0.2, nodes=frozenset({3}))
    assert _kinds(board) == []  # a node paused until 0.2 s before: a ttl's margin


def test_a_refused_try_beside_a_racer_that_met_a_fault() -> None:
    """Seed 8136: the other racer's try ran on after the first was refused, and a node it held a yes of (for
    its recheck) was paused meanwhile: the recheck could not confirm that yes, and refusing it is the safe
    choice. Not judged: a fault within either try's stretch (a ttl's margin before) excuses both."""
    board = _board()
    _try(board, "c0", 0.030, 0.0325, blocking=False)
    _try(board, "c1", 0.030, 0.416, blocking=False)
    assert _kinds(board) == ["free_try"]
    board.timeline.add("pause", 0.095, 2.3, nodes=frozenset({2}))
    assert _kinds(board) == []


def _many(
    board: Board, client: str, names: tuple[str, ...], start: float, finished: float, granted: float | None = None
) -> None:
    attempt = Attempt(client, 0, names, start, True)
    attempt.finished = finished
    attempt.granted = granted
    attempt.outcome = "done" if granted is not None else "refused"
    board.attempts.append(attempt)
    if granted is not None:
        for name in names:
            section = Section(client, client, None, granted, finished)
            board.histories.setdefault(name, History()).sections.append(section)


def test_lock_many_head_of_line_is_not_idle() -> None:
    """lock_many in the idle oracle: b free and wanted by a waiter for b alone is not idle while the head of
    b's line (the earliest waiter) waits for a+b and a is held (FIFO per name, by design), nor when a is
    itself reserved so (a chain); it is idle when the waiter for b alone came first, or when a is free."""
    board = _board("many")
    _many(board, "c0", ("a",), 0.0, 2.0, granted=0.0)  # holds a until 2.0
    _many(board, "c1", ("a", "b"), 0.1, 2.1, granted=2.1)  # head of b's line: waits for a
    _many(board, "c2", ("b",), 0.3, 2.5, granted=2.5)  # behind it in b's line
    assert _kinds(board) == []
    board.attempts[2].start = 0.02  # first in b's line: b is its to take
    assert _kinds(board) == ["idle"]
    board.attempts[2].start = 0.3
    board.attempts[0].finished = 0.2  # a held until 0.2 only: c1 should have had a+b by 0.7
    board.histories["a"].sections[0] = Section("c0", "c0", None, 0.0, 0.2)
    assert _kinds(board) == ["idle"]
    board = _board("many")
    _many(board, "c0", ("c",), 0.0, 2.0, granted=0.0)  # holds c
    _many(board, "c3", ("a", "c"), 0.05, 2.4, granted=2.1)  # head of a's line, waits for c
    _many(board, "c1", ("a", "b"), 0.1, 2.7, granted=2.45)  # head of b's line, waits for a (reserved)
    _many(board, "c2", ("b",), 0.3, 2.9, granted=2.75)
    assert _kinds(board) == []


def test_a_lock_wanted_and_held_by_nobody() -> None:
    """A wait with no section open for more than half a ttl is a violation, judged under SCRIPT FLUSH
    but not beside a pause."""
    board = _board()
    _try(board, "c0", 0.0, 1.0, blocking=True, granted=0.0)
    _try(board, "c1", 0.5, 2.0, blocking=True, granted=1.45)
    assert _kinds(board) == []  # free 1.0 to 1.45: less than half a ttl
    _try(board, "c2", 1.5, 2.6, blocking=True, granted=2.6)
    assert _kinds(board) == ["idle"]  # free 2.0 to 2.6
    board.timeline.add("flush", 2.1, 2.1, nodes=frozenset({0}))
    assert _kinds(board) == ["idle"]
    board.timeline.add("pause", 2.2, 2.3, clients=frozenset({"c1"}))
    assert _kinds(board) == []


def test_a_waiter_overtaken_too_often() -> None:
    """More than RUN grants in a row to one other client, each asked after the waiter began, while it
    waited: a violation; a grant to the waiter's own client breaks the run."""
    board = _board()
    _try(board, "c1", 0.0, 3.0, blocking=True, granted=0.1 + (RUN + 1) * 0.05)
    for k in range(RUN + 1):
        when = 0.1 + k * 0.05
        _try(board, "c0", when - 0.01, when + 0.02, blocking=True, granted=when)
    assert _kinds(board) == ["overtaken"]
    board.grants["res"].insert(RUN // 2, (0.1 + (RUN // 2) * 0.05 - 0.001, "c1", 0.5))
    assert _kinds(board) == []


def test_a_holder_lost_with_four_healthy_nodes() -> None:
    """A lock lost after two extensions with one node unhealthy is a violation (without the grant queue);
    with two nodes unhealthy, or a fault reaching another client before the extensions, it is not; with
    the grant queue it is not judged."""
    board = _board(queue=False)
    board.lock_events += [
        ("acquired", "c0", "res", 1.0),
        ("extended", "c0", "res", 1.7),
        ("extended", "c0", "res", 2.4),
        ("lost", "c0", "res", 3.2),
    ]
    board.timeline.add("pause", 2.6, 3.5, nodes=frozenset({1}))
    assert _kinds(board) == ["lost_healthy"]
    board.timeline.add("restart", 2.9, 4.0, nodes=frozenset({2}))
    assert _kinds(board) == []
    board.timeline.faults.pop()
    board.timeline.add("pause", 0.5, 0.8, clients=frozenset({"c2"}))
    assert _kinds(board) == []
    board.timeline.faults.pop()
    board.settings["queue"] = True
    assert _kinds(board) == []


def test_the_timeline() -> None:
    """Which nodes a fault spoils for a client, and whether a stretch is quiet: clock faults and restarts
    make everything after them unjudged by quiet(); SCRIPT FLUSH spoils nothing."""
    timeline = Timeline(5)
    timeline.add("partition", 1.0, 2.0, nodes=frozenset({0, 1}), clients=frozenset({"c0"}))
    timeline.add("flush", 1.5, 1.5, nodes=frozenset({2}))
    assert timeline.unhealthy("c0", 1.5, 1.6, 0.5) == {0, 1}
    assert timeline.unhealthy("c1", 1.5, 1.6, 0.5) == set()
    assert timeline.unhealthy("c0", 2.6, 3.0, 0.5) == set()
    assert not timeline.quiet(2.4, 3.0, 0.5)
    assert timeline.quiet(2.6, 3.0, 0.5)
    assert timeline.others_reached("c1", 1.0, 1.1, 0.0)
    assert not timeline.others_reached("c0", 1.0, 1.1, 0.0)
    timeline.add("clock", 5.0, math.inf, nodes=frozenset({3}))
    assert not timeline.quiet(9.0, 9.5, 0.5)
    assert timeline.unhealthy("c1", 9.0, 9.5, 0.5) == {3}
