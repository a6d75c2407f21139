"""The clock nemesis (redlock_async.testing: LocalNode(clock=True), NodeClock) on real servers.

Redis and Valkey expire keys by the wall clock: each test shows the fault a lock library must
survive, on one node whose clock alone is faked (libfaketime), as the issue measured them.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from redlock_async.testing import LocalNodes

from .conftest import needs_faketime

pytestmark = needs_faketime


@pytest.fixture(scope="module")
def clocked() -> Iterator[LocalNodes]:
    with LocalNodes(2, clock=True) as nodes:
        yield nodes


@pytest.fixture(autouse=True)
def fresh(clocked: LocalNodes) -> None:
    for node in clocked:
        node.clock.reset()
        node.command("FLUSHALL")


def pttl(nodes: LocalNodes, i: int, key: str) -> int:
    value = nodes[i].command("PTTL", key)
    assert isinstance(value, int)
    return value


def test_a_step_forward_expires_a_key_at_once_on_that_node_only(clocked: LocalNodes) -> None:
    for node in clocked:
        node.command("SET", "k", "v", "PX", 10_000)
    clocked[0].clock.step(30)
    assert clocked[0].clock.offset() == pytest.approx(30, abs=0.05)
    assert clocked[0].time() - time.time() == pytest.approx(30, abs=0.1)
    assert clocked[0].command("EXISTS", "k") == 0
    assert clocked[1].command("EXISTS", "k") == 1  # the other node's clock is real


def test_a_step_back_stretches_a_key(clocked: LocalNodes) -> None:
    clocked[0].command("SET", "k", "v", "PX", 10_000)
    clocked[0].clock.step(-30)
    assert 39_000 < pttl(clocked, 0, "k") <= 40_000  # 10 s left, read 30 s earlier


def test_a_clock_running_twice_as_fast_halves_a_lease(clocked: LocalNodes) -> None:
    clocked[0].clock.run_at(2.0)
    clocked[0].command("SET", "k", "v", "PX", 1_000)
    time.sleep(0.6)  # 1.2 node seconds
    assert clocked[0].command("EXISTS", "k") == 0


def test_a_frozen_clock_keeps_a_key_past_its_ttl_and_reset_ends_it(clocked: LocalNodes) -> None:
    clocked[0].command("SET", "k", "v", "PX", 300)
    clocked[0].clock.freeze()
    time.sleep(0.5)
    assert clocked[0].command("EXISTS", "k") == 1
    assert clocked[0].clock.rate == 0
    clocked[0].clock.reset()
    assert clocked[0].command("EXISTS", "k") == 0


def test_a_restarted_node_keeps_its_clock(clocked: LocalNodes) -> None:
    clocked[1].clock.step(120)
    clocked[1].restart(keep_data=False)
    assert clocked[1].time() - time.time() == pytest.approx(120, abs=0.5)


@pytest.mark.parametrize("change", ["step", "rate"])
def test_a_change_the_server_reads_late_still_shows_as_asked(clocked: LocalNodes, change: str) -> None:
    """libfaketime starts an ``@date xrate`` spec at the server's first clock read after it is written:
    a server that reads it late (busy, here paused 0.3 s) ran behind by the delay times the rate, for
    good, and the change was reported as failed after 3 s (CI, on a loaded box: "+119.923 s from ours,
    +119.997 s was asked for")."""
    node = clocked[0]
    node.pause()
    threading.Timer(0.3, node.resume).start()
    asked = time.time()
    if change == "step":
        node.clock.step(120)
    else:
        node.clock.run_at(2.0)
    assert node.time() - node.clock.now() == pytest.approx(0, abs=0.1)
    ran = time.time() - asked  # twice as fast since it was asked: ahead by as much
    assert node.clock.offset() == pytest.approx(120 if change == "step" else ran, abs=0.1)


def test_a_node_restarted_long_after_its_clock_changed_keeps_it(clocked: LocalNodes) -> None:
    """The spec read again at the server's start began the clock anew there: the time since the change
    was lost (the node came back behind by that much)."""
    clocked[1].clock.run_at(2.0)
    time.sleep(1.0)
    offset = clocked[1].clock.offset()  # about +1 s
    clocked[1].restart(keep_data=False)
    assert clocked[1].time() - clocked[1].clock.now() == pytest.approx(0, abs=0.1)
    assert clocked[1].clock.offset() > offset  # it ran on, twice as fast, through the restart


def test_bad_rates_are_refused_with_what_to_do(clocked: LocalNodes) -> None:
    with pytest.raises(ValueError, match="freeze"):
        clocked[0].clock.run_at(0)


def test_clock_control_needs_clock_true() -> None:
    with LocalNodes(1) as nodes, pytest.raises(RuntimeError, match="clock=True"):
        nodes[0].clock.step(1)
