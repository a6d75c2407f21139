"""Lua of fencing: the counter read with an acquisition, its raise, and the guarded write.

Also the Lua helpers the other groups reuse (FLOOR, RAISE): raw source fragments, not scripts.
"""

from __future__ import annotations

FLOOR = b"""
-- The counter read for a new token: the node's, or with a floor (fence_ttl: counters expire) at
-- least the node's time in microseconds, so that a counter that expired never restarts below a
-- token already given (see docs/fencing.md).
local function counter_of(key, floor)
    local counter = tonumber(redis.call('GET', key) or '0')
    if floor then
        local clock = redis.call('TIME')
        local now = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
        if now > counter then
            counter = now
        end
    end
    return counter
end
"""


RAISE = b"""
-- Raise a fencing counter to a token: with a ttl (fence_ttl) the counter expires that long after its
-- last raise; without, it never expires (and a counter another client gave a ttl loses it).
local function raise_counter(key, token, ttl)
    if tonumber(redis.call('GET', key) or '0') < tonumber(token) then
        if ttl then
            redis.call('SET', key, token, 'PX', ttl)
        else
            redis.call('SET', key, token)
        end
    elseif ttl then
        local left = redis.call('PTTL', key)
        if left >= 0 and left < tonumber(ttl) then
            redis.call('PEXPIRE', key, ttl)
        end
    end
end

-- Name the acquisition whose fence ran here (SHA1 of its token) beside the counter, with the
-- counter's life: inspection shows a holder's counter only where this names the holder.
local function name_fencer(key, token, ttl)
    if ttl then
        redis.call('SET', key, redis.sha1hex(token), 'PX', ttl)
    else
        redis.call('SET', key, redis.sha1hex(token))
    end
end
"""


ACQUIRE_FENCED = (
    b"""
-- SET NX PX, and read the resource's fencing counter in the same step.
-- KEYS[1]  the lock key
-- KEYS[2]  the resource's fencing counter
-- ARGV[1]  the token of this acquisition
-- ARGV[2]  the ttl in integer milliseconds
-- ARGV[3]  optional, "floor": read at least the node's time in microseconds (fence_ttl)
-- returns  the counter (>= 0) when the key was set; -1 when it exists
"""
    + FLOOR
    + b"""
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
    return counter_of(KEYS[2], ARGV[3])
end
return -1
"""
)


FENCE = (
    b"""
-- Raise the fencing counter to the new token, only while this acquisition
-- still holds the key: any later holder of the key then reads it. In the
-- same step, name the acquisition that fenced (a digest of its token) beside
-- the counter, so a reader (inspection: MGET of key, counter and this, one
-- atomic read) can tell a counter raised by the key's holder from one that
-- a grant still in its first step has not raised yet.
-- KEYS[1]  the lock key
-- KEYS[2]  the resource's fencing counter
-- KEYS[3]  the counter's fencer: KEYS[2] followed by FENCED_BY
-- ARGV[1]  the token of this acquisition
-- ARGV[2]  the fencing token chosen for it
-- ARGV[3]  optional: the counter's ttl in integer milliseconds (fence_ttl); none: it never expires
-- returns  1 written (or already higher); 0 the key is gone or not ours
"""
    + RAISE
    + b"""
if redis.call('GET', KEYS[1]) == ARGV[1] then
    raise_counter(KEYS[2], ARGV[2], ARGV[3])
    name_fencer(KEYS[3], ARGV[1], ARGV[3])
    return 1
end
return 0
"""
)


RAISE_COUNTER = b"""
-- A node back from a restart: raise its fencing counter to what the nodes in service have, before it
-- counts again (docs/fencing.md, "A node that lost its counters"). Raises only: a counter already as
-- high is left as it is, with its life; a key that is not a counter is left alone.
-- KEYS[1]  a fencing counter
-- ARGV[1]  the largest value read for it on the nodes in service
-- ARGV[2]  its ttl in integer milliseconds there (fence_ttl), 0 when it never expires
-- returns  1 raised, 0 left as it was
local counter = tonumber(redis.call('GET', KEYS[1]) or '0')
if counter == nil or counter >= tonumber(ARGV[1]) then
    return 0
end
if ARGV[2] == '0' then
    redis.call('SET', KEYS[1], ARGV[1])
else
    redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
end
return 1
"""


FENCED_BY = b"\x00by"
"""After a fencing counter's key: the key that names (SHA1 of the token, hex) the acquisition whose fence
ran last there. Its life is the counter's."""


FENCED_SET = b"""
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
