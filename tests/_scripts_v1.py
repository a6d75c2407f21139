"""The semaphore scripts of the layout before one-slot keys (redlock-async at 2ceb497), kept verbatim so that
tests/test_layout_upgrade.py runs them beside this version's: a rolling upgrade has both on the nodes."""

from __future__ import annotations

NOW = b"""
-- The node's clock, read once and only when needed: microseconds (a float, exact below 2^53).
local clock_us
local function now_us()
    if not clock_us then
        local clock = redis.call('TIME')
        clock_us = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
    end
    return clock_us
end
"""

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

GRANT_PERMIT = b"""
-- KEYS[1] the semaphore's base key (and channel), KEYS[2] its line, KEYS[3] its waits, KEYS[4] its
-- widest-limit key; the slots' key prefix is passed in.
local function keep_widest(ttl)
    local keep = 2 * tonumber(ttl)
    if redis.call('PTTL', KEYS[4]) < keep then
        redis.call('PEXPIRE', KEYS[4], keep)
    end
end

-- A waiter's entry: "<expiry, node ms> <ttl ms> <wanted slot, or -1: any>".
local function parse(entry)
    local a = string.find(entry, ' ', 1, true)
    local b = string.find(entry, ' ', a + 1, true)
    local want = b and string.sub(entry, b + 1) or '-1'
    return tonumber(string.sub(entry, 1, a - 1)), string.sub(entry, a + 1, (b or 0) - 1), tonumber(want)
end

-- The limit a token was taken under (its "<limit>:" prefix; nil for a token without one).
local function limit_of(token)
    return tonumber(string.match(token, '^(%d+):'))
end

-- The limit of the slots held on this node once one of *limit* is held beside those of *held* (0: none
-- held; -1: several limits, which no grant makes: only a lease regaining a free node can).
local function joined(held, limit)
    if held == 0 or held == limit then
        return limit
    end
    return -1
end

-- SET slot j to the first live waiter that takes it and publish the grant on the semaphore's channel:
-- g<sha1 of its token>:<node time of the grant, us>:<j>. A waiter takes slot j when it wants any slot
-- or j, j is below its own limit, and every other slot held on this node (*held*: their limit, 0 for
-- none) is held under its limit: a waiter is never handed a slot of another limit's range, nor one
-- beside permits of another limit (ACQUIRE_PERMIT's rule; it stays in line, and its next entry is
-- refused). Expired entries are dropped. Returns its token and its limit, or nil when no one takes it.
local function grant_permit(prefix, j, held)
    if held < 0 then
        return nil
    end
    local line = redis.call('ZRANGE', KEYS[2], 0, -1)
    for _, head in ipairs(line) do
        local entry = redis.call('HGET', KEYS[3], head)
        local expiry, ttl, want
        if entry then
            expiry, ttl, want = parse(entry)
        end
        local limit = limit_of(head)
        if not entry or expiry <= now_us() / 1000 then
            redis.call('ZREM', KEYS[2], head)
            redis.call('HDEL', KEYS[3], head)
        elseif (want < 0 or want == j) and limit and j < limit and (held == 0 or held == limit) then
            redis.call('ZREM', KEYS[2], head)
            redis.call('HDEL', KEYS[3], head)
            redis.call('SET', prefix .. j, head, 'PX', ttl)
            keep_widest(ttl)
            local word = 'g' .. redis.sha1hex(head) .. ':' .. string.format('%.0f', now_us()) .. ':' .. j
            redis.call('PUBLISH', KEYS[1], word)
            return head, limit
        end
    end
    return nil
end

-- Put (or keep) *token* in line at *score*: its entry lives *life* ms, wants *ttl* ms and slot *want*.
local function enter_line(token, score, life, ttl, want)
    redis.call('ZADD', KEYS[2], score, token)
    local expiry = string.format('%.0f', math.floor(now_us() / 1000) + tonumber(life))
    redis.call('HSET', KEYS[3], token, expiry .. ' ' .. ttl .. ' ' .. want)
    if redis.call('PTTL', KEYS[2]) < tonumber(life) then  -- the line outlives its entries
        redis.call('PEXPIRE', KEYS[2], 2 * tonumber(life))
        redis.call('PEXPIRE', KEYS[3], 2 * tonumber(life))
    end
end

-- The slots (below the widest limit in use) that hold *token*, but *keep*; and the limit of every other
-- slot held on this node (*keep* included: 0 none, -1 several), what grant_permit is told.
local function slots_of(prefix, token, keep)
    local mine = {}
    local held = 0
    local widest = tonumber(redis.call('GET', KEYS[4]) or '0')
    for j = 0, widest - 1 do
        local holder = redis.call('GET', prefix .. j)
        if holder == token and j ~= keep then
            mine[#mine + 1] = j
        elseif holder then
            held = joined(held, limit_of(holder) or -1)
        end
    end
    return mine, held
end

-- Hand slot j, which held *token*, to the first live waiter that takes it (*held*: the limit of the
-- other slots held here); with none, free it and publish the release word (waiters without the queue
-- hear it). Returns the limit of the slots held here now.
local function hand_on(prefix, j, token, held)
    local head, limit = grant_permit(prefix, j, held)
    if not head then
        redis.call('DEL', prefix .. j)
        redis.call('PUBLISH', KEYS[1], redis.sha1hex(token))
        return held
    end
    return joined(held, limit)
end
"""

