"""The fault-injection proxy itself, in front of real servers; and the pytest plugin, run as a user would."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from redlock_async.testing import Fault, LocalNode, LocalNodes, Proxy, ProxyState

PING = b"*1\r\n$4\r\nPING\r\n"
SLACK = 0.5  # generous upper margin on timings: these are correctness bounds, not benchmarks


def _set(key: str, value: str) -> bytes:
    return b"*3\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n" % (len(key), key.encode(), len(value), value.encode())


@pytest.fixture
def node() -> Iterator[LocalNode]:
    with LocalNodes(1) as nodes:
        yield nodes[0]


@pytest.fixture
def proxy(node: LocalNode) -> Iterator[Proxy]:
    with Proxy(node.port) as p:
        yield p


def _connect(proxy: Proxy, timeout: float = 2.0) -> socket.socket:
    return socket.create_connection(("127.0.0.1", proxy.port), timeout=timeout)


def _round_trip(sock: socket.socket, payload: bytes = PING) -> tuple[bytes, float]:
    """Send *payload*, wait for the first bytes back; (reply, seconds taken)."""
    started = time.monotonic()
    sock.sendall(payload)
    reply = sock.recv(4096)
    return reply, time.monotonic() - started


def _silent(sock: socket.socket, seconds: float) -> bool:
    """True when nothing at all (no bytes, no EOF, no reset) comes within *seconds*."""
    sock.settimeout(seconds)
    try:
        sock.recv(4096)
    except TimeoutError:
        return True
    except OSError:
        return False
    return False


def active(fault: Fault) -> bool:
    # A call, not the property itself: mypy would narrow the property across asserts.
    return fault.active


def _client(proxy: Proxy) -> redis.Redis:
    return redis.Redis(port=proxy.port, socket_timeout=2, retry=Retry(NoBackoff(), 0))


def test_forwards_both_ways(node: LocalNode, proxy: Proxy) -> None:
    assert proxy.url == f"redis://127.0.0.1:{proxy.port}"
    assert proxy.port != node.port
    assert proxy.upstream == ("127.0.0.1", node.port)
    client = _client(proxy)
    try:
        assert client.set("k", "v") is True
        assert client.get("k") == b"v"
        assert node.command("GET", "k") == b"v"  # the same server
    finally:
        client.close()
    stats = proxy.stats()
    assert stats.accepted >= 1
    assert stats.request_bytes > 0
    assert stats.reply_bytes > 0
    assert stats.dropped_bytes == 0
    assert proxy.state.healthy


@pytest.mark.serial
def test_latency_delays_each_direction_and_heals_at_once(proxy: Proxy) -> None:
    with _connect(proxy) as sock:
        assert _round_trip(sock)[0] == b"+PONG\r\n"
        with proxy.latency(0.1):  # both directions: the round trip takes 0.2 s more
            assert proxy.state == ProxyState(request_delay=0.1, reply_delay=0.1)
            reply, took = _round_trip(sock)
            assert reply == b"+PONG\r\n"
            assert 0.2 <= took < 0.2 + SLACK
        assert proxy.state.healthy
        for direction in ("reply", "request"):
            with proxy.latency(0.1, direction=direction):
                reply, took = _round_trip(sock)
                assert reply == b"+PONG\r\n"
                assert 0.1 <= took < 0.1 + SLACK, direction
        # Healing also frees bytes already waiting out a long latency.
        proxy.latency(30.0)
        sock.sendall(PING)
        assert _silent(sock, 0.2)
        proxy.heal()
        sock.settimeout(SLACK)
        assert sock.recv(4096) == b"+PONG\r\n"


def test_a_fault_with_a_duration_ends_by_itself(proxy: Proxy) -> None:
    fault = proxy.latency(0.05, direction="reply", duration=0.3)
    assert active(fault)
    assert proxy.state.reply_delay == 0.05
    time.sleep(0.3 + SLACK)
    assert not active(fault)
    assert proxy.state.healthy
    with pytest.raises(ValueError, match="duration"):
        proxy.blackhole(duration=0)
    with pytest.raises(ValueError, match="latency"):
        proxy.latency(-1)
    with pytest.raises(ValueError, match="direction"):
        proxy.latency(0.1, direction="sideways")  # type: ignore[arg-type]
    assert proxy.state.healthy


def test_ending_a_fault_leaves_later_and_other_faults_alone(proxy: Proxy) -> None:
    slow = proxy.latency(0.1)
    slower = proxy.latency(0.2, direction="reply")  # takes over the reply direction only
    hole = proxy.blackhole()
    slow.end()
    assert proxy.state == ProxyState(request_delay=0.0, reply_delay=0.2, blackholed=True)
    assert not active(slow)
    assert active(slower)
    hole.end()
    hole.end()  # idempotent
    assert proxy.state == ProxyState(reply_delay=0.2)
    proxy.heal()
    assert proxy.state.healthy
    assert not active(slower)


def test_drop_replies_loses_replies_but_the_command_runs(node: LocalNode, proxy: Proxy) -> None:
    with _connect(proxy) as sock:
        assert _round_trip(sock)[0] == b"+PONG\r\n"
        fault = proxy.drop_replies()
        sock.sendall(_set("dropped", "v"))
        assert _silent(sock, 0.3)  # the reply is lost, and the connection is not cut
        assert node.command("GET", "dropped") == b"v"  # but the SET ran
        assert proxy.stats().dropped_bytes == len(b"+OK\r\n")
        # A connection that lost bytes is out of step: ending the fault cuts it.
        fault.end()
        sock.settimeout(SLACK)
        with pytest.raises(ConnectionResetError):
            sock.recv(4096)
    assert proxy.stats().resets == 1
    with _connect(proxy) as sock:
        assert _round_trip(sock)[0] == b"+PONG\r\n"  # new connections work at once


def test_drop_replies_keeps_connections_that_lost_nothing(proxy: Proxy) -> None:
    with _connect(proxy) as idle, _connect(proxy) as busy:
        assert _round_trip(idle)[0] == b"+PONG\r\n"
        assert _round_trip(busy)[0] == b"+PONG\r\n"
        with proxy.drop_replies():
            busy.sendall(PING)
            assert _silent(busy, 0.2)
        assert _round_trip(idle)[0] == b"+PONG\r\n"
        busy.settimeout(SLACK)
        with pytest.raises(ConnectionResetError):
            busy.recv(4096)


def test_blackhole_is_silence_not_a_reset_and_holds_the_bytes(node: LocalNode, proxy: Proxy) -> None:
    with _connect(proxy) as sock:
        assert _round_trip(sock)[0] == b"+PONG\r\n"
        with proxy.blackhole():
            sock.sendall(_set("held", "v"))
            assert _silent(sock, 0.3)
            assert node.command("GET", "held") is None  # nothing reached the server
            with _connect(proxy) as late:  # new connections are accepted, and silent too
                late.sendall(PING)
                assert _silent(late, 0.1)
            assert proxy.stats().open_connections >= 1
        # Healed: the held request runs, and its reply comes back on the same connection.
        sock.settimeout(SLACK)
        assert sock.recv(4096) == b"+OK\r\n"
        assert node.command("GET", "held") == b"v"
        assert _round_trip(sock)[0] == b"+PONG\r\n"


def test_reset_cuts_every_connection(proxy: Proxy) -> None:
    with _connect(proxy) as a, _connect(proxy) as b:
        for sock in (a, b):
            assert _round_trip(sock)[0] == b"+PONG\r\n"
        assert proxy.reset() == 2
        for sock in (a, b):
            sock.settimeout(SLACK)
            with pytest.raises(ConnectionResetError):
                sock.recv(4096)
    with _connect(proxy) as sock:
        assert _round_trip(sock)[0] == b"+PONG\r\n"


@pytest.mark.serial
def test_a_server_that_is_down_refuses_through_the_proxy(node: LocalNode, proxy: Proxy) -> None:
    node.kill()
    started = time.monotonic()
    with pytest.raises(ConnectionError), _connect(proxy) as sock:  # reset during or right after the connect
        sock.settimeout(SLACK)
        _round_trip(sock)
    assert time.monotonic() - started < SLACK
    node.start()  # same port: the proxy reaches it again
    with _connect(proxy) as sock:
        assert _round_trip(sock)[0] == b"+PONG\r\n"


async def test_works_while_the_test_event_loop_is_blocked(proxy: Proxy) -> None:
    # A blocking client call inside the test's loop: a proxy that ran on this loop would never answer.
    client = _client(proxy)
    try:
        with proxy.latency(0.01):
            assert client.ping() is True
    finally:
        client.close()


def _open_fds() -> set[str] | None:
    try:
        return set(os.listdir("/proc/self/fd"))
    except OSError:
        return None


@pytest.mark.serial
def test_close_leaves_no_thread_socket_or_port(node: LocalNode) -> None:
    node.command("PING")  # the harness's own client connects before the count
    threads_before = set(threading.enumerate())
    fds_before = _open_fds()
    proxy = Proxy(node.port)
    socks = [_connect(proxy) for _ in range(3)]
    for sock in socks:
        assert _round_trip(sock)[0] == b"+PONG\r\n"
    proxy.blackhole()
    socks[0].sendall(PING)  # held bytes, and a pump waiting on the blackhole
    assert len(set(threading.enumerate()) - threads_before) == 1
    started = time.monotonic()
    proxy.close()
    assert time.monotonic() - started < SLACK
    assert proxy.closed
    for sock in socks:
        sock.settimeout(SLACK)
        with pytest.raises(ConnectionResetError):
            sock.recv(4096)
        sock.close()
    assert set(threading.enumerate()) == threads_before
    if fds_before is not None:
        assert _open_fds() == fds_before
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", proxy.port), timeout=SLACK).close()
    proxy.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        proxy.blackhole()


def test_proxied_local_nodes() -> None:
    threads_before = set(threading.enumerate())
    with LocalNodes(3, proxied=True) as nodes:
        proxies = nodes.proxies
        assert nodes.urls == [p.url for p in proxies]
        assert nodes.direct_urls == [f"redis://127.0.0.1:{n.port}" for n in nodes]
        assert all(p.upstream == ("127.0.0.1", n.port) for p, n in zip(proxies, nodes, strict=True))
        client = redis.Redis.from_url(nodes.urls[0], socket_timeout=2, retry=Retry(NoBackoff(), 0))
        try:
            assert client.set("k", "v") is True
            nodes[0].proxy.blackhole()
            assert nodes[0].command("GET", "k") == b"v"  # command() goes around the proxy
            nodes.heal()
            assert proxies[0].state.healthy
            assert client.get("k") == b"v"
            nodes[0].restart(keep_data=True)
            assert nodes[0].url == proxies[0].url  # the same proxy, in front of the restarted server
            assert client.get("k") == b"v"  # a new connection, after the restart cut the old one
        finally:
            client.close()
        assert "via proxy" in repr(nodes[0])
    assert all(p.closed for p in proxies)
    assert set(threading.enumerate()) == threads_before


def test_unproxied_nodes_are_unchanged(node: LocalNode) -> None:
    assert node.url == node.direct_url == f"redis://127.0.0.1:{node.port}"
    with pytest.raises(RuntimeError, match="proxied=True"):
        node.proxy  # noqa: B018
    with pytest.raises(ValueError, match="proxied and unix_socket"):
        LocalNode(proxied=True, unix_socket=True)


PLUGIN_USER_TESTS = """
import pytest

