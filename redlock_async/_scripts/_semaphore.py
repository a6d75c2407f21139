"""Lua of a semaphore's permit slots and the widest-limit key they share."""

from __future__ import annotations

ACQUIRE_PERMIT = b"""
-- Take permit slot i of a semaphore: a SET NX PX of that slot's key, after
-- checking that no slot is held under another limit. Every token starts
-- with its semaphore's limit ("3:..."), so holders of one limit see those
-- of another; the widest limit in use is kept so that every slot that may be
-- held is looked at. That key lives a lease longer than every permit granted
-- (here) or extended (KEEP_LIMIT) on this node, so it goes once no permit is
-- held, and never while one is.
-- KEYS[1]  the slot's key
-- KEYS[2]  the semaphore's widest-limit key
-- ARGV[1]  the token of this acquisition ("<limit>:<random>")
-- ARGV[2]  the ttl in integer milliseconds
-- ARGV[3]  the limit this client uses
-- ARGV[4]  the slots' key prefix (slot j is this followed by j)
-- returns  1 set; -L a slot is held under limit L (not ours); the slot is held:
--          the list of this node's free slots (so the next try goes where it can win)
local limit = tonumber(ARGV[3])
local keep = 2 * tonumber(ARGV[2])  -- the permit's ttl, and a lease more
local function keep_widest()
    if redis.call('PTTL', KEYS[2]) < keep then
        redis.call('PEXPIRE', KEYS[2], keep)
    end
end
local widest = tonumber(redis.call('GET', KEYS[2]) or '0')
if limit > widest then
    redis.call('SET', KEYS[2], ARGV[3], 'KEEPTTL')  -- (the expiry that other permits set stays)
    keep_widest()
    widest = limit
end
local free = {}
for j = 0, widest - 1 do
    local held = redis.call('GET', ARGV[4] .. j)
    if held then
        local other = tonumber(string.match(held, '^(%d+):'))
        if other ~= limit then
            return -other
        end
    elseif j < limit then
        free[#free + 1] = j
    end
end
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
    keep_widest()
    return 1
end
return free
"""


KEEP_LIMIT = b"""
-- After a permit's extension: its semaphore's widest-limit key lives at least a
-- margin longer than the permit's slot, and names at least its limit (written
-- again if this node lost it), only while the slot holds the permit's token.
-- KEYS[1]  the permit's slot key
-- KEYS[2]  the semaphore's widest-limit key
-- ARGV[1]  the permit's token ("<limit>:<random>")
-- ARGV[2]  the margin in integer milliseconds (the permit's ttl)
-- returns  1 kept; 0 the slot is gone or holds another token (nothing written)
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
    return 0
end
local limit = string.match(ARGV[1], '^(%d+):')
if tonumber(redis.call('GET', KEYS[2]) or '0') < tonumber(limit) then
    redis.call('SET', KEYS[2], limit, 'KEEPTTL')
end
local keep = redis.call('PTTL', KEYS[1]) + tonumber(ARGV[2])
if redis.call('PTTL', KEYS[2]) < keep then
    redis.call('PEXPIRE', KEYS[2], keep)
end
return 1
"""
