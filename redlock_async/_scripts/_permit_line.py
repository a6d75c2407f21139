"""Lua of the grant queue for semaphores: one line per semaphore name, a release grants its slot.

A semaphore's waiters wait in one line per name (``_names.SemaphoreKeys``: its line and its entries),
ordered by the score each waiter chose once. A permit's
release (or a waiter's give-back) hands its slot straight to the first live waiter: the slot key is
set to that waiter's token, and a grant word ``g<sha1 of the token>:<node time, us>:<slot>`` is
published on the semaphore's channel. A free slot found by an entry goes to the
first waiter the same way. Every token starts with its limit (``"<limit>:..."``): a slot held under
another limit refuses the entry, as ``ACQUIRE_PERMIT`` does, and a slot goes only to a waiter it is
below the limit of, while no slot of the node is held under another limit (a waiter of another limit
stays in line until its next entry is refused): no grant puts permits of two limits on one node, nor a
permit on a slot beyond its limit. Every write keeps the widest-limit key alive a lease longer than the
permits it saw granted (``ACQUIRE_PERMIT``'s rule).

Every key is in KEYS, all of them in one cluster slot: the channel, the line, its entries, the
widest-limit key, then slots 0..n-1 (n at least the waiter's limit). A node whose widest limit is wider
than n (a client of a wider limit holds or held here) is answered as ``ACQUIRE_PERMIT`` answers it (entry:
nothing written; the waiter names more next time), and a leave then hands nothing on (it cannot see every
slot): it frees its own, which are always below its limit. A widest-limit key of the layout before 2 is
answered OLD_LAYOUT (``_scripts/_semaphore.py``).
"""

from __future__ import annotations

from redlock_async._scripts._queue import NOW
from redlock_async._scripts._semaphore import WIDEST

GRANT_PERMIT = b"""
-- KEYS[1] the semaphore's channel, KEYS[2] its line, KEYS[3] its waits, KEYS[4] its widest-limit key,
-- KEYS[5..] its slots (slot j at KEYS[j + 5]): NAMED of them.
local NAMED = #KEYS - 4
local function slot_key(j)
    return KEYS[j + 5]
end
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
local function grant_permit(j, held)
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
            redis.call('SET', slot_key(j), head, 'PX', ttl)
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
-- slot held on this node (*keep* included: 0 none, -1 several or unknown: slots not named, or the layout
-- before), what grant_permit is told.
local function slots_of(token, keep)
    local mine = {}
    local held = 0
    local widest = widest_of(KEYS[4])
    if not widest or widest > NAMED then
        held = -1
        widest = NAMED
    end
    for j = 0, widest - 1 do
        local holder = redis.call('GET', slot_key(j))
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
local function hand_on(j, token, held)
    local head, limit = grant_permit(j, held)
    if not head then
        redis.call('DEL', slot_key(j))
        redis.call('PUBLISH', KEYS[1], redis.sha1hex(token))
        return held
    end
    return joined(held, limit)
end
"""

