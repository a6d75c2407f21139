"""Lua of the read/write lock (``Redlock.rw_lock``): readers' own keys, the writer key, the readers'
index and the waiting writers (the data model and the rule on one node: ``redlock_async/rwlock.py``
and docs/algorithm.md, "Read/write locks").

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

NOW_MS = b"""
-- The node's clock in milliseconds (a float, exact below 2^53), read only when needed.
local function now_ms()
    local clock = redis.call('TIME')
    return tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
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

KEEP_INDEX = b"""
-- The readers' index lives two leases longer than every reader key it names (a writer finds the readers
-- through it: it must never end under a live one, even when a few KEEP_READERS after its extensions are
-- lost): raised (never lowered) to three times a reader's ttl when the reader is added here, and after each
-- of its extensions (KEEP_READERS). So the index of a name no one uses again ends two leases after its
-- last reader, one that crashed included.
local function keep_index(index, ttl)
    local keep = 3 * tonumber(ttl)
    if redis.call('PTTL', index) < keep then
        redis.call('PEXPIRE', index, keep)
    end
end
"""

RW_READ = (
    b"""
-- A reader's acquire: its own key, only while no writer holds W and no writer waits.
-- KEYS[1]  the writer key W
-- KEYS[2]  this reader's key: ARGV[3] followed by the SHA1 of ARGV[1]
-- KEYS[3]  the readers' index
-- KEYS[4]  the waiting writers
-- KEYS[5]  optional: the fencing counter (read in the same step: the last writer's token)
-- ARGV[1]  the reader's token
-- ARGV[2]  the ttl in integer milliseconds
-- ARGV[3]  the reader keys' prefix
-- returns  the counter (>= 0; 0 when none is named) granted; -1 a writer holds; -2 a writer waits
"""
    + NOW_MS
    + COUNTER
    + KEEP_INDEX
    + b"""
if redis.call('EXISTS', KEYS[1]) == 1 then
    return -1
end
if redis.call('EXISTS', KEYS[4]) == 1 then
    redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', now_ms())  -- entries of writers that died
    if redis.call('ZCARD', KEYS[4]) > 0 then
        return -2
    end
end
-- Two random entries of the index, dropped when their reader left or died: the index stays near the
-- number of live readers without a writer, at a bounded cost per acquire.
for _, id in ipairs(redis.call('SRANDMEMBER', KEYS[3], 2)) do
    if redis.call('EXISTS', ARGV[3] .. id) == 0 then
        redis.call('SREM', KEYS[3], id)
    end
end
redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[2])
redis.call('SADD', KEYS[3], redis.sha1hex(ARGV[1]))
keep_index(KEYS[3], ARGV[2])
return counter(KEYS[5])
"""
)

RW_WRITE = (
    b"""
-- A writer's acquire: W, only while W is free and no reader's key lives; refused, a blocking writer
-- enters (or stays in) the waiting writers, which keeps new readers out.
-- KEYS[1]  the writer key W
-- KEYS[2]  the readers' index
-- KEYS[3]  the waiting writers
-- KEYS[4]  optional: the fencing counter (read in the same step, as ACQUIRE_FENCED does)
-- ARGV[1]  the writer's token
-- ARGV[2]  the ttl in integer milliseconds
-- ARGV[3]  the reader keys' prefix
-- ARGV[4]  the writer's waiter id (the same for every attempt of one acquire)
-- ARGV[5]  how long its entry lives unless entered again, integer milliseconds; 0: do not enter
-- ARGV[6]  optional, "floor": read at least the node's time in microseconds (fence_ttl)
-- returns  the counter (>= 0; 0 when none is named) granted; -1 a writer holds; -3 a reader holds
"""
    + NOW_MS
    + b"""
local function wait()
    local life = tonumber(ARGV[5])
    if life > 0 then
        redis.call('ZADD', KEYS[3], string.format('%.0f', now_ms() + life), ARGV[4])
        if redis.call('PTTL', KEYS[3]) < life then
            redis.call('PEXPIRE', KEYS[3], life)
        end
    end
end
if redis.call('EXISTS', KEYS[1]) == 1 then
    wait()
    return -1
end
local live = false
for _, id in ipairs(redis.call('SMEMBERS', KEYS[2])) do
    if redis.call('EXISTS', ARGV[3] .. id) == 1 then
        live = true
    else
        redis.call('SREM', KEYS[2], id)  -- a reader that left or died
    end
end
if live then
    wait()
    return -3
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
if not KEYS[4] then
    return 0
end
local value = tonumber(redis.call('GET', KEYS[4]) or '0')
if ARGV[6] then
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

RW_READ_RELEASE = b"""
-- A reader's release: compare-and-delete of its key, out of the index; the last reader on this node
-- tells the lock's channel (a waiting writer counts the word to a majority, as for a mutex).
-- KEYS[1]  the reader's key
-- KEYS[2]  the readers' index
-- KEYS[3]  the lock's channel (the writer key)
-- ARGV[1]  the reader's token
-- returns  1 deleted; 0 the key is gone or holds another token (left alone)
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
    return 0
end
redis.call('DEL', KEYS[1])
local id = redis.sha1hex(ARGV[1])
redis.call('SREM', KEYS[2], id)
if redis.call('SCARD', KEYS[2]) == 0 then
    redis.call('PUBLISH', KEYS[3], id)
end
return 1
"""

RW_DOWNGRADE = (
    b"""
-- A writer becomes a reader in one step: where W holds the writer's token, W goes and the reader's
-- key comes (so the node never holds neither: no other writer can come between), and the waiting
-- readers are told. Waiting writers do not stop it: it adds no reader, it turns one holder into another.
-- KEYS[1]  the writer key W (and the channel)
-- KEYS[2]  the new reader's key: ARGV[4] followed by the SHA1 of ARGV[2]
-- KEYS[3]  the readers' index
-- KEYS[4]  optional: the fencing counter (read in the same step: the writer's own token, once fenced)
-- ARGV[1]  the writer's token
-- ARGV[2]  the reader's token
-- ARGV[3]  the ttl in integer milliseconds
-- ARGV[4]  the reader keys' prefix
-- returns  the counter (>= 0; 0 when none is named) done; -1 W is gone or holds another token
"""
    + COUNTER
    + KEEP_INDEX
    + b"""
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
    return -1
end
redis.call('DEL', KEYS[1])
redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3])
redis.call('SADD', KEYS[3], redis.sha1hex(ARGV[2]))
keep_index(KEYS[3], ARGV[3])
redis.call('PUBLISH', KEYS[1], redis.sha1hex(ARGV[1]))
return counter(KEYS[4])
"""
)

KEEP_READERS = b"""
-- After a reader's extension: the readers' index names the reader (again, if this node lost it) and lives
-- at least two leases longer than its key (keep_index's rule), only while the key holds the reader's token.
-- KEYS[1]  the reader's key
-- KEYS[2]  the readers' index
-- ARGV[1]  the reader's token
-- ARGV[2]  its ttl in integer milliseconds (the lease)
-- returns  1 kept; 0 the key is gone or holds another token (nothing written)
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
    return 0
end
redis.call('SADD', KEYS[2], redis.sha1hex(ARGV[1]))
local keep = redis.call('PTTL', KEYS[1]) + 2 * tonumber(ARGV[2])
if redis.call('PTTL', KEYS[2]) < keep then
    redis.call('PEXPIRE', KEYS[2], keep)
end
return 1
"""
