"""Lua of the read/write lock (``Redlock.rw_lock``): the writer key, the readers' hash and the waiting writers
(the data model and the rule on one node: ``_rw/_requests.py`` and docs/algorithm.md, "Read/write locks").

Every key a script touches is one of its KEYS: the readers of a name live in ONE hash, ``R``, the SHA1 of a
reader's token -> ``"<token> <expiry, node ms>"``. An entry past its expiry, by the node's own clock read in
the script, is a reader that left or died: it counts as absent, and goes when a script meets it. R's own
expiry is raised (never lowered) to a ttl and a second whenever an entry is set to a ttl, so R outlives its
longest live entry. R is named as the readers' index of the layout before (a set of digests, beside a key
per reader): a script of that layout fails on a hash before it writes, and these refuse a set (OLD_LAYOUT).

Every acquire answers like ``ACQUIRE_FENCED``: the fencing counter (>= 0; 0 unfenced) when granted,
a negative code when not (below).
"""

from __future__ import annotations

WRITER_HOLDS = -1
"""A node's answer to either acquire: a writer holds the lock there."""
WRITER_WAITS = -2
"""A node's answer to a reader: a writer waits there (no new readers until it has had its turn)."""
READERS_HOLD = -3
"""A node's answer to a writer: a reader holds there."""
OLD_READERS = -4
"""A node's answer to either acquire (and a downgrade): its readers' key is a set, the layout before the readers'
hash, whose readers hold keys of their own that these scripts do not read (nothing written)."""

OLD_WORDS = (
    b"OLDLAYOUT readers of a redlock-async client before the readers' hash hold this read/write lock here: "
    b"upgrade every client of it, or let their readers end, and try again"
)
"""The error a line script answers instead of writing when it meets the layout before."""

NOW_MS = b"""
-- The node's clock in milliseconds (a float, exact below 2^53), read once and only when needed.
local clock_ms
local function now_ms()
    if not clock_ms then
        local clock = redis.call('TIME')
        clock_ms = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
    end
    return clock_ms
end
"""

COUNTER = b"""
-- The fencing counter when one is named (the last fenced writer's token on this node), else 0.
local function counter(key)
    if key then
        return tonumber(redis.call('GET', key) or '0')
    end
    return 0
end
"""

READERS = b"""
-- The readers' hash *readers*: the SHA1 of a reader's token -> "<token> <expiry, node ms>".
-- True when *readers* is of the layout before (a set: readers with keys of their own may hold).
local function old_layout(readers)
    return redis.call('TYPE', readers)['ok'] == 'set'
end

-- The token and expiry of an entry.
local function entry(value)
    local token, expiry = string.match(value, '^(.*) (%d+)$')
    return token, tonumber(expiry)
end

-- How many readers live (entries past their expiry are dropped on the way).
local function live_readers(readers)
    local live = 0
    local all = redis.call('HGETALL', readers)
    for i = 1, #all, 2 do
        local _, expiry = entry(all[i + 1])
        if expiry > now_ms() then
            live = live + 1
        else
            redis.call('HDEL', readers, all[i])
        end
    end
    return live
end

-- The reader holding *token* lives *ttl* ms from now; the hash outlives it. (The hash's expiry counts from
-- the script's start, a little before the TIME its entries count from: a second more covers that.)
local function set_reader(readers, token, ttl)
    local life = tonumber(ttl)
    redis.call('HSET', readers, redis.sha1hex(token), token .. ' ' .. string.format('%.0f', now_ms() + life))
    if redis.call('PTTL', readers) < life + 1000 then
        redis.call('PEXPIRE', readers, life + 1000)
    end
end

-- The ms the reader holding *token* has left here, nil when it holds nothing live (a dead entry is dropped).
local function reader_left(readers, token)
    local id = redis.sha1hex(token)
    local value = redis.call('HGET', readers, id)
    if not value then
        return nil
    end
    local held, expiry = entry(value)
    if expiry <= now_ms() then
        redis.call('HDEL', readers, id)
        return nil
    end
    if held ~= token then
        return nil
    end
    return expiry - now_ms()
end
"""

RW_READ = (
    b"""
-- A reader's acquire: its entry in the readers' hash, only while no writer holds W and no writer waits.
-- KEYS[1]  the writer key W
-- KEYS[2]  the readers' hash
-- KEYS[3]  the waiting writers
-- KEYS[4]  optional: the fencing counter (read in the same step: the last writer's token)
-- ARGV[1]  the reader's token
-- ARGV[2]  the ttl in integer milliseconds
-- returns  the counter (>= 0; 0 when none is named) granted; -1 a writer holds; -2 a writer waits;
--          -4 the readers' key is of the layout before (nothing written)
"""
    + NOW_MS
    + COUNTER
    + READERS
    + b"""
if old_layout(KEYS[2]) then
    return -4
end
if redis.call('EXISTS', KEYS[1]) == 1 then
    return -1
end
if redis.call('EXISTS', KEYS[3]) == 1 then
    redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now_ms())  -- entries of writers that died
    if redis.call('ZCARD', KEYS[3]) > 0 then
        return -2
    end
end
-- Two random entries, dropped when their reader left or died: the hash stays near the number of live
-- readers without a writer, at a bounded cost per acquire.
for _, id in ipairs(redis.call('HRANDFIELD', KEYS[2], 2)) do
    local _, expiry = entry(redis.call('HGET', KEYS[2], id))
    if expiry <= now_ms() then
        redis.call('HDEL', KEYS[2], id)
    end
end
set_reader(KEYS[2], ARGV[1], ARGV[2])
return counter(KEYS[4])
"""
)

