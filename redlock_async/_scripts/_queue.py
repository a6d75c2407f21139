"""Lua of the grant queue (Redlock(queue=True)).

Each node keeps, per lock key, the waiters of that key: a sorted set of their
tokens by a score each waiter chose once (its wall-clock start, the same on
every node, so every node serves the same waiter first) and a hash of each
entry's expiry (node milliseconds) and the ttl it wants. A release, or a
waiter finding the key free, SETs the key to the first live entry's token
and publishes a grant word naming it (by digest) with the node's time of the
grant: that waiter holds the key on this node without another round trip.
"""

from __future__ import annotations

from redlock_async._scripts._fencing import RAISE

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


GRANT_NEXT = b"""
-- The key's fencing counter *fence* (nil: none given), as a string: what a fenced waiter granted the
-- key now reads, in the same step as the grant (docs/fencing.md, "Fenced grants from the queue").
local function counter_now(fence)
    return fence and redis.call('GET', fence) or '0'
end

-- SET the key to the first live waiter (expired entries are dropped) and publish the grant:
-- g<sha1 of its token>:<node time of the grant, us>:<the fencing counter then>;
-- returns that waiter's token, or nil when no one waits. *fence*: the key's fencing counter, or nil.
local function grant_next(key, queue, waits, fence)
    while true do
        local head = redis.call('ZPOPMIN', queue)[1]
        if not head then
            return nil
        end
        local entry = redis.call('HGET', waits, head)
        redis.call('HDEL', waits, head)
        if entry then
            local space = string.find(entry, ' ', 1, true)
            if tonumber(string.sub(entry, 1, space - 1)) > now_us() / 1000 then
                redis.call('SET', key, head, 'PX', string.sub(entry, space + 1))
                local word = 'g' .. redis.sha1hex(head) .. ':' .. string.format('%.0f', now_us())
                redis.call('PUBLISH', key, word .. ':' .. counter_now(fence))
                return head
            end
        end
    end
end
"""


QUEUE_ENTER = (
    b"""
-- A waiter joins (or stays in) the key's line; a free key goes to the first live waiter now.
-- KEYS[1]  the lock key (and the channel)
-- KEYS[2]  its line: a sorted set of waiting tokens
-- KEYS[3]  its waits: token -> "<entry expiry, node ms> <ttl ms>"
-- KEYS[4]  optional: the key's fencing counter (read when the key holds the token, and for grants)
-- ARGV[1]  the waiter's token
-- ARGV[2]  the ttl it wants, integer milliseconds
-- ARGV[3]  its score (the same on every node: its place in line)
-- ARGV[4]  how long the entry lives unless entered again, integer milliseconds
-- returns  {1 the key holds the token now / 0 queued, the node's time in us, the key's pttl in ms,
--          the fencing counter (a string) when the key holds the token, else 0}
"""
    + NOW
    + GRANT_NEXT
    + b"""
local time = string.format('%.0f', now_us())
local held = redis.call('GET', KEYS[1])
if held == ARGV[1] then
    return {1, time, redis.call('PTTL', KEYS[1]), counter_now(KEYS[4])}
end
if not held and redis.call('EXISTS', KEYS[2]) == 0 then  -- free, and no one in line: ours, told by this reply
    redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
    return {1, time, tonumber(ARGV[2]), counter_now(KEYS[4])}
end
local life = tonumber(ARGV[4])
redis.call('ZADD', KEYS[2], ARGV[3], ARGV[1])
redis.call('HSET', KEYS[3], ARGV[1], string.format('%.0f', math.floor(now_us() / 1000) + life) .. ' ' .. ARGV[2])
if redis.call('PTTL', KEYS[2]) < life then  -- the line outlives its entries (set once per life)
    redis.call('PEXPIRE', KEYS[2], 2 * life)
    redis.call('PEXPIRE', KEYS[3], 2 * life)
end
if not held and grant_next(KEYS[1], KEYS[2], KEYS[3], KEYS[4]) == ARGV[1] then
    return {1, time, tonumber(ARGV[2]), counter_now(KEYS[4])}
end
return {0, time, 0, 0}
"""
)


