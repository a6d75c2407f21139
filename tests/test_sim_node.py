"""The simulated node against a real valkey-server: random command and script sequences, replayed on both,
give the same replies (times and ttls within their reading's distance). Plus the node's own clock, faults
and pub/sub, which a server cannot be made to show on demand."""

from __future__ import annotations

import math
import os
import random
import re
import socket
import time
from typing import Any

import hiredis
import pytest

from redlock_async._scripts import SCRIPTS, Script
from redlock_async.testing.sim._node import WALL_START, SimNode
from redlock_async.testing.sim._store import Error, Status
from tests.conftest import Cluster

SEQUENCES = int(os.environ.get("REDLOCK_SIM_DIFF_SEQUENCES", "1500"))
STEPS = 12

_NUMERIC_WORDS = ("ms", "millisecond", "integer", "number", "limit", "count", "score", "ttl", "time", "keep", "life")
_TOKENS = [b"t1", b"t2", b"t3", b"{r}k1", b""]
_TIMES = [b"100000", b"50000", b"200000", b"0", b"-1", b"1700000000000"]
"""A ttl, a life, a score: none so short that it ends between the server's reading and the model's."""
_NUMBERS = [b"100000", b"50000", b"200000", b"3", b"2", b"1", b"0", b"-1", b"1700000000000", b"x"]
_ODD = [*_TOKENS, b"3", b"0", b"-1", b"x"]
"""What any argument may be, now and then (no large number: a limit of 10**12 is a loop that long)."""


def _shape(script: Script) -> tuple[int, list[list[bytes]]]:
    """(how many KEYS, per ARGV: the values to pick from, by what its header says it is)."""
    source = script.source.decode()
    keys = max((int(n) for n in re.findall(r"KEYS\[(\d+)\]", source)), default=0)
    argv = max((int(n) for n in re.findall(r"ARGV\[(\d+)\]", source)), default=0)
    numeric = []
    for i in range(1, argv + 1):
        header = re.search(rf"-- ARGV\[{i}\](.*)", source)
        text = header.group(1).lower() if header else ""
        if "limit" in text or "count" in text or "slot" in text:
            numeric.append([b"1", b"2", b"3", b"-1"])  # (a limit of 100000 has scripts loop 100000 times)
        elif any(word in text for word in _NUMERIC_WORDS) or f"tonumber(ARGV[{i}])" in source:
            numeric.append(_TIMES)
        else:
            numeric.append(_TOKENS)
    return keys, numeric


_SHAPES = {script.sha: _shape(script) for script in SCRIPTS}


def _key(rng: random.Random, i: int) -> bytes:
    return b"{r}k%d" % i if rng.random() < 0.75 else rng.choice([b"{r}k1", b"{r}k2", b"{r}k3", b"{r}f", b"{r}s"])


def _step(rng: random.Random) -> list[bytes]:
    """One random command: a script (most often), or a plain command the library sends."""
    if rng.random() < 0.6:
        script = rng.choice(SCRIPTS)
        keys, numeric = _SHAPES[script.sha]
        args = [rng.choice(pool) if rng.random() < 0.9 else rng.choice(_ODD) for pool in numeric]
        head = [b"EVALSHA", script.sha] if rng.random() < 0.8 else [b"EVAL", script.source]
        return [*head, b"%d" % keys, *(_key(rng, i) for i in range(1, keys + 1)), *args]
    key = _key(rng, rng.randint(1, 3))
    token = rng.choice(_TOKENS)
    return rng.choice(
        [
            [b"SET", key, token, b"NX", b"PX", rng.choice(_NUMBERS[:3])],
            [b"SET", key, token],
            [b"SET", key, token, b"PX", rng.choice([b"0", b"x", b"100000"]), b"KEEPTTL"],
            [b"GET", key],
            [b"MGET", key, b"{r}k2", b"{r}f"],
            [b"PTTL", key],
            [b"PEXPIRE", key, rng.choice([*_TIMES, b"x"])],
            [b"DEL", key, b"{r}k2"],
            [b"EXISTS", key],
            [b"TYPE", key],
            [b"SMEMBERS", key],
            [b"SADD", key, token],
            [b"SREM", key, token],
            [b"ZADD", key, rng.choice(_NUMBERS), token],
            [b"ZRANGE", key, b"0", b"-1", b"WITHSCORES"],
            [b"ZPOPMIN", key],
            [b"HSET", key, token, rng.choice(_NUMBERS)],
            [b"HGET", key, token],
            [b"PUBLISH", key, token],
            [b"SCAN", b"0", b"MATCH", b"{r}k*", b"COUNT", b"1000"],
            [b"SCRIPT", b"FLUSH"],
            [b"TIME"],
        ]
    )


def _norm(reply: Any, command: bytes) -> Any:
    """A reply with what differs between two readings of a clock taken apart (times, ttls) made comparable."""
    if isinstance(reply, hiredis.ReplyError | Error):
        return ("error", str(reply).split(" ", 1)[0])
    if command == b"TIME" and isinstance(reply, list):
        return ("about", int(reply[0]) * 1_000_000 + int(reply[1]))
    if isinstance(reply, list):
        items = [_norm(item, command) for item in reply]
        if command in (b"SMEMBERS", b"SCAN"):
            items.sort(key=repr)
        return items
    if isinstance(reply, Status):
        return bytes(reply)
    if isinstance(reply, bytes):
        return re.sub(rb"\d{10,}", b"T", reply)
    if isinstance(reply, int) and (abs(reply) >= 1000 or (command == b"PTTL" and reply > 0)):
        return ("about", reply)  # (a ttl a script computed from its node's time: a reading apart)
    return reply


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, tuple) and isinstance(b, tuple) and a[:1] == b[:1] == ("about",):
        return math.isclose(a[1], b[1], rel_tol=1e-6, abs_tol=100)
    return bool(a == b)


