"""A lease that ran out while the body blocked the loop, whose release the nodes then refused (found by the
attack on issue 38 items 4 and 5): the LockLost said "2 of the 2 nodes that held it did not answer the
release (nodes unreachable ...)" while both had answered, with NOPERM. An error answered is not a node
unreachable: the words no longer blame the network, and the votes carry the reasons."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from redlock_async import LockLost, Redlock
from redlock_async.testing import LocalNodes

from .test_acl import documented_rules, urls_of


@pytest.fixture
def nodes() -> Iterator[LocalNodes]:
    with LocalNodes(3, password="default-pw", acl=[documented_rules()]) as nodes:
        yield nodes


async def test_a_refused_release_after_an_overrun_is_not_called_unreachable(nodes: LocalNodes) -> None:
    async with Redlock(urls_of(nodes), ttl=1.0) as redlock:
        with pytest.raises(LockLost) as caught:
            async with redlock.lock("ow:lock", ttl=1.0):
                for i in (0, 1):
                    nodes[i].command("ACL", "SETUSER", "redlock", "-eval", "-evalsha")
                time.sleep(1.5)  # the loop blocked past the validity: the nodes decide at release
        words = str(caught.value)
        assert "ran out while the body ran" in words, words
        assert "unreachable" not in words, words  # before: "nodes unreachable"
        assert "did not answer" not in words, words
        assert "could not run the release" in words, words
        assert sum("NOPERM" in outcome.detail for outcome in caught.value.outcomes) >= 1, caught.value.outcomes
