"""pytest fixtures for testing code that uses redlock_async, on real local servers with network faults.

Enable it in your ``conftest.py`` (it is not loaded automatically)::

    pytest_plugins = ["redlock_async.testing.pytest_plugin"]

Fixtures:

* ``redlock_nodes``: a started :class:`~redlock_async.testing.LocalNodes` of the test's own,
  5 nodes each behind a :class:`~redlock_async.testing.Proxy`, closed after the test.
  ``@pytest.mark.redlock_nodes(3)`` changes the count, ``proxied=False`` drops the proxies.
* ``redlock_cluster``: a started :class:`~redlock_async.testing.LocalCluster` of the test's own
  (3 shards of a master and a replica), closed after the test; its ``url`` is a voter.
* ``redlock_sentinels``: a started :class:`~redlock_async.testing.LocalSentinels` of the test's
  own (a master, a replica, 3 Sentinels), closed after the test; its ``url`` is a voter.
* ``redlock_history``: a :class:`~redlock_async.testing.History`; once the test body has run,
  it is checked, and any overlap of critical sections or fencing token that went backwards
  fails the test.

See docs/testing.md for examples.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator

import pytest

from redlock_async.testing._history import History
from redlock_async.testing._servers import LocalNodes
from redlock_async.testing._shapes import LocalCluster, LocalSentinels

__all__ = ["redlock_cluster", "redlock_history", "redlock_nodes", "redlock_sentinels"]

_MARKER = "redlock_nodes"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{_MARKER}(count=5, *, proxied=True): the redlock_nodes fixture's node count, and whether they are proxied",
    )


def _node_options(request: pytest.FixtureRequest) -> tuple[int, bool]:
    marker = request.node.get_closest_marker(_MARKER)
    if marker is None:
        return 5, True

    def options(count: int = 5, *, proxied: bool = True) -> tuple[int, bool]:
        return count, proxied

    try:
        count, proxied = options(*marker.args, **marker.kwargs)
    except TypeError as exc:
        pytest.fail(f"@pytest.mark.{_MARKER}(count=5, *, proxied=True): {exc}", pytrace=False)
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        pytest.fail(f"@pytest.mark.{_MARKER}: count must be a positive int, got {count!r}", pytrace=False)
    return count, bool(proxied)


@pytest.fixture
def redlock_nodes(request: pytest.FixtureRequest) -> Iterator[LocalNodes]:
    """Started local nodes of this test's own (5, proxied, unless ``@pytest.mark.redlock_nodes`` says otherwise)."""
    count, proxied = _node_options(request)
    with LocalNodes(count, proxied=proxied) as nodes:
        yield nodes


@pytest.fixture
def redlock_cluster() -> Iterator[LocalCluster]:
    """A started local Redis/Valkey Cluster of this test's own: 3 shards, each a master and a replica."""
    with LocalCluster(3, 1) as cluster:
        yield cluster


@pytest.fixture
def redlock_sentinels() -> Iterator[LocalSentinels]:
    """A started Sentinel-managed group of this test's own: a master, a replica and 3 Sentinels."""
    with LocalSentinels(1, 3) as group:
        yield group


@pytest.fixture
def redlock_history() -> History:
    """A History of critical sections, checked once the test body has run."""
    return History()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    # Checked as part of the test itself, so a violation is a failure of the test, not an error at teardown.
    result = yield
    funcargs = getattr(item, "funcargs", {})
    history = funcargs.get("redlock_history")
    if isinstance(history, History):
        history.check()
    return result
