"""_requests without servers: what one acquire, release or extend round sends to every node, and
what it decides from the replies (the shared fake nodes of tests/fakes.py; the test answers)."""

from __future__ import annotations

import asyncio
import contextlib

from redlock_async._core._algorithm import NO, PENDING, YES
from redlock_async._core._settings import Settings
from redlock_async._rounds import _requests
from redlock_async._scripts import ACQUIRE_FENCED, FENCE, FENCED_BY, RELEASE

from .fakes import FakeNode, as_nodes, fake_nodes

KEY, FENCE_KEY = b"redlock:r", b"redlock-fence:r"
SETTINGS = Settings(ttl=10.0, node_timeout=0.5)
FENCED = Settings(ttl=10.0, node_timeout=0.5, fencing=True)


async def sent(nodes: list[FakeNode], count: int = 1) -> None:
    """Let the round go out (it is queued synchronously, in the task's first step): *count* requests each."""
    for _ in range(50):
        if all(len(node.sent) >= count for node in nodes):
            return
        await asyncio.sleep(0)
    raise AssertionError(f"not sent: {[node.sent for node in nodes]}")


async def test_a_majority_of_sets_grants_and_nothing_is_given_back() -> None:
    nodes = fake_nodes()
    task = asyncio.create_task(_requests.attempt(as_nodes(nodes), (KEY,), (FENCE_KEY,), SETTINGS, b"me"))
    await sent(nodes)
    assert all(node.sent[0][:2] == (b"SET", KEY) and node.sent[0][3:5] == (b"NX", b"PX") for node in nodes)
    assert len({node.sent[0][2] for node in nodes}) == 1  # one token, on every node
    for node in nodes[:3]:
        node.answer(b"OK")
    result = await asyncio.wait_for(task, 1.0)
    assert result.validity is not None
    assert 9.8 < result.validity <= 10.0
    assert result.holders == [0, 1, 2]
    assert list(result.votes) == [YES, YES, YES, PENDING, PENDING]  # decided without the last two
    assert result.token.endswith(b"~me")
    assert all(len(node.sent) == 1 for node in nodes)  # no release


async def test_a_lost_round_is_released_on_every_node_even_those_that_said_no() -> None:
    nodes = fake_nodes()
    task = asyncio.create_task(_requests.attempt(as_nodes(nodes), (KEY,), (), SETTINGS, b"me"))
    await sent(nodes)
    token = nodes[0].sent[0][2]
    nodes[0].answer(b"OK")
    for node in nodes[1:4]:
        node.answer(None)  # held by another client
    # A majority can no longer say yes: the round is lost, and given back everywhere (a reply can be
    # lost after the SET ran), before the attempt returns.
    await sent(nodes, 2)
    assert all(node.sent[-1][:4] == (b"EVALSHA", RELEASE.sha, b"1", KEY) for node in nodes)
    assert all(node.sent[-1][4] == token for node in nodes)
    assert not task.done()  # it waits for the release of the node that said yes
    nodes[0].answer(1, latest=True)
    nodes[4].answer(1, latest=True)  # the one that never answered the SET: its release too
    result = await asyncio.wait_for(task, 1.0)
    assert result.validity is None
    assert list(result.votes)[:4] == [YES, NO, NO, NO]


async def test_a_round_cancelled_mid_vote_is_given_back_before_the_cancellation_goes_on() -> None:
    nodes = fake_nodes()
    task = asyncio.create_task(_requests.attempt(as_nodes(nodes), (KEY,), (), SETTINGS, b"me"))
    await sent(nodes)
    nodes[0].answer(b"OK")
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    assert all(node.sent[-1][:2] == (b"EVALSHA", RELEASE.sha) for node in nodes)


async def test_a_fenced_grant_takes_one_more_than_the_largest_counter_and_fences_a_majority() -> None:
    nodes = fake_nodes()
    task = asyncio.create_task(_requests.attempt(as_nodes(nodes), (KEY,), (FENCE_KEY,), FENCED, b"me"))
    await sent(nodes)
    assert all(node.sent[0][:5] == (b"EVALSHA", ACQUIRE_FENCED.sha, b"2", KEY, FENCE_KEY) for node in nodes)
    for node, counter in zip(nodes[:3], (4, 7, 2), strict=True):
        node.answer(counter)
    await sent(nodes[:3], 2)
    fences = [node.sent[-1] for node in nodes[:3]]
    fenced = (b"EVALSHA", FENCE.sha, b"3", KEY, FENCE_KEY, FENCE_KEY + FENCED_BY)
    assert all(fence[:6] == fenced and fence[7] == b"8" for fence in fences)
    assert not task.done()  # granted only once a majority holds the new counter
    for node in nodes[:3]:
        node.answer(1, latest=True)
    result = await asyncio.wait_for(task, 1.0)
    assert result.fencing_tokens == (8,)
    assert result.validity is not None


def test_a_release_skips_the_nodes_it_never_reached() -> None:
    nodes = fake_nodes()
    _requests.send_release(as_nodes(nodes), (KEY,), b"token", skip=[1, 3])
    assert [len(node.sent) for node in nodes] == [1, 0, 1, 0, 1]
