"""The Lua scripts, one constant each, with the SHA1 that EVALSHA names them by.

Every script checks the token before it touches the key, so a client can
only ever delete or extend its own lease, never another holder's.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Script:
    """A Lua source and its SHA1 digest (what EVALSHA sends instead of the source)."""

    source: bytes
    creates: bool = False
    """It can create a lock key. Such a script, sent again as EVAL after the server lost it,
    would run after commands sent later; it is not sent again when one of those names its key."""
    sha: bytes = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "sha", hashlib.sha1(self.source).hexdigest().encode())


RELEASE = Script(
    b"""
-- Compare-and-delete, then tell the waiters (pushed hand-off): a digest of
-- the released token (listeners only match words from several nodes; the
-- token itself would let a listener extend or release a lease), on the
-- channel named like the key (or KEYS[2]), only when a key was deleted.
-- KEYS[1]  the lock key (and the channel)
-- KEYS[2]  optional: the channel instead (a semaphore's permits share one)
-- ARGV[1]  the token of the acquisition being released
-- returns  1 deleted; 0 the key is gone or holds another token (left alone)
if redis.call('GET', KEYS[1]) == ARGV[1] then
    redis.call('DEL', KEYS[1])
    redis.call('PUBLISH', KEYS[2] or KEYS[1], redis.sha1hex(ARGV[1]))
    return 1
end
return 0
"""
)

HANDED_RELEASE = Script(
    b"""
-- Compare-and-delete, telling no one: the release of a hand-over, whose next
-- holder's SET follows it on this connection (a word would only wake waiters
-- elsewhere to find the key taken again).
-- KEYS[1]  the lock key
-- ARGV[1]  the token of the acquisition being released
-- returns  1 deleted; 0 the key is gone or holds another token (left alone)
if redis.call('GET', KEYS[1]) == ARGV[1] then
    redis.call('DEL', KEYS[1])
    return 1
end
return 0
"""
)

EXTEND = Script(
    b"""
-- Compare-and-PEXPIRE. Never re-creates a missing key: a lease that ran
-- out may already belong to someone else.
-- KEYS[1]  the lock key
-- ARGV[1]  the token of the acquisition being extended
-- ARGV[2]  the new ttl in integer milliseconds, counted from now
-- returns  1 extended; 0 the key is gone or holds another token
if redis.call('GET', KEYS[1]) == ARGV[1] then
    return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""
)

EXTEND_MANY = Script(
    b"""
-- EXTEND for many locks in one call: the watchdog's batched round.
-- KEYS[i]      the key of lock i
-- ARGV[2i-1]   its token
-- ARGV[2i]     its new ttl in integer milliseconds, counted from now
-- returns      an array: element i is 1 when lock i was extended, 0 when
--              its key is gone or holds another token (never re-created)
local extended = {}
for i, key in ipairs(KEYS) do
    if redis.call('GET', key) == ARGV[2 * i - 1] then
        extended[i] = redis.call('PEXPIRE', key, ARGV[2 * i])
    else
        extended[i] = 0
    end
end
return extended
"""
)

ACQUIRE_FENCED = Script(
    b"""
-- SET NX PX, and read the resource's fencing counter in the same step.
-- KEYS[1]  the lock key
-- KEYS[2]  the resource's fencing counter (never expires)
-- ARGV[1]  the token of this acquisition
-- ARGV[2]  the ttl in integer milliseconds
-- returns  the counter (>= 0) when the key was set; -1 when it exists
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
    return tonumber(redis.call('GET', KEYS[2]) or '0')
end
return -1
""",
    creates=True,
)

FENCE = Script(
    b"""
-- Raise the fencing counter to the new token, only while this acquisition
-- still holds the key: any later holder of the key then reads it.
-- KEYS[1]  the lock key
-- KEYS[2]  the resource's fencing counter
-- ARGV[1]  the token of this acquisition
-- ARGV[2]  the fencing token chosen for it
-- returns  1 written (or already higher); 0 the key is gone or not ours
if redis.call('GET', KEYS[1]) == ARGV[1] then
    if tonumber(redis.call('GET', KEYS[2]) or '0') < tonumber(ARGV[2]) then
        redis.call('SET', KEYS[2], ARGV[2])
    end
    return 1
end
return 0
"""
)

