"""Lua of a semaphore's permit slots and the widest-limit key they share.

Every key a script touches is in its KEYS (``_names.SemaphoreKeys``, all in one cluster slot): the
widest-limit key, then the slots' keys 0..n-1, n at least the client's limit. A node whose widest limit is
wider than the slots named answers WIDER - widest (nothing written), and the client names that many. The
widest-limit key holds ``"<widest> layout-2"`` (``_names.LAYOUT_MARK``): a bare number there was written by
a client of the layout before 2 (whose permits live in keys these scripts do not name), answered OLD_LAYOUT.
"""

from __future__ import annotations

OLD_LAYOUT = -1_000_000
"""A script's answer: the widest-limit key holds a value of the layout before 2 (its permits may be held)."""
WIDER = -1_000_000
"""A script's answer ``WIDER - w`` (w >= 1): the node's widest limit is w, more than the slots named."""

WIDEST = b"""
-- The widest limit in use here (0: none), from the widest-limit key *key*: "<widest> layout-2"; nil
-- for a value of the layout before (a bare number: its permits may be held, in keys not named here).
local function widest_of(key)
    local value = redis.call('GET', key)
    if not value then
        return 0
    end
    return tonumber(string.match(value, '^(%d+) layout%-2$'))
end
"""

ACQUIRE_PERMIT = (
    b"""
-- Take permit slot i of a semaphore: a SET NX PX of that slot's key, after
-- checking that no slot is held under another limit. Every token starts
-- with its semaphore's limit ("3:..."), so holders of one limit see those
-- of another; the widest limit in use is kept so that every slot that may be
-- held is looked at. That key lives a lease longer than every permit granted
-- (here) or extended (KEEP_LIMIT) on this node, so it goes once no permit is
-- held, and never while one is.
-- KEYS[1]     the semaphore's widest-limit key
-- KEYS[2..]   its slots' keys, slot j at KEYS[j + 2] (at least the limit of them)
-- ARGV[1]     the token of this acquisition ("<limit>:<random>")
-- ARGV[2]     the ttl in integer milliseconds
-- ARGV[3]     the limit this client uses
-- ARGV[4]     the slot to take
-- returns     1 set; -L a slot is held under limit L (not ours); -1000000 the layout before 2 is in use;
--             -1000000 - W name W slots; the slot is held: the list of this node's free slots (so the
--             next try goes where it can win)
"""
    + WIDEST
    + b"""
local limit = tonumber(ARGV[3])
local keep = 2 * tonumber(ARGV[2])  -- the permit's ttl, and a lease more
local function keep_widest()
    if redis.call('PTTL', KEYS[1]) < keep then
        redis.call('PEXPIRE', KEYS[1], keep)
    end
end
local widest = widest_of(KEYS[1])
if not widest then
    return -1000000
elseif widest > #KEYS - 1 then
    return -1000000 - widest
end
if limit > widest then
    redis.call('SET', KEYS[1], string.format('%d layout-2', limit), 'KEEPTTL')  -- (the expiry other permits set stays)
    keep_widest()
    widest = limit
end
local free = {}
for j = 0, widest - 1 do
    local held = redis.call('GET', KEYS[j + 2])
    if held then
        local other = tonumber(string.match(held, '^(%d+):'))
        if other ~= limit then
            return -other
        end
    elseif j < limit then
        free[#free + 1] = j
    end
end
if redis.call('SET', KEYS[tonumber(ARGV[4]) + 2], ARGV[1], 'NX', 'PX', ARGV[2]) then
    keep_widest()
    return 1
end
return free
"""
)


KEEP_LIMIT = (
    b"""
-- After a permit's extension: its semaphore's widest-limit key lives at least a
-- margin longer than the permit's slot, and names at least its limit (written
-- again if this node lost it), only while the slot holds the permit's token.
-- KEYS[1]  the permit's slot key
-- KEYS[2]  the semaphore's widest-limit key
-- ARGV[1]  the permit's token ("<limit>:<random>")
-- ARGV[2]  the margin in integer milliseconds (the permit's ttl)
-- returns  1 kept; 0 the slot is gone or holds another token (nothing written)
"""
    + WIDEST
    + b"""
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
    return 0
end
local limit = string.match(ARGV[1], '^(%d+):')
if (widest_of(KEYS[2]) or 0) < tonumber(limit) then
    redis.call('SET', KEYS[2], limit .. ' layout-2', 'KEEPTTL')
end
local keep = redis.call('PTTL', KEYS[1]) + tonumber(ARGV[2])
if redis.call('PTTL', KEYS[2]) < keep then
    redis.call('PEXPIRE', KEYS[2], keep)
end
return 1
"""
)