@pytest.mark.serial  # the server runs a sequence, then the model: load between them moves ttls computed in scripts
def test_differential_against_valkey(cluster: Cluster) -> None:
    """SEQUENCES random sequences of STEPS commands each, on a flushed server and a fresh model. The seed
    is fixed (REDLOCK_SIM_DIFF_SEED=random draws one, and a failure names it for its replay)."""
    url = cluster.urls[0]
    chosen = os.environ.get("REDLOCK_SIM_DIFF_SEED", "20261128")
    seed = random.randrange(2**32) if chosen == "random" else int(chosen)
    rng = random.Random(seed)
    compared = 0
    host, _, port = url.removeprefix("redis://").partition(":")
    node = SimNode("model", lambda: time.time() - WALL_START, random.Random(seed))
    with socket.create_connection((host, int(port.split("/")[0])), timeout=10) as real:
        _replay(real, [[b"SCRIPT", b"FLUSH"]])
        for sequence in range(SEQUENCES):
            steps = [_step(rng) for _ in range(STEPS)]
            if rng.random() < 0.3:  # as the library does on each connection (the scripts are kept between sequences)
                steps[:0] = [[b"SCRIPT", b"LOAD", script.source] for script in SCRIPTS]
            steps.insert(0, [b"FLUSHALL"])
            try:
                theirs = _replay(real, steps)
            except TimeoutError:
                shown = [_shown(s) for s in steps if s[0] != b"SCRIPT"]
                pytest.fail(f"seed {seed} sequence {sequence}: no reply in 10 s to {shown}")
            ours = [node.execute(None, step)[0] for step in steps]
            for step, mine, real_reply in zip(steps, ours, theirs, strict=True):
                name = step[0].upper()
                if not _same(_norm(mine, name), _norm(real_reply, name)):
                    pytest.fail(
                        f"seed {seed} sequence {sequence}: {_shown(step)!r}\n  model: {mine!r}\n"
                        f"  valkey: {real_reply!r}\n  sequence: {[_shown(s) for s in steps if s[0] != b'SCRIPT']}"
                    )
                compared += 1
    assert compared >= SEQUENCES * STEPS


def _shown(step: list[bytes]) -> list[bytes]:
    """A step as a failure shows it: a script by the first words of its source's comment."""
    if step[0] == b"EVAL":
        return [b"EVAL", step[1].strip()[:60], *step[2:]]
    return step


def _replay(real: socket.socket, steps: list[list[bytes]]) -> list[Any]:
    """The server's replies to *steps*, sent in one write (errors as hiredis.ReplyError, with their text)."""
    real.sendall(b"".join(hiredis.pack_command(tuple(step)) for step in steps))  # type: ignore[arg-type]
    reader = hiredis.Reader()
    replies: list[Any] = []
    while len(replies) < len(steps):
        data = real.recv(1 << 16)
        assert data, "the server closed the connection"
        reader.feed(data)
        while (reply := reader.gets()) is not False:
            replies.append(reply)
    return replies


def test_expiry_reads_the_nodes_clock() -> None:
    now = [0.0]
    node = SimNode("n", lambda: now[0], random.Random(0))
    assert node.command([b"SET", b"k", b"v", b"PX", b"1000"]) == b"OK"
    now[0] = 0.5
    assert node.command([b"PTTL", b"k"]) == 500
    node.step_clock(0.6)  # the node's clock jumps: its keys expire by it, whatever true time says
    assert node.command([b"GET", b"k"]) is None
    node.set_clock_rate(2.0)
    node.command([b"SET", b"k", b"v", b"PX", b"1000"])
    now[0] = 1.0  # half a second of true time: a second on this node's clock
    assert node.command([b"EXISTS", b"k"]) == 0


def test_restart_new_run_id_scripts_forgotten_data_kept_or_lost() -> None:
    node = SimNode("n", lambda: 0.0, random.Random(0))
    script = SCRIPTS[0]
    node.command([b"SCRIPT", b"LOAD", script.source])
    node.command([b"SET", b"k", b"v"])
    before = node.run_id
    node.restart(keep_data=True)
    assert node.run_id != before
    assert node.command([b"GET", b"k"]) == b"v"
    reply = node.command([b"EVALSHA", script.sha, b"0"])
    assert isinstance(reply, Error)
    assert reply.startswith("NOSCRIPT")
    node.restart(keep_data=False)
    assert node.command([b"GET", b"k"]) is None


def test_pubsub_as_the_listener_uses_it() -> None:
    node = SimNode("n", lambda: 0.0, random.Random(0))
    heard: list[object] = []
    session = node.open_session(heard.append)
    assert node.execute(session, [b"SUBSCRIBE", b"c"]) == [[b"subscribe", b"c", 1]]
    refused = node.execute(session, [b"GET", b"c"])[0]
    assert isinstance(refused, Error)
    assert "allowed in this context" in refused
    assert node.command([b"PUBLISH", b"c", b"w"]) == 1
    assert heard == [[b"message", b"c", b"w"]]
    assert node.execute(session, [b"UNSUBSCRIBE", b"c"]) == [[b"unsubscribe", b"c", 0]]
    node.close_session(session)
    assert node.command([b"PUBLISH", b"c", b"w"]) == 0