_LEAVE_HEAD = b"""
-- A waiter or holder leaves the key's line: its entry goes, and if the key holds its token,
-- the key goes straight to the next live waiter (or, with none, is deleted and the release
-- word published, as RELEASE does). It only ever takes away what is its token's: run late (sent
-- again as EVAL after the server lost it, behind commands sent after it), it does what a release
-- of a departed holder does, so it is always sent again (a leave that never ran kept a departed
-- waiter in line, and the next release handed it the key for a whole ttl).
-- The release word is published only where someone may hear it: when KEYS[5] (the key's listening
-- mark) is given, a key freed with no one in line and no mark is deleted without a word. Whoever
-- subscribes to the key's channel sets the mark (with a ttl it refreshes while it listens) on the
-- connection its next look at the key goes on, after its subscription is in place: a release that
-- runs after that look finds the mark, and one that ran before it is seen by the look itself.
-- KEYS[1]  the lock key (and the channel)
-- KEYS[2]  its line
-- KEYS[3]  its waits
-- KEYS[4]  optional: the key's fencing counter (a grant's word carries it); given when KEYS[5] is
-- KEYS[5]  optional: the key's listening mark; without it the release word is always published
-- ARGV[1]  the token
-- returns  1 the key held the token; 0 it did not (as RELEASE)
local found = redis.call('EXISTS', KEYS[2], KEYS[5] or KEYS[2])  -- the line, and the mark (or the line again)
if found == 0 or (found == 1 and KEYS[5] and redis.call('EXISTS', KEYS[2]) == 0) then
    -- No one in line (nor us): RELEASE's work, and no more; its word only where someone may listen.
"""

_LEAVE_ALONE = b"""
        if found == 1 or not KEYS[5] then
            redis.call('PUBLISH', KEYS[1], redis.sha1hex(ARGV[1]))
        end
        return 1
    end
    return 0
end
"""

_LEAVE_LINE = b"""
if redis.call('ZREM', KEYS[2], ARGV[1]) == 1 then
    redis.call('HDEL', KEYS[3], ARGV[1])
end
local had = redis.call('GET', KEYS[1]) == ARGV[1]
if had and not grant_next(KEYS[1], KEYS[2], KEYS[3], KEYS[4]) then
    redis.call('DEL', KEYS[1])
    redis.call('PUBLISH', KEYS[1], redis.sha1hex(ARGV[1]))
end
return had and 1 or 0
"""

QUEUE_LEAVE = (
    _LEAVE_HEAD
    + b"""    if redis.call('GET', KEYS[1]) == ARGV[1] then
        redis.call('DEL', KEYS[1])"""
    + _LEAVE_ALONE
    + NOW
    + GRANT_NEXT
    + _LEAVE_LINE
)


QUEUE_LEAVE_NATIVE = (
    b"""
-- QUEUE_LEAVE on a server whose native compare-and-delete the user may run (DELIFEQ: Valkey 9; the
-- handshake checks both, ``_handshake.py``): the same keys, arguments, effects and reply, one call
-- fewer on a node where no one is in line (DELIFEQ in place of GET and DEL)."""
    + _LEAVE_HEAD
    + b"""    if redis.call('DELIFEQ', KEYS[1], ARGV[1]) == 1 then"""
    + _LEAVE_ALONE
    + NOW
    + GRANT_NEXT
    + _LEAVE_LINE
)