RW_WRITE = (
    b"""
-- A writer's acquire: W, only while W is free and no reader lives; refused, a blocking writer enters (or
-- stays in) the waiting writers, which keeps new readers out.
-- KEYS[1]  the writer key W
-- KEYS[2]  the readers' hash
-- KEYS[3]  the waiting writers
-- KEYS[4]  optional: the fencing counter (read in the same step, as ACQUIRE_FENCED does)
-- ARGV[1]  the writer's token
-- ARGV[2]  the ttl in integer milliseconds
-- ARGV[3]  the writer's waiter id (the same for every attempt of one acquire)
-- ARGV[4]  how long its entry lives unless entered again, integer milliseconds; 0: do not enter
-- ARGV[5]  optional, "floor": read at least the node's time in microseconds (fence_ttl)
-- returns  the counter (>= 0; 0 when none is named) granted; -1 a writer holds; -3 a reader holds;
--          -4 the readers' key is of the layout before (nothing written)
"""
    + NOW_MS
    + READERS
    + b"""
local function wait()
    local life = tonumber(ARGV[4])
    if life > 0 then
        redis.call('ZADD', KEYS[3], string.format('%.0f', now_ms() + life), ARGV[3])
        if redis.call('PTTL', KEYS[3]) < life then
            redis.call('PEXPIRE', KEYS[3], life)
        end
    end
end
if old_layout(KEYS[2]) then
    return -4
end
if redis.call('EXISTS', KEYS[1]) == 1 then
    wait()
    return -1
end
if live_readers(KEYS[2]) > 0 then
    wait()
    return -3
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
if not KEYS[4] then
    return 0
end
local value = tonumber(redis.call('GET', KEYS[4]) or '0')
if ARGV[5] then
    local clock = redis.call('TIME')
    local floor = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
    if floor > value then
        value = floor
    end
end
return value
"""
)

RW_LEAVE = b"""
-- A writer's acquire ended (granted, timed out, cancelled): its entry in the waiting writers goes.
-- When it was the last one and no writer holds the key, new readers may come: told on the lock's
-- channel, with a word that every node says alike (the digest of the waiter id), so waiting readers
-- count it to a majority (while a writer holds, the word would only wake readers to be refused).
-- It only takes away: run late, it does no harm.
-- KEYS[1]  the waiting writers
-- KEYS[2]  the writer key W (and the lock's channel)
-- ARGV[1]  the writer's waiter id
-- returns  1 the entry was there; 0 it was not
if redis.call('ZREM', KEYS[1], ARGV[1]) == 0 then
    return 0
end
if redis.call('ZCARD', KEYS[1]) == 0 and redis.call('EXISTS', KEYS[2]) == 0 then
    redis.call('PUBLISH', KEYS[2], redis.sha1hex(ARGV[1]))
end
return 1
"""

RW_READ_RELEASE = (
    b"""
-- A reader's release: its entry goes from the readers' hash when it holds the reader's token (a dead one
-- goes too, answered 0); when no reader lives here after it, the lock's channel is told (a waiting writer
-- counts the word to a majority, as for a mutex).
-- KEYS[1]  the readers' hash
-- KEYS[2]  the lock's channel (the writer key)
-- ARGV[1]  the reader's token
-- returns  1 deleted; 0 it held nothing live here (another token, or none, left alone)
"""
    + NOW_MS
    + READERS
    + b"""
if not reader_left(KEYS[1], ARGV[1]) then
    return 0
end
local id = redis.sha1hex(ARGV[1])
redis.call('HDEL', KEYS[1], id)
if live_readers(KEYS[1]) == 0 then
    redis.call('PUBLISH', KEYS[2], id)
end
return 1
"""
)

RW_READ_EXTEND = (
    b"""
-- A reader's extension: its entry lives the new ttl from now, only while it holds the reader's token and
-- lives (a dead entry is dropped: it is no longer a lease to extend); the hash outlives it.
-- KEYS[1]  the readers' hash
-- ARGV[1]  the reader's token
-- ARGV[2]  the new ttl in integer milliseconds, counted from now
-- returns  {1} it holds the token now (extended); {0} it does not (as EXTEND_MANY for one lease)
"""
    + NOW_MS
    + READERS
    + b"""
if not reader_left(KEYS[1], ARGV[1]) then
    return {0}
end
set_reader(KEYS[1], ARGV[1], ARGV[2])
return {1}
"""
)

RW_DOWNGRADE = (
    b"""
-- A writer becomes a reader in one step: where W holds the writer's token, W goes and the reader's entry
-- comes (so the node never holds neither: no other writer can come between), and the waiting readers are
-- told. Waiting writers do not stop it: it adds no reader, it turns one holder into another.
-- KEYS[1]  the writer key W (and the channel)
-- KEYS[2]  the readers' hash
-- KEYS[3]  optional: the fencing counter (read in the same step: the writer's own token, once fenced)
-- ARGV[1]  the writer's token
-- ARGV[2]  the reader's token
-- ARGV[3]  the ttl in integer milliseconds
-- returns  the counter (>= 0; 0 when none is named) done; -1 W is gone or holds another token; -4 the
--          readers' key is of the layout before (nothing written)
"""
    + NOW_MS
    + COUNTER
    + READERS
    + b"""
if old_layout(KEYS[2]) then
    return -4
end
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
    return -1
end
redis.call('DEL', KEYS[1])
set_reader(KEYS[2], ARGV[2], ARGV[3])
redis.call('PUBLISH', KEYS[1], redis.sha1hex(ARGV[1]))
return counter(KEYS[3])
"""
)
