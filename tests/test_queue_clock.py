"""The premises of a grant's validity (docs/algorithm.md, "The grant queue"), checked on the real server.

A grant heard as a word counts from our own request's send time *L*, plus the node-clock time
between our script's run (*N*, from its reply) and the grant (*G*, in the word). That needs:

1. *N* is never earlier than *L*: the time our scripts read is not a stale cache from before
   the request arrived (an idle server, a busy one);
2. the key a grant sets expires no earlier than ``G + ttl`` on the node's clock.

Both compare the node's clock with ours: the servers run on this machine, so wall clocks agree.
"""

from __future__ import annotations

import time

import redis

from redlock_async._queue import queue_keys
from redlock_async._scripts import QUEUE_ENTER, QUEUE_LEAVE

from .conftest import Cluster

KEYS = queue_keys(b"redlock:clock")
ENTER, LEAVE = QUEUE_ENTER.sha.decode(), QUEUE_LEAVE.sha.decode()


def enter(r: redis.Redis, token: str, score: int, ttl_ms: int = 10_000) -> list[object]:
    reply: list[object] = r.evalsha(ENTER, 3, *KEYS, token, ttl_ms, score, 1000)
    return reply


def test_the_node_time_in_a_reply_is_never_before_the_request_was_sent(cluster: Cluster) -> None:
    r = redis.Redis.from_url(cluster.urls[0])
    r.script_load(QUEUE_ENTER.source)
    early = []
    for i in range(120):
        if i % 3 == 0:
            time.sleep(0.02)  # an idle server: its cached clock, if any, is old
        sent = time.time_ns() // 1000
        reply = enter(r, f"t{i}", i)
        node_us = int(reply[1])  # type: ignore[call-overload]
        if node_us < sent:
            early.append(sent - node_us)
    assert early == [], f"the node's time was earlier than our send by {early} us"


def test_a_granted_key_expires_no_earlier_than_the_grant_time_plus_its_ttl(cluster: Cluster) -> None:
    r = redis.Redis.from_url(cluster.urls[0])
    r.script_load(QUEUE_ENTER.source)
    r.script_load(QUEUE_LEAVE.source)
    pubsub = r.pubsub()  # type: ignore[no-untyped-call]
    pubsub.subscribe(KEYS[0])
    assert pubsub.get_message(timeout=1.0) is not None  # the subscribe confirmation
    checked = 0
    for i in range(20):
        assert int(enter(r, f"holder{i}", 2 * i)[0]) == 1  # type: ignore[call-overload]
        assert int(enter(r, f"waiter{i}", 2 * i + 1, ttl_ms=5_000)[0]) == 0  # type: ignore[call-overload]
        time.sleep(0.003)
        r.evalsha(LEAVE, 3, *KEYS, f"holder{i}")
        message = pubsub.get_message(timeout=1.0)
        while message is not None and not bytes(message["data"]).startswith(b"g"):
            message = pubsub.get_message(timeout=1.0)  # the holder's own grant, from its first entry
        assert message is not None
        grant_us = int(bytes(message["data"]).split(b":")[1])
        expires_ms = int(r.pexpiretime("redlock:clock"))
        assert r.get(KEYS[0]) == f"waiter{i}".encode()
        assert expires_ms * 1000 >= grant_us + 5_000_000 - 1000, (expires_ms, grant_us)  # to the ms it is stored in
        r.evalsha(LEAVE, 3, *KEYS, f"waiter{i}")
        checked += 1
    pubsub.close()
    assert checked == 20
