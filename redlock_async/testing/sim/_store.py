"""A simulated node's keyspace: strings, hashes, sets and sorted sets, with expiry on the node's own clock,
and the plain commands the library sends (and its Lua scripts call) answered as Valkey answers them.

A reply is a Python value: ``bytes`` (a bulk string), ``int``, ``None`` (a nil bulk), a ``list`` (an array),
:class:`Status` (a simple string) or :class:`Error` (an error reply). :func:`encode` makes RESP2 of it.
"""

from __future__ import annotations

import fnmatch
import math
import random
from collections.abc import Callable
from typing import Any, TypeAlias

Value: TypeAlias = Any  # bytes | dict[bytes, bytes] | set[bytes] | dict[bytes, float] (a zset: member -> score)
Reply: TypeAlias = Any


class Status(bytes):
    """A simple-string reply (``+OK``)."""


class Error(str):
    """An error reply's text (``-ERR ...``)."""


OK = Status(b"OK")
WRONGTYPE = Error("WRONGTYPE Operation against a key holding the wrong kind of value")
NOT_INTEGER = Error("ERR value is not an integer or out of range")
NOT_FLOAT = Error("ERR value is not a valid float")
SYNTAX = Error("ERR syntax error")


def arity(name: bytes) -> Error:
    return Error(f"ERR wrong number of arguments for '{name.decode(errors='replace').lower()}' command")


def encode(reply: Reply) -> bytes:
    """*reply* in RESP2."""
    kind = type(reply)
    if kind is bytes:
        return b"$%d\r\n%s\r\n" % (len(reply), reply)
    if kind is int:
        return b":%d\r\n" % reply
    if isinstance(reply, Error):
        return b"-" + reply.encode() + b"\r\n"
    if isinstance(reply, Status):
        return b"+" + bytes(reply) + b"\r\n"
    if isinstance(reply, bytes):
        return b"$%d\r\n%s\r\n" % (len(reply), reply)
    if reply is None:
        return b"$-1\r\n"
    if isinstance(reply, bool):
        return b":%d\r\n" % int(reply)
    if isinstance(reply, int):
        return b":%d\r\n" % reply
    if isinstance(reply, list):
        return b"*%d\r\n" % len(reply) + b"".join(encode(item) for item in reply)
    raise TypeError(f"no RESP for {reply!r}")


def integer(arg: bytes) -> int | None:
    """*arg* as Valkey reads an integer argument (no spaces, no '+', no leading zeros), or None."""
    try:
        value = int(arg)
    except ValueError:
        return None
    if arg != b"%d" % value or not -(2**63) <= value < 2**63:
        return None
    return value


def number(arg: bytes) -> float | None:
    """*arg* as a score or a double (``inf``, ``-inf``, ``+inf`` too), or None."""
    text = arg.lower()
    if text in (b"inf", b"+inf", b"infinity", b"+infinity"):
        return math.inf
    if text in (b"-inf", b"-infinity"):
        return -math.inf
    try:
        value = float(arg)
    except ValueError:
        return None
    if math.isnan(value) or arg != arg.strip() or not arg:
        return None
    return value


def score_text(score: float) -> bytes:
    """A score as Valkey writes it (the shortest text that reads back the same)."""
    if math.isinf(score):
        return b"inf" if score > 0 else b"-inf"
    if score == int(score) and abs(score) < 1e17:
        return b"%d" % int(score)
    return repr(score).encode()