PERMIT_ENTER = (
    b"""
-- A semaphore waiter joins (or stays in) the line; free slots go to the first live waiters now.
-- KEYS[1]  the semaphore's channel
-- KEYS[2]  its line: a sorted set of waiting tokens
-- KEYS[3]  its waits: token -> "<entry expiry, node ms> <ttl ms> <wanted slot>"
-- KEYS[4]  its widest-limit key
-- KEYS[5..] its slots' keys, slot j at KEYS[j + 5] (at least the limit of them)
-- ARGV[1]  the waiter's token ("<limit>:<random>")
-- ARGV[2]  the ttl it wants, integer milliseconds
-- ARGV[3]  its score (the same on every node: its place in line)
-- ARGV[4]  how long the entry lives unless entered again, integer milliseconds
-- ARGV[5]  the limit this client uses
-- ARGV[6]  the slot it wants (-1: any; a waiter split between slots waits for the one most nodes gave it)
-- returns  {1 a slot holds the token now / 0 queued / -L a slot is held under limit L / -1000000 the
--          layout before 2 is in use / -1000000 - W name W slots (nothing written for these three), the
--          node's time in us, that slot's pttl in ms (else 0), the slot (else -1)}
"""
    + NOW
    + WIDEST
    + GRANT_PERMIT
    + b"""
local time = string.format('%.0f', now_us())
local limit = tonumber(ARGV[5])
local want = tonumber(ARGV[6])
local widest = widest_of(KEYS[4])
if not widest then
    return {-1000000, time, 0, -1}
elseif widest > NAMED then
    return {-1000000 - widest, time, 0, -1}
end
local free = {}
local taken = 0  -- the limit of the slots held here (ours, once one is: another refuses us)
for j = 0, math.max(widest, limit) - 1 do
    local held = redis.call('GET', slot_key(j))
    if held == ARGV[1] then
        return {1, time, redis.call('PTTL', slot_key(j)), j}
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
    redis.call('SET', KEYS[4], string.format('%d layout-2', limit), 'KEEPTTL')  -- (the expiry other permits set stays)
end
keep_widest(ARGV[2])
if free[1] and want < 0 and redis.call('EXISTS', KEYS[2]) == 0 then  -- a free slot, no one in line: ours
    redis.call('SET', slot_key(free[1]), ARGV[1], 'PX', ARGV[2])
    return {1, time, tonumber(ARGV[2]), free[1]}
end
enter_line(ARGV[1], ARGV[3], ARGV[4], ARGV[2], ARGV[6])
for _, j in ipairs(free) do  -- free slots go to the first in line that takes them (which may be us)
    local head, other = grant_permit(j, taken)
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
-- KEYS        as PERMIT_ENTER's
-- ARGV[1]     the token
-- returns     1 a slot held the token; 0 none did (as RELEASE)
"""
    + NOW
    + WIDEST
    + GRANT_PERMIT
    + b"""
if redis.call('ZREM', KEYS[2], ARGV[1]) == 1 then
    redis.call('HDEL', KEYS[3], ARGV[1])
end
local mine, held = slots_of(ARGV[1], -1)
for _, j in ipairs(mine) do
    held = hand_on(j, ARGV[1], held)
end
return mine[1] and 1 or 0
"""
)

PERMIT_STAY = (
    b"""
-- A semaphore waiter gives back what this node granted it (a split: no majority on one slot) and
-- keeps (or puts back) its entry, now wanting slot ARGV[6] (the one most nodes gave it; -1: any).
-- A slot of its token that it does not want goes to the first live waiter that takes it, itself
-- excluded; one it wants stays. It can put its token back in line, so it is never run after a later
-- command on the key (its own leave would then be undone): not sent again then.
-- KEYS        as PERMIT_ENTER's
-- ARGV[1]     the token
-- ARGV[2]     its score, ARGV[3] the entry's life, ARGV[4] its ttl (as for PERMIT_ENTER)
-- ARGV[5]     the limit
-- ARGV[6]     the slot it wants (-1: any)
-- returns     {1 a slot held the token / 0 none did, the node's time in us, the pttl of the slot it
--             holds now (the one it wants, or one granted to it as first in line) else 0, that slot else -1}
"""
    + NOW
    + WIDEST
    + GRANT_PERMIT
    + b"""
local want = tonumber(ARGV[6])
if redis.call('ZREM', KEYS[2], ARGV[1]) == 1 then  -- out of line while its slots go on: not to itself
    redis.call('HDEL', KEYS[3], ARGV[1])
end
local mine, held = slots_of(ARGV[1], want)  -- (the slot it wants, if its, is not handed on)
local kept = -1
if want >= 0 and want < NAMED and redis.call('GET', slot_key(want)) == ARGV[1] then
    kept = want
end
for _, j in ipairs(mine) do
    held = hand_on(j, ARGV[1], held)
end
local time = string.format('%.0f', now_us())
if kept >= 0 then
    return {1, time, redis.call('PTTL', slot_key(kept)), kept}
end
enter_line(ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[6])
if want >= 0 and want < tonumber(ARGV[5]) and want < NAMED and not redis.call('GET', slot_key(want)) then
    if grant_permit(want, held) == ARGV[1] then  -- the slot it wants is free here: the first who takes it
        return {1, time, tonumber(ARGV[4]), want}
    end
end
return {mine[1] and 1 or 0, time, 0, -1}
"""
)
