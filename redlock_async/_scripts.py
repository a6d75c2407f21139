"""The Lua scripts, one constant each, with the SHA1 that EVALSHA names them by.

Every script checks the token before it touches the key, so a client can
only ever delete or extend its own lease, never another holder's.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Script:
    """A Lua source and its SHA1 digest (what EVALSHA sends instead of the source)."""

    source: bytes
    creates: bool = False
    """It can create a lock key. Such a script, sent again as EVAL after the server lost it,
    would run after commands sent later; it is not sent again when one of those names its key."""
    sha: bytes = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "sha", hashlib.sha1(self.source).hexdigest().encode())


RELEASE = Script(
    b"""
-- Compare-and-delete, then tell the waiters (pushed hand-off): a digest of
-- the released token (listeners only match words from several nodes; the
-- token itself would let a listener extend or release a lease), on the
-- channel named like the key, only when a key was deleted.
-- KEYS[1]  the lock key (and the channel)
-- ARGV[1]  the token of the acquisition being released
-- returns  1 deleted; 0 the key is gone or holds another token (left alone)
if redis.call('GET', KEYS[1]) == ARGV[1] then
    redis.call('DEL', KEYS[1])
    redis.call('PUBLISH', KEYS[1], redis.sha1hex(ARGV[1]))
    return 1
end
return 0
"""
)

EXTEND = Script(
    b"""
-- Compare-and-PEXPIRE. Never re-creates a missing key: a lease that ran
-- out may already belong to someone else.
-- KEYS[1]  the lock key
-- ARGV[1]  the token of the acquisition being extended
-- ARGV[2]  the new ttl in integer milliseconds, counted from now
-- returns  1 extended; 0 the key is gone or holds another token
if redis.call('GET', KEYS[1]) == ARGV[1] then
    return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""
)

EXTEND_MANY = Script(
    b"""
-- EXTEND for many locks in one call: the watchdog's batched round.
-- KEYS[i]      the key of lock i
-- ARGV[2i-1]   its token
-- ARGV[2i]     its new ttl in integer milliseconds, counted from now
-- returns      an array: element i is 1 when lock i was extended, 0 when
--              its key is gone or holds another token (never re-created)
local extended = {}
for i, key in ipairs(KEYS) do
    if redis.call('GET', key) == ARGV[2 * i - 1] then
        extended[i] = redis.call('PEXPIRE', key, ARGV[2 * i])
    else
        extended[i] = 0
    end
end
return extended
"""
)

ACQUIRE_FENCED = Script(
    b"""
-- SET NX PX, and read the resource's fencing counter in the same step.
-- KEYS[1]  the lock key
-- KEYS[2]  the resource's fencing counter (never expires)
-- ARGV[1]  the token of this acquisition
-- ARGV[2]  the ttl in integer milliseconds
-- returns  the counter (>= 0) when the key was set; -1 when it exists
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
    return tonumber(redis.call('GET', KEYS[2]) or '0')
end
return -1
""",
    creates=True,
)

FENCE = Script(
    b"""
-- Raise the fencing counter to the new token, only while this acquisition
-- still holds the key: any later holder of the key then reads it.
-- KEYS[1]  the lock key
-- KEYS[2]  the resource's fencing counter
-- ARGV[1]  the token of this acquisition
-- ARGV[2]  the fencing token chosen for it
-- returns  1 written (or already higher); 0 the key is gone or not ours
if redis.call('GET', KEYS[1]) == ARGV[1] then
    if tonumber(redis.call('GET', KEYS[2]) or '0') < tonumber(ARGV[2]) then
        redis.call('SET', KEYS[2], ARGV[2])
    end
    return 1
end
return 0
"""
)

FENCED_SET = Script(
    b"""
-- A write to a protected Redis resource, applied only for a fencing token
-- that is not smaller than the largest one this resource has seen.
-- KEYS[1]  the data key written
-- KEYS[2]  the largest fencing token seen for that data (never expires)
-- ARGV[1]  the writer's fencing token
-- ARGV[2]  the value
-- returns  {1, previous largest token} applied; {0, largest token} refused
local seen = tonumber(redis.call('GET', KEYS[2]) or '-1')
local token = tonumber(ARGV[1])
if token < seen then
    return {0, seen}
end
redis.call('SET', KEYS[2], ARGV[1])
redis.call('SET', KEYS[1], ARGV[2])
return {1, seen}
"""
)

SCRIPTS = (RELEASE, EXTEND, EXTEND_MANY, ACQUIRE_FENCED, FENCE)
"""The scripts a node loads on every new connection (FENCED_SET runs on the protected resource)."""