class Store:
    """Keys and their expiries (node milliseconds), read through *clock_ms*, the node's clock."""

    def __init__(self, clock_ms: Callable[[], float], rng: random.Random) -> None:
        self.data: dict[bytes, Value] = {}
        self.expires: dict[bytes, float] = {}
        self.clock_ms = clock_ms
        self.rng = rng

    # -- keys ---------------------------------------------------------------

    def get(self, key: bytes) -> Value:
        """The live value of *key* (an expired one is deleted first), or None."""
        when = self.expires.get(key)
        if when is not None and when <= self.clock_ms():
            del self.expires[key]
            del self.data[key]
            return None
        return self.data.get(key)

    def delete(self, key: bytes) -> bool:
        if self.get(key) is None:
            return False
        del self.data[key]
        self.expires.pop(key, None)
        return True

    def live_keys(self) -> list[bytes]:
        return [key for key in list(self.data) if self.get(key) is not None]

    def _typed(self, key: bytes, kind: type) -> Value:
        """The value of *key* if it is a *kind*, None when there is none; WRONGTYPE raised as an Error."""
        value = self.get(key)
        if value is not None and type(value) is not kind:
            raise _Refused(WRONGTYPE)
        return value

    def _drop_if_empty(self, key: bytes, value: Value) -> None:
        if not value:
            self.data.pop(key, None)
            self.expires.pop(key, None)

    # -- commands -----------------------------------------------------------

    def execute(self, args: list[bytes]) -> Reply:
        """Run one command (*args*: its name and arguments) on the keyspace."""
        if not args:
            return Error("ERR empty command")
        name = args[0].upper()
        handler = _COMMANDS.get(name)
        if handler is None:
            return Error(f"ERR unknown command '{args[0].decode(errors='replace')}', with args beginning with: ")
        low, high = _ARITY[name]
        if len(args) - 1 < low or (high is not None and len(args) - 1 > high):
            return arity(name)
        try:
            return handler(self, args[1:])
        except _Refused as refused:
            return refused.reply

    def cmd_get(self, a: list[bytes]) -> Reply:
        return self._typed(a[0], bytes)

    def cmd_mget(self, a: list[bytes]) -> Reply:
        return [v if isinstance(v := self.get(key), bytes) else None for key in a]

    def cmd_set(self, a: list[bytes]) -> Reply:
        key, value = a[0], a[1]
        nx = xx = keepttl = False
        ttl_ms: float | None = None
        rest = a[2:]
        i = 0
        while i < len(rest):
            opt = rest[i].upper()
            if opt == b"NX" and not xx:
                nx = True
            elif opt == b"XX" and not nx:
                xx = True
            elif opt == b"KEEPTTL" and ttl_ms is None:
                keepttl = True
            elif opt in (b"PX", b"EX") and ttl_ms is None and not keepttl and i + 1 < len(rest):
                amount = integer(rest[i + 1])
                if amount is None:
                    return NOT_INTEGER
                if amount <= 0:
                    return Error(f"ERR invalid expire time in '{'set'}' command")
                ttl_ms = float(amount if opt == b"PX" else amount * 1000)
                i += 1
            else:
                return SYNTAX
            i += 1
        exists = self.get(key) is not None
        if (nx and exists) or (xx and not exists):
            return None
        self.data[key] = value
        if ttl_ms is not None:
            self.expires[key] = self.clock_ms() + ttl_ms
        elif not keepttl:
            self.expires.pop(key, None)
        return OK

    def cmd_del(self, a: list[bytes]) -> Reply:
        return sum(self.delete(key) for key in a)

    def cmd_exists(self, a: list[bytes]) -> Reply:
        return sum(self.get(key) is not None for key in a)

    def cmd_type(self, a: list[bytes]) -> Reply:
        value = self.get(a[0])
        kinds: dict[type, bytes] = {bytes: b"string", dict: b"hash", set: b"set", _ZSet: b"zset"}
        kind = kinds.get(type(value), b"none")
        return Status(kind)

    def cmd_pttl(self, a: list[bytes]) -> Reply:
        if self.get(a[0]) is None:
            return -2
        when = self.expires.get(a[0])
        return -1 if when is None else max(0, round(when - self.clock_ms()))

    def cmd_pexpire(self, a: list[bytes]) -> Reply:
        amount = integer(a[1])
        if amount is None:
            return NOT_INTEGER
        if len(a) > 2:
            return Error(f"ERR Unsupported option {a[2].decode(errors='replace')}")
        if self.get(a[0]) is None:
            return 0
        if amount <= 0:
            self.delete(a[0])
        else:
            self.expires[a[0]] = self.clock_ms() + amount
        return 1

    # hashes

    def cmd_hset(self, a: list[bytes]) -> Reply:
        if len(a) % 2 == 0:
            return arity(b"hset")
        value = self._typed(a[0], dict)
        if value is None:
            value = self.data[a[0]] = {}
        added = 0
        for field, item in zip(a[1::2], a[2::2], strict=True):
            added += field not in value
            value[field] = item
        return added

    def cmd_hget(self, a: list[bytes]) -> Reply:
        value = self._typed(a[0], dict)
        return None if value is None else value.get(a[1])

    def cmd_hgetall(self, a: list[bytes]) -> Reply:
        return [item for pair in (self._typed(a[0], dict) or {}).items() for item in pair]

    def cmd_hrandfield(self, a: list[bytes]) -> Reply:  # a count >= 0 only: distinct fields (the rw scripts')
        fields, count = sorted(self._typed(a[0], dict) or ()), integer(a[1])
        return NOT_INTEGER if count is None or count < 0 else self.rng.sample(fields, min(count, len(fields)))

    def cmd_hdel(self, a: list[bytes]) -> Reply:
        value = self._typed(a[0], dict)
        if value is None:
            return 0
        gone = sum(value.pop(field, None) is not None for field in a[1:])
        self._drop_if_empty(a[0], value)
        return gone

    # sets

    def cmd_sadd(self, a: list[bytes]) -> Reply:
        value = self._typed(a[0], set)
        if value is None:
            value = self.data[a[0]] = set()
        before = len(value)
        value.update(a[1:])
        return len(value) - before

    def cmd_srem(self, a: list[bytes]) -> Reply:
        value = self._typed(a[0], set)
        if value is None:
            return 0
        gone = 0
        for member in a[1:]:
            if member in value:
                value.discard(member)
                gone += 1
        self._drop_if_empty(a[0], value)
        return gone

    def cmd_scard(self, a: list[bytes]) -> Reply:
        value = self._typed(a[0], set)
        return 0 if value is None else len(value)

    def cmd_smembers(self, a: list[bytes]) -> Reply:
        value = self._typed(a[0], set)
        return [] if value is None else sorted(value)

    def cmd_srandmember(self, a: list[bytes]) -> Reply:
        value = self._typed(a[0], set)
        if len(a) == 1:
            return None if not value else self.rng.choice(sorted(value))
        count = integer(a[1])
        if count is None:
            return NOT_INTEGER
        if not value:
            return []
        members = sorted(value)
        if count >= 0:
            return self.rng.sample(members, min(count, len(members)))
        return [self.rng.choice(members) for _ in range(-count)]

    # sorted sets

    def cmd_zadd(self, a: list[bytes]) -> Reply:
        key, rest = a[0], a[1:]
        flags: set[bytes] = set()
        while rest and rest[0].upper() in (b"NX", b"XX", b"GT", b"LT", b"CH"):
            flags.add(rest[0].upper())
            rest = rest[1:]
        if not rest or len(rest) % 2:
            return SYNTAX
        pairs = []
        for score_arg, member in zip(rest[::2], rest[1::2], strict=True):
            score = number(score_arg)
            if score is None:
                return NOT_FLOAT
            pairs.append((score, member))
        value = self._typed(key, _ZSet)
        if value is None:
            value = self.data[key] = _ZSet()
        added = changed = 0
        for score, member in pairs:
            old = value.get(member)
            if old is None:
                if b"XX" in flags:
                    continue
                value[member] = score
                added += 1
            elif b"NX" not in flags:
                if (b"GT" in flags and score <= old) or (b"LT" in flags and score >= old):
                    continue
                if old != score:
                    value[member] = score
                    changed += 1
        self._drop_if_empty(key, value)
        return added + changed if b"CH" in flags else added

    def cmd_zrem(self, a: list[bytes]) -> Reply:
        value = self._typed(a[0], _ZSet)
        if value is None:
            return 0
        gone = sum(value.pop(member, None) is not None for member in a[1:])
        self._drop_if_empty(a[0], value)
        return gone

    def cmd_zcard(self, a: list[bytes]) -> Reply:
        value = self._typed(a[0], _ZSet)
        return 0 if value is None else len(value)

    def cmd_zscore(self, a: list[bytes]) -> Reply:
        value = self._typed(a[0], _ZSet)
        score = None if value is None else value.get(a[1])
        return None if score is None else score_text(score)

    def cmd_zrange(self, a: list[bytes]) -> Reply:
        start, stop = integer(a[1]), integer(a[2])
        scores = False
        for opt in a[3:]:
            if opt.upper() != b"WITHSCORES":
                return SYNTAX
            scores = True
        if start is None or stop is None:
            return NOT_INTEGER
        value = self._typed(a[0], _ZSet)
        ordered = value.ordered() if value else []
        size = len(ordered)
        start = max(start + size if start < 0 else start, 0)
        stop = min(stop + size if stop < 0 else stop, size - 1)
        picked = ordered[start : stop + 1] if start <= stop else []
        if scores:
            return [item for member, score in picked for item in (member, score_text(score))]
        return [member for member, _ in picked]

    def cmd_zremrangebyscore(self, a: list[bytes]) -> Reply:
        low, high = _bound(a[1]), _bound(a[2])
        if low is None or high is None:
            return Error("ERR min or max is not a float")
        value = self._typed(a[0], _ZSet)
        if value is None:
            return 0
        gone = [m for m, s in value.items() if _above(s, low) and _below(s, high)]
        for member in gone:
            del value[member]
        self._drop_if_empty(a[0], value)
        return len(gone)

    def cmd_zpopmin(self, a: list[bytes]) -> Reply:
        count = 1
        if len(a) > 1:
            parsed = integer(a[1])
            if parsed is None or parsed < 0:
                return Error("ERR value is out of range, must be positive")
            count = parsed
        value = self._typed(a[0], _ZSet)
        if value is None:
            return []
        popped = value.ordered()[:count]
        for member, _ in popped:
            del value[member]
        self._drop_if_empty(a[0], value)
        return [item for member, score in popped for item in (member, score_text(score))]

    def cmd_zunion(self, a: list[bytes]) -> Reply:
        count = integer(a[0])
        if count is None or count < 1 or count > len(a) - 1:
            return Error("ERR at least 1 input key is needed for 'zunion' command") if count == 0 else SYNTAX
        union = _ZSet()
        for key in a[1 : 1 + count]:
            for member, score in (self._typed(key, _ZSet) or {}).items():
                union[member] = union.get(member, 0.0) + score
        return [member for member, _ in union.ordered()]

    def cmd_scan(self, a: list[bytes]) -> Reply:
        if integer(a[0]) is None:
            return Error("ERR invalid cursor")
        pattern = b"*"
        opts = a[1:]
        for opt, arg in zip(opts[::2], opts[1::2], strict=False):
            if opt.upper() == b"MATCH":
                pattern = arg
            elif opt.upper() != b"COUNT" or integer(arg) is None:
                return SYNTAX
        if len(opts) % 2:
            return SYNTAX
        keys = sorted(
            k for k in self.live_keys() if fnmatch.fnmatchcase(k.decode("latin-1"), pattern.decode("latin-1"))
        )
        return [b"0", keys]


