"""Attacks on the held yes of a node met without marker (``Node.vouching``, ``_fanout.Ballot``).

A client meets nodes 3 and 4 without marker while 0, 1 and 2 show theirs (a majority: never judged a
new cluster, whatever order the probes answer in); 0 and 1 hold another client's key, so the try
turns on the held yes votes of 3 and 4, which wait for each node's first recheck. What a production
cluster can do in that moment: restart the node empty, stop it answering, or cancel the acquire in
the very turn the recheck decides.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import anyio
import pytest

from redlock_async import Redlock
from redlock_async._core._algorithm import Vote
from redlock_async._health import _quarantine
from redlock_async._health._markers import marker_value
from redlock_async.testing._inside import cluster_of

from .conftest import Cluster, eventually

PERIOD = 10.0 + 0.01 * 10.0 + 0.002  # the default ttl's quarantine (ttl plus drift)
KEY = "redlock:moment"


@pytest.fixture(autouse=True)
def _slow_recheck(monkeypatch: pytest.MonkeyPatch) -> None:
    """The first recheck after 0.5 s (not 0.1), a yes held up to 1.5 s (not 0.3): the test sees the held
    votes before they are decided, however loaded the machine (polled, a 0.1 s window was missed)."""
    monkeypatch.setattr(_quarantine, "RECHECK_FIRST", 0.5)
    monkeypatch.setattr(_quarantine, "VOUCH_WAIT", 1.5)


def _mark(node: object) -> None:
    """Write the marker another client writes on a node it judged in service."""
    run_id = node.command("INFO", "server")["run_id"]  # type: ignore[attr-defined]
    node.command("SET", "redlock:", marker_value(run_id.encode(), PERIOD))  # type: ignore[attr-defined]


def _nodes(redlock: Redlock) -> list:  # type: ignore[type-arg]
    return list(cluster_of(redlock).nodes)


def _held(redlock: Redlock, indices: tuple[int, ...]) -> bool:
    nodes = _nodes(redlock)
    return all(nodes[i].vouching for i in indices)


def _why_not(redlock: Redlock, lock: object) -> str:
    """What the nodes and the lock showed when the held votes were not all seen."""
    nodes = _nodes(redlock)
    return f"vouching {[n.vouching for n in nodes]}, sitting out {[n.quarantined_until for n in nodes]}, " + (
        f"outcomes {lock.outcomes}"  # type: ignore[attr-defined]
    )


def _keys(faulty: Cluster, indices: tuple[int, ...]) -> list[object]:
    return [faulty[i].command("EXISTS", KEY) for i in indices]


def _other_client_holds_0_and_1(faulty: Cluster) -> None:
    """Markers on 0, 1 and 2 (judged in service by another client), its key on 0 and 1."""
    for i in (0, 1, 2):
        _mark(faulty[i])
    for i in (0, 1):
        faulty[i].command("SET", KEY, "the other client", "PX", 60_000)


def _other_client_leaves(faulty: Cluster) -> None:
    for i in (0, 1):
        faulty[i].command("DEL", KEY)


async def test_a_node_restarted_empty_while_its_yes_is_held_never_counts_it(
    faulty: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    """Node 3 restarts without its data while its yes waits, and another client at once vouches for
    the new server (its marker, under the new run_id); 4 is marked too. The old server's yes is
    refused all the same (its key is gone): the try fails rather than count a majority (2, 3, 4)
    one of whose keys was lost, and leaves no key behind."""
    caplog.set_level(logging.INFO, logger="redlock_async._quarantine")
    _other_client_holds_0_and_1(faulty)
    try:
        async with Redlock(faulty.urls) as b:
            lock = b.lock("moment")
            trying = asyncio.ensure_future(lock.acquire(blocking=False))
            assert await eventually(lambda: _held(b, (3, 4)), 5.0), _why_not(b, lock)
            faulty[3].restart(keep_data=False)  # blocks this loop: nothing is counted meanwhile
            for i in (3, 4):
                _mark(faulty[i])
            assert not await trying, lock.outcomes
            votes = [o.vote for o in lock.outcomes]
            assert votes[:3] == [Vote.NO, Vote.NO, Vote.YES], lock.outcomes
            assert votes[3] is Vote.QUARANTINED, lock.outcomes
            assert "in restart quarantine" in lock.outcomes[3].detail
            assert await eventually(lambda: _keys(faulty, (2, 3, 4)) == [0, 0, 0], 2.0)
            name = f"{_nodes(b)[4].name} "
    finally:
        _other_client_leaves(faulty)
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert not any(name in message for message in warned), warned  # 4 was marked meanwhile


async def test_a_node_that_never_answers_its_recheck_holds_the_try_no_longer_than_the_wait(faulty: Cluster) -> None:
    """Node 3 stops (SIGSTOP) right after its yes: its recheck never answers. The try ends once the
    hold runs out (0.3 s; 1.5 s here), refusing that yes; the keys of 2 and 4 are given back. Once
    node 3 answers again and is marked, it counts."""
    _other_client_holds_0_and_1(faulty)
    try:
        async with Redlock(faulty.urls) as b:
            lock = b.lock("moment")
            started = time.monotonic()
            trying = asyncio.ensure_future(lock.acquire(blocking=False))
            assert await eventually(lambda: _held(b, (3, 4)), 5.0), _why_not(b, lock)
            faulty[3].pause()
            _mark(faulty[4])
            assert not await trying, lock.outcomes
            took = time.monotonic() - started
            votes = [o.vote for o in lock.outcomes]
            assert votes[:3] == [Vote.NO, Vote.NO, Vote.YES], lock.outcomes
            assert votes[3] is Vote.QUARANTINED, lock.outcomes
            assert "in restart quarantine" in lock.outcomes[3].detail
            assert took < 5.0, took  # bounded by the hold and the release's node timeout: no hang
            assert _keys(faulty, (2, 4)) == [0, 0]
            faulty[3].resume()
            _mark(faulty[3])
            assert await eventually(lambda: not _nodes(b)[3].quarantined_until, 5.0), _why_not(b, lock)
            assert await eventually(lambda: _keys(faulty, (3,)) == [0], 5.0)  # its release, answered late
            _other_client_leaves(faulty)
            assert await lock.acquire(blocking=False), lock.outcomes
            assert [o.vote for o in lock.outcomes].count(Vote.YES) >= 3
            await lock.release()
    finally:
        faulty[3].resume()
        _other_client_leaves(faulty)


@pytest.mark.parametrize("scope", ["task", "anyio"])
@pytest.mark.parametrize("marked", [True, False], ids=["marked", "never-marked"])
async def test_a_cancel_in_the_turn_the_recheck_decides_leaves_no_key(
    faulty: Cluster, scope: str, marked: bool
) -> None:
    """The acquire is cancelled in the very loop turn its held yes decides it (the cancel is called
    by the recheck, right after the ballot counted that vote: won when 3 and 4 were marked, lost
    when not): no key of ours left anywhere, the lock held only if the grant came back first."""
    _other_client_holds_0_and_1(faulty)
    try:
        async with Redlock(faulty.urls) as b:
            lock = b.lock("moment")
            cancels: list[Callable[[], object]] = []
            outcome: list[bool] = []

            async def attempt() -> None:
                if scope == "anyio":
                    with anyio.CancelScope() as cancel_scope:
                        cancels.append(cancel_scope.cancel)
                        outcome.append(await lock.acquire(blocking=False))
                else:
                    outcome.append(await lock.acquire(blocking=False))

            task = asyncio.ensure_future(attempt())
            if scope == "task":
                cancels.append(task.cancel)
            assert await eventually(lambda: _held(b, (3, 4)), 5.0), _why_not(b, lock)
            for node in _nodes(b)[3:]:
                node.vouching.append(lambda: cancels[0]())  # after the ballot's own: the same turn
            if marked:
                for i in (3, 4):
                    _mark(faulty[i])
            if scope == "task":
                with pytest.raises(asyncio.CancelledError):
                    await task
            else:
                await task  # the scope swallows its own cancel
            assert outcome == [], outcome  # the cancel came before the acquire could return
            assert not lock.held
            assert await eventually(lambda: _keys(faulty, (2, 3, 4)) == [0, 0, 0], 2.0), _keys(faulty, (2, 3, 4))
            assert [faulty[i].command("GET", KEY) for i in (0, 1)] == [b"the other client"] * 2
    finally:
        _other_client_leaves(faulty)
