"""Lua of the read/write lock's line in the grant queue: readers and writers of one name wait in one line
per node, in arrival order, and a leave (a release) grants the head.

A name's line is its writer key W followed by ``\\x00queue`` (a sorted set of waiting tokens by the score
each waiter chose once, the same on every node) and ``\\x00waits`` (token -> ``"<entry expiry, node ms>
<ttl ms> <r|w>"``). The head is granted as the rule on one node allows (``_scripts/_rw.py``): a writer
when W is free and no reader's key lives (W set to its token); every reader at the head up to the next
writer when W is free (each one's key set and indexed). Each grant publishes, on the lock's channel W, a
grant word ``g<sha1 of the token>:<node time of the grant, us>:<the fencing counter then>``, as a lock's
line does. A writer in line is also in the waiting writers (scored by its entry's expiry, as RW_WRITE
enters them), so a reader's first try (RW_READ) is refused while a writer waits anywhere: a waiting
writer keeps new readers out. Readers in line ahead of a writer are not kept out by it: they are granted
when no writer outside the line waits.

Every script below is built from ``LINE``'s functions; KEYS are always:

KEYS[1] W (and the channel), KEYS[2] the readers' index, KEYS[3] the waiting writers, KEYS[4] the line,
KEYS[5] the waits, KEYS[6] optional: the fencing counter (read for every grant: a reader's token is the
last writer's, a fenced writer's is raised by QUEUE_FENCE).
"""

from __future__ import annotations

from redlock_async._scripts._queue import NOW
from redlock_async._scripts._rw import KEEP_INDEX

LINE = (
    KEEP_INDEX
    + b"""
local function counter_now()
    return KEYS[6] and redis.call('GET', KEYS[6]) or '0'
end

-- A waiter's entry: "<expiry, node ms> <ttl ms> <r|w>".
local function parse(entry)
    local a = string.find(entry, ' ', 1, true)
    local b = string.find(entry, ' ', a + 1, true)
    return tonumber(string.sub(entry, 1, a - 1)), string.sub(entry, a + 1, b - 1), string.sub(entry, b + 1)
end

-- The token out of line (and out of the waiting writers).
local function drop(token)
    redis.call('ZREM', KEYS[4], token)
    redis.call('HDEL', KEYS[5], token)
    redis.call('ZREM', KEYS[3], token)
end

-- True when a reader's key lives (entries of readers that left or died are dropped from the index).
local function readers_live(prefix)
    local live = false
    for _, id in ipairs(redis.call('SMEMBERS', KEYS[2])) do
        if redis.call('EXISTS', prefix .. id) == 1 then
            live = true
        else
            redis.call('SREM', KEYS[2], id)
        end
    end
    return live
end

-- True when a live writer waits outside the line (a client without the queue: RW_WRITE's entries).
local function writer_outside()
    if redis.call('EXISTS', KEYS[3]) == 0 then
        return false
    end
    redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', math.floor(now_us() / 1000))
    for _, id in ipairs(redis.call('ZRANGE', KEYS[3], 0, -1)) do
        if not redis.call('ZSCORE', KEYS[4], id) then
            return true
        end
    end
    return false
end

local function publish(token)
    local word = 'g' .. redis.sha1hex(token) .. ':' .. string.format('%.0f', now_us())
    redis.call('PUBLISH', KEYS[1], word .. ':' .. counter_now())
end

local function set_reader(prefix, token, ttl)
    local id = redis.sha1hex(token)
    redis.call('SET', prefix .. id, token, 'PX', ttl)
    redis.call('SADD', KEYS[2], id)
    keep_index(KEYS[2], ttl)
end

-- Grant the head of the line, as the rule on one node allows: a writer when W is free and no reader's
-- key lives; every reader at the head up to the next writer when W is free (and no writer outside the
-- line waits). Expired entries are dropped on the way.
local function grant_head(prefix)
    if redis.call('EXISTS', KEYS[1]) == 1 then
        return
    end
    local outside = nil
    for _, head in ipairs(redis.call('ZRANGE', KEYS[4], 0, -1)) do
        local entry = redis.call('HGET', KEYS[5], head)
        local expiry, ttl, kind
        if entry then
            expiry, ttl, kind = parse(entry)
        end
        if not entry or expiry <= now_us() / 1000 then
            drop(head)
        elseif kind == 'w' then
            if not readers_live(prefix) then
                drop(head)
                redis.call('SET', KEYS[1], head, 'PX', ttl)
                publish(head)
            end
            return
        else
            if outside == nil then
                outside = writer_outside()
            end
            if outside then
                return
            end
            drop(head)
            set_reader(prefix, head, ttl)
            publish(head)
        end
    end
end

-- The key that holds *token* here for *kind* ('w': W; 'r': its reader key), and whether it does.
local function holds(prefix, token, kind)
    local key = kind == 'w' and KEYS[1] or prefix .. redis.sha1hex(token)
    return key, redis.call('GET', key) == token
end

-- Put (or keep) *token* in line at *score*: its entry lives *life* ms, wants *ttl* ms, of *kind*.
local function enter_line(token, score, life, ttl, kind)
    local expiry = math.floor(now_us() / 1000) + tonumber(life)
    redis.call('ZADD', KEYS[4], score, token)
    redis.call('HSET', KEYS[5], token, string.format('%.0f', expiry) .. ' ' .. ttl .. ' ' .. kind)
    if kind == 'w' then
        redis.call('ZADD', KEYS[3], string.format('%.0f', expiry), token)
        if redis.call('PTTL', KEYS[3]) < tonumber(life) then
            redis.call('PEXPIRE', KEYS[3], tonumber(life))
        end
    end
    if redis.call('PTTL', KEYS[4]) < tonumber(life) then  -- the line outlives its entries
        redis.call('PEXPIRE', KEYS[4], 2 * tonumber(life))
        redis.call('PEXPIRE', KEYS[5], 2 * tonumber(life))
    end
end

-- Give back what *token* holds here: W, or its reader key (out of the index); the release word is
-- published for clients without the queue, as RELEASE and RW_READ_RELEASE do (a reader's only when the
-- index is empty after it: the last reader). True when it held something.
local function give_up(prefix, token, kind)
    local key, held = holds(prefix, token, kind)
    if not held then
        return false
    end
    redis.call('DEL', key)
    if kind == 'r' then
        redis.call('SREM', KEYS[2], redis.sha1hex(token))
        if redis.call('SCARD', KEYS[2]) > 0 then
            return true
        end
    end
    redis.call('PUBLISH', KEYS[1], redis.sha1hex(token))
    return true
end
"""
)