class _ZSet(dict[bytes, float]):
    """A sorted set: member -> score, ordered by (score, member) when read."""

    def ordered(self) -> list[tuple[bytes, float]]:
        return sorted(self.items(), key=lambda item: (item[1], item[0]))


class _Refused(Exception):
    def __init__(self, reply: Error) -> None:
        self.reply = reply


def _bound(arg: bytes) -> tuple[float, bool] | None:
    exclusive = arg.startswith(b"(")
    value = number(arg[1:] if exclusive else arg)
    return None if value is None else (value, exclusive)


def _above(score: float, low: tuple[float, bool]) -> bool:
    return score > low[0] if low[1] else score >= low[0]


def _below(score: float, high: tuple[float, bool]) -> bool:
    return score < high[0] if high[1] else score <= high[0]


_SPEC: dict[bytes, tuple[int, int | None]] = {
    b"GET": (1, 1),
    b"MGET": (1, None),
    b"SET": (2, None),
    b"DEL": (1, None),
    b"EXISTS": (1, None),
    b"TYPE": (1, 1),
    b"PTTL": (1, 1),
    b"PEXPIRE": (2, 3),
    b"HSET": (3, None),
    b"HGET": (2, 2),
    b"HDEL": (2, None),
    b"HGETALL": (1, 1),
    b"HRANDFIELD": (2, 2),
    b"SADD": (2, None),
    b"SREM": (2, None),
    b"SCARD": (1, 1),
    b"SMEMBERS": (1, 1),
    b"SRANDMEMBER": (1, 2),
    b"ZADD": (3, None),
    b"ZREM": (2, None),
    b"ZCARD": (1, 1),
    b"ZSCORE": (2, 2),
    b"ZRANGE": (3, None),
    b"ZREMRANGEBYSCORE": (3, 3),
    b"ZPOPMIN": (1, 2),
    b"ZUNION": (2, None),
    b"SCAN": (1, None),
}
_ARITY = dict(_SPEC)
_COMMANDS: dict[bytes, Callable[[Store, list[bytes]], Reply]] = {
    name: getattr(Store, "cmd_" + name.decode().lower()) for name in _SPEC
}
STORE_COMMANDS = frozenset(_SPEC)
"""The commands a :class:`Store` answers (the node answers the rest: TIME, INFO, PUBLISH, scripts, ...)."""
