"""Lua of the grant queue for lock_many: one script leaves the lines of every name of an acquisition.

A lock of several names waits in each name's line with one token (``_queue``'s scripts, one name at a
time); its release is one script per node, so that one reply tells whether every key still held the
token (as RELEASE_ALL's does), for the release's ballot.
"""

from __future__ import annotations

from redlock_async._scripts._queue import GRANT_NEXT, NOW

QUEUE_LEAVE_ALL = (
    b"""
-- QUEUE_LEAVE for every name of one acquisition: for each name, the token's entry leaves the line,
-- and a key that holds the token goes to that line's next live waiter (or, with none, is deleted and
-- the release word published). It only takes away what is its token's: run late, it does no harm.
-- KEYS[4k+1..4k+4]  for each name: the lock key (and channel), its line, its waits, its fencing counter
-- ARGV[1]           the token of the acquisition
-- returns           1 every key held the token; 0 some did not (as RELEASE_ALL)
"""
    + NOW
    + GRANT_NEXT
    + b"""
local all = 1
for k = 1, #KEYS, 4 do
    local key, line, waits, fence = KEYS[k], KEYS[k + 1], KEYS[k + 2], KEYS[k + 3]
    if redis.call('ZREM', line, ARGV[1]) == 1 then
        redis.call('HDEL', waits, ARGV[1])
    end
    if redis.call('GET', key) == ARGV[1] then
        if not grant_next(key, line, waits, fence) then
            redis.call('DEL', key)
            redis.call('PUBLISH', key, redis.sha1hex(ARGV[1]))
        end
    else
        all = 0
    end
end
return all
"""
)