RW_ENTER = (
    b"""
-- A reader or writer joins (or stays in) the line; what the rule allows goes to the head now.
-- KEYS     as the module says
-- ARGV[1]  the waiter's token
-- ARGV[2]  the ttl it wants, integer milliseconds
-- ARGV[3]  its score (the same on every node: its place in line)
-- ARGV[4]  how long the entry lives unless entered again, integer milliseconds
-- ARGV[5]  the reader keys' prefix
-- ARGV[6]  'r' a reader, 'w' a writer
-- returns  {1 it holds here now / 0 in line, the node's time in us, its key's pttl in ms (else 0),
--          the fencing counter (a string) when it holds, else 0}
"""
    + NOW
    + LINE
    + b"""
local time = string.format('%.0f', now_us())
local key, held = holds(ARGV[5], ARGV[1], ARGV[6])
if held then
    return {1, time, redis.call('PTTL', key), counter_now()}
end
enter_line(ARGV[1], ARGV[3], ARGV[4], ARGV[2], ARGV[6])
grant_head(ARGV[5])
key, held = holds(ARGV[5], ARGV[1], ARGV[6])
if held then
    return {1, time, redis.call('PTTL', key), counter_now()}
end
return {0, time, 0, 0}
"""
)

RW_QUEUE_LEAVE = (
    b"""
-- A reader or writer leaves the line, or releases: its entry goes, what it holds here goes (the release
-- word published), and the head is granted what the rule now allows. It only takes away what is its
-- token's: run late, it does what a release of a departed holder does, so it is always sent again.
-- KEYS     as the module says
-- ARGV[1]  the token
-- ARGV[2]  the reader keys' prefix
-- ARGV[3]  'r' a reader, 'w' a writer
-- returns  1 it held here; 0 it did not (as RELEASE)
"""
    + NOW
    + LINE
    + b"""
drop(ARGV[1])
local had = give_up(ARGV[2], ARGV[1], ARGV[3])
grant_head(ARGV[2])
return had and 1 or 0
"""
)

RW_QUEUE_STAY = (
    b"""
-- A reader or writer gives back what this node granted it (a split: no majority came) and keeps (or
-- puts back) its entry; the head is granted what the rule allows, which may be itself again. It can
-- put its token back in line and on a key, so it is not sent again after the server lost it.
-- KEYS     as the module says
-- ARGV[1]  the token
-- ARGV[2]  its score, ARGV[3] the entry's life, ARGV[4] its ttl (as for RW_ENTER)
-- ARGV[5]  the reader keys' prefix
-- ARGV[6]  'r' a reader, 'w' a writer
-- returns  {1 it held here / 0 it did not, the node's time in us, its key's pttl when it holds again
--          (granted as the head), else 0, and then the fencing counter, else 0}
"""
    + NOW
    + LINE
    + b"""
local had = give_up(ARGV[5], ARGV[1], ARGV[6])
enter_line(ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[6])
grant_head(ARGV[5])
local time = string.format('%.0f', now_us())
local key, held = holds(ARGV[5], ARGV[1], ARGV[6])
if held then
    return {1, time, redis.call('PTTL', key), counter_now()}
end
return {had and 1 or 0, time, 0, 0}
"""
)

RW_QUEUE_DOWNGRADE = (
    b"""
-- RW_DOWNGRADE for the line: where W holds the writer's token, W goes and the reader's key comes in one
-- step (no other writer can come between), then the readers at the head of the line are granted.
-- KEYS     as the module says
-- ARGV[1]  the writer's token
-- ARGV[2]  the reader's token
-- ARGV[3]  the ttl in integer milliseconds
-- ARGV[4]  the reader keys' prefix
-- returns  the counter (>= 0; 0 when none is named) done; -1 W is gone or holds another token
"""
    + NOW
    + LINE
    + b"""
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
    return -1
end
redis.call('DEL', KEYS[1])
set_reader(ARGV[4], ARGV[2], ARGV[3])
redis.call('PUBLISH', KEYS[1], redis.sha1hex(ARGV[1]))
grant_head(ARGV[4])
return tonumber(counter_now())
"""
)