from redlock_async.testing._history import Section


def test_five_proxied_nodes_by_default(redlock_nodes):
    assert len(redlock_nodes) == 5
    assert redlock_nodes.urls == [p.url for p in redlock_nodes.proxies]
    redlock_nodes[0].proxy.blackhole()
    assert redlock_nodes[0].command("PING") is True


@pytest.mark.redlock_nodes(3, proxied=False)
def test_marker_sets_count_and_proxies(redlock_nodes):
    assert len(redlock_nodes) == 3
    assert redlock_nodes.urls == redlock_nodes.direct_urls


def test_clean_history_passes(redlock_history):
    redlock_history.sections.append(Section("a", "t1", None, 0.0, 1.0))
    redlock_history.sections.append(Section("b", "t2", None, 1.0, 2.0))


def test_overlap_fails_the_test(redlock_history):
    redlock_history.sections.append(Section("a", "t1", None, 0.0, 1.0))
    redlock_history.sections.append(Section("b", "t2", None, 0.5, 2.0))
"""


@pytest.mark.slow
def test_pytest_plugin_as_users_enable_it(pytester: pytest.Pytester) -> None:
    pytester.makeconftest('pytest_plugins = ["redlock_async.testing.pytest_plugin"]\n')
    pytester.makepyfile(test_user=PLUGIN_USER_TESTS)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--strict-markers")
    result.assert_outcomes(passed=3, failed=1)
    result.stdout.fnmatch_lines(["*test_overlap_fails_the_test*", "*1 safety violations in 2 sections*"])
