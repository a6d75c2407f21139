"""Voter URLs of a Cluster (``redis+cluster://``) and a Sentinel group (``redis+sentinel://``): taken apart,
and every bad form refused with words that say what to write instead, never quoting a password."""

from __future__ import annotations

import re

import pytest

from redlock_async import Redlock
from redlock_async._nodes._endpoint import endpoint_for, endpoints_for
from redlock_async._nodes._voter_urls import CLUSTER, SENTINEL, voter_url


def test_plain_urls_are_not_voter_urls() -> None:
    for url in ("redis://h:1", "rediss://h:1", "unix:///tmp/s", "redis://u:p+q@h:1"):
        assert voter_url(url, 0) is None


def test_a_cluster_url_with_seeds() -> None:
    voter = voter_url("redis+cluster://u:pw@a:7000?seed=b:7001&seed=[::1]:7002&seed=a:7000", 0)
    assert voter is not None
    assert voter.kind == CLUSTER
    assert voter.addresses == (("a", 7000), ("b", 7001), ("::1", 7002))
    assert voter.base == "redis://u:pw@a:7000"
    tls = voter_url("rediss+cluster://a?ssl_cert_reqs=none", 0)
    assert tls is not None
    assert tls.base == "rediss://a:6379?ssl_cert_reqs=none"


def test_a_sentinel_url_with_more_sentinels_and_their_password() -> None:
    voter = voter_url("redis+sentinel://:pw@s1:26379/my-service?sentinel=s2:26380&db=2&sentinel_password=spw", 0)
    assert voter is not None
    assert voter.kind == SENTINEL
    assert voter.service == "my-service"
    assert voter.addresses == (("s1", 26379), ("s2", 26380))
    assert voter.base == "redis://:pw@s1:26379?db=2"
    assert voter.sentinel_password == "spw"
    assert voter_url("redis+sentinel://s1/svc", 0).addresses == (("s1", 26379),)  # type: ignore[union-attr]


def test_a_sentinel_endpoint_names_its_sentinels_and_service() -> None:
    endpoint = endpoint_for("rediss+sentinel://u:pw@s1:1/svc?sentinel=s2:2&ssl_cert_reqs=none", 3)
    assert endpoint.service == "svc"
    assert endpoint.name == "sentinel:s1:1/svc"
    assert [(s.host, s.port, s.password) for s in endpoint.sentinels] == [("s1", 1, None), ("s2", 2, None)]
    assert endpoint.password == "pw"  # the data nodes'
    assert endpoint.tls is not None
    assert all(s.tls is endpoint.tls for s in endpoint.sentinels)
    assert "pw" not in repr(endpoint)


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("redis+sentinel://s1:26379", "names no service"),
        ("redis+sentinel://s1:26379/", "names no service"),
        ("redis+sentinel://s1:26379/svc/2", "write redis+sentinel://HOST:PORT/SERVICE"),
        ("redis+sentinel://s1:x/svc", "port that is not a number"),
        ("redis+sentinel://s1:99999/svc", "port that is not a number"),
        ("redis+sentinel:///svc", "names no host"),
        ("redis+sentinel://s1/svc?sentinel=s2", "sentinel='s2': each sentinel= is HOST:PORT"),
        ("redis+sentinel://s1/svc?sentinel=u:p@s2:1", "each sentinel= is HOST:PORT"),
        ("redis+sentinel://s1/svc?seed=s2:1", "seed=, which is not for this kind of voter"),
        ("redis+cluster://a:1/2", "a Cluster has db 0 only"),
        ("redis+cluster://a:1?db=2", "a Cluster has db 0 only"),
        ("redis+cluster://a:1?sentinel=b:2", "sentinel=, which is not for this kind of voter"),
        ("redis+cluster://a:1?sentinel_password=x", "only a redis+sentinel:// URL takes"),
        ("redis+cluster://a:1?seed=b:", "each seed= is HOST:PORT"),
        ("unix+cluster:///tmp/s", "scheme unix+cluster://, which is not a voter"),
        ("redis+shards://a:1", "write redis+cluster://HOST:PORT"),
    ],
)
def test_bad_forms_say_what_to_write(url: str, words: str) -> None:
    with pytest.raises(ValueError, match=re.escape(words)) as info:
        endpoint_for(url, 2)
    assert str(info.value).startswith("nodes[2] ")


def test_errors_never_quote_a_password() -> None:
    for url in (
        "redis+sentinel://:hunter2@s1:1",
        "redis+sentinel://:hunter2#x@s1:1/svc",
        "redis+cluster://:hunter2@a:1/3",
        "redis+sentinel://:hunter2@s1:x/svc",
        "redis+cluster://:hunter2@a:1?seed=b",
    ):
        with pytest.raises(ValueError, match=r"^nodes\[0\] ") as info:
            endpoint_for(url, 0)
        assert "hunter2" not in str(info.value)


def test_a_cluster_voter_is_accepted_beside_standalone_ones_with_its_seeds_and_settings() -> None:
    redlock = Redlock(["redis://127.0.0.1:1", "redis+cluster://u:pw@127.0.0.1:2?seed=h:3", "redis://127.0.0.1:3"])
    assert redlock.nodes == ("127.0.0.1:1", "cluster:127.0.0.1:2", "127.0.0.1:3")
    endpoint = endpoint_for("rediss+cluster://u:pw@a:2?seed=b:3&ssl_cert_reqs=none", 0)
    assert endpoint.cluster
    assert endpoint.seeds == (("a", 2), ("b", 3))
    assert (endpoint.username, endpoint.password) == ("u", "pw")
    assert endpoint.tls is not None
    assert endpoint.server_hostname == "a"
    assert "pw" not in repr(endpoint)


def test_one_cluster_twice_is_refused() -> None:
    with pytest.raises(ValueError, match=r"nodes\[1\] \(cluster:a:1\) is the same server as nodes\[0\]"):
        endpoints_for(["redis+cluster://b:2?seed=a:1", "redis+cluster://a:1?seed=b:2"])


def test_one_sentinel_group_twice_is_refused() -> None:
    with pytest.raises(ValueError, match=r"nodes\[1\] \(sentinel:b:2/svc\) is the same server as nodes\[0\]"):
        endpoints_for(["redis+sentinel://a:1/svc?sentinel=b:2", "redis+sentinel://b:2/svc?sentinel=a:1"])
    two = endpoints_for(["redis+sentinel://a:1/one", "redis+sentinel://a:1/two", "redis://a:1"])
    assert [e.name for e in two] == ["sentinel:a:1/one", "sentinel:a:1/two", "a:1"]