QUEUE_STAY = (
    b"""
-- A waiter gives back what this node granted it (a split: no majority came) and keeps (or puts
-- back) its entry: if the key holds its token, the key goes to the first live waiter, which may
-- be itself again. It can put its token back in line and on the key, so it is never run after
-- a later command on the key (its own leave would then be undone): not sent again then.
-- KEYS[1]  the lock key (and the channel)
-- KEYS[2]  its line
-- KEYS[3]  its waits
-- KEYS[4]  optional: the key's fencing counter (as for QUEUE_ENTER)
-- ARGV[1]  the token
-- ARGV[2]  its score, ARGV[3] the entry's life and ARGV[4] its ttl (as for QUEUE_ENTER)
-- returns  {1 the key held the token / 0 it did not, the node's time in us, the key's pttl when
--          it holds the token again (given back to the first waiter: us), else 0, and then the
--          fencing counter, else 0}
"""
    + NOW
    + GRANT_NEXT
    + b"""
if not redis.call('HGET', KEYS[3], ARGV[1]) then
    local expiry = math.floor(now_us() / 1000) + tonumber(ARGV[3])
    redis.call('HSET', KEYS[3], ARGV[1], string.format('%.0f', expiry) .. ' ' .. ARGV[4])
end
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[1])
local had = redis.call('GET', KEYS[1]) == ARGV[1]
local head = had and grant_next(KEYS[1], KEYS[2], KEYS[3], KEYS[4])
if had and not head then  -- (our entry was there already, and expired)
    redis.call('DEL', KEYS[1])
    redis.call('PUBLISH', KEYS[1], redis.sha1hex(ARGV[1]))
end
local time = string.format('%.0f', now_us())
if head == ARGV[1] then
    return {1, time, tonumber(ARGV[4]), counter_now(KEYS[4])}
end
return {had and 1 or 0, time, 0, 0}
"""
)


QUEUE_FENCE = (
    b"""
-- FENCE for a waiter of the grant queue that holds the key on a majority (however each node gave it
-- the key: its own SET, an entry, a grant): raise the counter to the chosen fencing token only while
-- the key holds the waiter's token, and name the fencer; reply as QUEUE_ENTER does, so the reply also
-- says where things stand (docs/fencing.md, "Fenced grants from the queue"). It only writes while the
-- key is its token's: run late, it does no harm (a counter raised for a grant that never counted).
-- KEYS[1]  the lock key
-- KEYS[2]  the resource's fencing counter
-- KEYS[3]  the counter's fencer: KEYS[2] followed by FENCED_BY
-- ARGV[1]  the waiter's token
-- ARGV[2]  the fencing token chosen for it
-- ARGV[3]  optional: the counter's ttl in integer milliseconds (fence_ttl); none: it never expires
-- returns  {1 raised (or already higher) / 0 the key is gone or not ours, the node's time in us,
--          the key's pttl when ours, else 0, the counter now when ours, else 0}
"""
    + NOW
    + RAISE
    + b"""
local time = string.format('%.0f', now_us())
if redis.call('GET', KEYS[1]) == ARGV[1] then
    raise_counter(KEYS[2], ARGV[2], ARGV[3])
    name_fencer(KEYS[3], ARGV[1], ARGV[3])
    return {1, time, redis.call('PTTL', KEYS[1]), redis.call('GET', KEYS[2])}
end
return {0, time, 0, 0}
"""
)


DROP_LINES = b"""
-- redlock break: a name's lines go (entries of waiters that died in line with them), sent before the
-- broken holders' releases, so that no release hands a key or a slot to a waiter that is gone. A live
-- waiter loses nothing: it enters again at its next try (at once when a release word wakes it,
-- else within its retry delay), with the score it chose, and no grant is made here.
-- KEYS     every line of the name and its companions, deleted: the sorted sets of waiting tokens
--          (a lock's line, a semaphore's, a read/write lock's and its waiting writers) and the
--          hashes of their entries
-- returns  how many waiters were dropped (distinct tokens in the sorted sets)
local seen = {}
local dropped = 0
for _, key in ipairs(KEYS) do
    if redis.call('TYPE', key).ok == 'zset' then
        for _, token in ipairs(redis.call('ZRANGE', key, 0, -1)) do
            if not seen[token] then
                seen[token] = true
                dropped = dropped + 1
            end
        end
    end
end
redis.call('DEL', unpack(KEYS))
return dropped
"""