FENCED_SET = Script(
    b"""
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
)

ACQUIRE_ALL = Script(
    b"""
-- SET NX PX of several keys at once, all or none (lock_many): a node says
-- yes only when it set every key.
-- KEYS[1..n]  the lock keys, in canonical order
-- ARGV[1]     the token of this acquisition (the same on every key)
-- ARGV[2]     the ttl in integer milliseconds
-- returns     1 every key set; -i when key i exists (then nothing was set)
for i, key in ipairs(KEYS) do
    if redis.call('EXISTS', key) == 1 then
        return -i
    end
end
for _, key in ipairs(KEYS) do
    redis.call('SET', key, ARGV[1], 'PX', ARGV[2])
end
return 1
""",
    creates=True,
)

ACQUIRE_ALL_FENCED = Script(
    b"""
-- ACQUIRE_ALL, and read each resource's fencing counter in the same step.
-- KEYS[1..n]     the lock keys, in canonical order
-- KEYS[n+1..2n]  their fencing counters, in the same order (never expire)
-- ARGV[1]        the token of this acquisition
-- ARGV[2]        the ttl in integer milliseconds
-- returns        the n counters (>= 0) when every key was set; -i when key i exists
local n = #KEYS / 2
for i = 1, n do
    if redis.call('EXISTS', KEYS[i]) == 1 then
        return -i
    end
end
local counters = {}
for i = 1, n do
    redis.call('SET', KEYS[i], ARGV[1], 'PX', ARGV[2])
    counters[i] = tonumber(redis.call('GET', KEYS[n + i]) or '0')
end
return counters
""",
    creates=True,
)

FENCE_ALL = Script(
    b"""
-- FENCE for several keys of one acquisition: only while it holds every one.
-- KEYS[1..n]     the lock keys
-- KEYS[n+1..2n]  their fencing counters
-- ARGV[1]        the token of this acquisition
-- ARGV[1+i]      the fencing token chosen for key i
-- returns        1 written (or already higher); 0 a key is gone or not ours
local n = #KEYS / 2
for i = 1, n do
    if redis.call('GET', KEYS[i]) ~= ARGV[1] then
        return 0
    end
end
for i = 1, n do
    if tonumber(redis.call('GET', KEYS[n + i]) or '0') < tonumber(ARGV[1 + i]) then
        redis.call('SET', KEYS[n + i], ARGV[1 + i])
    end
end
return 1
"""
)

EXTEND_ALL = Script(
    b"""
-- Compare-and-PEXPIRE of several keys of one acquisition: all or none.
-- KEYS[1..n]  the lock keys
-- ARGV[1]     the token of the acquisition
-- ARGV[2]     the new ttl in integer milliseconds, counted from now
-- returns     1 every key extended; 0 a key is gone or not ours (none extended)
for _, key in ipairs(KEYS) do
    if redis.call('GET', key) ~= ARGV[1] then
        return 0
    end
end
for _, key in ipairs(KEYS) do
    redis.call('PEXPIRE', key, ARGV[2])
end
return 1
"""
)

RELEASE_ALL = Script(
    b"""
-- RELEASE for several keys of one acquisition: each key that still holds
-- the token is deleted, and its waiters told on its own channel.
-- KEYS[1..n]  the lock keys
-- ARGV[1]     the token of the acquisition
-- returns     1 every key held the token (all deleted); 0 some did not
local all = 1
for _, key in ipairs(KEYS) do
    if redis.call('GET', key) == ARGV[1] then
        redis.call('DEL', key)
        redis.call('PUBLISH', key, redis.sha1hex(ARGV[1]))
    else
        all = 0
    end
end
return all
"""
)

ACQUIRE_PERMIT = Script(
    b"""
-- Take permit slot i of a semaphore: a SET NX PX of that slot's key, after
-- checking that no slot is held under another limit. Every token starts
-- with its semaphore's limit ("3:..."), so holders of one limit see those
-- of another; the widest limit ever used is kept (it never expires, a few
-- bytes) so that every slot that may be held is looked at.
-- KEYS[1]  the slot's key
-- KEYS[2]  the semaphore's widest-limit key
-- ARGV[1]  the token of this acquisition ("<limit>:<random>")
-- ARGV[2]  the ttl in integer milliseconds
-- ARGV[3]  the limit this client uses
-- ARGV[4]  the slots' key prefix (slot j is this followed by j)
-- returns  1 set; -L a slot is held under limit L (not ours); the slot is held:
--          the list of this node's free slots (so the next try goes where it can win)
local limit = tonumber(ARGV[3])
local widest = tonumber(redis.call('GET', KEYS[2]) or '0')
if limit > widest then
    redis.call('SET', KEYS[2], ARGV[3])
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
    return 1
end
return free
""",
    creates=True,
)

# -- the grant queue (Redlock(queue=True)) -----------------------------------
#
# Each node keeps, per lock key, the waiters of that key: a sorted set of their
# tokens by a score each waiter chose once (its wall-clock start, the same on
# every node, so every node serves the same waiter first) and a hash of each
# entry's expiry (node milliseconds) and the ttl it wants. A release, or a
# waiter finding the key free, SETs the key to the first live entry's token
# and publishes a grant word naming it (by digest) with the node's time of the
# grant: that waiter holds the key on this node without another round trip.

_NOW = b"""
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

_GRANT_NEXT = b"""
-- SET the key to the first live waiter (expired entries are dropped) and publish the grant;
-- returns that waiter's token, or nil when no one waits.
local function grant_next(key, queue, waits)
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
                redis.call('PUBLISH', key, 'g' .. redis.sha1hex(head) .. ':' .. string.format('%.0f', now_us()))
                return head
            end
        end
    end
end
"""

QUEUE_ENTER = Script(
    b"""
-- A waiter joins (or stays in) the key's line; a free key goes to the first live waiter now.
-- KEYS[1]  the lock key (and the channel)
-- KEYS[2]  its line: a sorted set of waiting tokens
-- KEYS[3]  its waits: token -> "<entry expiry, node ms> <ttl ms>"
-- ARGV[1]  the waiter's token
-- ARGV[2]  the ttl it wants, integer milliseconds
-- ARGV[3]  its score (the same on every node: its place in line)
-- ARGV[4]  how long the entry lives unless entered again, integer milliseconds
-- returns  {1 the key holds the token now / 0 queued, the node's time in us, the key's pttl in ms}
"""
    + _NOW
    + _GRANT_NEXT
    + b"""
local time = string.format('%.0f', now_us())
local held = redis.call('GET', KEYS[1])
if held == ARGV[1] then
    return {1, time, redis.call('PTTL', KEYS[1])}
end
if not held and redis.call('EXISTS', KEYS[2]) == 0 then  -- free, and no one in line: ours, told by this reply
    redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
    return {1, time, tonumber(ARGV[2])}
end
local life = tonumber(ARGV[4])
redis.call('ZADD', KEYS[2], ARGV[3], ARGV[1])
redis.call('HSET', KEYS[3], ARGV[1], string.format('%.0f', math.floor(now_us() / 1000) + life) .. ' ' .. ARGV[2])
if redis.call('PTTL', KEYS[2]) < life then  -- the line outlives its entries (set once per life)
    redis.call('PEXPIRE', KEYS[2], 2 * life)
    redis.call('PEXPIRE', KEYS[3], 2 * life)
end
if not held and grant_next(KEYS[1], KEYS[2], KEYS[3]) == ARGV[1] then
    return {1, time, tonumber(ARGV[2])}
end
return {0, time, 0}
""",
    creates=True,
)

QUEUE_LEAVE = Script(
    b"""
-- A waiter or holder leaves the key's line: its entry goes, and if the key holds its token,
-- the key goes straight to the next live waiter (or, with none, is deleted and the release
-- word published, as RELEASE does).
-- KEYS[1]  the lock key (and the channel)
-- KEYS[2]  its line
-- KEYS[3]  its waits
-- ARGV[1]  the token
-- ARGV[2]  "leave"; or "stay": keep (or put back) the entry (a split grant given back), with
-- ARGV[3]  its score, ARGV[4] the entry's life and ARGV[5] its ttl (as for QUEUE_ENTER)
-- returns  {1 the key held the token / 0 it did not, the node's time in us (0 when leaving with
--          no one in line: no one counts on it then), the key's pttl when it holds the token
--          again (given back to the first waiter: us), else 0}
"""
    + _NOW
    + _GRANT_NEXT
    + b"""
local stay = ARGV[2] == 'stay'
if stay then
    if not redis.call('HGET', KEYS[3], ARGV[1]) then
        local expiry = math.floor(now_us() / 1000) + tonumber(ARGV[4])
        redis.call('HSET', KEYS[3], ARGV[1], string.format('%.0f', expiry) .. ' ' .. ARGV[5])
    end
    redis.call('ZADD', KEYS[2], ARGV[3], ARGV[1])
elseif redis.call('ZREM', KEYS[2], ARGV[1]) == 1 then
    redis.call('HDEL', KEYS[3], ARGV[1])
end
local had = redis.call('GET', KEYS[1]) == ARGV[1]
local head = had and grant_next(KEYS[1], KEYS[2], KEYS[3])
if had and not head then
    redis.call('DEL', KEYS[1])
    redis.call('PUBLISH', KEYS[1], redis.sha1hex(ARGV[1]))
end
local time = (stay or clock_us) and string.format('%.0f', now_us()) or '0'
if head == ARGV[1] then
    return {1, time, tonumber(ARGV[5])}
end
return {had and 1 or 0, time, 0}
""",
    creates=True,
)

SCRIPTS = (
    QUEUE_ENTER,
    QUEUE_LEAVE,
    HANDED_RELEASE,
    RELEASE,
    EXTEND,
    EXTEND_MANY,
    ACQUIRE_FENCED,
    FENCE,
    ACQUIRE_ALL,
    ACQUIRE_ALL_FENCED,
    FENCE_ALL,
    EXTEND_ALL,
    RELEASE_ALL,
    ACQUIRE_PERMIT,
)
"""The scripts a node loads on every new connection (FENCED_SET runs on the protected resource)."""
