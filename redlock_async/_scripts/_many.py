"""Lua of lock_many: several keys of one acquisition, all or none on a node."""

from __future__ import annotations

from redlock_async._scripts._fencing import FLOOR, RAISE

ACQUIRE_ALL = b"""
-- SET NX PX of several keys at once, all or none (lock_many): a node says
-- yes only when it set every key.
-- KEYS[1..n]  the lock keys, in canonical order
-- ARGV[1]     the token of this acquisition (the same on every key)
-- ARGV[2]     the ttl in integer milliseconds
-- returns     1 every key set; -i when key i exists (then nothing was set)
for i, key in ipairs(KEYS) do
    if redis.call('EXISTS', key) == 1 then
        return -i
    end
end
for _, key in ipairs(KEYS) do
    redis.call('SET', key, ARGV[1], 'PX', ARGV[2])
end
return 1
"""


ACQUIRE_ALL_FENCED = (
    b"""
-- ACQUIRE_ALL, and read each resource's fencing counter in the same step.
-- KEYS[1..n]     the lock keys, in canonical order
-- KEYS[n+1..2n]  their fencing counters, in the same order
-- ARGV[1]        the token of this acquisition
-- ARGV[2]        the ttl in integer milliseconds
-- ARGV[3]        optional, "floor": read at least the node's time in microseconds (fence_ttl)
-- returns        the n counters (>= 0) when every key was set; -i when key i exists
"""
    + FLOOR
    + b"""
local n = #KEYS / 2
for i = 1, n do
    if redis.call('EXISTS', KEYS[i]) == 1 then
        return -i
    end
end
local counters = {}
for i = 1, n do
    redis.call('SET', KEYS[i], ARGV[1], 'PX', ARGV[2])
    counters[i] = counter_of(KEYS[n + i], ARGV[3])
end
return counters
"""
)


FENCE_ALL = (
    b"""
-- FENCE for several keys of one acquisition: only while it holds every one.
-- KEYS[1..n]        the lock keys
-- KEYS[n+1..2n]     their fencing counters
-- KEYS[2n+1..3n]    their counters' fencers (each counter's key followed by FENCED_BY)
-- ARGV[1]           the token of this acquisition
-- ARGV[1+i]         the fencing token chosen for key i
-- ARGV[n+2]         optional: the counters' ttl in integer milliseconds (fence_ttl); none: they never expire
-- returns           1 written (or already higher); 0 a key is gone or not ours
"""
    + RAISE
    + b"""
local n = #KEYS / 3
for i = 1, n do
    if redis.call('GET', KEYS[i]) ~= ARGV[1] then
        return 0
    end
end
for i = 1, n do
    raise_counter(KEYS[n + i], ARGV[1 + i], ARGV[n + 2])
    name_fencer(KEYS[2 * n + i], ARGV[1], ARGV[n + 2])
end
return 1
"""
)


RELEASE_ALL = b"""
-- RELEASE for several keys of one acquisition: each key that still holds
-- the token is deleted, and its waiters told on its own channel.
-- KEYS[1..n]  the lock keys
-- ARGV[1]     the token of the acquisition
-- returns     1 every key held the token (all deleted); 0 some did not
local all = 1
for _, key in ipairs(KEYS) do
    if redis.call('GET', key) == ARGV[1] then
        redis.call('DEL', key)
        redis.call('PUBLISH', key, redis.sha1hex(ARGV[1]))
    else
        all = 0
    end
end
return all
"""