PERMIT_ENTER = (
    b"""
-- A semaphore waiter joins (or stays in) the line; free slots go to the first live waiters now.
-- KEYS[1]  the semaphore's base key (and channel)
-- KEYS[2]  its line: a sorted set of waiting tokens
-- KEYS[3]  its waits: token -> "<entry expiry, node ms> <ttl ms> <wanted slot>"
-- KEYS[4]  its widest-limit key
-- ARGV[1]  the waiter's token ("<limit>:<random>")
-- ARGV[2]  the ttl it wants, integer milliseconds
-- ARGV[3]  its score (the same on every node: its place in line)
-- ARGV[4]  how long the entry lives unless entered again, integer milliseconds
-- ARGV[5]  the limit this client uses
-- ARGV[6]  the slots' key prefix (slot j is this followed by j)
-- ARGV[7]  the slot it wants (-1: any; a waiter split between slots waits for the one most nodes gave it)
-- returns  {1 a slot holds the token now / 0 queued / -L a slot is held under limit L (nothing
--          written), the node's time in us, that slot's pttl in ms (else 0), the slot (else -1)}
"""
    + NOW
    + GRANT_PERMIT
    + b"""
local time = string.format('%.0f', now_us())
local limit = tonumber(ARGV[5])
local prefix = ARGV[6]
local want = tonumber(ARGV[7])
local widest = tonumber(redis.call('GET', KEYS[4]) or '0')
local free = {}
local taken = 0  -- the limit of the slots held here (ours, once one is: another refuses us)
for j = 0, math.max(widest, limit) - 1 do
    local held = redis.call('GET', prefix .. j)
    if held == ARGV[1] then
        return {1, time, redis.call('PTTL', prefix .. j), j}
    elseif held then
        local other = limit_of(held)
        if other ~= limit then
            return {-other, time, 0, -1}
        end
        taken = limit
    elseif j < limit then
        free[#free + 1] = j
    end
end
if limit > widest then
    redis.call('SET', KEYS[4], ARGV[5], 'KEEPTTL')  -- (the expiry that other permits set stays)
end
keep_widest(ARGV[2])
if free[1] and want < 0 and redis.call('EXISTS', KEYS[2]) == 0 then  -- a free slot, no one in line: ours
    redis.call('SET', prefix .. free[1], ARGV[1], 'PX', ARGV[2])
    return {1, time, tonumber(ARGV[2]), free[1]}
end
enter_line(ARGV[1], ARGV[3], ARGV[4], ARGV[2], ARGV[7])
for _, j in ipairs(free) do  -- free slots go to the first in line that takes them (which may be us)
    local head, other = grant_permit(prefix, j, taken)
    if head == ARGV[1] then
        return {1, time, tonumber(ARGV[2]), j}
    elseif head then
        taken = joined(taken, other)
    end
end
return {0, time, 0, -1}
"""
)

PERMIT_LEAVE = (
    b"""
-- A semaphore waiter or holder leaves the line: its entry goes, and every slot that holds its token
-- goes straight to the next live waiter that takes it (or, with none, is deleted and the release word
-- published). It only ever takes away what is its token's: run late, it does what a release of a
-- departed holder does, so it is always sent again.
-- KEYS[1..4]  as PERMIT_ENTER's
-- ARGV[1]     the token
-- ARGV[2]     the slots' key prefix
-- returns     1 a slot held the token; 0 none did (as RELEASE)
"""
    + NOW
    + GRANT_PERMIT
    + b"""
if redis.call('ZREM', KEYS[2], ARGV[1]) == 1 then
    redis.call('HDEL', KEYS[3], ARGV[1])
end
local mine, held = slots_of(ARGV[2], ARGV[1], -1)
for _, j in ipairs(mine) do
    held = hand_on(ARGV[2], j, ARGV[1], held)
end
return mine[1] and 1 or 0
"""
)

PERMIT_STAY = (
    b"""
-- A semaphore waiter gives back what this node granted it (a split: no majority on one slot) and
-- keeps (or puts back) its entry, now wanting slot ARGV[7] (the one most nodes gave it; -1: any).
-- A slot of its token that it does not want goes to the first live waiter that takes it, itself
-- excluded; one it wants stays. It can put its token back in line, so it is never run after a later
-- command on the key (its own leave would then be undone): not sent again then.
-- KEYS[1..4]  as PERMIT_ENTER's
-- ARGV[1]     the token
-- ARGV[2]     its score, ARGV[3] the entry's life, ARGV[4] its ttl (as for PERMIT_ENTER)
-- ARGV[5]     the limit (unused: the entry's ARGV layout), ARGV[6] the slots' key prefix
-- ARGV[7]     the slot it wants (-1: any)
-- returns     {1 a slot held the token / 0 none did, the node's time in us, the pttl of the slot it
--             holds now (the one it wants, or one granted to it as first in line) else 0, that slot else -1}
"""
    + NOW
    + GRANT_PERMIT
    + b"""
local want = tonumber(ARGV[7])
if redis.call('ZREM', KEYS[2], ARGV[1]) == 1 then  -- out of line while its slots go on: not to itself
    redis.call('HDEL', KEYS[3], ARGV[1])
end
local mine, held = slots_of(ARGV[6], ARGV[1], want)  -- (the slot it wants, if its, is not handed on)
local kept = -1
if want >= 0 and redis.call('GET', ARGV[6] .. want) == ARGV[1] then
    kept = want
end
for _, j in ipairs(mine) do
    held = hand_on(ARGV[6], j, ARGV[1], held)
end
local time = string.format('%.0f', now_us())
if kept >= 0 then
    return {1, time, redis.call('PTTL', ARGV[6] .. kept), kept}
end
enter_line(ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[7])
if want >= 0 and not redis.call('GET', ARGV[6] .. want) and want < tonumber(ARGV[5]) then
    if grant_permit(ARGV[6], want, held) == ARGV[1] then  -- the slot it wants is free here: the first who takes it
        return {1, time, tonumber(ARGV[4]), want}
    end
end
return {mine[1] and 1 or 0, time, 0, -1}
"""
)
