"""Lua of the read/write lock's line in the grant queue: readers and writers of one name wait in one line
per node, in arrival order, and a leave (a release) grants the head.

A name's line is its writer key W followed by ``\\x00queue`` (a sorted set of waiting tokens by the score
each waiter chose once, the same on every node) and ``\\x00waits`` (token -> ``"<entry expiry, node ms>
<ttl ms> <r|w>"``). The head is granted as the rule on one node allows (``_scripts/_rw.py``): a writer
when W is free and no reader lives in the readers' hash (W set to its token); every reader at the head up
to the next writer when W is free (each one's entry set in the readers' hash). Each grant publishes, on
the lock's channel W, a grant word ``g<sha1 of the token>:<node time of the grant, us>:<the fencing
counter then>``, as a lock's line does. A writer in line is also in the waiting writers (scored by its
entry's expiry, as RW_WRITE enters them), so a reader's first try (RW_READ) is refused while a writer
waits anywhere: a waiting writer keeps new readers out. Readers in line ahead of a writer are not kept out
by it: they are granted when no writer outside the line waits.

Every script below is built from ``LINE``'s functions; KEYS are always:

KEYS[1] W (and the channel), KEYS[2] the readers' hash, KEYS[3] the waiting writers, KEYS[4] the line,
KEYS[5] the waits, KEYS[6] optional: the fencing counter (read for every grant: a reader's token is the
last writer's, a fenced writer's is raised by QUEUE_FENCE). Every key a script touches is one of them.

Where the readers' key is of the layout before (a set), nothing is granted, and a script that would put its
sender in line or on a key answers the error ``OLD_WORDS`` instead (nothing written); a leave still takes
away what is its own.
"""

from __future__ import annotations

from redlock_async._scripts._queue import NOW
from redlock_async._scripts._rw import OLD_WORDS, READERS

NOW_LINE = b"""
-- The node's clock in milliseconds, from the same reading as now_us (the readers' entries count in it).
local function now_ms()
    return math.floor(now_us() / 1000)
end
"""

LINE = (
    READERS
    + b"""
local old = old_layout(KEYS[2])

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

-- True when a live writer waits outside the line (a client without the queue: RW_WRITE's entries).
local function writer_outside()
    if redis.call('EXISTS', KEYS[3]) == 0 then
        return false
    end
    redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now_ms())
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

-- Grant the head of the line, as the rule on one node allows: a writer when W is free and no reader
-- lives; every reader at the head up to the next writer when W is free (and no writer outside the line
-- waits). Expired entries are dropped on the way. Nothing where the layout before holds readers.
local function grant_head()
    if old or redis.call('EXISTS', KEYS[1]) == 1 then
        return
    end
    local outside = nil
    for _, head in ipairs(redis.call('ZRANGE', KEYS[4], 0, -1)) do
        local entry = redis.call('HGET', KEYS[5], head)
        local expiry, ttl, kind
        if entry then
            expiry, ttl, kind = parse(entry)
        end
        if not entry or expiry <= now_ms() then
            drop(head)
        elseif kind == 'w' then
            if live_readers(KEYS[2]) == 0 then
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
            set_reader(KEYS[2], head, ttl)
            publish(head)
        end
    end
end

-- The ms *token* has left here as *kind* ('w': on W; 'r': in the readers' hash), nil when it holds nothing.
local function held(token, kind)
    if kind == 'w' then
        if redis.call('GET', KEYS[1]) == token then
            return redis.call('PTTL', KEYS[1])
        end
        return nil
    end
    if old then
        return nil
    end
    return reader_left(KEYS[2], token)
end

-- Put (or keep) *token* in line at *score*: its entry lives *life* ms, wants *ttl* ms, of *kind*.
local function enter_line(token, score, life, ttl, kind)
    local expiry = now_ms() + tonumber(life)
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

-- Give back what *token* holds here: W, or its reader's entry; the release word is published for clients
-- without the queue, as RELEASE and RW_READ_RELEASE do (a reader's only when no reader lives after it:
-- the last reader). True when it held something.
local function give_up(token, kind)
    if not held(token, kind) then
        return false
    end
    if kind == 'r' then
        redis.call('HDEL', KEYS[2], redis.sha1hex(token))
        if live_readers(KEYS[2]) > 0 then
            return true
        end
    else
        redis.call('DEL', KEYS[1])
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
-- ARGV[5]  'r' a reader, 'w' a writer
-- returns  {1 it holds here now / 0 in line, the node's time in us, its lease's pttl in ms (else 0),
--          the fencing counter (a string) when it holds, else 0}; the error OLD_WORDS where the readers'
--          key is of the layout before (nothing written)
"""
    + NOW
    + NOW_LINE
    + LINE
    + b"""
if old then
    return redis.error_reply([["""
    + OLD_WORDS
    + b"""]])
end
local time = string.format('%.0f', now_us())
local left = held(ARGV[1], ARGV[5])
if left then
    return {1, time, left, counter_now()}
end
enter_line(ARGV[1], ARGV[3], ARGV[4], ARGV[2], ARGV[5])
grant_head()
left = held(ARGV[1], ARGV[5])
if left then
    return {1, time, left, counter_now()}
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
-- ARGV[2]  'r' a reader, 'w' a writer
-- returns  1 it held here; 0 it did not (as RELEASE)
"""
    + NOW
    + NOW_LINE
    + LINE
    + b"""
drop(ARGV[1])
local had = give_up(ARGV[1], ARGV[2])
grant_head()
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
-- ARGV[5]  'r' a reader, 'w' a writer
-- returns  {1 it held here / 0 it did not, the node's time in us, its lease's pttl when it holds again
--          (granted as the head), else 0, and then the fencing counter, else 0}; the error OLD_WORDS
--          where the readers' key is of the layout before (nothing written)
"""
    + NOW
    + NOW_LINE
    + LINE
    + b"""
if old then
    return redis.error_reply([["""
    + OLD_WORDS
    + b"""]])
end
local had = give_up(ARGV[1], ARGV[5])
enter_line(ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5])
grant_head()
local time = string.format('%.0f', now_us())
local left = held(ARGV[1], ARGV[5])
if left then
    return {1, time, left, counter_now()}
end
return {had and 1 or 0, time, 0, 0}
"""
)

RW_QUEUE_DOWNGRADE = (
    b"""
-- RW_DOWNGRADE for the line: where W holds the writer's token, W goes and the reader's entry comes in one
-- step (no other writer can come between), then the readers at the head of the line are granted.
-- KEYS     as the module says
-- ARGV[1]  the writer's token
-- ARGV[2]  the reader's token
-- ARGV[3]  the ttl in integer milliseconds
-- returns  the counter (>= 0; 0 when none is named) done; -1 W is gone or holds another token; -4 the
--          readers' key is of the layout before (nothing written)
"""
    + NOW
    + NOW_LINE
    + LINE
    + b"""
if old then
    return -4
end
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
    return -1
end
redis.call('DEL', KEYS[1])
set_reader(KEYS[2], ARGV[2], ARGV[3])
redis.call('PUBLISH', KEYS[1], redis.sha1hex(ARGV[1]))
grant_head()
return tonumber(counter_now())
"""
)
