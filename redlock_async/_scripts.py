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
    sha: bytes = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "sha", hashlib.sha1(self.source).hexdigest().encode())


RELEASE = Script(
    b"""
-- Compare-and-delete.
-- KEYS[1]  the lock key
-- ARGV[1]  the token of the acquisition being released
-- returns  1 deleted; 0 the key is gone or holds another token (left alone)
if redis.call('GET', KEYS[1]) == ARGV[1] then
    return redis.call('DEL', KEYS[1])
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
